"""Given hard negatives: supervised SimCSE's third column (Gao et al. 2021, Sec. 4, Eq. 5).

With pairs ``(x_i, x_i⁺)`` and a hard negative ``x_i⁻`` per pair (SNLI+MNLI: the contradiction
hypothesis), the objective of each anchor ``h_i`` over a batch of ``N`` triplets is (Eq. 5)::

    l_i = -log( e^{s(h_i,h_i⁺)/τ} / Σ_j ( e^{s(h_i,h_j⁺)/τ} + e^{s(h_i,h_j⁻)/τ} ) )

i.e. every hard negative of the (global) batch is a column for every anchor, SimCSE's
``N × (N + N)`` similarity matrix; the in-batch part is unchanged
(:class:`~cselab.objectives.infonce.InBatchNegatives` over the other positives). With ``K``
negatives per pair the block is ``N × N·K``.

The authors' code adds a ``hard_negative_weight`` ``w`` to the logit of each anchor's **own**
hard negative only (the diagonal of the hard-negative block; 0 elsewhere), after the
temperature: that column enters the denominator as ``e^w · e^{s(h_i,h_i⁻)/τ}``. ``w = 0``, the
paper's setting, is Eq. 5. Here ``w`` is the block's log-weight on the own columns.

The block is scored like every other negative column: with Focal-InfoNCE the energy is
``s(s+m)``, so a hard negative above ``s = 1 - m`` gains energy (see ``docs/objectives.md``).
"""

from __future__ import annotations

import torch

from ..core.datakind import SENTENCES, DataKind
from .assembly import Assembly
from .base import (
    VIEW_ANCHOR,
    VIEW_HARD_NEGATIVE,
    VIEW_POSITIVE,
    NegativeBlock,
    NegativeSource,
    Pair,
)
from .config import ObjectiveConfig
from .context import ObjectiveContext, constant
from .infonce import SIMCSE
from .spaces import DROPOUT_SPACE, NegativeSpace


class HardNegatives(NegativeSource):
    """Every gathered hard negative as a column for every anchor; ``weight`` on the own ones.

    Args:
        weight: ``w``, the log-weight added to the logits of the anchor's own hard negative(s)
            (SimCSE's ``hard_negative_weight``; 0 = Eq. 5).
        space: whose representation of the anchor is compared with the hard negatives (the
            hard negatives themselves have one view, ``neg``).

    Inputs:
        ``pair.views["neg"]``: ``(B, K, D)`` normalised hard negatives of this rank's rows.
    """

    required_views = frozenset({VIEW_ANCHOR, VIEW_POSITIVE, VIEW_HARD_NEGATIVE})
    papers = (SIMCSE,)

    def __init__(
        self,
        weight: float = ObjectiveConfig.hard_negative_weight,
        space: NegativeSpace = DROPOUT_SPACE,
    ) -> None:
        super().__init__()
        self.weight = float(weight)
        self.space = space
        self.required_views = space.required_views | {VIEW_HARD_NEGATIVE}

    def forward(self, pair: Pair, ctx: ObjectiveContext) -> NegativeBlock:
        anchor = self.space.anchor_of(pair)
        negatives = pair.cache.gather(ctx, pair.views[VIEW_HARD_NEGATIVE])  # (N, K, D)
        n, k, d = negatives.shape
        # Column j·K + c is the c-th hard negative of sentence j of the global batch.
        sims = anchor @ negatives.reshape(n * k, d).T
        if self.weight == 0.0:
            return NegativeBlock(sims)
        b, offset, device, dtype, w = (
            anchor.shape[0],
            ctx.offset,
            sims.device,
            sims.dtype,
            self.weight,
        )

        def build() -> torch.Tensor:  # the log-weight w on each anchor's own K columns
            rows = torch.arange(b, device=device) + offset
            own = (torch.arange(n * k, device=device) // k).unsqueeze(0) == rows.unsqueeze(1)
            return own.to(dtype) * w

        key = ("hard_negative_weights", b, n, k, offset, dtype, w)
        return NegativeBlock(sims, constant(key, device, build))

    def describe(self, kind: DataKind = SENTENCES) -> str:
        per_pair = f" ({kind.negatives} per pair)" if kind.negatives else ""
        return (
            "**Given hard negatives** (supervised SimCSE, Gao et al. 2021, Eq. 5): every hard "
            f"negative of the batch{per_pair} is a negative of every anchor, with log-weight "
            f"{self.weight:g} on an anchor's own."
        )

    def extra_repr(self) -> str:
        return f"weight={self.weight}, space={self.space.name}"


def build(weight: float, parts: Assembly) -> None:
    """``objective.hard_negative_weight``: data with given hard negatives add their column
    (supervised SimCSE), whatever the weight (0: the paper's setting)."""
    if parts.data is not None and parts.data.hard_negatives:
        parts.negatives.append(HardNegatives(weight, space=parts.space))
