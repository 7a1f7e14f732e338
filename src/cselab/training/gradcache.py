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

Peak activation memory is that of one chunk (``3·chunk_size`` rows with the off-dropout view,
``2·chunk_size`` without) instead of the batch; the price is a second forward pass (about a third
more compute for a forward+backward). Generated negatives (Gaussian, mixing partners, noise,
BarlowTwins padding) are drawn once per step, because the objective runs once.

:func:`cached_forward_backward` is the building block (an encoder, an objective, a batch);
:func:`gradcache_step` plugs it into :class:`~cselab.training.trainer.Trainer` as its ``step_fn``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from ..objectives.base import LossTerms, Objective, ObjectiveContext, total_loss
from .views import compute_views

if TYPE_CHECKING:  # pragma: no cover
    from .trainer import Trainer

#: Set to ``1`` to check, at every GradCache step, that the re-encoded embeddings equal the cached
#: ones (a host sync per chunk; for debugging a new model or kernel, not for production runs).
VERIFY_ENV = "CSELAB_GRADCACHE_VERIFY"


class ReplayMismatch(RuntimeError):
    """The second GradCache pass did not reproduce the embeddings of the first."""


# --------------------------------------------------------------------------------------------
# Random state
# --------------------------------------------------------------------------------------------


@dataclass
class RNGState:
    """The generators a forward pass may draw from: the CPU one and, on GPU, the device's."""

    cpu: Tensor
    cuda: Tensor | None = None
    cuda_device: int | None = None


def capture_rng(device: torch.device | str | None = None) -> RNGState:
    """Snapshot the CPU generator and, for a CUDA ``device``, that device's generator."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    state = RNGState(cpu=torch.get_rng_state())
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        state.cuda = torch.cuda.get_rng_state(index)
        state.cuda_device = index
    return state


def restore_rng(state: RNGState) -> None:
    """Put the generators back to ``state``."""
    torch.set_rng_state(state.cpu)
    if state.cuda is not None:
        torch.cuda.set_rng_state(state.cuda, state.cuda_device)


# --------------------------------------------------------------------------------------------
# Chunking
# --------------------------------------------------------------------------------------------


def chunk_bounds(n: int, chunk_size: int) -> list[tuple[int, int]]:
    """``[(start, end), ...]`` covering ``range(n)`` in pieces of at most ``chunk_size`` rows."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return [(s, min(s + chunk_size, n)) for s in range(0, n, chunk_size)]


def _rows(batch: Mapping[str, Tensor], start: int, end: int) -> dict[str, Tensor]:
    # Chunks keep the batch's padded width: trimming would need the lengths on the host (a
    # device sync per step) and changes nothing in the embeddings.
    return {k: v[start:end] for k, v in batch.items()}


def _default_views(
    encoder: nn.Module, batch: Mapping[str, Tensor], names: frozenset[str]
) -> dict[str, Tensor]:
    return compute_views(encoder, batch, names)


# --------------------------------------------------------------------------------------------
# The two passes
# --------------------------------------------------------------------------------------------


