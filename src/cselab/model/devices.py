"""The device abstraction: whether this machine has a device (one line naming ``device`` and
the devices there are, before a model is moved to it: ``cselab encode --device mps`` on a
machine without MPS), and everything a run asks of its device (the GPU of ``train.device:
auto``, its generator's state, synchronisation, making it current, autocast, pinned copies,
bf16, TF32, the optimiser's fused kernels, its name). The rest of cselab asks these functions
and never compares a device type with a name; the torch-free facts by type name are
:mod:`cselab.core.devices`'s. What ``auto`` means for a model that encodes: :func:`resolve_device`."""

from __future__ import annotations

import contextlib
import logging

import torch
from torch import Tensor

from ..core.devices import AUTO, GPU_TYPE, SCALER_TYPES, is_gpu_type
from ..core.errors import ConfigSettingError

log = logging.getLogger("cselab")


def available_devices() -> list[str]:
    """The devices this machine has (``cpu``, ``cuda:0``, ``mps``...), for messages."""
    names = ["cpu"]
    for kind in (GPU_TYPE, "xpu", "mtia"):
        module = getattr(torch, kind, None)
        if module is not None and module.is_available():
            names += [f"{kind}:{i}" for i in range(module.device_count())]
    if torch.backends.mps.is_available():
        names.append("mps")
    return names


def _present(device: torch.device) -> bool:
    """Whether this machine has ``device``. CUDA, XPU and MTIA are asked for their count
    (touching a GPU would open a context on it, on every rank of a distributed run); other
    types are probed with an empty tensor, which fails for a backend absent or not built."""
    if device.type == "cpu":
        return True
    if device.type == "mps":
        return torch.backends.mps.is_available()
    module = getattr(torch, device.type, None)
    if device.type in (GPU_TYPE, "xpu", "mtia") and module is not None:
        # ``cuda`` alone is each rank's own GPU (``LOCAL_RANK``): there is one if there is any
        index_ok = device.index is None or device.index < module.device_count()
        return module.is_available() and index_ok
    try:
        torch.empty(0, device=device)
    except Exception:  # each absent backend fails its own way (ModuleNotFound, NotImplemented...)
        return False
    return True


def available_device(name: str | torch.device, key: str | None = None) -> torch.device:
    """``torch.device(name)``, once this machine is known to have it.

    Args:
        name: a device name (:func:`check_device`) or a ``torch.device``.
        key: the config key holding it (``train.device``), for ``cselab train``'s message.

    Raises:
        ConfigSettingError: naming the setting ``device`` and the devices there are.
    """
    text = str(name)
    try:
        device = torch.device(name)
        present = _present(device)
    except RuntimeError:  # a type this torch does not know without its plugin (npu)
        present = False
    if not present:
        raise ConfigSettingError(
            "device", text, "{setting} is not available on this machine (available: {there})",
            key=key, there=", ".join(available_devices()),
        )  # fmt: skip
    return device


def best_device() -> torch.device:
    """This machine's device for encoding: its (current) CUDA GPU, else Apple's MPS, else the
    CPU."""
    if gpu_available():
        return gpu(torch.cuda.current_device())
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def resolve_device(name: str | torch.device, key: str | None = None) -> torch.device:
    """The device ``name`` stands for: ``auto`` is :func:`best_device`, the choice logged in
    one line (the commands that encode default to it); any other name must be present
    (:func:`available_device`, whose ``key`` and error it shares)."""
    if str(name) != AUTO:
        return available_device(name, key)
    device = best_device()
    what = f" ({torch.cuda.get_device_name(device)})" if is_gpu(device) else ""
    log.info("device auto: %s%s", device, what)
    return device


# ------------------------------------------------------------------ what a run asks its device
def is_gpu(device: torch.device | str | None) -> bool:
    """Whether ``device`` is a CUDA (or ROCm) GPU."""
    return device is not None and is_gpu_type(torch.device(device).type)


def gpu_available() -> bool:
    """Whether this machine has a CUDA (or ROCm) GPU (asks the driver; opens no context)."""
    return torch.cuda.is_available()


