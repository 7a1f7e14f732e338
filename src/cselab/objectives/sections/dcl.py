"""ImSimCSE's dimension-wise contrastive section, ``objective.dcl`` (Xu et al. 2023, Eq. 5).

Torch-free, so that a config is read without torch; the paper module
(:mod:`cselab.objectives.dcl`) turns the section into its part.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ...core.schema import check, finite
from .facts import PREFIX as _P
from .facts import ObjectiveFacts, positive


@dataclass
class DCLConfig:
    """ImSimCSE's dimension-wise contrastive learning (Xu et al. 2023, Eq. 5), weight ``λ``.

    Attributes:
        enabled: add ``weight × ℓ_DCL`` as the term ``dcl``.
        weight: ``λ`` of Eq. 6 (paper: 0.1, Table 5).
        temperature: ``τ_DCL`` (paper: 5, Table 5).
        formulation: ``authors_code`` (default; the scale on which the paper's ``τ_DCL = 5`` and
            ``λ = 0.1`` were tuned): standardise with the biased batch variance (BatchNorm
            without affine), divide the similarity by the batch size and *average* the loss
            over dimensions. ``paper``: the literal Eq. 5: unbiased standard deviation, no
            division by the batch size, loss *summed* over dimensions. At batch ``N`` and width
            ``D`` the two agree when ``τ_paper = (N-1)·τ_code`` and ``λ_paper = λ_code / D``.
        eps: added to the variance before the square root (BatchNorm's 1e-5), in both forms.
    """

    enabled: bool = False
    weight: float = 0.1
    temperature: float = 5.0
    formulation: Literal["authors_code", "paper"] = "authors_code"
    eps: float = 1e-5

    def validate(self, facts: ObjectiveFacts) -> None:
        """The checks of ``objective.dcl``."""
        d = self
        check(finite(d.weight) and d.weight >= 0, f"{_P}.dcl.weight must be >= 0", d.weight)
        check(positive(d.temperature), f"{_P}.dcl.temperature must be > 0", d.temperature)
        check(positive(d.eps), f"{_P}.dcl.eps must be > 0", d.eps)
