"""One training step as one function: ``train_step(task, optim, batch, chunk) -> losses``.

The step reads its batch (already on the device) and changes only the parameters, the
optimiser's state and the task's state (a momentum encoder), with no host sync: the shape a
CUDA graph or ``torch.compile`` can take whole. The trainer, the benchmarks and any caller of
GradCache (:func:`~.gradcache.cached_forward_backward`, when ``chunk`` is set) go through here,
so the sequence forward → backward → update → ``after_step`` is written once.
"""

from __future__ import annotations

import os

import torch

from ..objectives import LossTerms, total_loss
from .gradcache import VERIFY_ENV, cached_forward_backward
from .optim import Optimization
from .task import Batch, Task


def forward_backward(task: Task, optim: Optimization, batch: Batch, chunk: int = 0) -> LossTerms:
    """The loss terms of ``batch``, with their gradients accumulated into the parameters: in
    chunks of ``chunk`` rows through GradCache (its checks on with ``CSELAB_GRADCACHE_VERIFY``),
    else in one pass (the loss scaled for fp16)."""
    if task.graphs:
        # One generation of CUDA-graph memory per step, begun here: without the mark,
        # torch.compile starts one at any encoder call with no backward pending, and GradCache's
        # first-pass chunks (no backward of their own) would overwrite each other's outputs
        torch.compiler.cudagraph_mark_step_begin()
    if chunk:
        verify = os.environ.get(VERIFY_ENV, "") not in ("", "0")
        return cached_forward_backward(task, batch, chunk, scale=optim.scale, verify=verify)
    terms = task(batch)
    optim.scale(total_loss(terms)).backward()
    return terms


def update(task: Task, optim: Optimization) -> None:
    """The optimiser's step (average over ranks, clip, AdamW, schedule), then the task's state
    that follows the new weights (a momentum encoder)."""
    optim.step()
    task.after_step()


def train_step(task: Task, optim: Optimization, batch: Batch, chunk: int = 0) -> LossTerms:
    """One optimiser step on ``batch``; returns its loss terms (on the device, not synced)."""
    terms = forward_backward(task, optim, batch, chunk)
    update(task, optim)
    return terms


__all__ = ["forward_backward", "train_step", "update"]
