"""ESimCSE's two sections, ``objective.word_repetition`` and ``objective.momentum_queue``
(Wu et al. 2022, Sec. 3.1 and 3.2).

Torch-free, so that a config is read without torch; the paper module
(:mod:`cselab.objectives.esimcse`) turns the section into its part.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core.schema import ConfigError, check, finite
from .facts import PREFIX as _P
from .facts import ObjectiveFacts


@dataclass
class WordRepetitionConfig:
    """ESimCSE's word repetition (Wu et al. 2022, Sec. 3.1): the positive view of a sentence is
    the sentence with some of its subword tokens written twice, so the pair differs in length.

    Done as the authors' code does (``--dup_type bpe``): on the token ids after truncation,
    ``randrange(min(10, int(dup_rate · L)))`` tokens (``L`` counts ``[CLS]``/``[SEP]``, which are
    never repeated), positions without replacement; the paper's text differs (words,
    ``[0, max(2, int(dup_rate · len))]``), see ``docs/objectives.md``. Sentences only: with given
    pairs the positive is another sentence.

    Attributes:
        enabled: encode the positive view ``z2`` from the repeated tokens (re-drawn every step).
        dup_rate: the repetition rate, in ``[0, 1)``; the authors' scripts: 0.32 (BERT-base and
            -large), 0.3 (RoBERTa-base), 0.28 (RoBERTa-large). ``0`` repeats nothing (SimCSE).
    """

    enabled: bool = False
    dup_rate: float = 0.32

    def validate(self, facts: ObjectiveFacts) -> None:
        """The checks of ``objective.word_repetition``; it is defined for sentences only."""
        check(finite(self.dup_rate) and 0 <= self.dup_rate < 1,
              f"{_P}.word_repetition.dup_rate must be in [0, 1)", self.dup_rate)  # fmt: skip
        if (facts.pairs or facts.hard_negatives) and self.enabled:
            raise ConfigError(
                f"{_P}.word_repetition makes the positive view of one sentence (ESimCSE, Wu et al. "
                "2022, Sec. 3.1: the sentence with some tokens repeated); with given pairs the "
                "positive is another sentence: disable it for pairs data"
            )


#: ``objective.momentum_queue.init``: the momentum encoder's starting weights.
MOMENTUM_INITS = ("pretrained", "random")


@dataclass
class MomentumQueueConfig:
    """ESimCSE's momentum contrast (Wu et al. 2022, Sec. 3.2): a queue of the last
    ``queue_size`` sentences encoded by a momentum encoder, each an extra negative of every anchor.

    The momentum encoder is a copy of the backbone updated after every optimiser step as
    ``θ_m ← momentum · θ_m + (1 - momentum) · θ``; it encodes each batch's sentences with dropout
    off and no gradient (through the live pooler, as the authors' code does), and after the
    step's loss the global batch's rows enter the queue, the oldest leaving. The queue and the
    momentum weights are saved in the checkpoint.

    Attributes:
        enabled: add the queued negatives.
        queue_size: how many earlier sentences the queue keeps (the authors' ``neg_size``:
            160 at batch 64 for BERT-base/-large and RoBERTa-base, 128 for RoBERTa-large);
            ``0`` keeps none (SimCSE).
        momentum: the EMA coefficient, in ``[0, 1]`` (the authors' scripts: 0.995).
        init: the momentum encoder's starting weights: ``pretrained`` (a copy of the backbone
            as training starts) or ``random`` (the architecture's own random initialisation,
            drawn from ``train.seed``: what the authors' code does, since its copy is made
            before the checkpoint loads).
    """

    enabled: bool = False
    queue_size: int = 160
    momentum: float = 0.995
    init: str = "pretrained"

    def validate(self, facts: ObjectiveFacts) -> None:
        """The checks of ``objective.momentum_queue``."""
        q = self
        check(q.queue_size >= 0, f"{_P}.momentum_queue.queue_size must be >= 0", q.queue_size)
        check(finite(q.momentum) and 0 <= q.momentum <= 1,
              f"{_P}.momentum_queue.momentum must be in [0, 1]", q.momentum)  # fmt: skip
        check(q.init in MOMENTUM_INITS,
              f"{_P}.momentum_queue.init must be one of {', '.join(MOMENTUM_INITS)}", q.init)  # fmt: skip
