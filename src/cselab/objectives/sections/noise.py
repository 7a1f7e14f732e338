"""ImSimCSE's noise ablation section, ``objective.noise`` (Xu et al. 2023, Table 1).

Torch-free, so that a config is read without torch; the paper module
(:mod:`cselab.objectives.noise`) turns the section into its part.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ...core.schema import ConfigError, check, finite
from .facts import PREFIX as _P
from .facts import ObjectiveFacts


@dataclass
class NoiseConfig:
    """ImSimCSE's noise ablation (Xu et al. 2023, Table 1, "+Noise" rows).

    Adds ``N(0, variance)`` noise to each raw embedding (independently per view and step)
    before the similarities of the chosen side are computed; the other side stays clean.

    Attributes:
        enabled: perturb the embeddings.
        side: ``positive`` (``s(z¹+g¹, z²+g²)`` replaces the positive pair), ``negative``
            (the negatives become ``s(z_i¹+g¹, z_j²+g²)``) or ``both``.
        variance: the noise variance (paper: 0.1).
    """

    enabled: bool = False
    side: Literal["positive", "negative", "both"] = "negative"
    variance: float = 0.1

    def validate(self, facts: ObjectiveFacts) -> None:
        """The checks of ``objective.noise``: noisy negatives need every negative to have a
        noise view (not off-dropout, the momentum queue or given hard negatives)."""
        n = self
        check(finite(n.variance) and n.variance >= 0, f"{_P}.noise.variance must be >= 0",
               n.variance)  # fmt: skip
        noisy_negatives = n.enabled and n.side in ("negative", "both")
        if noisy_negatives and facts.hard_negatives:
            raise ConfigError(
                f"{_P}.noise.side='{n.side}' perturbs the dropout views z1/z2 (ImSimCSE Table 1); "
                "given hard negatives have no such view, so the negative side would be half "
                "noisy: use noise.side='positive' with hard negatives"
            )
        if noisy_negatives and facts.objective.off_dropout.enabled:
            raise ConfigError(
                f"{_P}.noise.side='{n.side}' adds noise to the negatives, but "
                f"{_P}.off_dropout scores the negatives on noise-free off-dropout representations; "
                "enable only one of them, or use noise.side='positive'"
            )
        if noisy_negatives and facts.objective.momentum_queue.enabled:
            raise ConfigError(
                f"{_P}.noise.side='{n.side}' adds noise to the negatives, but the entries of "
                f"{_P}.momentum_queue are momentum-encoded sentences without a noise view, so the "
                "negative side would be half noisy: use noise.side='positive' with the queue"
            )
