"""Peak bytes of the activations autograd keeps for backward: a diagnostic for benchmarks and tests.

Used by ``bench_gpu.py`` (GradCache's memory table on CPU) and ``tests/test_gradcache.py`` (the
memory claim), never by the library.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor, nn


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