def gpu(index: int) -> torch.device:
    """The GPU numbered ``index`` (a rank's own: ``LOCAL_RANK``)."""
    return torch.device(GPU_TYPE, index)


def auto_device(local_rank: int = 0) -> torch.device:
    """``auto``: this rank's GPU (``local_rank``) when the machine has one, else the CPU."""
    return gpu(local_rank) if gpu_available() else torch.device("cpu")


def gpu_in_use() -> torch.device | None:
    """The current GPU once this process uses one (CUDA initialised), else ``None``."""
    if gpu_available() and torch.cuda.is_initialized():
        return gpu(torch.cuda.current_device())
    return None


def gpu_index(device: torch.device | None) -> int:
    """The number of the GPU ``device`` names (``cuda`` alone, or ``None``: the current one)."""
    if device is not None and device.index is not None:
        return device.index
    return torch.cuda.current_device()


def gpu_rng_state(index: int) -> Tensor:
    """The state of GPU ``index``'s default generator (dropout draws from it)."""
    return torch.cuda.get_rng_state(index)


def set_gpu_rng_state(state: Tensor, index: int) -> None:
    """Put GPU ``index``'s default generator back to ``state``."""
    torch.cuda.set_rng_state(state, index)


def make_current(device: torch.device) -> None:
    """Make ``device`` the current GPU of this process (a no-op for other devices)."""
    if is_gpu(device):
        torch.cuda.set_device(device)


def current_gpu_ids() -> list[int] | None:
    """``[the current GPU]`` when this process uses one (NCCL's barrier names it), else
    ``None``."""
    return [torch.cuda.current_device()] if gpu_available() else None


def synchronize(device: torch.device) -> None:
    """Wait until ``device`` has finished the work queued on it (a no-op on the CPU)."""
    if is_gpu(device):
        torch.cuda.synchronize(device)


#: the precision names of runs and plans (``train.precision`` resolved) and their autocast
#: dtypes (``None``: full fp32)
PRECISION_NAMES = {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def precision_name(amp_dtype: torch.dtype | None) -> str:
    """The precision a run really trains in (``auto`` resolved): ``fp32``, ``bf16`` or ``fp16``."""
    return PRECISION_NAMES[amp_dtype]


def precision_dtype(name: str) -> torch.dtype | None:
    """The autocast dtype of a resolved precision (``fp32``: ``None``), as a run plan keeps it."""
    return {v: k for k, v in PRECISION_NAMES.items()}[name]


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """Autocast to ``dtype`` on ``device`` (``None``: full precision, no context)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def has_grad_scaler(device: torch.device) -> bool:
    """Whether PyTorch's fp16 loss scaling (``GradScaler``) and fused AdamW run on ``device``."""
    return device.type in SCALER_TYPES


def bf16_native(device: torch.device) -> bool:
    """Whether the GPU ``device`` computes in bf16 natively (compute capability 8.0 and later,
    Ampere on; ROCm: always), asked of ``device`` itself: ``torch.cuda.is_bf16_supported`` asks
    the current device, which is still the first GPU on every rank before the process group sets
    each rank's. ``False`` off a GPU. Initialises CUDA as that call does, and makes no device
    current."""
    if not is_gpu(device):
        return False
    if torch.version.hip:
        return True
    return torch.cuda.get_device_properties(device).major >= 8


def set_tf32(enabled: bool) -> None:
    """TF32 tensor cores (10-bit mantissa inputs, fp32 accumulation) for GPU fp32 matrix
    products and convolutions, on or off. The flags are global to the process: every GPU run
    sets them (on only for ``auto`` resolved to fp32, as sentence-transformers and the
    transformers Trainer's ``tf32`` do), so an explicit ``fp32`` means IEEE fp32 products
    whatever ran before in the same process."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


def allow_tf32() -> None:
    """TF32 on (:func:`set_tf32`)."""
    set_tf32(True)


def gpu_name(device: str) -> str | None:
    """The GPU's product name for a device named ``device`` when it is one this machine has,
    else ``None``."""
    if not is_gpu_type(device.split(":")[0]) or not gpu_available():
        return None
    return torch.cuda.get_device_name(torch.device(device).index or 0)
