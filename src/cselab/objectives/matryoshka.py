"""Matryoshka Representation Learning (Kusupati et al. 2022): any objective at several prefix
dimensions, so that the first ``d`` coordinates of an embedding are an embedding of their own.

Eq. 1 of the paper trains one network with the sum, over a set ``M`` of nested dimensions, of the
task loss computed on the prefix ``z_{1:m}`` of the representation, each with an importance
weight ``c_m``::

    L_MRL = Σ_{m ∈ M} c_m · L(z_{1:m})

Here ``L`` is whichever cselab objective the rest of the ``objective:`` section describes
(:class:`Matryoshka` wraps it; :func:`cselab.objectives.build_objective` does so when
``objective.matryoshka.dims`` is set). What "the same objective at a prefix" means for each part:

* **Views.** Every view the objective reads (``z1``, ``z2``, ``off``, ``neg``) is cut to its first
  ``d`` coordinates; nothing else changes. Every similarity of the InfoNCE family is a cosine, so
  the contrastive term sees the re-normalised prefix (sentence-transformers' ``MatryoshkaLoss``,
  tested equal); the auxiliary terms (DCL, BarlowTwins) see the raw prefix exactly as they see the
  raw full vector otherwise, so they too act on ``d`` dimensions (DCL's dimension-wise softmax runs
  over ``d`` dimensions, BarlowTwins' cross-correlation is ``d × d``).
* **Random draws are the same step at every dimension.** The task re-seeds the context's
  generator once per step; the wrapper rewinds it to that state before each dimension and asks
  for draws at the full width (:attr:`ObjectiveContext.draw_width
  <cselab.objectives.context.ObjectiveContext>`), so MixCSE's partners are the same at every
  dimension and the Gaussian negatives, the BarlowTwins padding and the noise ablation's noise at
  ``d`` are the prefixes of the full-width draws. A Matryoshka objective is thereby one step's
  objective seen at several widths, not several steps; after the call the generator stands where
  one call of the plain objective leaves it. With no generator (``ctx.generator`` is ``None``:
  the global RNG) each dimension draws afresh.
* **Terms keep their names.** Each named term is summed over the dimensions with the weights
  (``infonce = Σ_d c_d · infonce_d``, ``dcl = Σ_d c_d · dcl_d``), so logs, the divergence check
  and the model card read the same names. No per-dimension term is returned: every returned term
  is part of the loss (:func:`~cselab.objectives.base.total_loss` sums them all).
* **Data parallelism and GradCache** need nothing new: the wrapper is an objective of
  embeddings, each dimension's inner call gathers its own (narrower) views once, and GradCache
  runs the whole wrapped objective once on the batch's views (tested like every objective).

With one dimension equal to the full width and weight 1 this is the inner objective exactly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor, nn

from ..core.datakind import SENTENCES, DataKind
from ..data.inputs import StepInputs
from .assembly import Assembly
from .base import LossTerms, Objective
from .context import ObjectiveContext, PrepareContext
from .papers import Cited, Paper
from .sections.matryoshka import MatryoshkaConfig

MATRYOSHKA = Paper(
    key="kusupati2022matryoshka",
    name="Matryoshka Representation Learning",
    summary="one embedding whose nested prefixes are embeddings of their own: the loss is "
    "summed over several prefix dimensions",
    bibtex="""@inproceedings{kusupati2022matryoshka,
  title     = {Matryoshka Representation Learning},
  author    = {Kusupati, Aditya and Bhatt, Gantavya and Rege, Aniket and Wallingford, Matthew and Sinha, Aditya and Ramanujan, Vivek and Howard-Snyder, William and Chen, Kaifeng and Kakade, Sham and Jain, Prateek and Farhadi, Ali},
  booktitle = {Advances in Neural Information Processing Systems (NeurIPS)},
  volume    = {35},
  year      = {2022}
}""",
)


class MatryoshkaPrefixes(Cited, nn.Module):
    """The prefix dimensions ``d`` and weights ``c_d`` of Eq. 1, and the cut of views to a prefix.

    The part of :class:`Matryoshka` that names the paper and describes it (registered after the
    wrapped objective, so the card lists the wrapped objective's papers first).
    """

    papers = (MATRYOSHKA,)
    tags = ("matryoshka",)

    def __init__(self, dims: Sequence[int], weights: Sequence[float] | None = None) -> None:
        super().__init__()
        self.dims = [int(d) for d in dims]
        self.weights = [float(w) for w in weights] if weights is not None else [1.0] * len(dims)
        assert self.dims and len(self.weights) == len(self.dims), "validated by the config"

    @staticmethod
    def cut(views: Mapping[str, Tensor], dim: int) -> dict[str, Tensor]:
        """Every view at its first ``dim`` coordinates (the last axis; ``neg`` is ``(B, K, D)``)."""
        for name, view in views.items():
            if view.shape[-1] < dim:
                raise ValueError(
                    f"Matryoshka dimension {dim} exceeds the width {view.shape[-1]} of view "
                    f"{name!r} (objective.matryoshka.dims must not exceed the encoder's width)"
                )
        return {name: view[..., :dim] for name, view in views.items()}

    def describe(self, kind: DataKind = SENTENCES) -> str:
        dims = ", ".join(str(d) for d in self.dims)
        if all(w == 1.0 for w in self.weights):
            weights = "equal weights"
        else:
            weights = "weights " + ", ".join(f"{w:g}" for w in self.weights)
        return (
            "**Matryoshka Representation Learning** (Kusupati et al. 2022, Eq. 1): the loss "
            f"above is computed on the first d = {dims} coordinates of every embedding and "
            f"summed with {weights}, so the embedding can be truncated to any of these "
            "dimensions (and re-normalised) at inference."
        )

    def extra_repr(self) -> str:
        return f"dims={self.dims}, weights={self.weights}"


class Matryoshka(Objective):
    """Any objective summed over prefix dimensions (Kusupati et al. 2022, Eq. 1).

    For each ``d`` of ``dims`` with weight ``c_d``, the inner objective is called on every view
    cut to its first ``d`` coordinates with the same context, and each of its named terms is
    summed over the dimensions with the weights. The rules of each part at a prefix (random draws,
    auxiliary terms, data parallelism) are in the module docstring.

    Args:
        inner: the objective to wrap (an :class:`~cselab.objectives.infonce.InfoNCE` as
            :func:`~cselab.objectives.build_objective` builds it, or any
            :class:`~cselab.objectives.base.Objective`).
        dims: the prefix dimensions, e.g. ``[384, 256, 128, 64]``, each at most the views' width.
        weights: ``c_d``, one per dimension (default: 1 each, the paper's setting).

    Inputs:
        the inner objective's views (:attr:`required_views`), each ``(..., D)`` with ``D`` at least
        ``max(dims)``.

    References:
        - Kusupati et al. 2022, "Matryoshka Representation Learning", NeurIPS 2022, Eq. 1.
        - sentence-transformers' ``MatryoshkaLoss`` (``MatryoshkaLoss(model,
          MultipleNegativesRankingLoss(model, scale=1/τ), dims)`` equals this wrapper around
          supervised SimCSE's InfoNCE; tested).

    Example::

        >>> import torch
        >>> from cselab.objectives import InfoNCE
        >>> loss = Matryoshka(InfoNCE(0.05), dims=[16, 8], weights=[1.0, 0.5])
        >>> terms = loss({"z1": torch.randn(4, 16), "z2": torch.randn(4, 16)})
        >>> sorted(terms)
        ['infonce']
    """

    def __init__(
        self, inner: Objective, dims: Sequence[int], weights: Sequence[float] | None = None
    ) -> None:
        super().__init__()
        self.inner = inner
        self.prefixes = MatryoshkaPrefixes(dims, weights)
        self.required_views = inner.required_views
        # What the training layer asks of an objective with state or token-level views
        # (ESimCSE's parts) is the inner objective's: the wrapper changes widths, not steps.
        self.view_settings = inner.view_settings

    def setup(self, tokenizer: Any) -> None:
        self.inner.setup(tokenizer)

    def prepare(self, inputs: StepInputs, ctx: PrepareContext) -> StepInputs:
        return self.inner.prepare(inputs, ctx)

    def added_tokens(self) -> tuple[int, str]:
        return self.inner.added_tokens()

    def on_step_end(self, views: Mapping[str, Tensor], ctx: ObjectiveContext) -> None:
        self.inner.on_step_end(views, ctx)

    def run_state(self) -> dict[str, Tensor]:
        return self.inner.run_state()

    def load_run_state(self, state: Mapping[str, Tensor]) -> None:
        self.inner.load_run_state(state)

    def forward(
        self, views: Mapping[str, Tensor], ctx: ObjectiveContext | None = None
    ) -> LossTerms:
        ctx = ctx or ObjectiveContext()
        width = max(v.shape[-1] for v in views.values())
        at_prefix = dataclasses.replace(ctx, draw_width=width)
        gen = ctx.generator
        start = gen.get_state() if gen is not None else None
        total: LossTerms = {}
        for dim, weight in zip(self.prefixes.dims, self.prefixes.weights, strict=True):
            if gen is not None:
                gen.set_state(start)  # the same step's draws at every dimension
            terms = self.inner(self.prefixes.cut(views, dim), at_prefix)
            for name, term in terms.items():
                term = term if weight == 1.0 else weight * term
                total[name] = total[name] + term if name in total else term
        return total


def build(section: MatryoshkaConfig, parts: Assembly) -> None:
    """``objective.matryoshka``: wraps whatever the other keys assembled."""
    if section.enabled:
        parts.wrappers.append(
            lambda objective: Matryoshka(objective, section.dims, section.weights)
        )
