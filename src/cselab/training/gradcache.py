"""GradCache: the contrastive batch of a big GPU on a small one (Gao et al. 2021, "Scaling Deep
Contrastive Learning Batch Size under Memory Limited Setup").

A contrastive loss couples every sentence of the batch, so the batch cannot simply be split into
gradient-accumulation micro-batches. It can, however, be split at the embeddings:

1. **Encode** the batch in chunks of ``chunk_size`` sentences and keep only the embeddings
   (``(B, D)`` per view); no chunk's graph outlives its chunk (under ``no_grad`` on CPU; on GPUs
   and for compiled encoders the graph is built and dropped at once, so that both passes run the
   same code — see ``first_pass_graph``).
2. **Loss**: make the cached embeddings leaves, compute the objective on the whole batch and
   backpropagate to them: ``∂L/∂z`` for every row (under data parallelism the objective gathers
   the other ranks' embeddings as usual, and its backward all-reduces as usual).
3. **Re-encode** chunk by chunk with a graph and backpropagate ``∂L/∂z`` of the chunk's rows into
   the parameters; the gradients accumulate to exactly those of the full-batch graph.

Step 3 must recompute *the same* embeddings as step 1, so each chunk's random state is saved
before its first encoding and restored before its re-encoding: the CPU generator and the CUDA
generator of the model's device, which between them drive ``nn.Dropout`` and the attention
dropout inside scaled-dot-product attention (otherwise the positive pair would change between the
passes). The off-dropout pass is deterministic, and is replayed in the same order anyway. After the
step the generators are set to where the first pass left them, so the random stream continues as
if every chunk had been encoded once.

Nothing in the chunk loops reads the device: a CUDA generator's state (seed and offset) lives
on the host, so its snapshot and replay are host operations; the cached embeddings and their
gradients stay on the model's device (``tests/test_gpu_path.py`` counts no sync in a cached step;
only ``verify`` reads a difference back, once per chunk). The replay is not the plain step's
masks: the plain step draws one dropout mask for the whole batch, GradCache one per chunk, so
with dropout the two steps differ as two draws do (without dropout, by roundoff only).

Peak activation memory is that of one chunk (``3·chunk_size`` rows with the off-dropout view,
``2·chunk_size`` without; ``(2+K)·chunk_size`` for pairs with ``K`` hard negatives, whose
:class:`~cselab.data.inputs.StepInputs` carry every column on the row's index) instead of the batch; the price is a second forward pass (about a third
more compute for a forward+backward). Generated negatives (Gaussian, mixing partners, noise,
BarlowTwins padding) are drawn once per step, because the objective runs once.

:func:`cached_forward_backward` takes the step's :class:`~cselab.training.task.Task`, the batch
and the chunk size; the trainer calls it instead of ``task(batch)`` + backward when
``train.cache_chunk_size`` is set.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..data.inputs import StepInputs
from ..model.devices import is_gpu
from ..objectives import LossTerms, total_loss
from .rng import RNGState
from .task import Batch, Task

#: Set to ``1`` to check, at every GradCache step, that the re-encoded embeddings equal the cached
#: ones (a host sync per chunk; for debugging a new model or kernel, not for production runs).
VERIFY_ENV = "CSELAB_GRADCACHE_VERIFY"


class ReplayMismatch(RuntimeError):
    """The second GradCache pass did not reproduce the embeddings of the first."""


def chunk_bounds(n: int, chunk_size: int) -> list[tuple[int, int]]:
    """``[(start, end), ...]`` covering ``range(n)`` in pieces of at most ``chunk_size`` rows."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return [(s, min(s + chunk_size, n)) for s in range(0, n, chunk_size)]


