"""Where a run executes: its device and its precision."""

from __future__ import annotations

import ctypes
import logging
import os
import sys

import torch

from ..config import check_precision
from ..model.devices import (
    auto_device,
    available_device,
    bf16_native,
    is_gpu,
    precision_dtype,
    precision_name,
    set_tf32,
)
from .distributed import DistInfo

log = logging.getLogger("cselab")


def pick_device(name: str, dist_info: DistInfo) -> torch.device:
    """``train.device``: ``auto`` is this rank's GPU when there is one, else the CPU; a device
    named that this machine lacks is a :class:`~cselab.core.errors.ConfigSettingError`."""
    if name == "auto":
        return auto_device(dist_info.local_rank)
    return available_device(name, key="train.device")


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for ``train.precision`` on ``device`` (``None``: full fp32).

    ``auto`` (the default) is bf16 autocast on a CUDA GPU that supports it (Ampere and later);
    on an older GPU it is fp32 with TF32 matrix products allowed (:func:`~cselab.model.devices.set_tf32`); on the CPU
    it is plain fp32, so CPU runs are unchanged by the default. Whatever it resolves to is
    logged once and recorded in ``results.json`` (:func:`precision_name`).
    """
    if precision == "auto":
        dtype = None
        if is_gpu(device):
            dtype = torch.bfloat16 if bf16_native(device) else None
            set_tf32(dtype is None)  # fp32 products on tensor cores, as sentence-transformers
        how = "with TF32 matrix products" if is_gpu(device) and dtype is None else ""
        if device.type == "cpu" and cpu_has_native_bf16():
            # auto keeps CPU runs in fp32 (a CPU run's numbers do not change with the CPU), but
            # where bf16 is native it trains 1.7x faster (AMX Xeon, train_benchmark.md)
            how = "(this CPU computes bf16 natively: train.precision=bf16 trains faster)"
        log.info(
            "train.precision=auto: %s on %s%s",
            precision_name(dtype),
            device,
            f" {how}" if how else "",
        )
        return dtype
    check_precision(precision, device.type)
    if is_gpu(device):
        # the flags are process-wide: an earlier run in this process (auto on a GPU without
        # bf16) must not leave TF32 on under an explicit fp32
        set_tf32(False)
    if precision == "fp16" and not is_gpu(device):
        log.warning(
            "train.precision=fp16 on %s: loss scaling runs (GradScaler) but fp16 arithmetic "
            "is emulated and slow off a GPU; it is there to test the fp16 path",
            device,
        )
    if precision == "bf16" and device.type == "cpu" and not cpu_has_native_bf16():
        log.warning(
            "train.precision=bf16 on a CPU without native bf16 matrix products (no AVX512-BF16/AMX): "
            "PyTorch falls back to slow bf16 kernels and training is several times slower than "
            "fp32; prefer train.precision=fp32 on this machine"
        )
    return precision_dtype(precision)


def cpu_has_native_bf16() -> bool:
    """Whether oneDNN has native bf16 matrix products on this CPU (AVX512-BF16 or AMX)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without oneDNN
        return False


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX = -1, -2, -4
_malloc_tuned = False


def retain_freed_memory() -> bool:
    """Make glibc's ``malloc`` keep freed memory for reuse; ``True`` if it was (or is) set.

    A CPU training step allocates and frees the same few hundred MB every step. By default glibc
    serves blocks above its mmap threshold (at most 32 MiB, e.g. the 47 MB gradient of BERT's
    word embeddings) with fresh ``mmap``s and hands the top of the heap back to the kernel when a
    step ends, so the next step touches new pages again: 20,000-40,000 page faults per MiniLM step,
    each a kernel zero-fill, charged to whichever operation first writes the memory. With mmap
    off and no trimming (``mallopt(M_MMAP_MAX, 0)``, ``M_TRIM_THRESHOLD`` at its maximum) the
    freed memory is reused: in development timings (the same batches, alternating processes) a
    bf16 MiniLM step at batch 64 went from 0.57 to 0.51 s on a 2-core Xeon with AMX; the peer
    gains as much from it (``docs/results/train_benchmark_equal_alloc.md``). The cost is that the
    process keeps its peak heap until it exits. Allocators such as tcmalloc (``LD_PRELOAD``) do
    the same and more; this is the part that needs no library. A no-op off Linux/glibc and when
    ``CSELAB_KEEP_FREED_MEMORY=0``; process-wide and irreversible, so done once.
    """
    global _malloc_tuned
    if _malloc_tuned:
        return True
    if sys.platform != "linux" or os.environ.get("CSELAB_KEEP_FREED_MEMORY", "1") == "0":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = all(
            libc.mallopt(param, value) == 1
            for param, value in (
                (_M_MMAP_MAX, 0),
                (_M_TRIM_THRESHOLD, 2**31 - 1),
                (_M_TOP_PAD, 64 << 20),
            )
        )
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    _malloc_tuned = ok
    if ok:
        log.info(
            "glibc malloc keeps freed memory for reuse (M_MMAP_MAX=0, no trimming; "
            "CSELAB_KEEP_FREED_MEMORY=0 turns this off)"
        )
    return ok
