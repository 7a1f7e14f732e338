"""Several sentences in each row: a decoder's training forward with its padding not computed.

A batch of sentences is padded to its longest; a decoder trained on wiki sentences with
LLM2Vec's 128-token budget computes mostly padding (69% of the positions of batches of 128,
``docs/results/gpu_benchmark.md``), and every linear layer pays for it. Here the batch's
sentences are packed whole into rows of the batch's width, first fit by decreasing length, so
the backbone runs on about as many positions as there are real tokens. Each token keeps its
position within its sentence (position ids from 0) and attends only to its own sentence's
tokens: a block-diagonal boolean 4D mask, causal within the block for a causal decoder, bare
for one made bidirectional. The last hidden states are then put back on the padded grid, so
every pooler (mean, last token, weighted mean, a prompt left out) reads them exactly as it reads
the padded forward's. The two forwards compute the same function: equal up to roundoff
(``tests/test_packing.py``); rotary position embeddings depend on relative positions only, so a
left-padded row's shifted positions do not change it either. Dropout draws other masks (as
the BERT fast path's, :mod:`.unpad`).

This is ``transformers``' own forward, given ``position_ids`` and a prepared 4D mask (which
``masking_utils`` uses as given), so it holds for every decoder of the table of backbones with
a 4D mask (:data:`PACKED_ROW_MODEL_TYPES`) under SDPA attention, whose sliding window (if any)
is not shorter than the row. The layout is made on the host from the lengths, which on a GPU
is a host sync per forward: the encoder packs rows on the CPU with ``model.fast_path``, and on a
GPU only with ``model.pack_rows: true`` (:func:`mode`, :func:`packs_on`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from . import backbones

#: the architectures whose training forward can run on packed rows: the decoders of the table
#: of backbones that take a prepared 4D mask (:mod:`.backbones`, its one home)
PACKED_ROW_MODEL_TYPES = frozenset(
    k for k, b in backbones.BACKBONES.items() if b.is_decoder and b.mask_4d
)

log = logging.getLogger("cselab")


@dataclass(frozen=True)
class RowLayout:
    """Where each real token of a padded ``(N, L)`` batch goes in ``rows`` packed rows of
    ``width`` positions, and back.

    Attributes:
        source: ``(rows * width,)`` the flat padded position of each packed position; a
            position no sentence fills points at ``N * L``, one past the batch (a pad token
            appended there).
        segments: ``(rows, width)`` which sentence a position holds (its row in the batch
            plus 1; 0: not filled).
        positions: ``(rows, width)`` each token's position within its sentence.
        back: ``(N * L,)`` the flat packed position of each padded position (a padding
            position points at its sentence's first token: read by no pooler).
    """

    source: np.ndarray
    segments: np.ndarray
    positions: np.ndarray
    back: np.ndarray
    rows: int
    width: int

    @property
    def filled(self) -> float:
        """The share of the packed positions that hold a token."""
        return float((self.segments > 0).mean())


def row_layout(mask: np.ndarray) -> RowLayout:
    """The layout of the padded batch whose attention mask is ``mask`` (``(N, L)``, each row's
    real tokens contiguous, padded on either side): rows of width ``L``, filled first fit by
    decreasing length (ties in batch order, so the layout depends on the lengths only)."""
    n, width = mask.shape
    real = mask.astype(bool)
    lengths = real.sum(1)
    starts = np.where(lengths > 0, real.argmax(1), 0)  # the first real token of each row
    ends = np.where(lengths > 0, width - real[:, ::-1].argmax(1), 0)  # one past the last
    if (ends - starts != lengths).any():  # a hole would pack the wrong tokens, silently
        raise ValueError("row_layout: each row's real tokens must be contiguous in its mask")
    order = np.argsort(-lengths, kind="stable")
    row_of, at = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    used: list[int] = []  # the positions filled in each packed row so far
    for i in order:
        need = int(lengths[i])
        row = next((r for r, filled in enumerate(used) if filled + need <= width), len(used))
        if row == len(used):
            used.append(0)
        row_of[i], at[i] = row, used[row]
        used[row] += need
    rows = max(len(used), 1)
    # every real token: its sentence, its offset within it, its padded and packed positions
    sentence = np.repeat(np.arange(n), lengths)
    offset = np.arange(len(sentence)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    padded = sentence * width + starts[sentence] + offset
    packed = row_of[sentence] * width + at[sentence] + offset
    source = np.full(rows * width, n * width, dtype=np.int64)
    source[packed] = padded
    segments = np.zeros(rows * width, dtype=np.int64)
    segments[packed] = sentence + 1
    positions = np.zeros(rows * width, dtype=np.int64)
    positions[packed] = offset
    # padding: its sentence's first token (an empty row's: the last position, as good)
    back = np.minimum(np.repeat(row_of * width + at, width), rows * width - 1)
    back[padded] = packed
    return RowLayout(
        source, segments.reshape(rows, width), positions.reshape(rows, width), back, rows, width
    )


def supports(backbone: nn.Module) -> bool:
    """Whether ``backbone``'s training forward can run on packed rows (see the module doc):
    a decoder of :data:`PACKED_ROW_MODEL_TYPES` under SDPA attention."""
    config = getattr(backbone, "config", None)
    return (
        config is not None
        and getattr(config, "model_type", None) in PACKED_ROW_MODEL_TYPES
        and getattr(config, "_attn_implementation", None) == "sdpa"
    )


def mode(backbone: nn.Module, asked: bool | None, fast_path: bool, name: str) -> str:
    """Where ``backbone`` trains on packed rows, from ``model.pack_rows`` (``asked``) and
    ``model.fast_path``: ``"cpu"`` (``null`` with the fast path), ``"anywhere"`` (``true``: a
    GPU too), else ``"no"``; ``true`` where it cannot apply is said in one warning."""
    if supports(backbone) and asked is not False:
        return "anywhere" if asked else "cpu" if fast_path else "no"
    if asked:
        config = backbone.config
        log.warning(
            "model.pack_rows: %s (%s, %s attention) trains on padded rows: packed rows are for "
            "the SDPA decoders of %s",
            name, getattr(config, "model_type", "?"), getattr(config, "_attn_implementation", "?"),
            ", ".join(sorted(PACKED_ROW_MODEL_TYPES)),
        )  # fmt: skip
    return "no"


def packs_on(mode: str, device: torch.device | str) -> bool:
    """Whether a model of packing ``mode`` (:func:`mode`) packs its rows on ``device``: the
    layout is made from the lengths on the host, a sync on a GPU, so there only when asked."""
    return mode == "anywhere" or (mode == "cpu" and torch.device(device).type == "cpu")


def fits(backbone: nn.Module, width: int) -> bool:
    """Whether rows of ``width`` positions fit the backbone's sliding window (none: any)."""
    window = getattr(backbone.config, "sliding_window", None)
    return window is None or width <= window


def block_mask(segments: Tensor, causal: bool) -> Tensor:
    """The ``(R, 1, W, W)`` boolean mask of packed rows (``True``: attend): each position
    attends to the positions of its own sentence (those before it and itself, if ``causal``);
    an unfilled position attends to itself alone (its state is never read, and a query with
    no key would make SDPA's softmax NaN)."""
    width = segments.shape[1]
    same = (segments[:, :, None] == segments[:, None, :]) & (segments > 0)[:, None, :]
    index = torch.arange(width, device=segments.device)
    if causal:
        same &= index[:, None] >= index[None, :]
    return (same | (index[:, None] == index[None, :]))[:, None]


def packed_last_hidden(
    backbone: nn.Module, input_ids: Tensor, attention_mask: Tensor, pad_id: int
) -> Tensor:
    """The backbone's last hidden states ``(N, L, D)`` of the padded batch, computed on packed
    rows (:func:`row_layout`) and put back on the padded grid (padding positions hold a copy
    of their sentence's first token's state, which no pooler reads)."""
    n, width = input_ids.shape
    layout = row_layout(attention_mask.detach().cpu().numpy())
    device = input_ids.device

    def tensor(a: np.ndarray) -> Tensor:
        return torch.from_numpy(a).to(device)

    pad = torch.full((1,), pad_id, dtype=input_ids.dtype, device=device)
    ids = torch.cat([input_ids.reshape(-1), pad])[tensor(layout.source)]
    causal = bool(getattr(backbone.config, "is_causal", True))
    kwargs: dict[str, Any] = {
        "input_ids": ids.view(layout.rows, width),
        "attention_mask": block_mask(tensor(layout.segments), causal),
        "position_ids": tensor(layout.positions),
        **backbones.no_cache(backbone),
    }
    hidden = backbone(**kwargs, return_dict=True).last_hidden_state
    return hidden.reshape(layout.rows * width, -1)[tensor(layout.back)].view(n, width, -1)


__all__ = [
    "PACKED_ROW_MODEL_TYPES", "RowLayout", "block_mask", "fits", "mode", "packed_last_hidden",
    "packs_on", "row_layout", "supports",
]  # fmt: skip
