"""Data parallelism on ``torch.distributed``: the one gather helper, gradient averaging, and the
bookkeeping a multi-process run needs.

Launch with ``torchrun --nproc_per_node=K -m cselab train CONFIG`` (several nodes: ``torchrun
--nnodes=N --node_rank=R --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT ...``); a single process
needs nothing. ``docs/distributed.md`` explains what every objective means under data parallelism.

Design (why there is no ``DistributedDataParallel`` wrapper):

* every rank computes the loss of the **global** batch restricted to its own anchors; candidates
  (in-batch negatives, mixes, batch statistics) are gathered from all ranks with
  :func:`gather_with_grad`, whose backward sends each row's gradient — summed over every rank that
  used the row — back to the rank that produced it (SimCSE's ``dist.all_gather`` drops it);
* after backward, :func:`average_gradients` all-reduces the parameter gradients (what DDP's reducer
  does). Multi-pass steps (the off-dropout pass, GradCache's two passes) therefore need no
  ``no_sync`` bookkeeping, and the loss scaling is the one DDP assumes: the sum over ranks of the
  per-rank losses is ``world_size`` times the single-process loss, which the averaging divides out.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..model.devices import current_gpu_ids, gpu, is_gpu, make_current

#: Whether :func:`init_distributed` created the process group (and so should destroy it).
_OWNS_GROUP = False


@dataclass
class DistInfo:
    """Where this process stands: ``rank`` of ``world_size``, and its ``local_rank`` on the node."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def is_distributed() -> bool:
    """Whether a process group with more than one rank is active."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


#: ``train.dist_timeout_s``'s default: how long a rank may wait in a collective.
DEFAULT_TIMEOUT_S = 7200


def dist_from_env() -> DistInfo:
    """This process's place in the run before the process group forms: ``RANK``,
    ``WORLD_SIZE`` and ``LOCAL_RANK`` as ``torchrun`` sets them (a group formed already, as a
    caller may, is asked instead). The ranks do their own heavy work (downloads, tokenising,
    loading the model) knowing only this, so that no rank waits in a collective meanwhile."""
    if dist.is_available() and dist.is_initialized():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        return DistInfo(dist.get_rank(), dist.get_world_size(), local)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    rank = int(os.environ.get("RANK", "0"))
    return DistInfo(rank, world, int(os.environ.get("LOCAL_RANK", "0")))


def init_distributed(device: torch.device | str, timeout_s: float = DEFAULT_TIMEOUT_S) -> DistInfo:
    """Join the process group when launched by ``torchrun`` (``WORLD_SIZE`` > 1).

    Reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` from the
    environment (what ``torchrun`` sets, also across nodes). NCCL when ``device`` (the run's, as
    the plan resolved it) is a GPU (each process's own: ``LOCAL_RANK``), gloo otherwise. An already initialised group is reused.

    ``timeout_s`` (``train.dist_timeout_s``) is how long a collective may wait before the
    group aborts. The group forms after the heavy work of the start (downloads, tokenising,
    the model's load: each rank does its own, coordinated through the token cache's file lock),
    so no rank waits in one while another tokenises; rank 0 still works alone while the others
    wait in a barrier when it evaluates and saves ``best/``. PyTorch's default (10 minutes for
    NCCL) can be shorter than that, so the default here is two hours.
    """
    global _OWNS_GROUP
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 and not (dist.is_available() and dist.is_initialized()):
        return DistInfo()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    timeout = datetime.timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        if is_gpu(device):
            make_current(gpu(local_rank))
            dist.init_process_group(backend="nccl", device_id=gpu(local_rank), timeout=timeout)
        else:
            dist.init_process_group(backend="gloo", timeout=timeout)
        _OWNS_GROUP = True
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank)


def shutdown_distributed() -> None:
    """Destroy the process group if :func:`init_distributed` created it."""
    global _OWNS_GROUP
    if _OWNS_GROUP and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _OWNS_GROUP = False


def _is_nccl() -> bool:
    return dist.get_backend() == "nccl"


class _GatherWithGrad(torch.autograd.Function):
    """All-gather along dim 0 whose backward returns to each rank the sum, over ranks, of the
    gradient of its own rows (every rank's loss may depend on every row)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        world = dist.get_world_size()
        ctx.rank, ctx.world, ctx.n = dist.get_rank(), world, x.shape[0]
        x = x.contiguous()
        if _is_nccl():
            out = x.new_empty((world * x.shape[0], *x.shape[1:]))
            dist.all_gather_into_tensor(out, x)
            return out
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x)
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        grad = grad.contiguous()
        if _is_nccl():
            # Each rank receives only its own rows, summed over ranks.
            out = grad.new_empty((ctx.n, *grad.shape[1:]))
            dist.reduce_scatter_tensor(out, grad, op=dist.ReduceOp.SUM)
            return out
        # A copy: the incoming gradient may be shared with another branch of the graph, which an
        # in-place all-reduce would corrupt.
        grad = grad.clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad[ctx.rank * ctx.n : (ctx.rank + 1) * ctx.n]


def gather_with_grad(x: Tensor) -> Tensor:
    """Concatenate ``x`` (``(n, ...)``, the same ``n`` on every rank) over ranks along dim 0.

    Rank ``r``'s rows are at ``r·n : (r+1)·n`` of the result (so labels are offset by
    ``rank × local batch``). Identity without an initialised process group. Gradients of the
    result flow back to the producing rank, summed over every rank's use of them: with per-rank
    losses ``L_r``, rank ``r`` receives ``Σ_q ∂L_q/∂x_r``.

    Every rank must call it the same number of times in the same order (it is a collective, and
    so is its backward).
    """
    if not is_distributed():
        return x
    return _GatherWithGrad.apply(x)


def average_gradients(parameters: list[nn.Parameter], bucket_bytes: int = 64 << 20) -> None:
    """Average ``.grad`` over ranks (what DDP's reducer does), in flat buckets of about
    ``bucket_bytes``.

    Every rank must hold the same set of ``None`` gradients (true when all ranks run the same
    objective on the same model).
    """
    if not is_distributed():
        return
    world = dist.get_world_size()
    grads = [p.grad for p in parameters if p.grad is not None]
    by_dtype: dict[torch.dtype, list[Tensor]] = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for group in by_dtype.values():
        bucket: list[Tensor] = []
        size = 0
        for g in group:
            bucket.append(g)
            size += g.numel() * g.element_size()
            if size >= bucket_bytes:
                _all_reduce_mean(bucket, world)
                bucket, size = [], 0
        if bucket:
            _all_reduce_mean(bucket, world)


class OverlappedReducer:
    """Averages gradients over ranks while the backward runs, bucket by bucket, as DDP's reducer
    does (Li et al. 2020, "PyTorch Distributed", Sec. 3.2.3).

    The parameters are cut into buckets of about ``bucket_bytes`` in reverse order (the order in
    which the backward produces their gradients). A hook on each parameter
    (``register_post_accumulate_grad_hook``) marks it ready once its gradient of this backward is
    accumulated; when every parameter of the next bucket is ready, the bucket is flattened and
    its all-reduce started asynchronously, in bucket order on every rank (collectives must be
    issued in the same order everywhere, whatever order the hooks fire in). :meth:`finish`
    (called by the optimiser step) reduces what is left (a bucket holding a parameter without a
    gradient this step), waits for the started all-reduces, and writes the means back. The
    sums are elementwise, so the result is exactly :func:`average_gradients`'.

    It assumes one backward per step: GradCache (several backward calls that accumulate into
    the same gradients) runs with ``enabled`` off, and then :meth:`finish` reduces everything
    after the backward, as :func:`average_gradients` does.
    """

    def __init__(self, parameters: list[nn.Parameter], bucket_bytes: int = 25 << 20) -> None:
        self.params = [p for p in parameters if p.requires_grad]
        self.world = dist.get_world_size()
        self.enabled = True
        self.buckets: list[list[nn.Parameter]] = []
        self.where: dict[int, int] = {}
        size, bucket = 0, []
        for p in reversed(self.params):
            if bucket and (size >= bucket_bytes or p.dtype != bucket[0].dtype):
                self.buckets.append(bucket)
                bucket, size = [], 0
            bucket.append(p)
            size += p.numel() * p.element_size()
        if bucket:
            self.buckets.append(bucket)
        for b, ps in enumerate(self.buckets):
            for p in ps:
                self.where[id(p)] = b
        #: buckets started during the last backward (the overlap), and in all
        self.started_in_backward = 0
        self._reset()
        self._hooks = [p.register_post_accumulate_grad_hook(self._ready) for p in self.params]

    def _reset(self) -> None:
        self._pending = [len(b) for b in self.buckets]
        self._next = 0  # the next bucket to start, in order
        self._work: list[tuple[Any, Tensor, list[Tensor]]] = []

    def _ready(self, p: nn.Parameter) -> None:
        if not self.enabled:
            return
        b = self.where[id(p)]
        self._pending[b] -= 1
        while self._next < len(self.buckets) and self._pending[self._next] == 0:
            self._start(self._next)
            self.started_in_backward += 1
            self._next += 1

    def _start(self, b: int) -> None:
        grads = [p.grad for p in self.buckets[b] if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        self._work.append((dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True), flat, grads))

    def finish(self) -> None:
        """Start the buckets not started yet, wait for all, write ``sum / world`` back."""
        while self._next < len(self.buckets):
            self._start(self._next)
            self._next += 1
        for work, flat, grads in self._work:
            work.wait()
            flat.div_(self.world)
            offset = 0
            for g in grads:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()
        self._reset()

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()


def _all_reduce_mean(grads: list[Tensor], world: int) -> None:
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat.div_(world)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def average_over_ranks(t: Tensor) -> Tensor:
    """Mean of ``t`` over ranks (a copy; ``t`` itself without a process group)."""
    if not is_distributed():
        return t
    t = t.detach().clone()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t / dist.get_world_size()


@torch.no_grad()
def broadcast_module(module: nn.Module, src: int = 0) -> None:
    """Copy ``src``'s parameters and buffers to every rank (what DDP does when it wraps a model),
    so that a freshly initialised head cannot differ between ranks."""
    if not is_distributed():
        return
    for tensor in [*module.parameters(), *module.buffers()]:
        dist.broadcast(tensor.data, src=src)


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order; ``[obj]`` without a process group."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` (picklable) on every rank; ``obj`` without a process group."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def check_same_on_all_ranks(value: Any, what: str) -> None:
    """Raise on every rank if ranks disagree on ``value`` (e.g. the step they resumed from: a
    rank that cannot see the checkpoint would otherwise start over while the others resume)."""
    values = all_gather_objects(value)
    if any(v != values[0] for v in values):
        per_rank = ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(values))
        raise RuntimeError(f"ranks disagree on {what} ({per_rank})")


def barrier() -> None:
    """Wait for every rank (no-op without a process group)."""
    if dist.is_available() and dist.is_initialized():
        if _is_nccl() and (ids := current_gpu_ids()):
            dist.barrier(device_ids=ids)
        else:
            dist.barrier()