def cached_forward_backward(
    task: Task,
    batch: Batch,
    chunk_size: int,
    *,
    scale: Callable[[Tensor], Tensor] | None = None,
    verify: bool = False,
    verify_atol: float = 1e-5,
    first_pass_graph: bool | None = None,
) -> LossTerms:
    """One GradCache forward/backward of ``task`` on ``batch``; gradients accumulate into the
    parameters' ``.grad`` exactly as ``total_loss(task(batch)).backward()`` would.

    Args:
        task: the step's computation (:meth:`Task.encode` per chunk, :meth:`Task.losses` once
            on the whole local batch, with the task's context and autocast, as without caching).
        batch: this rank's batch.
        chunk_size: sentences encoded at once (the last chunk may be smaller).
        scale: applied to the summed loss before its backward (``GradScaler.scale`` for fp16);
            the embedding gradients, and so the parameter gradients, carry the scale.
        verify: check that the second pass reproduces the cached embeddings (within
            ``verify_atol``), raising :class:`ReplayMismatch` otherwise. Costs a host sync.
        first_pass_graph: run the first pass with autograd on (each chunk's graph is dropped at
            once, so peak memory is still one chunk's), making both passes execute the very same
            code: a ``torch.compile``'d encoder runs the same compiled training graph (and so the
            same random-number code), and SDPA picks its kernel under the same conditions.
            ``None`` (default): on for CUDA and compiled encoders, off for eager CPU (where the
            ``no_grad`` first pass is tested to replay exactly).

    Returns:
        The objective's loss terms (detached), the same values as without caching.
    """
    batch = task.prepare(batch)  # once per step, on the whole batch (ESimCSE's repeated rows)
    bounds = chunk_bounds(len(batch), chunk_size)
    device = batch.inputs.device
    if first_pass_graph is None:
        first_pass_graph = is_gpu(device) or _is_compiled(task.encoder)

    # Pass 1: embeddings only, remembering where each chunk's random stream started.
    states: list[RNGState] = []
    pieces: dict[str, list[Tensor]] = {}
    with torch.enable_grad() if first_pass_graph else torch.no_grad():
        for start, end in bounds:
            states.append(RNGState.capture(device))
            # Only detached embeddings leave the helper: with first_pass_graph, the chunk's graph
            # is freed before the next chunk is encoded.
            for name, value in _encode_detached(task, batch.rows(start, end)):
                pieces.setdefault(name, []).append(value)

    # The objective on the whole batch, differentiated down to the cached embeddings.
    cached = {name: torch.cat(parts).requires_grad_(True) for name, parts in pieces.items()}
    terms = task.losses(cached, batch.step)
    loss = total_loss(terms)
    (scale(loss) if scale is not None else loss).backward()
    after_objective = RNGState.capture(device)
    grads = {name: z.grad for name, z in cached.items()}
    if all(g is None for g in grads.values()):
        return {k: v.detach() for k, v in terms.items()}

    # Pass 2: replay each chunk with its saved random state and push ∂L/∂z into the parameters.
    try:
        for (start, end), state in zip(bounds, states, strict=True):
            state.restore()
            # only the views the loss differentiates: the momentum view has no gradient, and the
            # views after the dropout pass draw no random numbers, so leaving them out keeps the
            # replay's masks those of pass 1
            views = task.encode(
                batch.rows(start, end), names={n for n, g in grads.items() if g is not None}
            )
            outputs, output_grads = [], []
            for name, value in views.items():
                g = grads.get(name)
                if g is None:
                    continue
                if verify:
                    _check_replay(name, start, end, value, cached[name], verify_atol)
                outputs.append(value)
                output_grads.append(g[start:end].to(value.dtype))
            if outputs:
                torch.autograd.backward(outputs, output_grads)
            del views, outputs, output_grads
    finally:
        # Continue the random stream where the first pass and the objective left it.
        after_objective.restore()
    return {k: v.detach() for k, v in terms.items()}


def _encode_detached(task: Task, rows: StepInputs) -> list[tuple[str, Tensor]]:
    return [(name, value.detach()) for name, value in task.encode(rows).items()]


def _is_compiled(module: nn.Module) -> bool:
    return hasattr(module, "_orig_mod")  # torch.compile's OptimizedModule


def _check_replay(
    name: str, start: int, end: int, new: Tensor, cached: Tensor, atol: float
) -> None:
    old = cached.detach()[start:end]
    diff = (new.detach().float() - old.float()).abs().max().item()
    if not diff <= atol:
        raise ReplayMismatch(
            f"GradCache re-encoding of view '{name}' rows {start}:{end} differs from the first "
            f"pass by {diff:.3g} (> {atol:g}): the forward pass is not reproducible from the "
            "saved CPU/CUDA random state (a non-deterministic kernel, or a random source other "
            "than the global generators)"
        )