def cached_forward_backward(
    encoder: nn.Module,
    objective: Objective,
    batch: Mapping[str, Tensor],
    chunk_size: int,
    ctx: ObjectiveContext | None = None,
    *,
    autocast: Callable[[], contextlib.AbstractContextManager] | None = None,
    scale: Callable[[Tensor], Tensor] | None = None,
    views_fn: Callable[[nn.Module, Mapping[str, Tensor], frozenset[str]], dict[str, Tensor]]
    | None = None,
    verify: bool = False,
    verify_atol: float = 1e-5,
    first_pass_graph: bool | None = None,
) -> LossTerms:
    """One GradCache forward/backward; gradients accumulate into the parameters' ``.grad``.

    Args:
        encoder: the model (``encoder(**rows) -> (n, D)``; may be a ``torch.compile`` wrapper).
        objective: any :class:`~cselab.objectives.Objective`; it sees the whole (local) batch.
        batch: ``input_ids``/``attention_mask`` (and optionally ``token_type_ids``), ``(B, L)``.
        chunk_size: sentences encoded at once (the last chunk may be smaller).
        ctx: the objective context (gather, offset, generator) exactly as without caching.
        autocast: factory of the autocast context used around the encoder (e.g.
            ``trainer.autocast``); the objective runs outside it, as in the trainer.
        scale: applied to the summed loss before its backward (``GradScaler.scale`` for fp16);
            the embedding gradients, and so the parameter gradients, carry the scale.
        views_fn: ``(encoder, rows, view_names) -> views`` (default
            :func:`cselab.training.views.compute_views`).
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
    ctx = ctx or ObjectiveContext()
    views_fn = views_fn or _default_views
    amp = autocast or contextlib.nullcontext
    names = frozenset(objective.required_views)
    n = next(iter(batch.values())).shape[0]
    bounds = chunk_bounds(n, chunk_size)
    device = batch["input_ids"].device
    if first_pass_graph is None:
        first_pass_graph = device.type == "cuda" or _is_compiled(encoder)

    # Pass 1: embeddings only, remembering where each chunk's random stream started.
    states: list[RNGState] = []
    pieces: dict[str, list[Tensor]] = {}
    with torch.enable_grad() if first_pass_graph else torch.no_grad():
        for start, end in bounds:
            states.append(capture_rng(device))
            # Only detached embeddings leave the helper: with first_pass_graph, the chunk's graph
            # is freed before the next chunk is encoded.
            for name, value in _encode_detached(views_fn, encoder, batch, start, end, names, amp):
                pieces.setdefault(name, []).append(value)

    # The objective on the whole batch, differentiated down to the cached embeddings.
    cached = {name: torch.cat(parts).requires_grad_(True) for name, parts in pieces.items()}
    terms = objective(cached, ctx)
    loss = total_loss(terms)
    (scale(loss) if scale is not None else loss).backward()
    after_objective = capture_rng(device)
    grads = {name: z.grad for name, z in cached.items()}
    if all(g is None for g in grads.values()):
        return {k: v.detach() for k, v in terms.items()}

    # Pass 2: replay each chunk with its saved random state and push ∂L/∂z into the parameters.
    try:
        for (start, end), state in zip(bounds, states, strict=True):
            restore_rng(state)
            with amp():
                views = views_fn(encoder, _rows(batch, start, end), names)
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
        restore_rng(after_objective)
    return {k: v.detach() for k, v in terms.items()}


def _encode_detached(
    views_fn: Callable[..., dict[str, Tensor]],
    encoder: nn.Module,
    batch: Mapping[str, Tensor],
    start: int,
    end: int,
    names: frozenset[str],
    amp: Callable[[], contextlib.AbstractContextManager],
) -> list[tuple[str, Tensor]]:
    with amp():
        views = views_fn(encoder, _rows(batch, start, end), names)
    return [(name, value.detach()) for name, value in views.items()]


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


def gradcache_step(trainer: Trainer, batch: dict[str, Tensor]) -> dict[str, Tensor]:
    """:class:`~cselab.training.trainer.Trainer` ``step_fn`` for ``train.cache_chunk_size``.

    Same contract as the trainer's own forward/backward: returns the loss terms, gradients
    accumulated (and, with fp16, scaled by the trainer's ``GradScaler``); the trainer averages
    them over ranks afterwards.
    """
    chunk = trainer.config.train.cache_chunk_size
    if not chunk:
        raise ValueError("gradcache_step needs train.cache_chunk_size")
    return cached_forward_backward(
        trainer.model_forward,
        trainer.objective,
        batch,
        int(chunk),
        trainer.ctx,
        autocast=trainer.autocast,
        scale=trainer.scaler.scale if trainer.scaler is not None else None,
        verify=os.environ.get(VERIFY_ENV, "") not in ("", "0"),
    )


class SavedTensorMeter:
    """Peak bytes of the activations autograd keeps for backward (device independent).

    A diagnostic for GradCache's memory claim that works on CPU, where PyTorch keeps no allocator
    statistics: inside the context every tensor saved for backward is counted (once per storage,
    parameters excluded) until the graph that holds it is freed. On CUDA,
    ``torch.cuda.max_memory_allocated`` gives the full picture (activations, weights, optimizer).

    Example::

        >>> with SavedTensorMeter(model) as meter:  # doctest: +SKIP
        ...     loss_fn(model(x)).backward()
        >>> meter.peak_bytes  # doctest: +SKIP
    """

    def __init__(self, module: nn.Module | None = None) -> None:
        self._skip = (
            {p.untyped_storage().data_ptr() for p in module.parameters()} if module else set()
        )
        self._live: dict[tuple[int, int], list[int]] = {}  # storage key -> [refs, bytes]
        self.current_bytes = 0
        self.peak_bytes = 0
        self._hooks: contextlib.AbstractContextManager | None = None

    def _pack(self, t: Tensor) -> object:
        storage = t.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if key[0] in self._skip or key[1] == 0:
            return t
        entry = self._live.setdefault(key, [0, key[1]])
        if entry[0] == 0:
            self.current_bytes += entry[1]
            self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        entry[0] += 1
        # Keep a detached alias: holding ``t`` itself would tie a saved output to its own
        # grad_fn (a reference cycle that outlives the graph).
        return _Saved(t.detach(), self, key)

    def _release(self, key: tuple[int, int]) -> None:
        entry = self._live.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.current_bytes -= entry[1]
            del self._live[key]

    @staticmethod
    def _unpack(saved: object) -> Tensor:
        return saved.tensor if isinstance(saved, _Saved) else saved  # type: ignore[return-value]

    def __enter__(self) -> SavedTensorMeter:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._hooks is not None
        self._hooks.__exit__(*exc)


class _Saved:
    """A saved tensor whose release (when its graph is freed) the meter hears about."""

    __slots__ = ("key", "meter", "tensor")

    def __init__(self, tensor: Tensor, meter: SavedTensorMeter, key: tuple[int, int]) -> None:
        self.tensor, self.meter, self.key = tensor, meter, key

    def __del__(self) -> None:
        self.meter._release(self.key)


__all__: Sequence[str] = [
    "RNGState",
    "SavedTensorMeter",
    "ReplayMismatch",
    "cached_forward_backward",
    "capture_rng",
    "chunk_bounds",
    "gradcache_step",
    "restore_rng",
]
