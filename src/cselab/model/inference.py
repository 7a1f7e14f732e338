"""Batched inference of a sentence encoder: length-sorted batches, and the bf16 inference copy.

:func:`encode_sentences` is ``SentenceEncoder.encode``: sentences sorted by length so each batch
pads little, vectors gathered on the device and put back in input order on the host.
:func:`tokenized_batches` and :func:`encode_batches` split it for sentences encoded again and
again (the dev set at every evaluation): tokenised once, kept on the device. :func:`inference_copy` is the bf16 copy it encodes
with for ``precision="bf16"``. Both take the encoder as an ``nn.Module`` with
``SentenceEncoder``'s attributes (``tokenize``, ``dim``, ``device``, ``inference_max_len``), so
this module needs nothing from the model's own module.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from ..core.errors import ConfigSettingError, check_count
from ..core.prompts import check_prompt_fits, count_prompt, exclude_prompt
from .choices import BATCH_SIZE, PRECISIONS
from .devices import PRECISION_NAMES, precision_dtype
from .devices import autocast as autocast_to
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
    if not isinstance(sentences, Sequence):  # a generator, a set: read once, in its order
        if not isinstance(sentences, Iterable):
            raise TypeError(f"encode() takes a list of sentences, not {type(sentences).__name__}")
        sentences = list(sentences)
    wrong = next((i for i, s in enumerate(sentences) if not isinstance(s, str)), None)
    if wrong is not None:  # "object has no len()" deep in the tokenizer before
        raise TypeError(
            f"encode() takes sentences as text: item {wrong} is {type(sentences[wrong]).__name__}"
        )
    batch_size = check_count("batch_size", batch_size)
    if max_seq_len is not None:  # 0 was the default length without a word, -1 the tokenizer's error
        max_seq_len = check_count("max_seq_len", max_seq_len)
    if precision not in PRECISIONS:
        raise ConfigSettingError("precision", precision, "{setting} is unknown; choose one of "
                                 "{known}", known=", ".join(PRECISIONS))  # fmt: skip
    if dim is not None:
        check_prefix(dim, encoder.dim)  # before any work
        # the prefix is cut from the pooled vector, then normalised (never normalised twice)
        full = _encode(encoder, sentences, batch_size, False, show_progress, max_seq_len,
                       precision, prompt)  # fmt: skip
        return truncate_rows(full, dim)
    normalize = normalize or _folder_normalizes(encoder)
    return _encode(
        encoder, sentences, batch_size, normalize, show_progress, max_seq_len, precision, prompt
    )


#: Rows of vectors gathered on the device before one copy to the host: a dev set is one copy,
#: a corpus of millions a copy per this many rows (the device holds no more than these).
FLUSH_ROWS = 16384


@dataclass(frozen=True)
class Batches:
    """Sentences tokenised once for encoding again and again (the dev set at every evaluation):
    longest first, in batches, on the encoder's device. ``order[i]`` is the input position of
    sorted row ``i``; ``key`` says which encoder setting they were made for
    (:func:`batches_key`)."""

    order: np.ndarray
    inputs: tuple[dict[str, torch.Tensor], ...]
    key: tuple[Any, ...]


def batches_key(encoder: nn.Module, batch_size: int, max_seq_len: int | None = None) -> tuple:
    """What tokenised batches depend on: the tokenizer, the device, the length limit, the batch
    size. Batches made under another key are made again."""
    return (id(encoder.tokenizer), str(encoder.device), _limit(encoder, max_seq_len), batch_size)


def tokenized_batches(
    encoder: nn.Module, sentences: Sequence[str], batch_size: int, max_seq_len: int | None = None
) -> Batches:
    """``sentences`` tokenised, sorted and batched as :func:`encode_sentences` does, on the
    encoder's device, to be encoded with :func:`encode_batches` as often as needed."""
    order = _order(sentences)
    inputs = tuple(_tokenize(encoder, sentences, order, batch_size, _limit(encoder, max_seq_len)))
    return Batches(order, inputs, batches_key(encoder, batch_size, max_seq_len))


@torch.inference_mode()  # as ``SentenceEncoder.encode``: the same kernels, the same vectors
def encode_batches(
    encoder: nn.Module,
    batches: Batches,
    normalize: bool = False,
    on_device: bool = False,
    autocast: str = "fp32",
) -> np.ndarray | torch.Tensor:
    """The float32 vectors of tokenised ``batches`` in input order: what ``encoder.encode``
    gives for the same sentences, batch size and length (the same batches, the same forward),
    with one copy to the host at the end; ``on_device``: no copy, a tensor on the encoder's
    device (a dev set's measures computed there). ``autocast``: the forward under that
    precision's autocast (``bf16``, ``fp16``: a training run's dev set on a GPU, the weights as
    they train, not ``encode(precision=)``'s cast copy), ``fp32``: none."""
    if batches_key(encoder, batches.key[3], None)[:2] != batches.key[:2]:
        raise ValueError("these batches were tokenised for another tokenizer or device")
    if autocast not in PRECISION_NAMES.values():
        names = ", ".join(PRECISION_NAMES.values())
        raise ValueError(f"autocast must be one of {names}, got {autocast!r}")
    normalize = normalize or _folder_normalizes(encoder)
    inputs = iter(batches.inputs)
    with autocast_to(torch.device(encoder.device), precision_dtype(autocast)):
        return _run(encoder, batches.order, inputs, normalize, False, "fp32", None, on_device)


