"""The assembly of an objective from the ``objective:`` section: :func:`build_objective`."""

from __future__ import annotations

from ..core.datakind import DataKind
from .barlow import BarlowTwinsTerm
from .base import (
    VIEW_ANCHOR,
    VIEW_POSITIVE,
    AuxiliaryTerm,
    NegativeSource,
    Objective,
    Score,
)
from .config import (
    ObjectiveConfig,
)
from .dcl import DimensionContrastive
from .esimcse import MomentumQueue, WordRepetition
from .focal import FocalScore
from .gaussian import GaussianNegatives
from .hard_negatives import HardNegatives
from .infonce import InBatchNegatives, InfoNCE
from .matryoshka import Matryoshka
from .mixcse import MixedNegatives
from .noise import AdditiveNoise
from .off_dropout import OffDropoutNegatives, PositiveRatioScore
from .spaces import (
    DROPOUT_SPACE,
    NOISY_SPACE,
    OFF_DROPOUT_SPACE,
    VIEW_ANCHOR_NOISY,
    VIEW_POSITIVE_NOISY,
)


def build_objective(
    cfg: ObjectiveConfig, data: DataKind | None = None, width: int | None = None
) -> Objective:
    """Validate ``cfg`` and assemble the :class:`InfoNCE` it describes.

    With no sub-section enabled this is unsupervised SimCSE (default parts); each enabled
    sub-section adds or replaces a part following the composition rules of :mod:`.infonce`.
    With ``matryoshka.dims`` set, that InfoNCE is wrapped in :class:`Matryoshka`.

    Args:
        cfg: the ``objective:`` section.
        data: the kind of the training data, as the data layer decided it when it opened the
            file (``None``: not known; the data-dependent checks of
            :meth:`ObjectiveConfig.validate` are skipped). Data with hard negatives (the
            ``neg`` view) add :class:`HardNegatives` with ``cfg.hard_negative_weight``
            (supervised SimCSE).
        width: the encoder's output width, where it is known (``None``: not known; the
            check of ``matryoshka.dims`` against it is skipped).
    """
    if data is None:
        cfg.validate(width=width)
    else:
        cfg.validate(data.pairs, data.hard_negatives, width)
    hard_negatives = data is not None and data.hard_negatives
    noise = AdditiveNoise(cfg.noise.variance, cfg.noise.side) if cfg.noise.enabled else None
    noisy_negatives = noise is not None and noise.on_negatives
    noisy_positive = noise is not None and noise.on_positive

    off = cfg.off_dropout
    if off.enabled:
        space = OFF_DROPOUT_SPACE
        negatives: list[NegativeSource] = [
            OffDropoutNegatives(off.tradeoff if off.variant == "paper" else 1.0)
        ]
    else:
        space = NOISY_SPACE if noisy_negatives else DROPOUT_SPACE
        negatives = [InBatchNegatives(space)]

    if hard_negatives:
        negatives.append(HardNegatives(cfg.hard_negative_weight, space=space))

    g = cfg.gaussian
    if g.enabled and g.weight > 0 and (g.num if g.num is not None else g.batch_multiple) > 0:
        negatives.append(
            GaussianNegatives(g.num, g.batch_multiple, g.mean, g.std, g.weight, space=space)
        )

    x = cfg.mixcse
    if x.enabled:
        negatives.append(
            MixedNegatives(x.mix_ratio, x.partner, x.columns, x.stop_gradient, space=space)
        )

    q = cfg.momentum_queue
    if q.enabled and q.queue_size > 0:
        negatives.append(MomentumQueue(q.queue_size, q.momentum, space=space))
    r = cfg.word_repetition
    repetition = WordRepetition(r.dup_rate) if r.enabled and r.dup_rate > 0 else None

    score: Score = FocalScore(cfg.focal.hardness) if cfg.focal.enabled else Score()
    if off.enabled and off.variant == "authors_code":
        score = PositiveRatioScore(score, off.tradeoff)

    auxiliary: list[AuxiliaryTerm] = []
    d = cfg.dcl
    if d.enabled and d.weight > 0:
        auxiliary.append(DimensionContrastive(d.weight, d.temperature, d.formulation, d.eps))
    b = cfg.barlow_twins
    if b.enabled and b.weight > 0:
        auxiliary.append(BarlowTwinsTerm(b.weight, b.off_diagonal, b.padding, b.center))

    objective = InfoNCE(
        cfg.temperature,
        negatives,
        score=score,
        auxiliary=auxiliary,
        symmetric=cfg.symmetric_loss,
        transforms=[noise] if noise is not None else [],
        positive_views=(VIEW_ANCHOR_NOISY, VIEW_POSITIVE_NOISY)
        if noisy_positive
        else (VIEW_ANCHOR, VIEW_POSITIVE),
        repetition=repetition,
    )
    # --- Matryoshka: wraps the objective assembled above ---
    if cfg.matryoshka.enabled:
        return Matryoshka(objective, cfg.matryoshka.dims, cfg.matryoshka.weights)
    return objective
