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

from . import datasets
from .embed import EmbeddingCache

POSITIVE_THRESHOLD = 4.0


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero)."""
    x = np.asarray(x, dtype=np.float64)
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norm > 0, norm, 1.0)


def alignment(x: np.ndarray, y: np.ndarray, alpha: float = 2.0) -> float:
    """Mean over rows of ``||x_i - y_i||_2 ** alpha`` (inputs already normalised)."""
    d = np.linalg.norm(np.asarray(x, np.float64) - np.asarray(y, np.float64), axis=1)
    return float(np.mean(d**alpha))


def uniformity(x: np.ndarray, t: float = 2.0, block: int = 2048) -> float:
    """``log`` of the mean of ``exp(-t ||x_i - x_j||^2)`` over pairs ``i < j`` (``torch.pdist``).

    Computed block by block from the Gram matrix, so memory stays ``O(block * N)``.
    """
    x = np.asarray(x, dtype=np.float64)
    n = len(x)
    if n < 2:
        return float("nan")
    sq = np.einsum("ij,ij->i", x, x)
    total = 0.0
    for start in range(0, n, block):
        stop = min(start + block, n)
        d2 = sq[start:stop, None] + sq[None, :] - 2.0 * (x[start:stop] @ x.T)
        np.maximum(d2, 0.0, out=d2)
        # keep j > i only: within the block, mask the lower triangle and diagonal
        cols = np.arange(n)[None, :]
        rows = np.arange(start, stop)[:, None]
        total += float(np.exp(-t * d2)[cols > rows].sum())
    return float(np.log(total / (n * (n - 1) / 2)))


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
