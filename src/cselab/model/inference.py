"""Batched inference of a sentence encoder: length-sorted batches, and the bf16 inference copy.

:func:`encode_sentences` is ``SentenceEncoder.encode``: sentences sorted by length so each batch
pads little, vectors put back in input order. :func:`inference_copy` is the bf16 copy it encodes
with for ``precision="bf16"``. Both take the encoder as an ``nn.Module`` with
``SentenceEncoder``'s attributes (``tokenize``, ``dim``, ``device``, ``inference_max_len``), so
this module needs nothing from the model's own module.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from ..core.prompts import exclude_prompt, prompt_length
from .choices import BATCH_SIZE, PRECISIONS
from .similarity import check_prefix, truncate_rows

#: where :func:`inference_graph` keeps a module's compiled forward: in the module's ``__dict__``,
#: not as a submodule (which would add its weights a second time to ``state_dict``)
_GRAPH = "_cselab_inference_graph"


def inference_graph(model: nn.Module, **options: Any) -> nn.Module:
    """``model``'s compiled inference forward (:func:`cselab.model.unpad.compile_encoder` with
    ``options``), compiled on first use and kept with the module.

    One graph for every batch shape (``dynamic=True``), so a corpus of any length distribution
    compiles once; the first batches pay the compile (15-30 s for MiniLM on 2 cores),
    which is why it is opt-in (``load(..., compile_inference=True)``, ``--compile``) and worth it
    for large corpora. ``docs/results/encode_benchmark.md`` measures it against eager.
    """
    graph = model.__dict__.get(_GRAPH)
    if graph is None:
        from .unpad import compile_encoder

        graph = compile_encoder(model, **options)
        model.__dict__[_GRAPH] = graph
    return graph


def drop_inference_graph(model: nn.Module) -> None:
    """Forget ``model``'s compiled forward (:func:`inference_graph` compiles a new one)."""
    model.__dict__.pop(_GRAPH, None)


def inference_copy(encoder: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A copy of ``encoder`` with its weights in ``dtype``, in eval mode (for inference).

    Inference needs no float32 master weights: with bf16 weights every operation runs in bf16
    with no per-operation casts, which is what makes bf16 inference fast on CPUs with
    AMX/AVX512-BF16. The copy keeps every setting of ``encoder`` (pooler, fast path, the
    folder's inference settings) and shares its tokenizer; ``encoder`` is left as it was.
    """
    tokenizer = encoder.tokenizer  # shared, not copied: it holds no weights
    memo = {id(tokenizer): tokenizer}
    graph = encoder.__dict__.get(_GRAPH)
    if graph is not None:  # the fp32 graph is not the copy's: it compiles its own
        memo[id(graph)] = None
    return copy.deepcopy(encoder, memo=memo).to(dtype).eval()


def encode_sentences(
    encoder: nn.Module,
    sentences: Sequence[str],
    batch_size: int = BATCH_SIZE,
    normalize: bool = False,
    show_progress: bool = False,
    max_seq_len: int | None = None,
    precision: str = "fp32",
    dim: int | None = None,
    prompt: str | None = None,
) -> np.ndarray:
    """``encoder.encode``: float32 ``(N, D)`` in input order (see ``SentenceEncoder.encode``);
    with ``dim``, the re-normalised prefixes ``(N, dim)``; ``prompt``: the text put before
    every sentence (its tokens left out of the pooling where the pooler says so)."""
    if isinstance(sentences, str):
        raise TypeError("encode() takes a list of sentences, not a single string")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    if dim is not None:
        check_prefix(dim, encoder.dim)  # before any work
        # the prefix is cut from the pooled vector, then normalised (never normalised twice)
        full = _encode(encoder, sentences, batch_size, False, show_progress, max_seq_len,
                       precision, prompt)  # fmt: skip
        return truncate_rows(full, dim)
    settings = getattr(encoder, "folder_settings", None)
    # A folder whose module list ends in Normalize gives unit vectors, as SentenceTransformer
    # gives them: the folder's vectors are the normalised ones (dot product = cosine).
    normalize = normalize or bool(getattr(settings, "normalize", False))
    return _encode(
        encoder, sentences, batch_size, normalize, show_progress, max_seq_len, precision, prompt
    )


def _encode(
    encoder: nn.Module,
    sentences: Sequence[str],
    batch_size: int,
    normalize: bool,
    show_progress: bool,
    max_seq_len: int | None,
    precision: str,
    prompt: str | None = None,
) -> np.ndarray:
    """The pooled vectors (L2-normalised with ``normalize``), in input order."""
    n = len(sentences)
    if prompt:  # the sentences as the model reads them; the order sorts them alike
        sentences = [prompt + s for s in sentences]
    # the prompt's own tokens, left out of the pooling (model.pool_prompt: false)
    skip = 0 if not prompt or encoder.pooler.include_prompt else _prompt_tokens(encoder, prompt)
    if n == 0:
        return np.zeros((0, encoder.dim), dtype=np.float32)
    limit = encoder.inference_max_len
    if max_seq_len:  # an explicit length is capped only by what the model accepts
        limit = min(max_seq_len, encoder.accepted_max_len)
    order = np.argsort([-len(s) for s in sentences], kind="stable")
    out = np.empty((n, encoder.dim), dtype=np.float32)
    model = inference_copy(encoder, torch.bfloat16) if precision == "bf16" else encoder
    options = getattr(encoder, "inference_compile", None)
    forward = model if options is None else inference_graph(model, **options)
    was_training = encoder.training
    encoder.eval()
    try:
        starts = range(0, n, batch_size)
        if show_progress:
            from tqdm.auto import tqdm

            starts = tqdm(starts, desc="encode", unit="batch")
        for start in starts:
            idx = order[start : start + batch_size]
            batch = encoder.tokenize([sentences[i] for i in idx], max_seq_len=limit)
            types = batch.get("token_type_ids")
            if types is not None and not types.any():
                # all one segment: the model's default token types are these zeros, and a
                # batch without them takes the packed forward with no check on the data
                del batch["token_type_ids"]
            if skip:
                batch["pool_mask"] = exclude_prompt(batch["attention_mask"], skip)
            batch = {k: v.to(encoder.device) for k, v in batch.items()}
            vec = forward(**batch).float()
            if normalize:
                vec = torch.nn.functional.normalize(vec, dim=-1)
            out[idx] = vec.cpu().numpy()
    finally:
        encoder.train(was_training)
    return out


def _prompt_tokens(encoder: nn.Module, prompt: str) -> int:
    """The tokens of ``prompt`` at the start of a row (:func:`~cselab.core.prompts.prompt_length`),
    lowercased first where the encoder lowercases its text."""
    settings = getattr(encoder, "folder_settings", None)
    lower = bool(getattr(settings, "do_lower_case", False))
    return prompt_length(encoder.tokenizer, prompt.lower() if lower else prompt)
