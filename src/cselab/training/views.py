"""Computing the views an objective asks for.

``z1``/``z2`` (SimCSE): one forward pass over the batch stacked twice (``2B`` rows), so each row
gets its own dropout mask and the two copies of a sentence are two dropout views.
``off`` (ImSimCSE, Xu et al. 2023, Sec. 3.1): one more forward pass of the ``B`` rows with every
dropout of the backbone switched off; the pooler stays in training mode, so a ``cls`` MLP head
is applied as it is to the dropout views.

Pairs (supervised SimCSE, Gao et al. 2021, Sec. 4; the run's
:class:`~cselab.core.datakind.DataKind` says so, and the step's
:class:`~cselab.data.inputs.StepInputs` carry ``positives`` and, with hard negatives,
``negatives``): ``z1`` are the anchors, ``z2`` the given
positives and ``neg`` the given hard negatives ``(B, K, D)``, all from one forward pass over the
columns stacked (``2B + B·K`` rows, padded to the widest column), with dropout on as the paper
trains. The off-dropout view is not defined for pairs (rejected by the objective's config).

With the ``prompt`` pooler (PromptBERT, Jiang et al. 2022, Sec. 5.2) the anchors are read
through ``model.prompt.template`` and every other row of the pass (positives, hard negatives)
through ``template2``, as the authors' ``prepare_features`` builds its two copies; the
off-dropout view is the anchors' and takes ``template``.

ESimCSE (Wu et al. 2022): a sentence batch may carry its word-repeated copy as ``positives``
(added by :meth:`Task.prepare <cselab.training.task.Task.prepare>`); then ``z2`` is
encoded from them, in the same forward pass as ``z1`` (rows stacked, padded to the widest).
``momentum``: the batch's sentences (the anchors of pairs) encoded by the task's
:class:`~cselab.training.momentum.MomentumEncoder`, dropout off, no gradient.

``token_logits``/``token_labels`` (MNTP, LLM2Vec, BehnamGhader et al. 2024, Sec. 2.2): the
batch's masked copy (``masked``, a :class:`~cselab.data.inputs.MaskedCopy`, added by
:meth:`Task.prepare <cselab.training.task.Task.prepare>`) goes through the backbone once, and
the language-modelling head reads only the position **before** each masked token (a masked
token is predicted from the previous position's state; a masked first token has no previous
position and is skipped): ``(M, V)`` logits instead of the ``(B, L, V)`` of a full LM pass.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Mapping

import torch
from torch import Tensor

from ..core.datakind import SENTENCES, DataKind
from ..data.inputs import StepInputs, as_step_inputs, stack_rows
from ..model.encoder import SentenceEncoder, dropout_disabled
from ..objectives import (
    VIEW_ANCHOR,
    VIEW_HARD_NEGATIVE,
    VIEW_MOMENTUM,
    VIEW_OFF_DROPOUT,
    VIEW_POSITIVE,
    VIEW_TOKEN_LABELS,
    VIEW_TOKEN_LOGITS,
)
from .momentum import MomentumEncoder

KNOWN_VIEWS = frozenset(
    {VIEW_ANCHOR, VIEW_POSITIVE, VIEW_OFF_DROPOUT, VIEW_HARD_NEGATIVE, VIEW_MOMENTUM,
     VIEW_TOKEN_LOGITS, VIEW_TOKEN_LABELS}
)  # fmt: skip
TOKEN_VIEWS = frozenset({VIEW_TOKEN_LOGITS, VIEW_TOKEN_LABELS})


def check_views(names: Iterable[str], kind: DataKind = SENTENCES) -> None:
    """That views ``names`` can be computed from data of ``kind``: checked once per set of
    names and kind (the task checks when it is built; :func:`compute_views`, called every step
    and chunk, finds the answer remembered)."""
    _check_views(frozenset(names), kind)


@functools.lru_cache(maxsize=64)
def _check_views(names: frozenset[str], kind: DataKind) -> None:
    unknown = names - KNOWN_VIEWS
    if unknown:
        raise ValueError(
            f"objective requires unknown views {sorted(unknown)}; known: {sorted(KNOWN_VIEWS)}"
        )
    if names & TOKEN_VIEWS and kind.pairs:
        raise ValueError("token prediction (MNTP) is defined for sentences, not given pairs")
    if VIEW_HARD_NEGATIVE in names and not kind.hard_negatives:
        what = "the pairs have none" if kind.pairs else "the batch has no pairs"
        raise ValueError(f"the objective asks for hard negatives, but {what}")
    if VIEW_OFF_DROPOUT in names and kind.pairs:
        raise ValueError("the off-dropout view is defined for sentences, not for given pairs")


def compute_views(
    encoder: SentenceEncoder,
    inputs: StepInputs | Mapping[str, Tensor],
    names: Iterable[str],
    kind: DataKind = SENTENCES,
    momentum: MomentumEncoder | None = None,
) -> dict[str, Tensor]:
    """Encode ``inputs`` (``B`` rows of data of ``kind``; a plain token dict is a sentence
    batch) into the requested views, each ``(B, D)`` (``neg``: ``(B, K, D)``); ``momentum``
    encodes the ``momentum`` view."""
    names = set(names)
    check_views(names, kind)
    inputs = as_step_inputs(inputs)
    if VIEW_MOMENTUM in names and momentum is None:
        raise ValueError("the objective asks for the momentum view, but no momentum encoder")
    views: dict[str, Tensor] = {}
    if names & TOKEN_VIEWS:
        views.update(token_views(encoder, inputs))
    if names & {VIEW_ANCHOR, VIEW_POSITIVE}:
        if inputs.positives is not None:  # given pairs, or ESimCSE's repetition
            views.update(pair_views(encoder, inputs, names))
        elif kind.pairs:
            raise ValueError("a batch of pairs without positives")
        else:
            n = len(inputs)
            doubled = {k: torch.cat([v, v], dim=0) for k, v in inputs.anchors.items()}
            both = encoder(**doubled, **_templates(encoder, n, 2 * n))
            views.update({VIEW_ANCHOR: both[:n], VIEW_POSITIVE: both[n:]})
    if VIEW_OFF_DROPOUT in names:
        with dropout_disabled(encoder.backbone):
            views[VIEW_OFF_DROPOUT] = encoder(**inputs.anchors)
    if momentum is not None and VIEW_MOMENTUM in names:
        views[VIEW_MOMENTUM] = momentum(inputs.anchors)
    return views


def token_views(encoder: SentenceEncoder, inputs: StepInputs) -> dict[str, Tensor]:
    """``token_logits`` ``(B·K, V)`` and ``token_labels`` ``(B·K,)`` of the batch's masked copy:
    the logits at position ``i - 1`` for each masked token at ``i`` whose previous position is
    a real token, ``K`` per row (padded with label ``IGNORE``,
    :func:`~cselab.data.masking.scored_positions`, made on the host by the task)."""
    if inputs.masked is None:
        raise ValueError("the objective predicts masked tokens, but the batch has no masked copy")
    raw = getattr(encoder, "_orig_mod", encoder)  # torch.compile's wrapper: its module
    masked = inputs.masked
    columns, targets = masked.positions, masked.targets
    rows = torch.arange(columns.shape[0], device=columns.device).unsqueeze(1).expand_as(columns)
    positions = torch.stack([rows, columns], -1).reshape(-1, 2)  # (B·K, 2): row, position
    logits = raw.token_logits(masked.input_ids, inputs.anchors["attention_mask"], positions)
    return {VIEW_TOKEN_LOGITS: logits, VIEW_TOKEN_LABELS: targets.reshape(-1)}


def pair_views(encoder: SentenceEncoder, inputs: StepInputs, names: set[str]) -> dict[str, Tensor]:
    """``z1`` (anchors), ``z2`` (positives) and, if asked for, ``neg`` of a batch with
    positives (the views checked by :func:`check_views`), from one pass over the columns."""
    n = len(inputs)
    k = inputs.num_negatives if VIEW_HARD_NEGATIVE in names else 0
    parts = list(itertools.islice(inputs.columns(), 3 if k else 2))
    out = encoder(**stack_rows(parts), **_templates(encoder, n, n * (2 + k)))
    views = {VIEW_ANCHOR: out[:n], VIEW_POSITIVE: out[n : 2 * n]}
    if k:
        views[VIEW_HARD_NEGATIVE] = out[2 * n :].reshape(n, k, -1)
    return views


def _templates(encoder: SentenceEncoder, anchors: int, rows: int) -> dict[str, Tensor]:
    """The ``template`` argument of a ``prompt`` encoder's pass over ``rows`` rows whose first
    ``anchors`` are the anchors (none for other poolers)."""
    prompt = getattr(encoder, "prompt", None)
    if prompt is None:
        return {}
    template = torch.full((rows,), prompt.second(), dtype=torch.long)
    template[:anchors] = 0
    return {"template": template}
