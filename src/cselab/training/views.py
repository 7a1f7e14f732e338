"""Computing the views an objective asks for.

``z1``/``z2`` (SimCSE): one forward pass over the batch stacked twice (``2B`` rows), so each row
gets its own dropout mask and the two copies of a sentence are two dropout views.
``off`` (ImSimCSE, Xu et al. 2023, Sec. 3.1): one more forward pass of the ``B`` rows with every
dropout of the backbone switched off; the pooler stays in training mode, so a ``cls`` MLP head
is applied as it is to the dropout views.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import Tensor

from ..model.encoder import SentenceEncoder, dropout_disabled
from ..objectives import VIEW_ANCHOR, VIEW_OFF_DROPOUT, VIEW_POSITIVE

KNOWN_VIEWS = frozenset({VIEW_ANCHOR, VIEW_POSITIVE, VIEW_OFF_DROPOUT})


def check_views(names: Iterable[str]) -> None:
    unknown = set(names) - KNOWN_VIEWS
    if unknown:
        raise ValueError(
            f"objective requires unknown views {sorted(unknown)}; known: {sorted(KNOWN_VIEWS)}"
        )


def compute_views(
    encoder: SentenceEncoder, batch: Mapping[str, Tensor], names: Iterable[str]
) -> dict[str, Tensor]:
    """Encode ``batch`` (``B`` rows of token ids) into the requested views, each ``(B, D)``."""
    names = set(names)
    check_views(names)
    n = batch["input_ids"].shape[0]
    doubled = {k: torch.cat([v, v], dim=0) for k, v in batch.items()}
    both = encoder(**doubled)
    views = {VIEW_ANCHOR: both[:n], VIEW_POSITIVE: both[n:]}
    if VIEW_OFF_DROPOUT in names:
        with dropout_disabled(encoder.backbone):
            views[VIEW_OFF_DROPOUT] = encoder(**batch)
    return views
