"""Whether this machine has a device: one line naming ``device`` and the devices there are,
before a model is moved to it (``cselab encode --device mps`` on a machine without MPS); and
what ``auto`` means for a model that encodes (:func:`resolve_device`)."""

from __future__ import annotations

import logging

import torch

from ..core.devices import AUTO
from ..core.errors import ConfigSettingError

log = logging.getLogger("cselab")


def available_devices() -> list[str]:
    """The devices this machine has (``cpu``, ``cuda:0``, ``mps``...), for messages."""
    names = ["cpu"]
    for kind in ("cuda", "xpu", "mtia"):
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
    if device.type in ("cuda", "xpu", "mtia") and module is not None:
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
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
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
    what = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    log.info("device auto: %s%s", device, what)
    return device
