"""Random state: the seeds of a run, and snapshots of the generators a step draws from.

Four streams, each with its own seed (so none depends on how many numbers another consumed):

* **dropout** — the global torch generators (CPU, and the CUDA device's), seeded per rank by
  :func:`dropout_seed` after the model is built;
* **generated negatives** — the objective's own generator, re-seeded before every step from
  :func:`objective_seed` (identical on every rank, and in a resumed run);
* **data order** — :class:`cselab.data.BatchOrder`'s per-epoch permutation;
* **token-level views** an objective makes on the host (ESimCSE's word repetition, MNTP's
  masking) — one generator per global row of a step, seeded by the objective's own module from
  :func:`objective_seed` and the row (``esimcse.repetition_seed``, ``mntp.masking_seed``).

:class:`RNGState` is the one snapshot of them: GradCache captures the torch generators before a
chunk and restores them before the chunk's replay; a checkpoint stores each rank's full state
(torch, CUDA, Python, NumPy) and a resumed rank restores it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..core.devices import GPU_TYPE
from ..model.devices import (
    gpu_available,
    gpu_in_use,
    gpu_index,
    gpu_rng_state,
    is_gpu,
    set_gpu_rng_state,
)


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def dropout_seed(seed: int, rank: int) -> int:
    """Seed of rank ``rank``'s global RNGs (dropout). Rank 0 keeps ``seed``, so a single process
    is unchanged; other ranks get their own streams, as the rows of one process's batch would."""
    return seed + 1_000_003 * rank


def objective_seed(seed: int, step: int) -> int:
    """Seed of the objective's generator at ``step`` (identical on every rank).

    Generated negatives, mixing partners and noise are drawn from ``ctx.generator``, re-seeded
    from ``(seed, step)`` before each step: the draws are the same on every rank, do not depend on
    the number of ranks or on GradCache, and a resumed run draws exactly what an uninterrupted
    one would.
    """
    return (seed * 1_000_033 + step * 7_919 + 0x5EED) % (2**63 - 1)


#: ``(tensors, json-able metadata)``: how an :class:`RNGState` travels in a checkpoint.
RNGRecord = tuple[dict[str, Tensor], dict[str, Any]]


@dataclass
class RNGState:
    """A snapshot of the generators: torch's CPU one, one CUDA device's, and optionally
    Python's and NumPy's (which a forward pass never draws from, but a resumed run must)."""

    cpu: Tensor
    cuda: Tensor | None = None
    cuda_device: int | None = None
    python: Any = None
    numpy: Any = None

    @classmethod
    def capture(cls, device: torch.device | str | None = None, *, host: bool = False) -> RNGState:
        """Snapshot the CPU generator, the CUDA generator of ``device`` (default: the current
        CUDA device once CUDA is in use), and with ``host`` Python's and NumPy's."""
        state = cls(cpu=torch.get_rng_state())
        device = torch.device(device) if device is not None else gpu_in_use()
        if is_gpu(device):
            index = gpu_index(device)
            state.cuda, state.cuda_device = gpu_rng_state(index), index
        if host:
            state.python, state.numpy = random.getstate(), np.random.get_state()
        return state

    def restore(self) -> None:
        """Put the generators back to this snapshot."""
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            set_gpu_rng_state(self.cuda, self.cuda_device)
        if self.python is not None:
            random.setstate(self.python)
        if self.numpy is not None:
            np.random.set_state(self.numpy)

    def to_record(self) -> RNGRecord:
        """Tensors and JSON metadata for a checkpoint."""
        tensors = {"torch": self.cpu}
        if self.cuda is not None:
            tensors[GPU_TYPE] = self.cuda  # the record's key: the device type
        py, npst = self.python, self.numpy
        meta = {
            "python": None if py is None else [py[0], list(py[1]), py[2]],
            "numpy": None if npst is None else [npst[0], npst[1].tolist(), *npst[2:]],
        }
        return tensors, meta

    @classmethod
    def from_record(cls, record: RNGRecord, device: torch.device | str | None = None) -> RNGState:
        """The state a checkpoint record describes; its CUDA state goes to ``device`` (the
        run's GPU; default: the current CUDA device)."""
        tensors, meta = record
        cuda = tensors.get(GPU_TYPE) if gpu_available() else None
        device = torch.device(device) if device is not None else None
        index = None
        if cuda is not None:
            index = gpu_index(device if is_gpu(device) else None)
        py, npst = meta.get("python"), meta.get("numpy")
        return cls(
            cpu=tensors["torch"],
            cuda=cuda,
            cuda_device=index,
            python=None if py is None else (py[0], tuple(py[1]), py[2]),
            numpy=None if npst is None else (npst[0], np.asarray(npst[1], np.uint32), *npst[2:]),
        )
