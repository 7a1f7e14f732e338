"""Cosine similarity of vectors: the one definition used by ``SentenceEncoder.similarity`` and
the search index (:mod:`cselab.index`)."""

from __future__ import annotations

import numpy as np


def normalize_rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm, in float32; a zero row stays zero (its cosines are 0)."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(norms, np.finfo(np.float32).tiny)


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
    :class:`~cselab.core.errors.ConfigError` (a ``ValueError``) naming ``what`` (``--dim``).
    The check of :func:`truncate_rows`, callable before any encoding."""
    from ..core.errors import ConfigError

    if isinstance(dim, bool) or not 1 <= int(dim) <= width:
        raise ConfigError(f"{what} {dim} is outside 1..{width} (the vectors' width)")
    return int(dim)
