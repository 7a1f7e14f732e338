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

from ..core.datakind import SENTENCES, DataKind
from .assembly import Assembly
from .base import VIEW_ANCHOR, VIEW_POSITIVE, ViewTransform
from .context import ObjectiveContext, StepCache
from .off_dropout import IMSIMCSE
from .sections.noise import NoiseConfig
from .spaces import NOISY_SPACE, VIEW_ANCHOR_NOISY, VIEW_POSITIVE_NOISY


class AdditiveNoise(ViewTransform):
    """Adds ``N(0, variance)`` noise to the raw ``z1``/``z2``, producing ``z1+noise``/``z2+noise``.

    The noise is constant (no gradient); gradients flow to the embeddings unchanged. Draws use
    ``ctx.generator`` when given, else the global RNG; view 1's noise is drawn before view 2's.

    Args:
        variance: of every coordinate's noise (paper: 0.1).
        side: which similarities use the noisy views: ``positive``, ``negative`` or ``both``
            (:func:`~cselab.objectives.build_objective` wires the objective by
            :attr:`on_positive` and :attr:`on_negatives`).
    """

    papers = (IMSIMCSE,)
    tags = ("embedding-noise",)

    def __init__(
        self, variance: float = NoiseConfig.variance, side: str = NoiseConfig.side
    ) -> None:
        super().__init__()
        self.variance = float(variance)
        self.side = side

    @property
    def on_positive(self) -> bool:
        """Whether the positive pair is scored on the noisy views."""
        return self.side in ("positive", "both")

    @property
    def on_negatives(self) -> bool:
        """Whether the negatives are scored on the noisy views."""
        return self.side in ("negative", "both")

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

    def describe(self, kind: DataKind = SENTENCES) -> str:
        return (
            f"**Embedding noise** (ImSimCSE Table 1 ablation): N(0, {self.variance:g}) added to "
            f"the embeddings on the {self.side} side."
        )

    def extra_repr(self) -> str:
        return f"variance={self.variance}, side={self.side}"


def build(section: NoiseConfig, parts: Assembly) -> None:
    """``objective.noise``: the noise transform; noisy negatives score in the noisy space, a
    noisy positive compares the noisy views."""
    if not section.enabled:
        return
    noise = AdditiveNoise(section.variance, section.side)
    parts.transforms.append(noise)
    if noise.on_negatives:
        parts.space = NOISY_SPACE
    if noise.on_positive:
        parts.positive_views = (VIEW_ANCHOR_NOISY, VIEW_POSITIVE_NOISY)
