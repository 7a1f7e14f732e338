"""The composable InfoNCE objective behind every paper preset.

Composition rules (also in ``docs/objectives.md``):

1. The **positive column** is always ``score.positive(s(z¹_i, z²_i))`` — the two dropout views
   (with ``noise.side`` positive/both: the noise-perturbed views).
2. Every **negative column** is scored from one *negative space*: the representation that stands
   for the anchor on the negative side and the pool that candidates are drawn from.

   ====================  ==========================  ===================================
   space                 anchor side                 candidate pool
   ====================  ==========================  ===================================
   ``dropout`` (SimCSE)  ``z¹_i``                    ``z²`` of the (global) batch
   ``off`` (ImSimCSE)    ``z^off_i``                 ``z^off`` of the (global) batch
   ``noisy`` (Table 1)   ``z¹_i + g¹``               ``z² + g²``
   ====================  ==========================  ===================================

   In-batch negatives, Gaussian negatives (``s(g_k, ·)``) and mixed negatives (mixes of the
   candidate pool) all use the same space, so e.g. with off-dropout *and* MixCSE the mixes are
   built from off-dropout representations and scored against ``z^off_i``.
3. The **score** (plain or Focal) is applied to every column, then the temperature once, then
   each block's log-weight (GS's ``log λ``, off-dropout's ``log m``), then masks (``-inf``).
4. **Auxiliary terms** (DCL, BarlowTwins) see the raw, unperturbed ``z¹``/``z²`` and are added
   with their own weight as separate named terms.
5. ``symmetric``: the whole construction is repeated with the views' roles exchanged (``z¹`` ↔
   ``z²``, including their noisy versions; ``off`` is shared) and the two losses averaged.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import (
    VIEW_ANCHOR,
    VIEW_OFF_DROPOUT,
    VIEW_POSITIVE,
    AuxiliaryTerm,
    ContrastiveObjective,
    LossTerms,
    NegativeBlock,
    NegativeSource,
    ObjectiveContext,
    Pair,
    Score,
    own_column_mask,
)

VIEW_ANCHOR_NOISY = "z1+noise"
VIEW_POSITIVE_NOISY = "z2+noise"

#: How view names are exchanged when the second view becomes the anchor.
SWAPPED_NAMES = {
    VIEW_ANCHOR: VIEW_POSITIVE,
    VIEW_POSITIVE: VIEW_ANCHOR,
    VIEW_ANCHOR_NOISY: VIEW_POSITIVE_NOISY,
    VIEW_POSITIVE_NOISY: VIEW_ANCHOR_NOISY,
}

#: Marks the per-call copy of the context in which random draws and gathers are cached.
PER_CALL = "cselab.objectives.per_call"

#: Views that objectives produce themselves from others (never asked from the trainer).
DERIVED_VIEWS = frozenset({VIEW_ANCHOR_NOISY, VIEW_POSITIVE_NOISY})


@dataclass(frozen=True)
class NegativeSpace:
    """Which normalised views stand for the anchor and the candidates on the negative side."""

    name: str
    anchor: str
    candidates: str

    @property
    def required_views(self) -> frozenset[str]:
        return frozenset({VIEW_ANCHOR, VIEW_POSITIVE, self.anchor, self.candidates}) - DERIVED_VIEWS

    def anchor_of(self, pair: Pair) -> Tensor:
        return pair.views[self.anchor]

    def local_candidates(self, pair: Pair) -> Tensor:
        return pair.views[self.candidates]


DROPOUT_SPACE = NegativeSpace("dropout", VIEW_ANCHOR, VIEW_POSITIVE)
OFF_DROPOUT_SPACE = NegativeSpace("off", VIEW_OFF_DROPOUT, VIEW_OFF_DROPOUT)
NOISY_SPACE = NegativeSpace("noisy", VIEW_ANCHOR_NOISY, VIEW_POSITIVE_NOISY)


class SpaceNegatives(NegativeSource):
    """In-batch negatives of one :class:`NegativeSpace`, optionally weighted.

    Column ``k`` of anchor ``i`` is ``s(a_i, c_k)`` for every candidate ``c_k`` of the global
    batch except the anchor's own sentence (masked at ``ctx.offset + i``). In the ``dropout``
    space this is exactly :class:`~cselab.objectives.base.InBatchNegatives`.

    Args:
        space: the negative space.
        weight: factor on these columns in the denominator (ImSimCSE's ``m``), ``> 0``.
    """

    def __init__(self, space: NegativeSpace = DROPOUT_SPACE, weight: float = 1.0) -> None:
        super().__init__()
        if not weight > 0:
            raise ValueError(f"negative weight must be > 0, got {weight}")
        self.space = space
        self.weight = float(weight)
        self.required_views = space.required_views

    def forward(self, pair: Pair, ctx: ObjectiveContext) -> NegativeBlock:
        anchor = self.space.anchor_of(pair)
        candidates = gathered(ctx, self.space.local_candidates(pair))
        sims = anchor @ candidates.T
        log_weight = 0.0 if self.weight == 1.0 else math.log(self.weight)
        return NegativeBlock(
            sims=sims,
            log_weight=log_weight,
            mask=own_column_mask(sims, ctx.offset),
            name=f"in_batch[{self.space.name}]",
        )

    def extra_repr(self) -> str:
        return f"space={self.space.name}, weight={self.weight}"


class ViewTransform(nn.Module):
    """Derives extra raw views from the raw views before normalisation."""

    def forward(
        self, views: Mapping[str, Tensor], ctx: ObjectiveContext
    ) -> dict[str, Tensor]:  # pragma: no cover - interface
        raise NotImplementedError


class CompositeObjective(ContrastiveObjective):
    """:class:`ContrastiveObjective` with view transforms and a configurable positive pair.

    Args:
        temperature, negatives, score, auxiliary, symmetric, name: as for
            :class:`ContrastiveObjective`.
        transforms: :class:`ViewTransform` modules ``(raw_views, ctx) -> new views`` run before
            normalisation (e.g. :class:`~cselab.objectives.noise.AdditiveNoise`).
        positive_views: the two view names whose similarity is the positive column
            (``("z1", "z2")``, or the noisy views for the positive-noise ablation).
    """

    def __init__(
        self,
        temperature: float,
        negatives: list[NegativeSource],
        score: Score | None = None,
        auxiliary: list[AuxiliaryTerm] | None = None,
        symmetric: bool = False,
        name: str = "infonce",
        transforms: Sequence[ViewTransform] = (),
        positive_views: tuple[str, str] = (VIEW_ANCHOR, VIEW_POSITIVE),
    ) -> None:
        super().__init__(temperature, negatives, score, auxiliary, symmetric, name)
        self.transforms = nn.ModuleList(transforms)
        self.positive_views = positive_views
        self.required_views = frozenset(self.required_views - DERIVED_VIEWS)

    def _pair(self, normed: Mapping[str, Tensor]) -> Pair:
        a, p = self.positive_views
        return Pair(normed[a], normed[p], normed)

    def forward(
        self, views: Mapping[str, Tensor], ctx: ObjectiveContext | None = None
    ) -> LossTerms:
        # A per-call context: parts cache their random draws in ``extras`` so that both
        # directions of a symmetric loss see the same Gaussian vectors and mixing partners.
        ctx = dataclasses.replace(ctx or ObjectiveContext(), extras={PER_CALL: True})
        raw = dict(views)
        for transform in self.transforms:
            raw.update(transform(raw, ctx))
        normed = {k: F.normalize(upcast(v), dim=-1) for k, v in raw.items()}
        loss = self.anchor_loss(self._pair(normed), ctx).mean()
        if self.symmetric:
            swapped = {SWAPPED_NAMES.get(k, k): v for k, v in normed.items()}
            loss = 0.5 * (loss + self.anchor_loss(self._pair(swapped), ctx).mean())
        terms: LossTerms = {self.name: loss}
        for term in self.auxiliary:
            terms[term.name] = term(views, ctx)
        return terms


def upcast(x: Tensor) -> Tensor:
    """``x`` in at least float32 (half precision is upcast; float64 is kept)."""
    return x if x.dtype == torch.float64 else x.float()


def draw_normal(
    rows: int,
    dim: int,
    ctx: ObjectiveContext,
    like: Tensor,
    mean: float = 0.0,
    std: float = 1.0,
) -> Tensor:
    """``rows × dim`` i.i.d. ``N(mean, std²)`` draws from ``ctx.generator`` (else the global RNG).

    Used for batch-level quantities (Gaussian negatives, BarlowTwins padding): every rank draws
    the full set. The trainer re-seeds ``ctx.generator`` identically on every rank before each
    step, so all ranks see the same vectors and the draws do not depend on the number of ranks.
    The result carries no gradient.
    """
    gen = ctx.generator
    device = gen.device if gen is not None else like.device
    draws = torch.randn(rows, dim, generator=gen, device=device, dtype=torch.float32)
    return (draws * std + mean).to(device=like.device, dtype=like.dtype)


def cached_draw(ctx: ObjectiveContext, key: object, draw: Callable[[], Tensor]) -> Tensor:
    """``draw()`` once per objective call, e.g. shared by both directions.

    Cached in ``ctx.extras`` only when the context is the per-call copy made by
    :meth:`CompositeObjective.forward` (a long-lived context must not keep values across steps).
    """
    if not ctx.extras.get(PER_CALL):
        return draw()
    if key not in ctx.extras:
        ctx.extras[key] = draw()
    return ctx.extras[key]


def gathered(ctx: ObjectiveContext, local: Tensor) -> Tensor:
    """``ctx.gather(local)``, computed once per objective call for each tensor (in-batch and
    mixed negatives of the same space share one all-gather)."""
    return cached_draw(ctx, ("gather", id(local)), lambda: ctx.gather(local))


def local_rows(local: Tensor, ctx: ObjectiveContext) -> Tensor:
    """Global indices ``offset .. offset + B - 1`` of this rank's rows."""
    return torch.arange(local.shape[0], device=local.device) + ctx.offset


def global_batch_size(local: Tensor, ctx: ObjectiveContext) -> int:
    """``N``: the local batch times the number of ranks (the trainer shards evenly)."""
    return local.shape[0] * max(1, ctx.world_size)
