"""Cosine similarity of vectors: the one definition used by ``SentenceEncoder.similarity``, the
search index (:mod:`cselab.search.index`) and retrieval evaluation (exact top-k search,
:func:`exact_topk`, lives here so that evaluation and model selection, below the search layer,
search as the index does)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

# Rows of the vector matrix scored per block in exact search: 64 queries x 65,536 rows of
# float32 scores is 16 MiB, small next to the 96 MiB block of width-384 vectors it reads.
EXACT_BLOCK_ROWS = 1 << 16
#: A top-k search over vectors held in memory: ``(queries, vectors, k) -> (scores, rows)``, best
#: first (:func:`exact_topk`, or the index's FAISS search, ``cselab.search.index.vector_search``).
TopK = Callable[[np.ndarray, np.ndarray, int], tuple[np.ndarray, np.ndarray]]


def normalize_rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm, in float32; a zero row stays zero (its cosines are 0)."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(norms, np.finfo(np.float32).tiny)


def vectors_of(encoder: Any, x: Any, batch_size: int) -> np.ndarray:
    """``x`` as vectors: a list of sentences encoded by ``encoder``, or an ``(N, D)`` array or
    tensor of vectors taken as it is."""
    if isinstance(x, str):
        raise TypeError("similarity() takes lists of sentences, not a single string")
    if hasattr(x, "detach"):  # a torch tensor
        return np.asarray(x.detach().cpu())
    if isinstance(x, np.ndarray):
        return x
    return encoder.encode(list(x), batch_size=batch_size)


def cosine_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``(N, D)`` x ``(M, D)`` -> ``(N, M)`` float32 matrix of cosines."""
    a, b = np.atleast_2d(a), np.atleast_2d(b)
    if a.shape[-1] != b.shape[-1]:
        raise ValueError(f"vector widths differ: {a.shape[-1]} and {b.shape[-1]}")
    return normalize_rows(a) @ normalize_rows(b).T


def truncate_rows(x: np.ndarray, dim: int | None) -> np.ndarray:
    """The first ``dim`` coordinates of each row, re-normalised to unit length (Matryoshka
    representations, Kusupati et al. 2022, Sec. 3: every prefix is a vector of its own).

    ``dim=None`` (or the full width) returns the rows normalised. The one home of "a vector at a
    smaller dimension": ``encode(..., dim=)``, the index, evaluation at ``--dims`` and mining use it.
    """
    x = np.atleast_2d(np.asarray(x, dtype=np.float32))
    if dim is not None:
        x = x[..., : check_prefix(dim, x.shape[-1])]
    return normalize_rows(x)


def check_prefix(dim: int, width: int, what: str = "dimension") -> int:
    """``dim`` as an int if it is a prefix of ``width``-wide vectors (``1..width``), else a
    :class:`~cselab.core.errors.ConfigError` (a ``ValueError``) naming ``what`` (a setting's keyword, ``dim``: a :class:`~cselab.core.errors.SettingError`
    that a command line shows as its flag).
    The check of :func:`truncate_rows`, callable before any encoding."""
    from ..core.errors import ConfigError, ConfigSettingError

    if isinstance(dim, bool) or not 1 <= int(dim) <= width:
        if what.isidentifier() and what != "dimension":  # a setting: the CLI shows its flag
            raise ConfigSettingError(
                what, dim, "{setting} is outside 1..{width} (the vectors' width)", width=width
            )
        raise ConfigError(f"{what} {dim} is outside 1..{width} (the vectors' width)")
    return int(dim)


def exact_topk(
    queries: np.ndarray, vectors: np.ndarray, k: int, block_rows: int = EXACT_BLOCK_ROWS
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` rows of ``vectors`` by dot product with each query; ``(scores, rows)``.

    Block by block over ``vectors`` (a memory map need not fit in RAM): each block's scores are
    one matrix product, its ``k`` best are kept with ``argpartition`` and merged with the best so
    far. Results are sorted by score, ties by row (lower first).
    """
    q = np.ascontiguousarray(queries, dtype=np.float32)
    n = int(vectors.shape[0])
    k = min(k, n)
    best_s = np.full((len(q), 0), -np.inf, dtype=np.float32)
    best_i = np.zeros((len(q), 0), dtype=np.int64)
    for start in range(0, n, block_rows):
        block = np.asarray(vectors[start : start + block_rows], dtype=np.float32)
        scores = q @ block.T
        if scores.shape[1] > k:
            part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        else:
            part = np.broadcast_to(np.arange(scores.shape[1]), scores.shape)
        best_s = np.concatenate([best_s, np.take_along_axis(scores, part, 1)], axis=1)
        best_i = np.concatenate([best_i, part + start], axis=1)
        if best_s.shape[1] > k:
            keep = np.argpartition(-best_s, k - 1, axis=1)[:, :k]
            best_s = np.take_along_axis(best_s, keep, 1)
            best_i = np.take_along_axis(best_i, keep, 1)
    order = np.lexsort((best_i, -best_s), axis=1)
    return np.take_along_axis(best_s, order, 1), np.take_along_axis(best_i, order, 1)
