"""The objective interface shared by every training loss in cselab.

An objective is an ``nn.Module`` that receives **embeddings** — never the model — and returns a
dict of named, already-weighted scalar loss terms. The trainer sums the terms, backpropagates the
sum and logs every term. The trainer never imports a specific objective: it asks the objective
which *views* it needs (:attr:`Objective.required_views`) and computes them.

Views
    ``"z1"``, ``"z2"``: the two dropout views of the batch, shape ``(B, D)``, unnormalised (both
    come from one forward pass over the duplicated batch). ``"off"``: the same batch encoded once
    with every dropout switched off (ImSimCSE's off-dropout view). Objectives declare extra view
    names they need; :mod:`cselab.training.views` knows how to produce each.

The InfoNCE family (SimCSE, Focal-InfoNCE, GS-InfoNCE, off-dropout, MixCSE) is one
:class:`ContrastiveObjective` assembled from three kinds of parts:

* a :class:`Score` turning cosine similarities into energies (plain ``s`` or Focal's
  ``s²`` / ``s(s+m)``); the temperature divides the energies in exactly one place,
  :meth:`ContrastiveObjective.anchor_loss`;
* :class:`NegativeSource` parts, each contributing a :class:`NegativeBlock` of candidate columns
  (in-batch, off-dropout, Gaussian, mixed), with an optional log-weight (a multiplicative weight in
  the denominator, e.g. GS-InfoNCE's λ) and a mask of excluded columns;
* :class:`AuxiliaryTerm` parts computed on the views and added with a weight (DCL, BarlowTwins).

Everything distributed goes through :class:`ObjectiveContext`: ``ctx.gather`` concatenates a
tensor over ranks with gradients flowing back to the rank that produced each row, and
``ctx.offset`` is the position of this rank's rows in the gathered batch. With one process the
gather is the identity and the offset is 0.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

VIEW_ANCHOR = "z1"
VIEW_POSITIVE = "z2"
VIEW_OFF_DROPOUT = "off"
BASE_VIEWS = frozenset({VIEW_ANCHOR, VIEW_POSITIVE})

LossTerms = dict[str, Tensor]


def _identity(x: Tensor) -> Tensor:
    return x


@dataclass
class ObjectiveContext:
    """What an objective may know beyond the embeddings.

    Attributes:
        gather: all-gather over ranks along dim 0 that carries gradients back to the producing
            rank (identity for one process). Every objective uses this one helper.
        rank: this process's rank.
        world_size: number of processes.
        offset: index of this rank's first row in the gathered batch.
        generator: optional random generator for generated negatives (``None``: global RNG).
    """

    gather: Callable[[Tensor], Tensor] = _identity
    rank: int = 0
    world_size: int = 1
    offset: int = 0
    generator: torch.Generator | None = None
    extras: dict[str, object] = field(default_factory=dict)


class Objective(nn.Module):
    """Base class: ``forward(views, ctx) -> {term_name: scalar}``.

    Subclasses set :attr:`required_views` and implement :meth:`forward`. Under data parallelism an
    objective computes, on each rank, the loss of the *global* batch restricted to its local
    anchors (per-anchor terms are averaged over local anchors; batch-level terms are computed on the
    gathered batch). Summed over ranks this is ``world_size`` times the single-process loss, which is
    exactly what DDP's gradient averaging divides back out.
    """

    required_views: frozenset[str] = BASE_VIEWS

    def forward(
        self, views: Mapping[str, Tensor], ctx: ObjectiveContext | None = None
    ) -> LossTerms:  # pragma: no cover - interface
        raise NotImplementedError


# --------------------------------------------------------------------------------------------
# Parts of the InfoNCE family
# --------------------------------------------------------------------------------------------


class Score(nn.Module):
    """Maps cosine similarities to energies; the temperature is applied later, once.

    The plain score is the identity (SimCSE Eq. 1). Subclasses change positives and negatives
    separately (Focal-InfoNCE Eq. 2).
    """

    def positive(self, sim: Tensor) -> Tensor:
        return sim

    def negative(self, sim: Tensor) -> Tensor:
        return sim


@dataclass
class NegativeBlock:
    """Candidate columns contributed to each anchor's denominator.

    Attributes:
        sims: ``(B, K)`` cosine similarity of each local anchor to ``K`` candidates.
        log_weight: added to the column logits *after* the temperature, so that a column enters the
            denominator as ``w · e^{score/τ}`` with ``w = exp(log_weight)``; scalar or ``(B, K)``.
        mask: ``(B, K)`` bool, ``True`` marks columns excluded for that anchor (given ``-inf``).
        name: for diagnostics.
    """

    sims: Tensor
    log_weight: float | Tensor = 0.0
    mask: Tensor | None = None
    name: str = "negatives"


@dataclass
class Pair:
    """One direction of a contrastive problem, in L2-normalised features.

    ``anchor[i]`` and ``positive[i]`` are the positive pair of local row ``i``; ``views`` holds all
    normalised views oriented for this direction (``z1`` is the anchor view), for sources that need
    more than the two.
    """

    anchor: Tensor
    positive: Tensor
    views: Mapping[str, Tensor]


class NegativeSource(nn.Module):
    """Produces one :class:`NegativeBlock` for a :class:`Pair`."""

    required_views: frozenset[str] = BASE_VIEWS

    def forward(self, pair: Pair, ctx: ObjectiveContext) -> NegativeBlock:  # pragma: no cover
        raise NotImplementedError


class InBatchNegatives(NegativeSource):
    """SimCSE's in-batch negatives: every other sentence's positive view (Gao et al. 2021, Eq. 1).

    Candidates are the positives of the global batch; the anchor's own positive is masked here
    because it is scored separately as the positive column.
    """

    def forward(self, pair: Pair, ctx: ObjectiveContext) -> NegativeBlock:
        candidates = ctx.gather(pair.positive)
        sims = pair.anchor @ candidates.T
        return NegativeBlock(sims=sims, mask=own_column_mask(sims, ctx.offset), name="in_batch")


def own_column_mask(sims: Tensor, offset: int) -> Tensor:
    """``(B, N)`` mask that is ``True`` at column ``offset + i`` of row ``i``."""
    rows = torch.arange(sims.shape[0], device=sims.device)
    mask = torch.zeros_like(sims, dtype=torch.bool)
    mask[rows, rows + offset] = True
    return mask


class AuxiliaryTerm(nn.Module):
    """A weighted, non-InfoNCE term computed from the views (e.g. DCL, BarlowTwins)."""

    name: str = "aux"
    required_views: frozenset[str] = BASE_VIEWS

    def forward(
        self, views: Mapping[str, Tensor], ctx: ObjectiveContext
    ) -> Tensor:  # pragma: no cover
        raise NotImplementedError


class ContrastiveObjective(Objective):
    """InfoNCE with pluggable score, negative sources and auxiliary terms.

    For local anchor ``i`` with energies ``e_p = score.positive(s(h_i, h_i'))`` and negative
    energies ``e_k`` with weights ``w_k``::

        l_i = -log( e^{e_p/τ} / ( e^{e_p/τ} + Σ_k w_k e^{e_k/τ} ) )

    and the loss is the mean over anchors. With the plain score and :class:`InBatchNegatives` this
    is exactly SimCSE's Eq. 1.

    Args:
        temperature: τ > 0 (SimCSE: 0.05).
        negatives: negative sources; their columns are concatenated.
        score: energy function; :class:`Score` (identity) by default.
        auxiliary: weighted extra terms, each reported under its own name.
        symmetric: also use the second view as anchor (the loss of both directions is averaged),
            as MixCSE does; SimCSE is one-directional.
        name: the name of the contrastive loss term.

    Inputs:
        ``views["z1"]``, ``views["z2"]``: ``(B, D)`` embeddings, plus whatever the parts require.

    Example::

        >>> obj = ContrastiveObjective(0.05, [InBatchNegatives()])
        >>> z1, z2 = torch.randn(8, 16), torch.randn(8, 16)
        >>> sorted(obj({"z1": z1, "z2": z2}))
        ['infonce']
    """

    def __init__(
        self,
        temperature: float,
        negatives: list[NegativeSource],
        score: Score | None = None,
        auxiliary: list[AuxiliaryTerm] | None = None,
        symmetric: bool = False,
        name: str = "infonce",
    ) -> None:
        super().__init__()
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if not negatives:
            raise ValueError("a contrastive objective needs at least one negative source")
        self.temperature = float(temperature)
        self.negatives = nn.ModuleList(negatives)
        self.score = score if score is not None else Score()
        self.auxiliary = nn.ModuleList(auxiliary or [])
        self.symmetric = symmetric
        self.name = name
        views = set(BASE_VIEWS)
        for part in [*negatives, *(auxiliary or [])]:
            views |= set(part.required_views)
        self.required_views = frozenset(views)

    def anchor_loss(self, pair: Pair, ctx: ObjectiveContext) -> Tensor:
        """Per-anchor loss ``(B,)`` for one direction."""
        pos = (pair.anchor * pair.positive).sum(-1, keepdim=True)
        energies = [self.score.positive(pos)]
        log_weights: list[Tensor | float] = [0.0]
        masks: list[Tensor | None] = [None]
        for source in self.negatives:
            block = source(pair, ctx)
            energies.append(self.score.negative(block.sims))
            log_weights.append(block.log_weight)
            masks.append(block.mask)
        # The one place the temperature is applied.
        columns = []
        for e, lw, m in zip(energies, log_weights, masks, strict=True):
            logits = e / self.temperature
            if not (isinstance(lw, float) and lw == 0.0):
                logits = logits + lw
            if m is not None:
                logits = logits.masked_fill(m, float("-inf"))
            columns.append(logits)
        logits = torch.cat(columns, dim=1)
        return torch.logsumexp(logits, dim=1) - logits[:, 0]

    def forward(
        self, views: Mapping[str, Tensor], ctx: ObjectiveContext | None = None
    ) -> LossTerms:
        ctx = ctx or ObjectiveContext()
        # Half precision is upcast; float64 is kept (like composite.upcast), so that the
        # scale-out equivalence tests can run in double precision.
        normed = {
            k: F.normalize(v if v.dtype == torch.float64 else v.float(), dim=-1)
            for k, v in views.items()
        }
        pair = Pair(normed[VIEW_ANCHOR], normed[VIEW_POSITIVE], normed)
        loss = self.anchor_loss(pair, ctx).mean()
        if self.symmetric:
            swapped = dict(normed)
            swapped[VIEW_ANCHOR], swapped[VIEW_POSITIVE] = (
                normed[VIEW_POSITIVE],
                normed[VIEW_ANCHOR],
            )
            back = Pair(swapped[VIEW_ANCHOR], swapped[VIEW_POSITIVE], swapped)
            loss = 0.5 * (loss + self.anchor_loss(back, ctx).mean())
        terms: LossTerms = {self.name: loss}
        for term in self.auxiliary:
            terms[term.name] = term(views, ctx)
        return terms


def total_loss(terms: Mapping[str, Tensor]) -> Tensor:
    """Sum of the named terms (they are already weighted)."""
    return torch.stack([t for t in terms.values()]).sum()
