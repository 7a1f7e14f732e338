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

import numpy as np
import torch
from torch import nn

from .similarity import check_prefix, truncate_rows

#: ``encode(precision=...)``: the backbone's compute precision at inference
PRECISIONS = ("fp32", "bf16")


def inference_copy(encoder: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A copy of ``encoder`` with its weights in ``dtype``, in eval mode (for inference).

    Inference needs no float32 master weights: with bf16 weights every operation runs in bf16
    with no per-operation casts, which is what makes bf16 inference fast on CPUs with
    AMX/AVX512-BF16. The copy keeps every setting of ``encoder`` (pooler, fast path, the
    folder's inference settings) and shares its tokenizer; ``encoder`` is left as it was.
    """
    tokenizer = encoder.tokenizer  # shared, not copied: it holds no weights
    return copy.deepcopy(encoder, memo={id(tokenizer): tokenizer}).to(dtype).eval()


def encode_sentences(
    encoder: nn.Module,
    sentences: Sequence[str],
    batch_size: int = 128,
    normalize: bool = False,
    show_progress: bool = False,
    max_seq_len: int | None = None,
    precision: str = "fp32",
    dim: int | None = None,
) -> np.ndarray:
    """``encoder.encode``: float32 ``(N, D)`` in input order (see ``SentenceEncoder.encode``);
    with ``dim``, the re-normalised prefixes ``(N, dim)``."""
    if isinstance(sentences, str):
        raise TypeError("encode() takes a list of sentences, not a single string")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    if dim is not None:
        check_prefix(dim, encoder.dim)  # before any work
        full = encode_sentences(encoder, sentences, batch_size, False, show_progress,
                                max_seq_len, precision)  # fmt: skip
        return truncate_rows(full, dim)
    n = len(sentences)
    if n == 0:
        return np.zeros((0, encoder.dim), dtype=np.float32)
    limit = encoder.inference_max_len
    if max_seq_len:  # an explicit length is capped only by what the model accepts
        limit = min(max_seq_len, encoder.accepted_max_len)
    order = np.argsort([-len(s) for s in sentences], kind="stable")
    out = np.empty((n, encoder.dim), dtype=np.float32)
    model = inference_copy(encoder, torch.bfloat16) if precision == "bf16" else encoder
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
            batch = {k: v.to(encoder.device) for k, v in batch.items()}
            vec = model(**batch).float()
            if normalize:
                vec = torch.nn.functional.normalize(vec, dim=-1)
            out[idx] = vec.cpu().numpy()
    finally:
        encoder.train(was_training)
    return out
