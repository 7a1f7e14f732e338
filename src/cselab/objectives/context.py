"""What an objective may know beyond the embeddings: the run's context and the per-step cache.

:class:`ObjectiveContext` is built once per run (by the trainer, or by ``cselab.st`` per call) and says
where this process stands in a data-parallel run: the one gather helper, the rank, the number of
ranks, this rank's offset in the gathered batch, and the generator that generated negatives draw
from. With one process the gather is the identity and the offset 0, so single-process and DDP
runs share one code path, and no objective ever imports ``torch.distributed``.

:class:`StepCache` lives for one call of an objective, i.e. one training step. It holds what the
parts of one objective share within that step: each view's all-gather (in-batch negatives, mixed
negatives, DCL and BarlowTwins of the same view need one gather, not four) and each random draw
(both directions of a symmetric loss must see the same Gaussian vectors and mixing partners).
:class:`~cselab.objectives.infonce.InfoNCE` creates it at the top of ``forward`` and hands it to
every part (negative sources through :attr:`Pair.cache <cselab.objectives.base.Pair>`, transforms
and auxiliary terms as an argument); a part called on its own gets a fresh one.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..core.datakind import SENTENCES, DataKind


def _identity(x: Tensor) -> Tensor:
    return x


@dataclass
class ObjectiveContext:
    """Where this process stands in the (possibly distributed) batch.

    Attributes:
        gather: all-gather over ranks along dim 0 that carries gradients back to the producing
            rank (identity for one process).
        rank: this process's rank.
        world_size: number of processes.
        offset: index of this rank's first row in the gathered batch (the trainer shards the
            global batch into equal contiguous slices, :func:`cselab.data.shard_bounds`).
        generator: the generator generated negatives draw from (``None``: the global RNG). The
            task re-seeds it from ``(seed, step)`` before every step, identically on every rank,
            so generated vectors are the same on all ranks and in a resumed run.
        draw_width: draw at least this many coordinates in :meth:`normal` and return the
            first ``dim`` (``None``: exactly ``dim``). Matryoshka's prefix objectives
            (:mod:`cselab.objectives.matryoshka`) set it to the full width, so that with the
            generator rewound the vectors drawn at a prefix are the prefixes of the vectors
            drawn at the full width.
    """

    gather: Callable[[Tensor], Tensor] = _identity
    rank: int = 0
    world_size: int = 1
    offset: int = 0
    generator: torch.Generator | None = None
    draw_width: int | None = None

    def global_rows(self, local: Tensor) -> int:
        """``N``, the global batch: the local rows times the number of ranks (equal shards)."""
        return local.shape[0] * max(1, self.world_size)

    def local_rows(self, local: Tensor) -> Tensor:
        """Global indices ``offset .. offset + B - 1`` of this rank's rows (a constant: made
        once per batch size, offset and device, :func:`constant`)."""
        b, offset, device = local.shape[0], self.offset, local.device
        return constant(
            ("local_rows", b, offset), device, lambda: torch.arange(b, device=device) + offset
        )

    def normal(
        self, rows: int, dim: int, like: Tensor, mean: float = 0.0, std: float = 1.0
    ) -> Tensor:
        """``rows × dim`` i.i.d. ``N(mean, std²)`` draws from :attr:`generator`, no gradient.

        Used for batch-level quantities (Gaussian negatives, BarlowTwins padding, the noise
        ablation): every rank draws the full set from the identically seeded generator, so all
        ranks see the same vectors and the draws do not depend on the number of ranks.
        """
        gen = self.generator
        device = gen.device if gen is not None else like.device
        width = max(dim, self.draw_width or dim)
        draws = torch.randn(rows, width, generator=gen, device=device, dtype=torch.float32)
        draws = draws[:, :dim]
        return (draws * std + mean).to(device=like.device, dtype=like.dtype)


#: :func:`constant`'s tensors; bounded, since batch sizes vary little within a run
_CONSTANTS: dict[Hashable, Tensor] = {}
_MAX_CONSTANTS = 256


def constant(key: Hashable, device: torch.device, build: Callable[[], Tensor]) -> Tensor:
    """``build()``, made once per ``(key, device)`` and reused: an index or mask that depends
    only on shapes and offsets (the diagonal of the in-batch columns, this rank's rows), so a
    step does not rebuild it (host work a captured or compiled step cannot hide). ``key`` names
    every value ``build`` reads. The tensor is made outside inference mode (it may be saved for
    a backward) and must never be written to."""
    full = (key, str(device))
    hit = _CONSTANTS.get(full)
    if hit is None:
        if len(_CONSTANTS) >= _MAX_CONSTANTS:
            _CONSTANTS.clear()
        with torch.inference_mode(False), torch.no_grad():
            hit = _CONSTANTS[full] = build()
    return hit


class StepCache:
    """Values computed once per objective call and shared by its parts (see the module doc)."""

    def __init__(self) -> None:
        # Keyed by the tensor's identity; the tensor itself is kept so its id cannot be reused
        # by another tensor while the cache lives.
        self._gathers: dict[int, tuple[Tensor, Tensor]] = {}
        self._draws: dict[Hashable, Tensor] = {}

    def gather(self, ctx: ObjectiveContext, local: Tensor) -> Tensor:
        """``ctx.gather(local)``, once per step for each tensor."""
        hit = self._gathers.get(id(local))
        if hit is None:
            hit = self._gathers[id(local)] = (local, ctx.gather(local))
        return hit[1]

    def draw(self, key: Hashable, draw: Callable[[], Tensor]) -> Tensor:
        """``draw()`` once per step for ``key`` (e.g. shared by both directions)."""
        if key not in self._draws:
            self._draws[key] = draw()
        return self._draws[key]


@dataclass(frozen=True)
class PrepareContext:
    """What an objective's host-side preparation of one step may know
    (:meth:`~cselab.objectives.base.Objective.prepare`).

    Attributes:
        step_seed: the step's seed, the same on every rank, under GradCache and after a resume
            (the training layer's ``objective_seed(seed, step)``); a part derives each row's
            stream from it and the row's global index.
        offset: index of this rank's first row in the global batch.
        kind: the kind of the training data.
    """

    step_seed: int
    offset: int = 0
    kind: DataKind = SENTENCES
