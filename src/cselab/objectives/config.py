"""Configuration of the training objective (the ``objective:`` section of a run config).

The defaults are unsupervised SimCSE (Gao et al. 2021, Eq. 1). Each paper's change is a
sub-section with an ``enabled`` switch; any combination of switches is a defined objective (see
``docs/objectives.md`` for the composition rules), and combinations that would be ambiguous are
rejected by :meth:`ObjectiveConfig.validate` with a message saying why.

The papers reuse symbols (``m`` is Focal's hardness and ImSimCSE's trade-off; ``λ`` is
GS-InfoNCE's noise weight, MixCSE's mixing ratio and ImSimCSE's DCL weight), so the config keys use
distinct names::

    objective:
      temperature: 0.05
      focal: {enabled: true, hardness: 0.3}                       # Hou & Li 2023, Eq. 2
      gaussian: {enabled: true, batch_multiple: 3.0, weight: 1.0}  # Wu et al., Eq. 5
      off_dropout: {enabled: true, tradeoff: 0.9}                  # Xu et al. 2023, Eq. 3
      dcl: {enabled: true, weight: 0.1, temperature: 5.0}          # Xu et al. 2023, Eq. 5-6
      barlow_twins: {enabled: true, padding: 704}                  # Xu et al. 2023, Eq. 4
      mixcse: {enabled: true, mix_ratio: 0.2}                      # Zhang et al. 2022
      noise: {enabled: true, side: negative}                       # Xu et al. 2023, Table 1
      word_repetition: {enabled: true, dup_rate: 0.32}             # Wu et al. 2022, Sec. 3.1
      momentum_queue: {enabled: true, queue_size: 160, momentum: 0.995}  # Wu et al. 2022, Sec. 3.2
      hard_negative_weight: 0.0          # pairs with hard negatives: Gao et al. 2021, Sec. 4
      matryoshka: {dims: [384, 256, 128, 64]}                      # Kusupati et al. 2022, Eq. 1
      mntp: {enabled: true, mask_ratio: 0.2}     # instead of InfoNCE: BehnamGhader et al. 2024
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from ..core.schema import ConfigError, check, check_kinds, finite
from .sections.barlow import BarlowTwinsConfig
from .sections.dcl import DCLConfig
from .sections.esimcse import MOMENTUM_INITS, MomentumQueueConfig, WordRepetitionConfig
from .sections.facts import PREFIX as _P
from .sections.facts import ObjectiveFacts, positive
from .sections.focal import FocalConfig
from .sections.gaussian import GaussianConfig
from .sections.matryoshka import MatryoshkaConfig
from .sections.mixcse import MixCSEConfig
from .sections.mntp import MNTPConfig
from .sections.noise import NoiseConfig
from .sections.off_dropout import OffDropoutConfig

__all__ = [
    "MOMENTUM_INITS",
    "BarlowTwinsConfig",
    "DCLConfig",
    "FocalConfig",
    "GaussianConfig",
    "MNTPConfig",
    "MatryoshkaConfig",
    "MixCSEConfig",
    "MomentumQueueConfig",
    "NoiseConfig",
    "ObjectiveConfig",
    "ObjectiveFacts",
    "OffDropoutConfig",
    "WordRepetitionConfig",
]


@dataclass
class ObjectiveConfig:
    """Which loss to train with.

    The defaults are unsupervised SimCSE (Gao et al. 2021, Eq. 1): InfoNCE over in-batch
    negatives with temperature 0.05. The sub-sections switch on the four papers' objectives.

    Attributes:
        temperature: τ of the InfoNCE family, applied once to every column's energy.
        symmetric: average the loss over both directions (view 2 as anchor too).
        focal, gaussian, off_dropout, dcl, barlow_twins, mixcse, noise: see their classes.
        matryoshka: the loss at several prefix dimensions (:class:`MatryoshkaConfig`); it wraps
            whatever the other keys describe.
        word_repetition, momentum_queue: ESimCSE's two parts (Wu et al. 2022); see their classes.
        hard_negative_weight: supervised SimCSE's log-weight on each anchor's own given hard
            negative(s) (Gao et al. 2021, Sec. 4 and Appendix; their code's
            ``hard_negative_weight``): the column enters the denominator as ``e^w · e^{s/τ}``.
            ``0`` (the paper's setting) is plain InfoNCE; needs pairs data with hard negatives.
        mntp: masked next-token prediction (LLM2Vec's step 2, :class:`MNTPConfig`); it
            replaces the contrastive loss, so every other sub-section must be off.
    """

    temperature: float = 0.05
    symmetric: bool = False
    focal: FocalConfig = field(default_factory=FocalConfig)
    gaussian: GaussianConfig = field(default_factory=GaussianConfig)
    off_dropout: OffDropoutConfig = field(default_factory=OffDropoutConfig)
    dcl: DCLConfig = field(default_factory=DCLConfig)
    barlow_twins: BarlowTwinsConfig = field(default_factory=BarlowTwinsConfig)
    mixcse: MixCSEConfig = field(default_factory=MixCSEConfig)
    noise: NoiseConfig = field(default_factory=NoiseConfig)
    word_repetition: WordRepetitionConfig = field(default_factory=WordRepetitionConfig)
    momentum_queue: MomentumQueueConfig = field(default_factory=MomentumQueueConfig)
    hard_negative_weight: float = 0.0
    matryoshka: MatryoshkaConfig = field(default_factory=MatryoshkaConfig)
    mntp: MNTPConfig = field(default_factory=MNTPConfig)

    def validate(
        self,
        pairs: bool | None = None,
        hard_negatives: bool | None = None,
        width: int | None = None,
    ) -> None:
        """Raise :class:`~cselab.schema.ConfigError` naming the key if a value has the wrong
        kind, is out of range, or a combination is not defined.

        The one home of every objective check: the parts assume a validated config.

        Args:
            pairs: whether the training data are given pairs (``None``: not known yet); the
                run config knows it from ``data.train_file`` and ``data.format``.
            hard_negatives: whether the pairs carry hard negatives (``None``: not known yet,
                i.e. before the file is read). :func:`~cselab.objectives.build_objective` passes
                both from the run's :class:`~cselab.core.datakind.DataKind`.
            width: the encoder's output width (``None``: not known yet), for
                ``matryoshka.dims``.
        """
        p = _P
        # Kinds first, with the YAML loader's own checks (choices, true/false, whole numbers):
        # a config built in Python skips the loader, and a misspelled choice would otherwise
        # build a different objective without a word.
        check_kinds(self, p)
        check(positive(self.temperature), f"{p}.temperature must be > 0", self.temperature)
        facts = ObjectiveFacts(self, pairs, hard_negatives, width)
        # each section checks its own keys, and the combinations it would break
        for name in self.sections():
            getattr(self, name).validate(facts)

        w = self.hard_negative_weight
        check(finite(w), f"{p}.hard_negative_weight must be finite", w)
        if w != 0 and (pairs is False or hard_negatives is False):
            raise ConfigError(
                f"{p}.hard_negative_weight={w} weights given hard negatives, but the training "
                "data has none (pairs with a negative column: data.columns.negative)"
            )

    @classmethod
    def sections(cls) -> tuple[str, ...]:
        """The sub-sections (one per paper, each with its ``validate``), in the config's order;
        a new paper's section is found here by being a field."""
        return tuple(
            f.name for f in fields(cls) if isinstance(f.type, str) and f.type.endswith("Config")
        )

    @property
    def symmetric_loss(self) -> bool:
        """Whether the built objective averages both directions."""
        return self.symmetric or (self.mixcse.enabled and self.mixcse.directions == "both")
