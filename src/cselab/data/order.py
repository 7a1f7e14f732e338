"""The batch order: a seeded permutation per epoch, resumable, and a rank's slice of each batch.

:class:`BatchOrder` draws a fresh random permutation per epoch (no length bucketing: grouping
similar lengths would let length leak into which sentences are in-batch negatives),
``drop_last``, and can resume from ``(epoch, batch index)``. :func:`collate` pads a batch
dynamically to its longest row.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from ..core.errors import CorpusError
from ..core.prompts import exclude_prompt


class BatchOrder:
    """Random batches over ``n`` items, one permutation per epoch, ``drop_last``, resumable.

    The permutation of epoch ``e`` depends only on ``(seed, e)``, so a resumed run sees exactly
    the batches an uninterrupted one would. Under data parallelism every rank draws the same
    global batch and takes its own contiguous slice (no overlap between ranks).
    """

    def __init__(
        self, n: int, batch_size: int, seed: int, *, source: str = "", unit: str = "sentences"
    ) -> None:
        """``source`` names the training data in the error of a too small one (the file, as
        ``data.train_file`` gives it); ``unit`` is what ``n`` counts (``sentences``, ``pairs``)."""
        if n < batch_size:
            what = f"{n} {unit.removesuffix('s') if n == 1 else unit}"
            raise CorpusError(
                f"{source + ': ' if source else ''}the training data has {what}, fewer than one "
                f"batch of {batch_size} (train.batch_size)"
            )
        self.n = n
        self.batch_size = batch_size
        self.seed = seed

    @property
    def batches_per_epoch(self) -> int:
        return self.n // self.batch_size

    def epoch_order(self, epoch: int) -> np.ndarray:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.n, generator=g).numpy()

    def batch(self, epoch: int, index: int, order: np.ndarray | None = None) -> np.ndarray:
        order = self.epoch_order(epoch) if order is None else order
        return order[index * self.batch_size : (index + 1) * self.batch_size]


def shard_bounds(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """``(start, end)`` of rank ``rank``'s contiguous, equal slice of a global batch of ``n``.

    The one definition of a rank's rows: the data slice (:func:`shard`) and the objective's
    ``ctx.offset`` both come from it. A batch the ranks cannot split equally is a
    ``ValueError`` here; the run's assembly refuses such a config first, naming its key.
    """
    if n % world_size:
        raise ValueError(f"a batch of {n} cannot be split equally over {world_size} ranks")
    per = n // world_size
    return rank * per, (rank + 1) * per


def shard(indices: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """This rank's contiguous slice of a global batch."""
    start, end = shard_bounds(len(indices), rank, world_size)
    return indices[start:end]


def collate(
    rows: Sequence[np.ndarray], pad_id: int, prompt_length: int | None = None
) -> dict[str, Tensor]:
    """Pad rows to the longest one: ``input_ids`` and ``attention_mask`` of shape ``(B, L)``;
    with ``prompt_length`` (rows that begin with a prompt left out of the pooling) also the
    ``pool_mask`` without the first ``prompt_length`` tokens of each row
    (:func:`~cselab.core.prompts.exclude_prompt`)."""
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
        mask[i, : len(r)] = 1
    out = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}
    if prompt_length is not None:
        out["pool_mask"] = exclude_prompt(out["attention_mask"], prompt_length)
    return out


def bucket_width(width: int, multiple: int) -> int:
    """``width`` rounded up to a multiple of ``multiple``: the padded widths a fixed-shape
    (CUDA-graph) step sees are then few (``max_seq_len / multiple`` at most), so each is
    captured once and replayed."""
    return -(-width // multiple) * multiple


def pad_to_width(inputs: dict[str, Tensor], multiple: int, pad_id: int) -> dict[str, Tensor]:
    """Right-pad every token column of a batch (``(B, L)``, or ``(B, K, L)`` for hard
    negatives) to :func:`bucket_width` (ids with ``pad_id``, masks and token types with 0): the
    padding is masked, so the sentence vectors do not change."""
    out = {}
    for key, value in inputs.items():
        if value.dim() < 2:  # e.g. the prompt pooler's template id per row
            out[key] = value
            continue
        extra = bucket_width(value.shape[-1], multiple) - value.shape[-1]
        fill = pad_id if key.endswith("input_ids") else 0
        out[key] = torch.nn.functional.pad(value, (0, extra), value=fill) if extra else value
    return out
