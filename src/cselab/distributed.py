"""Data parallelism on ``torch.distributed``: the one gather helper and gradient averaging.

Launch with ``torchrun --nproc_per_node=K -m cselab train CONFIG``; a single process needs
nothing. Every objective gathers candidates with :func:`gather_with_grad`, which — unlike
SimCSE's ``dist.all_gather`` — lets gradients flow back to the rank that produced each row.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor


@dataclass
class DistInfo:
    """Where this process stands: ``rank`` of ``world_size``, and its ``local_rank``."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device_type: str) -> DistInfo:
    """Join the process group when launched by ``torchrun`` (``WORLD_SIZE`` > 1)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    return DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


class _GatherWithGrad(torch.autograd.Function):
    """All-gather whose backward returns to each rank the sum, over ranks, of the gradient of its
    own rows (every rank's loss may depend on every row)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:  # noqa: ANN001
        ctx.rank, ctx.world, ctx.n = dist.get_rank(), dist.get_world_size(), x.shape[0]
        out = [torch.empty_like(x) for _ in range(ctx.world)]
        dist.all_gather(out, x.contiguous())
        return torch.cat(out, dim=0)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:  # noqa: ANN001
        grad = grad.contiguous()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad[ctx.rank * ctx.n : (ctx.rank + 1) * ctx.n]


def gather_with_grad(x: Tensor) -> Tensor:
    """Concatenate ``x`` (``(n, ...)``, same ``n`` on every rank) over ranks along dim 0.

    Identity without an initialised process group. Gradients of the result flow back to the
    producing rank, summed over every rank's use of them.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return x
    return _GatherWithGrad.apply(x)


def average_gradients(parameters: list[torch.nn.Parameter]) -> None:
    """Average ``.grad`` over ranks in one flat all-reduce (what DDP's reducer does)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
