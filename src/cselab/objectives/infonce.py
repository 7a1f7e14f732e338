"""InfoNCE, the one contrastive loss of cselab: unsupervised SimCSE and every variant of it.

With default parts this is SimCSE's objective (Gao et al. 2021, Eq. 1)::

    l_i = -log( e^{sim(h_i, h_i')/τ} / Σ_j e^{sim(h_i, h_j')/τ} )

``sim`` the cosine similarity, ``h_i, h_i'`` the two dropout views of sentence ``i`` and the sum
over the (global) batch. The papers' variants are parts plugged into the same class (assembled
from a config by :func:`cselab.objectives.build_objective`):

1. The **positive column** is ``score.positive(s(z¹_i, z²_i))`` — the two dropout views (with the
   noise ablation on the positive side: the noise-perturbed views, ``positive_views``).
2. Every **negative column** comes from a :class:`~cselab.objectives.base.NegativeSource` scored
   in one negative space (:mod:`cselab.objectives.spaces`): in-batch (this module), off-dropout
   (ImSimCSE Eq. 3), Gaussian (GS-InfoNCE Eq. 5), mixed (MixCSE).
3. The **score** (plain, or Focal-InfoNCE's Eq. 2) is applied to every column, then the
   temperature **once** (:meth:`InfoNCE.anchor_loss`), then each block's log-weight (GS's
   ``log λ``, off-dropout's ``log m``), then the masks (``-inf``). Parts never see τ.
4. **Auxiliary terms** (DCL, BarlowTwins) see the raw, unperturbed ``z¹``/``z²`` and are added
   with their own weight as separate named terms.
5. ``symmetric``: the construction is repeated with the views' roles exchanged (``z¹`` ↔ ``z²``,
   including their noisy versions; ``off`` is shared) and the two losses averaged (MixCSE's
   "both directions"). Both directions share the step's gathers and random draws
   (:class:`~cselab.objectives.context.StepCache`).

Extension goes through parts or ``super().forward()``, never a second loss body.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.datakind import SENTENCES, DataKind
from ..data.inputs import StepInputs
from .base import (
    VIEW_ANCHOR,
    VIEW_POSITIVE,
    AuxiliaryTerm,
    InputPart,
    LossTerms,
    NegativeBlock,
    NegativeSource,
    Objective,
    Pair,
    Score,
    ViewTransform,
    upcast,
)
from .config import ObjectiveConfig
from .context import ObjectiveContext, PrepareContext, StepCache, constant
from .papers import Paper
from .spaces import DERIVED_VIEWS, DROPOUT_SPACE, SWAPPED_NAMES, NegativeSpace

SIMCSE = Paper(
    key="gao2021simcse",
    name="SimCSE",
    summary="contrastive learning of sentence embeddings with dropout as the only augmentation "
    "(unsupervised), or on given pairs with hard negatives (supervised)",
    bibtex="""@inproceedings{gao2021simcse,
  title     = {{SimCSE}: Simple Contrastive Learning of Sentence Embeddings},
  author    = {Gao, Tianyu and Yao, Xingcheng and Chen, Danqi},
  booktitle = {Proceedings of the 2021 Conference on Empirical Methods in Natural Language Processing (EMNLP)},
  year      = {2021}
}""",
)


def own_column_mask(sims: Tensor, offset: int) -> Tensor:
    """``(B, N)`` mask that is ``True`` at column ``offset + i`` of row ``i``; made once per
    shape, offset and device (:func:`~cselab.objectives.context.constant`)."""
    (b, n), device = sims.shape, sims.device

    def build() -> Tensor:
        rows = torch.arange(b, device=device)
        mask = torch.zeros(b, n, dtype=torch.bool, device=device)
        mask[rows, rows + offset] = True
        return mask

    return constant(("own_column_mask", b, n, offset), device, build)


class InBatchNegatives(NegativeSource):
    """In-batch negatives of one negative space, optionally weighted (SimCSE Eq. 1).

    Column ``k`` of anchor ``i`` is ``s(a_i, c_k)`` for every candidate ``c_k`` of the global
    batch except the anchor's own sentence, which is masked (at ``ctx.offset + i``) because it is
    the positive column. In the ``dropout`` space the candidates are the other sentences' second
    views, SimCSE's negatives.

    Args:
        space: the negative space (:data:`~cselab.objectives.spaces.DROPOUT_SPACE` for SimCSE).
        weight: factor on these columns in the denominator (ImSimCSE's ``m``), ``> 0``.
    """

    def __init__(self, space: NegativeSpace = DROPOUT_SPACE, weight: float = 1.0) -> None:
        super().__init__()
        self.space = space
        self.weight = float(weight)
        self.required_views = space.required_views

    def forward(self, pair: Pair, ctx: ObjectiveContext) -> NegativeBlock:
        anchor = self.space.anchor_of(pair)
        candidates = pair.cache.gather(ctx, self.space.local_candidates(pair))
        sims = anchor @ candidates.T
        log_weight = 0.0 if self.weight == 1.0 else math.log(self.weight)
        return NegativeBlock(sims, log_weight, own_column_mask(sims, ctx.offset))

    def extra_repr(self) -> str:
        return f"space={self.space.name}, weight={self.weight}"


class InfoNCE(Objective):
    """InfoNCE with pluggable score, negative sources, view transforms and auxiliary terms.

    For local anchor ``i`` with energies ``e_p = score.positive(s(h_i, h_i'))`` and negative
    energies ``e_k`` with weights ``w_k``::

        l_i = -log( e^{e_p/τ} / ( e^{e_p/τ} + Σ_k w_k e^{e_k/τ} ) )

    and the loss is the mean over anchors. With the default parts (plain score,
    :class:`InBatchNegatives`) this is exactly SimCSE's Eq. 1, i.e. the cross-entropy over the
    ``B × B`` similarity matrix divided by τ.

    Args:
        temperature: τ > 0 (default: ``ObjectiveConfig.temperature``, SimCSE's 0.05).
        negatives: negative sources; their columns are concatenated (default: in-batch).
        score: energy function (default: the plain cosine).
        auxiliary: weighted extra terms, each reported under its own name.
        symmetric: also use the second view as anchor and average the two directions.
        transforms: derive extra raw views before normalisation (the noise ablation).
        positive_views: the two view names whose similarity is the positive column.
        name: the name of the contrastive loss term.
        inputs: the parts that make token-level views on the host (ESimCSE's word repetition:
            ``z2`` is then encoded from repeated tokens); :meth:`prepare` runs them in order.

    Inputs:
        ``views["z1"]``, ``views["z2"]``: ``(B, D)`` embeddings, plus whatever the parts require
        (:attr:`required_views`).

    Example::

        >>> loss = InfoNCE(0.05)({"z1": torch.randn(8, 16), "z2": torch.randn(8, 16)})
        >>> sorted(loss)
        ['infonce']
    """

    papers = (SIMCSE,)
    tags = ("simcse",)

    def __init__(
        self,
        temperature: float = ObjectiveConfig.temperature,
        negatives: Sequence[NegativeSource] | None = None,
        score: Score | None = None,
        auxiliary: Sequence[AuxiliaryTerm] = (),
        symmetric: bool = False,
        transforms: Sequence[ViewTransform] = (),
        positive_views: tuple[str, str] = (VIEW_ANCHOR, VIEW_POSITIVE),
        name: str = "infonce",
        inputs: Sequence[InputPart] = (),
    ) -> None:
        super().__init__()
        negatives = list(negatives) if negatives is not None else [InBatchNegatives()]
        assert temperature > 0 and negatives, "validated by ObjectiveConfig.validate"
        self.temperature = float(temperature)
        self.negatives = nn.ModuleList(negatives)
        self.score = score if score is not None else Score()
        self.auxiliary = nn.ModuleList(auxiliary)
        self.symmetric = symmetric
        self.transforms = nn.ModuleList(transforms)
        self.positive_views = positive_views
        self.name = name
        self.inputs = nn.ModuleList(inputs)
        views = set(positive_views)
        settings: dict[str, Any] = {}
        for part in [*negatives, *auxiliary]:
            views |= set(part.required_views)
            settings.update(getattr(part, "view_settings", {}))
        self.required_views = frozenset(views - DERIVED_VIEWS)
        self.view_settings = settings

    def setup(self, tokenizer: Any) -> None:
        for part in self.inputs:
            part.setup(tokenizer)

    def prepare(self, inputs: StepInputs, ctx: PrepareContext) -> StepInputs:
        for part in self.inputs:
            inputs = part.prepare(inputs, ctx)
        return inputs

    def added_tokens(self) -> tuple[int, str]:
        return max((part.added_tokens() for part in self.inputs), default=(0, ""))

    def describe(self, kind: DataKind = SENTENCES) -> str:
        sym = "averaged over both directions" if self.symmetric else "with the first view as anchor"
        if kind.pairs:
            return (
                "**InfoNCE** over given (anchor, positive) pairs (supervised SimCSE, Gao et al. "
                "2021, Eq. 5): anchors and positives are encoded with dropout and the other "
                f"positives of the batch are negatives; temperature τ = {self.temperature:g}, {sym}."
            )
        return (
            "**InfoNCE** over in-batch negatives (unsupervised SimCSE, Gao et al. 2021, Eq. 1): "
            "each sentence is encoded twice with different dropout masks and the two views form "
            f"the positive pair; temperature τ = {self.temperature:g}, {sym}."
        )

    def on_step_end(self, views: Mapping[str, Tensor], ctx: ObjectiveContext) -> None:
        for source in self.negatives:
            source.on_step_end(views, ctx)

    def run_state(self) -> dict[str, Tensor]:
        return {
            f"negatives.{i}.{k}": v
            for i, source in enumerate(self.negatives)
            for k, v in source.run_state().items()
        }

    def load_run_state(self, state: Mapping[str, Tensor]) -> None:
        for i, source in enumerate(self.negatives):
            prefix = f"negatives.{i}."
            source.load_run_state(
                {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}
            )

    def anchor_loss(self, pair: Pair, ctx: ObjectiveContext) -> Tensor:
        """Per-anchor loss ``(B,)`` for one direction."""
        pos = (pair.anchor * pair.positive).sum(-1, keepdim=True)
        columns = [self.score.positive(pos) / self.temperature]
        for source in self.negatives:
            block = source(pair, ctx)
            # The one place the temperature is applied; log-weights and masks come after it.
            logits = self.score.negative(block.sims) / self.temperature
            if not (isinstance(block.log_weight, float) and block.log_weight == 0.0):
                logits = logits + block.log_weight
            if block.mask is not None:
                logits = logits.masked_fill(block.mask, float("-inf"))
            columns.append(logits)
        logits = torch.cat(columns, dim=1)
        return torch.logsumexp(logits, dim=1) - logits[:, 0]

    def _pair(self, normed: Mapping[str, Tensor], cache: StepCache) -> Pair:
        a, p = self.positive_views
        return Pair(normed[a], normed[p], normed, cache)

    def forward(
        self, views: Mapping[str, Tensor], ctx: ObjectiveContext | None = None
    ) -> LossTerms:
        ctx = ctx or ObjectiveContext()
        cache = StepCache()  # this step's gathers and draws, shared by every part
        raw = dict(views)
        for transform in self.transforms:
            raw.update(transform(raw, ctx, cache))
        normed = {k: F.normalize(upcast(v), dim=-1) for k, v in raw.items()}
        loss = self.anchor_loss(self._pair(normed, cache), ctx).mean()
        if self.symmetric:
            swapped = {SWAPPED_NAMES.get(k, k): v for k, v in normed.items()}
            loss = 0.5 * (loss + self.anchor_loss(self._pair(swapped, cache), ctx).mean())
        terms: LossTerms = {self.name: loss}
        for term in self.auxiliary:
            terms[term.name] = term(views, ctx, cache)
        return terms
