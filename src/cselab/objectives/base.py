"""The objective interface and the part interfaces every training loss in cselab is built from.

An objective is an ``nn.Module`` that receives **embeddings** — never the model — and returns a
dict of named, already-weighted scalar loss terms. The task sums the terms and the trainer logs
every one. Objectives declare the *views* they need (:attr:`Objective.required_views`) and
:mod:`cselab.training.views` produces them:

``"z1"``, ``"z2"``
    the two dropout views of the batch, ``(B, D)``, unnormalised (one forward pass over the
    batch stacked twice, a different dropout mask per row; SimCSE, Gao et al. 2021, Sec. 3).
``"off"``
    the same batch encoded with every dropout switched off (ImSimCSE, Xu et al. 2023, Sec. 3.2).
``"momentum"``
    the batch encoded by the run's momentum encoder (an exponential moving average of the
    encoder's weights, dropout off, no gradient; ESimCSE, Wu et al. 2022, Sec. 3.2); the
    objective declares the encoder's settings in :attr:`Objective.view_settings`
    (:class:`MomentumSettings`).
``"token_logits"``, ``"token_labels"``
    token prediction (MNTP, LLM2Vec, BehnamGhader et al. 2024): the batch's masked copy (made by
    the objective's :meth:`Objective.prepare`), encoded through the language-modelling head;
    ``token_logits`` ``(M, V)`` are the logits at the position **before** each of the ``M``
    masked tokens, ``token_labels`` ``(M,)`` the masked tokens' ids.
``"neg"``
    the given hard negatives of a pair batch, ``(B, K, D)``: the ``K`` negatives of row ``i``
    on row ``i`` (supervised SimCSE, Gao et al. 2021, Sec. 4). For pairs, ``z1`` are the anchors
    and ``z2`` the given positives, both encoded with dropout on.

The InfoNCE family is one class, :class:`~cselab.objectives.infonce.InfoNCE`, assembled from the
parts defined here: a :class:`Score`, :class:`NegativeSource` parts that each add a
:class:`NegativeBlock` of columns, :class:`ViewTransform` parts that derive views, and
:class:`AuxiliaryTerm` parts added as separate terms. What a part may know besides the embeddings
is in :mod:`cselab.objectives.context` (:class:`~cselab.objectives.context.ObjectiveContext` for
the run, :class:`~cselab.objectives.context.StepCache` for one step). Every part is
:class:`~cselab.objectives.papers.Cited`: it names its papers and describes itself.

Token-level views are the objective's own host work, through two hooks the training layer calls
without knowing the paper: :meth:`Objective.setup` once per task (what it needs of the
tokenizer) and :meth:`Objective.prepare` once per step on the whole local batch, before any
encoding (ESimCSE's repeated positive, MNTP's masked copy: an :class:`InputPart` each).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor, nn

from ..data.inputs import StepInputs
from .context import ObjectiveContext, PrepareContext, StepCache
from .papers import Cited

VIEW_ANCHOR = "z1"
VIEW_POSITIVE = "z2"
VIEW_OFF_DROPOUT = "off"
VIEW_HARD_NEGATIVE = "neg"
VIEW_MOMENTUM = "momentum"
VIEW_TOKEN_LOGITS = "token_logits"
VIEW_TOKEN_LABELS = "token_labels"
BASE_VIEWS = frozenset({VIEW_ANCHOR, VIEW_POSITIVE})

LossTerms = dict[str, Tensor]

#: no settings for any view (the default of :attr:`Objective.view_settings`)
NO_SETTINGS: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True)
class MomentumSettings:
    """The encoder of the ``momentum`` view: ``θ_m ← momentum · θ_m + (1 - momentum) · θ``
    after every optimiser step, starting from ``init`` (``pretrained``: a copy of the encoder;
    ``random``: the architecture's own initialisation)."""

    momentum: float
    init: str = "pretrained"


def upcast(x: Tensor) -> Tensor:
    """``x`` in at least float32: half precision is upcast for the loss; float64 is kept so that
    equivalence tests can run the whole objective in double precision."""
    return x if x.dtype == torch.float64 else x.float()


def total_loss(terms: Mapping[str, Tensor]) -> Tensor:
    """Sum of the named terms (they are already weighted); a single term is itself (no
    ``stack`` and ``sum`` for the common one-term objective)."""
    values = list(terms.values())
    return values[0] if len(values) == 1 else torch.stack(values).sum()


class Objective(Cited, nn.Module):
    """Base class: ``forward(views, ctx) -> {term_name: scalar}``.

    Under data parallelism an objective computes, on each rank, the loss of the *global* batch
    restricted to its local anchors (per-anchor terms are averaged over local anchors; batch-level
    terms are computed on the gathered batch). Summed over ranks this is ``world_size`` times the
    single-process loss, which is exactly what the trainer's gradient averaging divides back out.
    """

    required_views: frozenset[str] = BASE_VIEWS
    #: settings of the views the objective asks for, by view name, where a view has any (the
    #: ``momentum`` view: :class:`MomentumSettings`); the training layer reads them once
    view_settings: Mapping[str, Any] = NO_SETTINGS

    def setup(self, tokenizer: Any) -> None:
        """Once per task, before any step: take what :meth:`prepare` needs of the tokenizer
        (and refuse, as a user error, what it cannot use). The default needs nothing."""

    def prepare(self, inputs: StepInputs, ctx: PrepareContext) -> StepInputs:
        """The step's inputs with the token-level views this objective makes on the host (a
        word-repeated positive, a masked copy), once per step on the whole local batch, before
        any encoding; row ``i`` draws from ``ctx`` and global row ``ctx.offset + i`` only. The
        default adds nothing and returns ``inputs`` itself."""
        return inputs

    def added_tokens(self) -> tuple[int, str]:
        """The most tokens :meth:`prepare` adds to a row, and what adds them (``(0, "")``: none);
        the run checks the model's positions for them once."""
        return 0, ""

    def forward(
        self, views: Mapping[str, Tensor], ctx: ObjectiveContext | None = None
    ) -> LossTerms:  # pragma: no cover - interface
        raise NotImplementedError

    def on_step_end(self, views: Mapping[str, Tensor], ctx: ObjectiveContext) -> None:
        """Called once per training step, after the step's loss was computed on ``views`` (the
        whole local batch, also under GradCache), with the step's context: where an objective
        with state (a queue of earlier batches) takes in this step. The default keeps nothing."""

    def run_state(self) -> dict[str, Tensor]:
        """Tensors an objective keeps across steps (saved in the checkpoint; none by default)."""
        return {}

    def load_run_state(self, state: Mapping[str, Tensor]) -> None:
        """Restore what :meth:`run_state` returned (an empty mapping: a fresh state)."""


class Score(Cited, nn.Module):
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
    """

    sims: Tensor
    log_weight: float | Tensor = 0.0
    mask: Tensor | None = None


@dataclass
class Pair:
    """One direction of the contrastive problem of one step, in L2-normalised features.

    ``anchor[i]`` and ``positive[i]`` are the positive pair of local row ``i``; ``views`` holds
    every normalised view oriented for this direction (``z1`` is the anchor view), for sources that
    need more than the two; ``cache`` is the step's :class:`StepCache`, shared by both directions.
    """

    anchor: Tensor
    positive: Tensor
    views: Mapping[str, Tensor]
    cache: StepCache = field(default_factory=StepCache)


class NegativeSource(Cited, nn.Module):
    """Produces one :class:`NegativeBlock` for a :class:`Pair`.

    A source with state across steps (ESimCSE's queue) overrides :meth:`on_step_end`,
    :meth:`run_state` and :meth:`load_run_state`, which :class:`Objective` hands down.
    """

    required_views: frozenset[str] = BASE_VIEWS
    #: see :attr:`Objective.view_settings`
    view_settings: Mapping[str, Any] = NO_SETTINGS

    def on_step_end(self, views: Mapping[str, Tensor], ctx: ObjectiveContext) -> None:
        """See :meth:`Objective.on_step_end` (default: nothing)."""

    def run_state(self) -> dict[str, Tensor]:
        return {}

    def load_run_state(self, state: Mapping[str, Tensor]) -> None:
        """See :meth:`Objective.load_run_state`."""

    def forward(self, pair: Pair, ctx: ObjectiveContext) -> NegativeBlock:  # pragma: no cover
        raise NotImplementedError


class ViewTransform(Cited, nn.Module):
    """Derives extra raw views from the raw views before normalisation."""

    def forward(
        self, views: Mapping[str, Tensor], ctx: ObjectiveContext, cache: StepCache | None = None
    ) -> dict[str, Tensor]:  # pragma: no cover - interface
        raise NotImplementedError


class AuxiliaryTerm(Cited, nn.Module):
    """A weighted, non-InfoNCE term computed from the raw views (e.g. DCL, BarlowTwins)."""

    name: str = "aux"
    required_views: frozenset[str] = BASE_VIEWS

    def forward(
        self, views: Mapping[str, Tensor], ctx: ObjectiveContext, cache: StepCache | None = None
    ) -> Tensor:  # pragma: no cover - interface
        raise NotImplementedError


class InputPart(Cited, nn.Module):
    """A part that makes token-level views on the host (see :meth:`Objective.prepare`); the
    objective that holds it hands :meth:`Objective.setup`, :meth:`Objective.prepare` and
    :meth:`Objective.added_tokens` down to it."""

    def setup(self, tokenizer: Any) -> None:
        """See :meth:`Objective.setup` (default: nothing)."""

    def prepare(self, inputs: StepInputs, ctx: PrepareContext) -> StepInputs:
        """See :meth:`Objective.prepare` (default: ``inputs`` unchanged)."""
        return inputs

    def added_tokens(self) -> tuple[int, str]:
        """See :meth:`Objective.added_tokens`."""
        return 0, ""
