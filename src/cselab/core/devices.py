"""Device names: the one check of a name, for ``--device`` and ``train.device`` alike, made
on the text without torch (``cselab --help`` and reading a config stay torch-free); whether
this machine has the device is :func:`cselab.model.devices.available_device`'s."""

from __future__ import annotations

import re

from .errors import ConfigError

#: The one accelerator type whose facts cselab spells by name (ROCm's HIP reports itself as it
#: too): copies to it from pinned host memory are asynchronous, its generator's state travels
#: in a checkpoint, its ranks talk over NCCL. Every other module asks
#: :mod:`cselab.model.devices` (torch) or the predicates below (device type names, no torch).
GPU_TYPE = "cuda"

#: The device types a model can run on, as ``torch.device`` spells them. ``npu`` is the name
#: Ascend's ``torch_npu`` gives its backend; ``meta`` is left out on purpose: it holds no
#: values, so nothing can be encoded or trained there.
DEVICE_TYPES = ("cpu", GPU_TYPE, "mps", "xpu", "hpu", "mtia", "xla", "npu", "privateuseone")

#: The device name that lets the machine choose: its GPU where there is one
#: (:func:`cselab.model.devices.resolve_device`); the default of the commands that encode.
AUTO = "auto"

#: The most digits of a device index: ``torch.device`` takes any int64, no machine has 10^4
MAX_INDEX_DIGITS = 4

#: ``TYPE`` or ``TYPE:N``, ``N`` without leading zeros (``torch.device`` refuses ``cuda:01``)
_DEVICE = re.compile(
    rf"(?:{'|'.join(DEVICE_TYPES)})(?::(?:0|[1-9]\d{{0,{MAX_INDEX_DIGITS - 1}}}))?"
)


def device_words(auto: bool = False) -> str:
    """The accepted names, as the messages and the ``--help`` list them."""
    names = (AUTO,) * auto + ("cpu", GPU_TYPE, f"{GPU_TYPE}:N") + DEVICE_TYPES[2:]
    return ", ".join(names)


def check_device(value: str, *, auto: bool = False) -> str:
    """``value`` if it names a device (``cpu``, ``cuda``, ``cuda:1``, ``mps``, ...), or
    ``auto`` where ``auto`` is allowed (``train.device``, ``--device``). Checked on the text alone, without
    importing torch, so that reading a config and ``cselab --help`` stay fast.

    Raises:
        ConfigError: ``'VALUE' is not a device; use ...`` (the caller names the option or key).
    """
    if isinstance(value, str) and (_DEVICE.fullmatch(value) or (auto and value == AUTO)):
        return value
    raise ConfigError(f"{value!r} is not a device; use {device_words(auto)}")


#: The device types with PyTorch's fp16 loss scaling (``GradScaler``) and a fused AdamW.
SCALER_TYPES = (GPU_TYPE, "cpu")


def is_gpu_type(device_type: str) -> bool:
    """Whether ``device_type`` (``torch.device.type``) is a CUDA (or ROCm) GPU."""
    return device_type == GPU_TYPE


def pins_memory(device_type: str) -> bool:
    """Whether a copy to a device of this type goes through pinned host memory (and is then
    asynchronous): a GPU's; to other devices a copy is a plain ``Tensor.to``."""
    return is_gpu_type(device_type)
