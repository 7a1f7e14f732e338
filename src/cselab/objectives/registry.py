"""The ordered registry of the objective's parts, and :func:`build_objective`, which assembles
an :class:`~cselab.objectives.infonce.InfoNCE` from the ``objective:`` section with it.

Each entry names a key of :class:`~cselab.objectives.config.ObjectiveConfig` and the ``build``
of the paper module that owns it; the section beside it (``objectives/sections/<paper>.py``,
torch-free, so that a config is read without torch) holds the key's default and its checks. A
new paper is its module with a ``build`` (its part, its hooks), its section, its field on
``ObjectiveConfig`` and one line here (``docs/design.md``'s checklist).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.datakind import DataKind
from . import (
    barlow,
    dcl,
    esimcse,
    focal,
    gaussian,
    hard_negatives,
    matryoshka,
    mixcse,
    mntp,
    noise,
    off_dropout,
)
from .assembly import Assembly
from .base import Objective
from .config import ObjectiveConfig

#: A paper module's ``build(section, assembly)``: adds or replaces its part.
Builder = Callable[[Any, Assembly], None]

#: ``(key of the objective section, build)`` in assembly order: the negative space first (the
#: noise ablation, then off-dropout, which replaces it), then the negative blocks in their column
#: order (given hard negatives, Gaussian, mixed, the momentum queue), the positive view, the
#: score, the auxiliary terms, the wrapper, and MNTP (which replaces the whole InfoNCE).
OBJECTIVE_PARTS: tuple[tuple[str, Builder], ...] = (
    ("noise", noise.build),
    ("off_dropout", off_dropout.build),
    ("hard_negative_weight", hard_negatives.build),
    ("gaussian", gaussian.build),
    ("mixcse", mixcse.build),
    ("momentum_queue", esimcse.build_queue),
    ("word_repetition", esimcse.build_repetition),
    ("focal", focal.build),
    ("dcl", dcl.build),
    ("barlow_twins", barlow.build),
    ("matryoshka", matryoshka.build),
    ("mntp", mntp.build),  # replaces the InfoNCE above (all of it off then: validated)
)


def build_objective(
    cfg: ObjectiveConfig, data: DataKind | None = None, width: int | None = None
) -> Objective:
    """Validate ``cfg`` and assemble the :class:`InfoNCE` it describes.

    With no sub-section enabled this is unsupervised SimCSE (default parts); each enabled
    sub-section adds or replaces a part following the composition rules of :mod:`.infonce`, in
    the order of :data:`OBJECTIVE_PARTS`. With ``matryoshka.dims`` set, that InfoNCE is wrapped
    in :class:`Matryoshka`.

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
    parts = Assembly(cfg, data)
    for key, build in OBJECTIVE_PARTS:
        build(getattr(cfg, key), parts)
    return parts.finish()
