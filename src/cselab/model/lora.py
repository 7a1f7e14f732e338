"""LoRA adapters on a backbone, through ``peft`` (Hu et al. 2022, "LoRA: Low-Rank Adaptation of
Large Language Models", Eq. 3: ``h = W₀x + (α/r)·BAx``).

:func:`add_adapters` wraps a backbone in a ``peft.PeftModel`` whose base weights are frozen, so
only the adapters (and cselab's pooler head) train. A saved folder of such a model holds the
adapters (``adapter_config.json`` + ``adapter_model.safetensors``, ``peft``'s own files) and
names its base model; :func:`load_adapters` puts them back on that base, :func:`merge_adapters`
folds them into the base weights (``W₀ + (α/r)·BA``) and returns a plain ``transformers`` model.

``peft`` is an optional dependency (``pip install cselab[lora]``); it is imported only where
adapters are used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from ..core.errors import ConfigError, ModelFormatError
from ..io.readers import read_json
from . import backbones
from .config import LoRAConfig

#: peft's file that makes a folder an adapter folder
ADAPTER_CONFIG = "adapter_config.json"
#: peft's adapter weights, and the pickle older peft versions (and some published folders) hold
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_PICKLE = "adapter_model.bin"


def _quietly(call: Any, *args: Any, **kwargs: Any) -> Any:
    """``call(*args, **kwargs)`` without the FutureWarning peft causes by reading a property
    transformers deprecated (``is_gradient_checkpointing``): one at every adapter load, about
    the two libraries, nothing a user can act on."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning
        )
        return call(*args, **kwargs)


def _peft() -> Any:
    try:
        import peft
    except ImportError:
        raise ConfigError("model.lora needs the peft package: pip install 'cselab[lora]'") from None
    return peft


def target_modules(backbone: nn.Module, settings: LoRAConfig) -> list[str] | None:
    """The module names that get adapters: the config's, else the architecture's default
    (``None``: ``peft`` decides from its own table)."""
    if settings.target_modules is not None:
        return list(settings.target_modules)
    row = backbones.lookup(getattr(getattr(backbone, "config", None), "model_type", None))
    return list(row.lora_targets) if row is not None else None


def add_adapters(backbone: nn.Module, settings: LoRAConfig, base: str | None) -> nn.Module:
    """``backbone`` wrapped with fresh LoRA adapters (a ``peft.PeftModel``); its own weights are
    frozen. ``base``: what the adapter folder names as its base model (the Hub name or folder
    the backbone was loaded from).

    Raises:
        ConfigError: ``peft`` is missing, or no module of the backbone matches the targets
            (naming ``model.lora.target_modules``).
    """
    peft = _peft()
    targets = target_modules(backbone, settings)
    config = peft.LoraConfig(
        r=settings.r,
        lora_alpha=settings.scale_alpha,
        lora_dropout=settings.dropout,
        target_modules=targets,
        bias="none",
        base_model_name_or_path=base,
    )
    try:
        return _quietly(peft.get_peft_model, backbone, config)
    except ValueError as err:  # peft: "Target modules ... not found in the base model"
        model_type = getattr(backbone.config, "model_type", "?")
        raise ConfigError(
            f"model.lora.target_modules: {targets or 'peft default'} on a {model_type} model: "
            f"{str(err).splitlines()[0]}"
        ) from None


def has_adapters(backbone: nn.Module) -> bool:
    """Whether ``backbone`` carries LoRA adapters (a ``peft`` model)."""
    return hasattr(backbone, "peft_config")


def adapter_settings(backbone: nn.Module) -> dict[str, Any]:
    """What ``cselab.json`` records of ``backbone``'s adapters: rank, alpha, dropout, targets."""
    cfg = backbone.peft_config["default"]
    targets = cfg.target_modules
    return {
        "r": int(cfg.r),
        "alpha": float(cfg.lora_alpha),
        "dropout": float(cfg.lora_dropout),
        "target_modules": sorted(targets) if isinstance(targets, set | list) else targets,
    }


