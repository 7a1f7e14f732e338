"""GS-InfoNCE's section, ``objective.gaussian`` (Wu et al., Eq. 5).

Torch-free, so that a config is read without torch; the paper module
(:mod:`cselab.objectives.gaussian`) turns the section into its part.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core.schema import check, finite
from .facts import PREFIX as _P
from .facts import ObjectiveFacts, positive


@dataclass
class GaussianConfig:
    """GS-InfoNCE (Wu et al., Eq. 5): ``M`` Gaussian vectors as extra negatives, weight ``λ``.

    Attributes:
        enabled: add the Gaussian negatives.
        num: ``M``, the number of noise vectors per step; ``null`` means
            ``round(batch_multiple × global batch size)``.
        batch_multiple: ``M`` as a multiple of the (global) batch size when ``num`` is null.
            Paper: 3 (Table 3), i.e. 192 at batch 64, as in the authors' scripts.
        mean: ``μ`` of every coordinate of ``g_k`` (paper: 0).
        std: ``σ`` (paper: 1). With ``mean = 0``, ``σ`` has no effect: the cosine similarity
            is scale invariant and ``g/σ`` is standard normal.
        weight: ``λ`` (paper: 1), applied exactly as a factor on the Gaussian terms of the
            denominator; ``0`` removes them.
    """

    enabled: bool = False
    num: int | None = None
    batch_multiple: float = 3.0
    mean: float = 0.0
    std: float = 1.0
    weight: float = 1.0

    def validate(self, facts: ObjectiveFacts) -> None:
        """The checks of ``objective.gaussian``."""
        g = self
        check(g.num is None or g.num >= 0, f"{_P}.gaussian.num must be >= 0 or null", g.num)
        check(finite(g.batch_multiple) and g.batch_multiple >= 0,
               f"{_P}.gaussian.batch_multiple must be >= 0", g.batch_multiple)  # fmt: skip
        check(finite(g.mean), f"{_P}.gaussian.mean must be finite", g.mean)
        check(positive(g.std), f"{_P}.gaussian.std must be > 0", g.std)
        check(finite(g.weight) and g.weight >= 0, f"{_P}.gaussian.weight must be >= 0", g.weight)
