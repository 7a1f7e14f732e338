"""Where a run executes: its device and its precision."""

from __future__ import annotations

import logging

import torch

from ..schema import ConfigError
from .distributed import DistInfo

log = logging.getLogger("cselab")


def pick_device(name: str, dist_info: DistInfo) -> torch.device:
    """``train.device``: ``auto`` is this rank's GPU when there is one, else the CPU."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", dist_info.local_rank)
        return torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"train.device={name}, but no CUDA GPU is available; use cpu or auto")
    return device


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for ``train.precision`` on ``device`` (``None``: full fp32)."""
    if precision == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return None
    if precision == "fp16" and device.type != "cuda":
        raise ConfigError(
            f"train.precision=fp16 needs a CUDA GPU, not {device.type}; use bf16 or fp32"
        )
    if precision == "bf16" and device.type == "cpu" and not cpu_has_native_bf16():
        log.warning(
            "train.precision=bf16 on a CPU without native bf16 matrix products (no AVX512-BF16/AMX): "
            "PyTorch falls back to slow bf16 kernels and training is several times slower than "
            "fp32; prefer train.precision=fp32 on this machine"
        )
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def cpu_has_native_bf16() -> bool:
    """Whether oneDNN has native bf16 matrix products on this CPU (AVX512-BF16 or AMX)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without oneDNN
        return False
