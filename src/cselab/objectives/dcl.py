"""ImSimCSE's dimension-wise contrastive learning, DCL (Xu et al. 2023, Sec. 4.3, Eq. 5-6).

Each embedding dimension is standardised over the batch, separately for each view
(``z̃_{ic} = (z_{ic} - z̄_c)/σ_c``), and dimension ``c`` of view 1 must pick out dimension ``c`` of
view 2 among all ``D`` dimensions::

    s(c, d) = Σ_i z̃¹_{ic} z̃²_{id} / τ_DCL          ℓ_DCL = -Σ_c log softmax_d s(c, ·)|_{d=c}

ImSimCSE's full objective is ``ℓ_off-info + λ ℓ_DCL`` (Eq. 6).

Two formulations (``formulation``):

``authors_code`` (default)
    What the authors' released code computes, and therefore the scale on which the paper's
    ``τ_DCL = 5`` and ``λ = 0.1`` (Table 5) were tuned: BatchNorm without affine (biased
    variance, ``eps`` added), ``s(c,d) = Σ_i z̃¹_{ic} z̃²_{id} / (N τ_DCL)`` — a correlation in
    ``[-1, 1]`` divided by ``τ_DCL``, so logits lie within ``±1/τ_DCL`` — and the loss
    *averaged* over the ``D`` dimensions (about ``log D`` at initialisation).
``paper``
    Eq. 5 literally: unbiased standard deviation, no division by ``N``, loss *summed* over
    dimensions; logits reach ``±(N-1)/τ_DCL`` and the loss is ``D`` times larger. The two agree
    when ``τ_paper = (N-1)·τ_code`` and ``λ_paper = λ_code / D`` (up to ``eps``).

Under data parallelism the statistics and the loss use the gathered batch (``ctx.gather``).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from ..core.datakind import SENTENCES, DataKind
from .assembly import Assembly
from .base import VIEW_ANCHOR, VIEW_POSITIVE, AuxiliaryTerm, upcast
from .context import ObjectiveContext, StepCache
from .off_dropout import IMSIMCSE
from .sections.dcl import DCLConfig


def standardize(z: Tensor, unbiased: bool, eps: float = 1e-5) -> Tensor:
    """Standardise each column of ``z`` ``(N, D)`` over the rows."""
    mean = z.mean(dim=0, keepdim=True)
    var = z.var(dim=0, unbiased=unbiased, keepdim=True)
    return (z - mean) / torch.sqrt(var + eps)


def dimension_similarity(
    z1: Tensor, z2: Tensor, temperature: float, formulation: str = "authors_code", eps: float = 1e-5
) -> Tensor:
    """The ``(D, D)`` cross-dimension similarity ``s(c, d)`` of Eq. 5 (see module docstring)."""
    unbiased = formulation == "paper"
    a = standardize(upcast(z1), unbiased, eps)
    b = standardize(upcast(z2), unbiased, eps)
    sims = a.T @ b / temperature
    if formulation == "authors_code":
        sims = sims / z1.shape[0]
    return sims


def dcl_loss(
    z1: Tensor, z2: Tensor, temperature: float, formulation: str = "authors_code", eps: float = 1e-5
) -> Tensor:
    """``ℓ_DCL`` of two ``(N, D)`` views (unweighted)."""
    if z1.shape[0] < 2:
        raise ValueError("DCL needs at least 2 sentences to standardise each dimension")
    sims = dimension_similarity(z1, z2, temperature, formulation, eps)
    per_dim = torch.logsumexp(sims, dim=1) - sims.diagonal()
    return per_dim.mean() if formulation == "authors_code" else per_dim.sum()


class DimensionContrastive(AuxiliaryTerm):
    """``λ ℓ_DCL`` on the two dropout views, reported as the term ``dcl``.

    Args:
        weight: ``λ`` (paper: 0.1).
        temperature: ``τ_DCL`` (paper: 5).
        formulation: ``authors_code`` (default) or ``paper``; see the module docstring.
        eps: variance epsilon (BatchNorm's 1e-5).
    """

    name = "dcl"
    papers = (IMSIMCSE,)
    tags = ("dcl",)

    def __init__(
        self,
        weight: float = DCLConfig.weight,
        temperature: float = DCLConfig.temperature,
        formulation: str = DCLConfig.formulation,
        eps: float = DCLConfig.eps,
    ) -> None:
        super().__init__()
        self.weight = float(weight)
        self.temperature = float(temperature)
        self.formulation = formulation
        self.eps = float(eps)

    def forward(
        self, views: Mapping[str, Tensor], ctx: ObjectiveContext, cache: StepCache | None = None
    ) -> Tensor:
        cache = cache or StepCache()
        z1 = cache.gather(ctx, views[VIEW_ANCHOR])
        z2 = cache.gather(ctx, views[VIEW_POSITIVE])
        return self.weight * dcl_loss(z1, z2, self.temperature, self.formulation, self.eps)

    def describe(self, kind: DataKind = SENTENCES) -> str:
        return (
            "**Dimension-wise contrastive learning** (ImSimCSE, Xu et al. 2023, Eq. 5): InfoNCE "
            f"across embedding dimensions, weight λ = {self.weight:g}, τ_DCL = "
            f"{self.temperature:g} ({self.formulation} formulation)."
        )

    def extra_repr(self) -> str:
        return (
            f"weight={self.weight}, temperature={self.temperature}, formulation={self.formulation}"
        )


def build(section: DCLConfig, parts: Assembly) -> None:
    """``objective.dcl``: the DCL term, unless its weight is 0."""
    d = section
    if d.enabled and d.weight > 0:
        parts.auxiliary.append(DimensionContrastive(d.weight, d.temperature, d.formulation, d.eps))
