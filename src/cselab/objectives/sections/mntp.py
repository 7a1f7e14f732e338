"""MNTP's section, ``objective.mntp`` (LLM2Vec, BehnamGhader et al. 2024).

Torch-free, so that a config is read without torch; the paper module
(:mod:`cselab.objectives.mntp`) turns the section into its part.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core.schema import ConfigError, check, finite
from .facts import PREFIX as _P
from .facts import ObjectiveFacts


@dataclass
class MNTPConfig:
    """Masked next-token prediction (LLM2Vec step 2, BehnamGhader et al. 2024), read from
    ``objective.mntp``. It replaces the contrastive loss: the run trains the LM objective only
    (:mod:`cselab.objectives.mntp`).

    Attributes:
        enabled: train with MNTP instead of InfoNCE (the model is loaded with its causal LM
            head; sentences data only).
        mask_ratio: the probability that a (non-special) token is chosen; the authors: 0.2 for
            Llama models, 0.8 for Mistral.
        mask_token: the token that replaces a chosen token (80% of them; 10% get a random token,
            10% stay); ``null``: the tokenizer's mask token, else ``_`` (the authors' "blank").
    """

    enabled: bool = False
    mask_ratio: float = 0.2
    mask_token: str | None = None

    def validate(self, facts: ObjectiveFacts | None = None) -> None:
        """Ranges of the keys; with ``facts``, MNTP is a language-modelling loss on sentences:
        no contrastive part composes with it (LLM2Vec trains MNTP, then SimCSE, as two runs).
        Raises :class:`ConfigError` naming the key."""
        prefix = f"{_P}.mntp"
        check(finite(self.mask_ratio) and 0 < self.mask_ratio <= 1,
              f"{prefix}.mask_ratio must be in (0, 1]", self.mask_ratio)  # fmt: skip
        if self.mask_token is not None and not self.mask_token:
            raise ConfigError(f"{prefix}.mask_token must be a token or null, not empty")
        if facts is None or not self.enabled:
            return
        objective = facts.objective
        on = [n for n in objective.sections() if n != "mntp" and getattr(objective, n).enabled]
        on += ["hard_negative_weight"] if objective.hard_negative_weight != 0 else []
        on += ["symmetric"] if objective.symmetric else []
        if on:
            raise ConfigError(
                f"{_P}.mntp replaces the contrastive loss, so {_P}.{on[0]} has nothing to act on: "
                "disable it (LLM2Vec trains MNTP first, then SimCSE in a second run)"
            )
        if facts.pairs or facts.hard_negatives:
            raise ConfigError(
                f"{_P}.mntp predicts masked tokens of single sentences; the training data are "
                "pairs: train it on a sentence corpus"
            )