def _limit(encoder: nn.Module, max_seq_len: int | None) -> int:
    if max_seq_len:  # an explicit length is capped only by what the model accepts
        return min(max_seq_len, encoder.accepted_max_len)
    return encoder.inference_max_len


def _order(sentences: Sequence[str]) -> np.ndarray:
    """Longest first: batches of similar length pad less."""
    return np.argsort([-len(s) for s in sentences], kind="stable")


def _folder_normalizes(encoder: nn.Module) -> bool:
    # A folder whose module list ends in Normalize gives unit vectors, as SentenceTransformer
    # gives them: the folder's vectors are the normalised ones (dot product = cosine).
    return bool(getattr(getattr(encoder, "folder_settings", None), "normalize", False))


def _tokenize(
    encoder: nn.Module,
    sentences: Sequence[str],
    order: np.ndarray,
    batch_size: int,
    limit: int,
    skip: int = 0,
) -> Iterator[dict[str, torch.Tensor]]:
    """The batches of ``order``, tokenised on the host and moved to the encoder's device;
    ``skip``: the prompt's tokens at the start of each row, left out of the pooling."""
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        batch = encoder.tokenize([sentences[i] for i in idx], max_seq_len=limit)
        types = batch.get("token_type_ids")
        if types is not None and not types.any():
            # all one segment: the model's default token types are these zeros, and a
            # batch without them takes the packed forward with no check on the data
            del batch["token_type_ids"]
        if skip:
            batch["pool_mask"] = exclude_prompt(batch["attention_mask"], skip)
        yield {k: v.to(encoder.device) for k, v in batch.items()}


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
    if len(sentences) == 0:
        return np.zeros((0, encoder.dim), dtype=np.float32)
    if prompt:  # the sentences as the model reads them; the order sorts them alike
        sentences = [prompt + s for s in sentences]
    # the prompt's own tokens, left out of the pooling (model.pool_prompt: false)
    skip = 0 if not prompt or encoder.pooler.include_prompt else prompt_tokens(encoder, prompt)
    order = _order(sentences)
    # tokenised batch by batch: the host makes the next batch while the device runs this one
    limit = _limit(encoder, max_seq_len)
    check_prompt_fits(encoder.tokenizer, prompt, limit, "prompt")
    batches = _tokenize(encoder, sentences, order, batch_size, limit, skip)
    total = -(-len(order) // batch_size)  # the progress bar's batches
    return _run(encoder, order, batches, normalize, show_progress, precision, total)


def _run(
    encoder: nn.Module,
    order: np.ndarray,
    batches: Iterator[dict[str, torch.Tensor]],
    normalize: bool,
    show_progress: bool,
    precision: str,
    total: int | None = None,
    on_device: bool = False,
) -> np.ndarray | torch.Tensor:
    """Encode ``batches`` (the sorted rows ``order``); the vectors are gathered on the device
    and copied to the host every :data:`FLUSH_ROWS` rows and at the end, not batch by batch
    (each copy waits for the device: one per batch would keep the host from queueing ahead).
    ``on_device``: all kept on the device, returned there in input order (no host copy)."""
    n = len(order)
    out = np.empty((n, encoder.dim), dtype=np.float32) if not on_device else None
    model = inference_copy(encoder, torch.bfloat16) if precision == "bf16" else encoder
    options = getattr(encoder, "inference_compile", None)
    forward = model if options is None else inference_graph(model, **options)
    if show_progress:
        from tqdm.auto import tqdm

        batches = iter(tqdm(batches, desc="encode", unit="batch", total=total))
    was_training = encoder.training
    encoder.eval()
    try:
        pending: list[torch.Tensor] = []
        done = gathered = 0
        for batch in batches:
            vec = forward(**batch).float()
            if normalize:
                vec = torch.nn.functional.normalize(vec, dim=-1)
            pending.append(vec)
            gathered += vec.shape[0]
            if not on_device and gathered - done >= FLUSH_ROWS:
                done = _flush(out, order, done, pending)
        if on_device:
            rows = torch.cat(pending) if pending else torch.zeros(0, encoder.dim)
            inverse = torch.as_tensor(np.argsort(order, kind="stable"), device=rows.device)
            return rows[inverse]  # sorted row k is input row order[k]
        _flush(out, order, done, pending)
    finally:
        encoder.train(was_training)
    return out


def _flush(out: np.ndarray, order: np.ndarray, done: int, pending: list[torch.Tensor]) -> int:
    """Copy the gathered vectors (sorted rows ``done:``) to their input rows of ``out``."""
    if not pending:
        return done
    rows = torch.cat(pending).cpu().numpy()
    pending.clear()
    out[order[done : done + len(rows)]] = rows
    return done + len(rows)


def prompt_tokens(encoder: nn.Module, prompt: str) -> int:
    """The tokens of ``prompt`` at the start of a row, counted as the model was trained
    (``encoder.prompt_count``, :func:`~cselab.core.prompts.count_prompt`), lowercased first
    where the encoder lowercases its text."""
    settings = getattr(encoder, "folder_settings", None)
    lower = bool(getattr(settings, "do_lower_case", False))
    rule = getattr(encoder, "prompt_count", "row")
    return count_prompt(encoder.tokenizer, prompt.lower() if lower else prompt, rule)
