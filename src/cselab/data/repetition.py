"""ESimCSE's word repetition: a sentence's positive view with some of its subword tokens doubled.

ESimCSE (Wu et al., COLING 2022, Sec. 3.1) builds the positive of a sentence by repeating a few of
its tokens, so that the two sides of a positive pair differ in length (SimCSE's dropout views
share it, and the model learns to call sentences of equal length similar). cselab does what the
authors' released code does with ``--dup_type bpe`` (the setting of their ``run.sh``; read in
``caskcsg/sentemb``, ``ESimCSE/train.py``, ``prepare_features``), not what the paper's text
describes:

* the unit is the **subword token after tokenisation and truncation** to ``max_seq_len``; the
  length ``L`` counts ``[CLS]`` and ``[SEP]``;
* with ``c = int(dup_rate · L)``, nothing is repeated when ``c = 0``; otherwise the number of
  repeated tokens is ``k = randrange(min(10, c))``, uniform on ``0 .. min(10, c) - 1`` (so ``k``
  is never 10, and can be 0);
* the ``k`` positions are drawn without replacement from ``1 .. L-2`` (never ``[CLS]`` at 0 nor
  ``[SEP]`` at ``L-1``), and each chosen token is written twice in place;
* the repeated row is **not** truncated again: it may be up to 9 tokens longer than
  ``max_seq_len``.

The paper describes the operation on words with ``dup_len`` drawn from
``[0, max(2, int(dup_rate · len))]``; the code's other mode (``--dup_type word``) splits on spaces
with ``min(10, len, max(2, int(dup_rate · len)))``. See ``docs/objectives.md``.

The authors draw once, when the dataset is preprocessed (one epoch, so every sentence once).
cselab draws at every step from a ``random.Random`` seeded per row by the training layer from
``(seed, step, global row)``: the same draws on every rank, under GradCache and after a resume.
The draws use Python's ``randrange`` and ``sample`` as the authors' code does, so a row's
positions for a given seed are exactly those of their procedure (tested against a loop written
from it).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

#: The authors' cap on the number of repeated tokens (exclusive bound of ``randrange``).
MAX_REPEATED = 10


def repeated_positions(length: int, dup_rate: float, rng: random.Random) -> list[int]:
    """The sorted positions, in a row of ``length`` real tokens (``[CLS]`` and ``[SEP]``
    included), whose token is written twice (see the module doc)."""
    cap = int(dup_rate * length)
    if cap <= 0:
        return []
    count = rng.randrange(min(MAX_REPEATED, cap))
    return sorted(rng.sample(range(1, length - 1), count))


def repeat_tokens(
    inputs: Mapping[str, Tensor], dup_rate: float, rngs: Sequence[random.Random]
) -> dict[str, Tensor]:
    """The word-repeated copy of a right-padded batch of token ids.

    Args:
        inputs: ``input_ids`` and ``attention_mask`` ``(B, L)`` (and optionally
            ``token_type_ids``), padded on the right as :func:`~cselab.data.collate` pads.
        dup_rate: ESimCSE's ``dup_rate`` (BERT-base: 0.32), in ``[0, 1)``.
        rngs: one generator per row (row ``i`` draws from ``rngs[i]`` only).

    Returns:
        ``input_ids`` and ``attention_mask`` ``(B, L')`` on the inputs' device, padded on the right
        with id 0 to the longest repeated row (pad cells are masked, so their id does not matter),
        plus ``token_type_ids`` of zeros if the inputs had them (the authors' code sets them to 0).
    """
    ids = inputs["input_ids"].cpu()
    lengths = inputs["attention_mask"].sum(dim=1).tolist()
    rows: list[list[int]] = []
    for i, (length, rng) in enumerate(zip(lengths, rngs, strict=True)):
        tokens = ids[i, : int(length)].tolist()
        for pos in reversed(repeated_positions(int(length), dup_rate, rng)):
            tokens.insert(pos, tokens[pos])
        rows.append(tokens)
    width = max(len(r) for r in rows)
    out_ids = torch.zeros(len(rows), width, dtype=ids.dtype)
    mask = torch.zeros(len(rows), width, dtype=inputs["attention_mask"].dtype)
    for i, r in enumerate(rows):
        out_ids[i, : len(r)] = torch.tensor(r, dtype=ids.dtype)
        mask[i, : len(r)] = 1
    device = inputs["input_ids"].device
    out = {"input_ids": out_ids.to(device), "attention_mask": mask.to(device)}
    if "token_type_ids" in inputs:
        out["token_type_ids"] = torch.zeros_like(out_ids).to(device)
    return out
