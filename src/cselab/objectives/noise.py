"""ImSimCSE's dropout-noise ablation (Xu et al. 2023, Sec. 3.1, Table 1, "+Noise" rows).

``z^{+} = f(x; ξ) + g`` with ``g ~ N(0, 0.1)`` (variance 0.1) drawn independently for each raw
embedding of each view. "Pos +Noise" replaces the positive pair ``s(z¹_i, z²_i)`` by
``s(z¹_i + g¹_i, z²_i + g²_i)``; "Neg +Noise" replaces the negatives ``s(z¹_i, z²_j)`` by
``s(z¹_i + g¹_i, z²_j + g²_j)``; the other side stays clean. With both sides on, the same
perturbed embeddings serve both.

The "-Noise" rows (averages of ``K = 10`` dropout samples) need ``K`` extra forward passes per
view; they are not offered (the trainer computes only the ``z1``, ``z2`` and ``off`` views).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from torch import Tensor

from .base import VIEW_ANCHOR, VIEW_POSITIVE, ViewTransform
from .context import ObjectiveContext, StepCache
from .spaces import VIEW_ANCHOR_NOISY, VIEW_POSITIVE_NOISY


class AdditiveNoise(ViewTransform):
    """Adds ``N(0, variance)`` noise to the raw ``z1``/``z2``, producing ``z1+noise``/``z2+noise``.

    The noise is constant (no gradient); gradients flow to the embeddings unchanged. Draws use
    ``ctx.generator`` when given, else the global RNG; view 1's noise is drawn before view 2's.
    """

    def __init__(self, variance: float = 0.1) -> None:
        super().__init__()
        self.variance = float(variance)

    def _noise(self, like: Tensor, ctx: ObjectiveContext) -> Tensor:
        # Drawn for the global batch and sliced to this rank's rows, so that the noise of a
        # sentence does not depend on the number of ranks.
        n = ctx.global_rows(like)
        g = ctx.normal(n, like.shape[1], like, std=math.sqrt(self.variance))
        return g[ctx.offset : ctx.offset + like.shape[0]]

    def forward(
        self, views: Mapping[str, Tensor], ctx: ObjectiveContext, cache: StepCache | None = None
    ) -> dict[str, Tensor]:
        z1, z2 = views[VIEW_ANCHOR], views[VIEW_POSITIVE]
        return {
            VIEW_ANCHOR_NOISY: z1 + self._noise(z1, ctx),
            VIEW_POSITIVE_NOISY: z2 + self._noise(z2, ctx),
        }

    def extra_repr(self) -> str:
        return f"variance={self.variance}"