def is_adapter_folder(folder: Path) -> bool:
    """Whether ``folder`` holds LoRA adapters: their config or their weights (a folder with
    only one of them is a damaged adapter folder, which :func:`adapter_base` names)."""
    return any(
        (folder / name).is_file() for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS, ADAPTER_PICKLE)
    )


def check_adapter_weights(folder: Path) -> None:
    """Refuse, naming the file, adapter weights that cannot be loaded: none at all (``peft``
    would then look ``folder`` up on the Hub as a repository name), or a safetensors file that
    is truncated or not one (its header is read; no tensor is). A pickle is checked as it is
    loaded (:func:`load_adapters`)."""
    from safetensors import SafetensorError, safe_open

    weights = folder / ADAPTER_WEIGHTS
    if not weights.is_file():
        if (folder / ADAPTER_PICKLE).is_file():
            return
        raise ModelFormatError(
            f"{weights}: missing; {folder} holds the adapters' config ({ADAPTER_CONFIG}) but not "
            "their weights, so they cannot be loaded"
        )
    try:
        with safe_open(str(weights), framework="pt"):
            pass
    except (SafetensorError, OSError) as err:
        raise ModelFormatError(
            f"{weights}: not a complete safetensors file ({str(err).splitlines()[0]}); the "
            "adapters cannot be loaded"
        ) from None


def adapter_base(folder: Path, loading: bool = False) -> str:
    """The base model an adapter folder was trained on (``base_model_name_or_path`` of its
    ``adapter_config.json``). ``loading``: refuse, naming the file, a base folder (an absolute
    path, as cselab records it) that is not there any more and adapter weights that cannot be
    loaded (:func:`check_adapter_weights`), before the base model loads.

    Raises:
        ModelFormatError: naming ``adapter_config.json`` when it is missing (a folder of adapter
            weights alone), or the file that cannot be used.
    """
    path = folder / ADAPTER_CONFIG
    if not path.is_file():
        weights = next(f for f in (ADAPTER_WEIGHTS, ADAPTER_PICKLE) if (folder / f).is_file())
        raise ModelFormatError(
            f"{path}: missing; {folder} holds LoRA adapter weights ({weights}) but not their "
            "config, so they cannot be put on a model"
        )
    if loading:
        check_adapter_weights(folder)
    base = (read_json(path) or {}).get("base_model_name_or_path")
    if not isinstance(base, str) or not base:
        raise ModelFormatError(
            f"{path}: base_model_name_or_path is missing; the adapters cannot be put on a model"
        )
    if loading and Path(base).is_absolute() and not Path(base).exists():
        raise ModelFormatError(
            f"{path}: base_model_name_or_path {base} does not exist; the adapters need their "
            "base model there (or edit that path)"
        )
    return base


def load_adapters(backbone: nn.Module, folder: Path) -> nn.Module:
    """``backbone`` (the base model) with the adapters saved in ``folder``, frozen.

    Raises:
        ModelFormatError: naming the weights file when it cannot be loaded: missing or damaged
            (:func:`check_adapter_weights`), or a pickle that holds code or objects (loaded as
            tensors only, so nothing in it runs).
    """
    from safetensors import SafetensorError

    from .hub import pickled_weights_refused, unpickling_failed

    peft = _peft()
    check_adapter_weights(folder)
    try:
        return _quietly(peft.PeftModel.from_pretrained, backbone, str(folder), is_trainable=False)
    except SafetensorError as err:
        raise ModelFormatError(
            f"{folder / ADAPTER_WEIGHTS}: cannot be read ({str(err).splitlines()[0]})"
        ) from None
    except Exception as err:
        if unpickling_failed(err):
            raise ModelFormatError(pickled_weights_refused(folder, ADAPTER_PICKLE)) from None
        raise


def merge_adapters(backbone: nn.Module) -> nn.Module:
    """The plain ``transformers`` model with the adapters folded into its weights
    (``W₀ + (α/r)·BA``), its parameters trainable again as after a plain load."""
    merged = backbone.merge_and_unload()
    return merged.requires_grad_(True)
