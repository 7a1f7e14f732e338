"""Unsupervised SimCSE's InfoNCE (Gao et al. 2021, Eq. 1).

``l_i = -log( e^{sim(h_i, h_i')/τ} / Σ_j e^{sim(h_i, h_j')/τ} )`` with ``sim`` the cosine
similarity, ``h_i, h_i'`` the two dropout views of sentence ``i`` and the sum over the (global)
batch.
"""

from __future__ import annotations

from .base import ContrastiveObjective, InBatchNegatives


def infonce(temperature: float = 0.05, symmetric: bool = False) -> ContrastiveObjective:
    """SimCSE's objective: in-batch negatives, plain cosine score.

    Example::

        >>> import torch
        >>> loss = infonce(0.05)({"z1": torch.randn(4, 8), "z2": torch.randn(4, 8)})["infonce"]
    """
    return ContrastiveObjective(temperature, [InBatchNegatives()], symmetric=symmetric)
