"""MixCSE's section, ``objective.mixcse`` (Zhang et al. 2022).

Torch-free, so that a config is read without torch; the paper module
(:mod:`cselab.objectives.mixcse`) turns the section into its part.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ...core.schema import ConfigError, check, finite
from .facts import PREFIX as _P
from .facts import ObjectiveFacts


@dataclass
class MixCSEConfig:
    """MixCSE (Zhang et al. 2022): mixed hard negatives ``normalize(λh'_i + (1-λ)h'_j)``.

    Attributes:
        enabled: add the mixed negatives.
        mix_ratio: ``λ``, the weight of the anchor's own positive in the mix (paper: 0.2);
            must be in ``[0, 1)``.
        directions: ``both`` (paper): both views serve as anchor, each with its own mixed
            negatives (the objective becomes symmetric). ``single``: only the first view is an
            anchor (MixCSE_single, Table 3); requires ``objective.symmetric: false``.
        partner: how ``j`` is chosen: ``random`` (a uniformly drawn other sentence of the global
            batch, fresh each step) or ``next`` (``j = i + 1`` modulo the batch, the authors'
            rolled batch).
        columns: ``one`` (paper, L_mix): one mixed negative per anchor. ``all`` (the authors'
            code): the ``N`` rolled mixes are columns for every anchor, and the mix whose
            ``(1 - λ)`` part is the anchor's own positive is removed (``-inf``; the code
            multiplied its logit by 0 instead, leaving ``e⁰`` in the denominator). ``all``
            requires ``partner: next``.
        stop_gradient: no gradient through the mixed negatives (paper); ``false`` is
            MixCSE_wo_sg (Table 3).
    """

    enabled: bool = False
    mix_ratio: float = 0.2
    directions: Literal["both", "single"] = "both"
    partner: Literal["random", "next"] = "random"
    columns: Literal["one", "all"] = "one"
    stop_gradient: bool = True

    def validate(self, facts: ObjectiveFacts) -> None:
        """The checks of ``objective.mixcse``, with ``objective.symmetric``."""
        x = self
        check(finite(x.mix_ratio) and 0 <= x.mix_ratio < 1,
               f"{_P}.mixcse.mix_ratio must be in [0, 1)", x.mix_ratio)  # fmt: skip
        if x.enabled and x.directions == "single" and facts.objective.symmetric:
            raise ConfigError(
                f"{_P}.mixcse.directions='single' uses only the first view as anchor, which "
                f"contradicts {_P}.symmetric=true; use directions='both' for a symmetric loss"
            )
        if x.enabled and x.columns == "all" and x.partner != "next":
            raise ConfigError(
                f"{_P}.mixcse.columns='all' is the authors' rolled construction and needs "
                f"{_P}.mixcse.partner='next' (got '{x.partner}')"
            )
