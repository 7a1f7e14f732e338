"""ImSimCSE's off-dropout section, ``objective.off_dropout`` (Xu et al. 2023, Eq. 3).

Torch-free, so that a config is read without torch; the paper module
(:mod:`cselab.objectives.off_dropout`) turns the section into its part.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ...core.schema import ConfigError, check
from .facts import PREFIX as _P
from .facts import ObjectiveFacts, positive


@dataclass
class OffDropoutConfig:
    """ImSimCSE's off-dropout negatives (Xu et al. 2023, Eq. 3).

    Needs the ``off`` view: one more forward pass of the batch with all dropout switched off.

    Attributes:
        enabled: score every negative column between off-dropout representations.
        tradeoff: ``m`` (paper: 0.9, Table 5).
        variant: ``paper`` multiplies the negative sum by ``m`` (Eq. 3). ``authors_code``
            follows the released code instead: no weight on the negatives and the *positive*
            logit multiplied by ``m`` both in the numerator and inside the log-sum-exp (this is a
            different objective: a temperature ``τ/m`` for the positive column only).
    """

    enabled: bool = False
    tradeoff: float = 0.9
    variant: Literal["paper", "authors_code"] = "paper"

    def validate(self, facts: ObjectiveFacts) -> None:
        """The checks of ``objective.off_dropout``; it is defined for sentences only."""
        check(positive(self.tradeoff), f"{_P}.off_dropout.tradeoff must be > 0", self.tradeoff)
        if (facts.pairs or facts.hard_negatives) and self.enabled:
            raise ConfigError(
                f"{_P}.off_dropout is defined for the dropout views of one sentence (ImSimCSE, "
                "Xu et al. 2023, Sec. 3.2: the negatives are the batch's sentences encoded "
                "without dropout); with given pairs the positive is another sentence and the "
                "paper defines no off-dropout objective for it: disable it for pairs data"
            )
