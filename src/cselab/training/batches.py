"""The ready batches of a run: this rank's rows of each step, prepared and on the device.

:class:`StepBatches` is what the trainer iterates (``batches(start)``: the batches from step
``start`` on, a resume included). On a GPU they are made ``prefetch`` steps ahead on a
background thread (:class:`~cselab.data.prefetch.Prefetch`), so that collating the next batch
overlaps the device's work on this one; the draws of a step's host-side views are seeded by the
step, so the batches are the same either way.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ..data import BatchOrder, TokenizedCorpus, shard
from ..data.pairs import TokenizedPairs
from ..data.prefetch import Prefetch
from .distributed import DistInfo
from .task import Batch, Task


class StepBatches:
    """Batches of ``corpus`` in ``order`` for this rank (``dist``), prepared by ``task``
    (host-side views) and copied to ``device``; padded to multiples of ``width_multiple`` tokens
    when set (the fixed shapes of a ``reduce-overhead`` compiled step); ``prefetch``: how many
    batches are made ahead on a background thread (0: none, each made when asked for)."""

    def __init__(
        self,
        corpus: TokenizedCorpus | TokenizedPairs,
        order: BatchOrder,
        task: Task,
        device: torch.device,
        dist: DistInfo,
        pad_id: int,
        width_multiple: int | None = None,
        prefetch: int = 0,
    ) -> None:
        self.corpus, self.order, self.task, self.device = corpus, order, task, device
        self.dist, self.pad_id, self.width_multiple = dist, pad_id, width_multiple
        self.prefetch = prefetch
        self._order: tuple[int, Any] = (-1, None)  # (epoch, permutation) of the last batch

    def batch(self, step: int) -> Batch:
        """This rank's slice of the global batch of ``step``, on the device."""
        epoch, index = divmod(step, self.order.batches_per_epoch)
        if self._order[0] != epoch:
            self._order = (epoch, self.order.epoch_order(epoch))
        rows = shard(
            self.order.batch(epoch, index, self._order[1]), self.dist.rank, self.dist.world_size
        )
        inputs = self.corpus.step_inputs(rows, self.pad_id)  # sentences or pairs alike
        # Host-side views (ESimCSE's word-repeated positive, MNTP's masked copy) are built here,
        # on the CPU tensors, before the copy: on a GPU the step then reads no device value back.
        inputs = self.task.prepare(Batch(step, inputs)).inputs
        if self.width_multiple:  # a few fixed shapes for the compiled (CUDA graph) step
            inputs = inputs.pad_to_width(self.width_multiple, self.pad_id)
        tokens = inputs.token_counts()  # on the host: the step reads nothing back for it
        return Batch(step, inputs.to(self.device), prepared=True, tokens=tokens)

    def __call__(self, start: int) -> Iterator[Batch]:
        """The batches of steps ``start``, ``start + 1``, ... (as many as asked for; close the
        iterator when done, which stops a prefetching thread)."""
        batches = self._from(start)
        return Prefetch(batches, self.prefetch) if self.prefetch else batches

    def _from(self, step: int) -> Iterator[Batch]:
        while True:
            yield self.batch(step)
            step += 1


__all__ = ["StepBatches"]
