"""Alignment and uniformity (Wang & Isola, ICML 2020) on STS-B dev, as SimCSE (Sec. 5) uses them.

* alignment ``E ||f(x) - f(y)||^alpha`` over positive pairs, alpha = 2: STS-B dev pairs with a
  gold score above 4;
* uniformity ``log E exp(-t ||f(x) - f(y)||^2)`` over all pairs of distinct sentences, t = 2:
  every distinct STS-B dev sentence (each counted once, so repeated sentences do not add
  zero-distance pairs).

Embeddings are L2-normalised first (SimCSE authors, princeton-nlp/SimCSE issues #122, #225).
Lower is better for both.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from . import datasets
from .embed import EmbeddingCache

POSITIVE_THRESHOLD = 4.0


def _float64(x: np.ndarray | Tensor) -> Tensor:
    """``x`` in float64 where it lives: an array on the host (any strides, read-only too), a
    tensor on its device (the trainer's dev vectors stay on the GPU: no copy of the ``N x N``
    work to the host)."""
    if isinstance(x, Tensor):
        return x.to(torch.float64)
    return torch.from_numpy(np.array(x, dtype=np.float64))  # a copy: contiguous, writable


def l2_normalize(x: np.ndarray | Tensor) -> Tensor:
    """Rows scaled to unit length (zero rows stay zero): a float64 tensor on ``x``'s device
    (the host's for an array)."""
    x = _float64(x)
    norm = torch.linalg.vector_norm(x, dim=1, keepdim=True)
    return x / torch.where(norm > 0, norm, torch.ones_like(norm))


def alignment(x: np.ndarray | Tensor, y: np.ndarray | Tensor, alpha: float = 2.0) -> float:
    """Mean over rows of ``||x_i - y_i||_2 ** alpha`` (inputs already normalised)."""
    d = torch.linalg.vector_norm(_float64(x) - _float64(y), dim=1)
    return float(torch.mean(d**alpha))


def uniformity(x: np.ndarray | Tensor, t: float = 2.0, block: int = 2048) -> float:
    """``log`` of the mean of ``exp(-t ||x_i - x_j||^2)`` over pairs ``i < j`` (``torch.pdist``).

    Computed block by block from the Gram matrix in float64 on ``x``'s device, so memory stays
    ``O(block * N)`` and a GPU's vectors are never copied; one host read at the end.
    """
    x = _float64(x)
    n = len(x)
    if n < 2:
        return float("nan")
    sq = torch.einsum("ij,ij->i", x, x)
    total = x.new_zeros(())
    for start in range(0, n, block):
        stop = min(start + block, n)
        # pairs j > i only: row r is sentence start + r and column c sentence start + 1 + c
        # (no earlier sentence pairs with this block), so j > i is c >= r: the upper triangle
        cols = x[start + 1 :]
        d2 = torch.addmm(sq[start:stop, None] + sq[None, start + 1 :], x[start:stop], cols.T,
                         alpha=-2.0)  # fmt: skip
        e = d2.clamp_(min=0.0).mul_(-t).exp_()
        total = total + e.triu_().sum()
    return float(torch.log(total / (n * (n - 1) / 2)))


def align_uniform(cache: EmbeddingCache, data_dir) -> dict[str, float]:
    """``{"alignment", "uniformity", "n_pairs", "n_sentences"}`` on STS-B dev."""
    pairs = datasets.load_stsb("dev", data_dir)
    positive = pairs.scores > POSITIVE_THRESHOLD
    s1 = [s for s, keep in zip(pairs.sent1, positive, strict=True) if keep]
    s2 = [s for s, keep in zip(pairs.sent2, positive, strict=True) if keep]
    distinct = list(dict.fromkeys(pairs.sent1 + pairs.sent2))
    return {
        "alignment": alignment(l2_normalize(cache.embed(s1)), l2_normalize(cache.embed(s2))),
        "uniformity": uniformity(l2_normalize(cache.embed(distinct))),
        "n_pairs": int(positive.sum()),
        "n_sentences": len(distinct),
    }
