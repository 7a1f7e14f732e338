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

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from ..core.errors import ConfigError, ModelFormatError
from ..core.schema import from_dict
from ..io.readers import read_json
from ..io.runfolder import RunFolder
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


def settings_of(lora: LoRAConfig | Mapping[str, Any] | None) -> LoRAConfig | None:
    """``model.lora`` as a checked :class:`LoRAConfig` (a mapping is read as the config file's
    section is, and validated the same way); ``None`` stays ``None``."""
    if lora is None:
        return None
    if isinstance(lora, Mapping):
        lora = from_dict(LoRAConfig, dict(lora), prefix="model.lora")
    return lora.validate()


def check_rank(settings: LoRAConfig, config: Any) -> None:
    """Refuse a rank above the model's width: ``B·A`` of rank ``r`` can be no more than
    ``hidden_size``-ranked, so the extra rank only adds parameters (and memory)."""
    width = getattr(config, "hidden_size", None)
    if isinstance(width, int) and settings.r > width:
        raise ConfigError(
            f"model.lora.r={settings.r} exceeds the width of the model ({width}): a rank above "
            f"it adds parameters and no expressiveness; choose r <= {width} (LLM2Vec: 16)"
        )


def module_names(backbone: nn.Module) -> list[str]:
    """The short names of ``backbone``'s modules that hold weights (the last part of each
    dotted name, without layer numbers), each once, in model order."""
    names = (name.rpartition(".")[2] for name, m in backbone.named_modules() if name)
    return list(dict.fromkeys(n for n in names if not n.isdigit()))


def _matches(name: str, target: str) -> bool:
    """``peft``'s rule for a target given as a name: the module's whole name or its last parts."""
    return name == target or name.endswith(f".{target}")


def target_modules(backbone: nn.Module, settings: LoRAConfig) -> list[str] | None:
    """The module names that get adapters: the config's, else the architecture's default
    (``None``: ``peft`` decides from its own table).

    Raises:
        ConfigError: a named target matches no module of ``backbone`` (one line listing the
            model's module names).
    """
    if settings.target_modules is not None:
        targets = list(settings.target_modules)
    else:
        row = backbones.lookup(getattr(getattr(backbone, "config", None), "model_type", None))
        if row is None:
            return None
        targets = list(row.lora_targets)
    names = [name for name, _ in backbone.named_modules()]
    missing = [t for t in targets if not any(_matches(n, t) for n in names)]
    if missing:
        kind = getattr(getattr(backbone, "config", None), "model_type", "?")
        raise ConfigError(
            f"model.lora.target_modules: {', '.join(missing)} matches no module of this {kind} "
            f"model; its modules: {', '.join(module_names(backbone))}"
        )
    return targets


def applied_targets(backbone: nn.Module) -> list[str]:
    """The module names that carry adapters on ``backbone`` (a ``peft`` model): what the run
    used, its config's list or the default resolved for the architecture, sorted."""
    targets = backbone.peft_config["default"].target_modules
    return sorted(targets) if isinstance(targets, set | list | tuple) else [str(targets)]


def add_adapters(backbone: nn.Module, settings: LoRAConfig, base: str | None) -> nn.Module:
    """``backbone`` wrapped with fresh LoRA adapters (a ``peft.PeftModel``); its own weights are
    frozen. ``base``: what the adapter folder names as its base model (the Hub name or folder
    the backbone was loaded from).

    Raises:
        ConfigError: ``peft`` is missing, or a target matches no module of the backbone
            (naming ``model.lora.target_modules`` and the model's modules).
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
    if base is not None:
        # peft names the base by the model's own name_or_path (the path it was loaded by,
        # relative to the working directory then); the folder must name it from anywhere
        backbone.name_or_path = base
    try:
        return _quietly(peft.get_peft_model, backbone, config)
    except ValueError as err:  # peft: "Target modules ... not found in the base model"
        model_type = getattr(backbone.config, "model_type", "?")
        odd = _unadaptable(backbone, targets or [])
        if odd:  # peft's own line quotes the module's repr, many lines for a container
            raise ConfigError(
                f"model.lora.target_modules: {', '.join(odd)} on this {model_type} model: LoRA "
                "adapts linear, embedding and convolution layers only (e.g. "
                f"{', '.join(_linear_names(backbone))})"
            ) from None
        raise ConfigError(
            f"model.lora.target_modules: {targets or 'peft default'} on a {model_type} model: "
            f"{str(err).splitlines()[0]}"
        ) from None


#: The layer types ``peft``'s LoRA replaces (by class name: transformers' GPT-2 ``Conv1D`` too)
_ADAPTABLE = {"Linear", "Embedding", "Conv1d", "Conv2d", "Conv3d", "Conv1D", "MultiheadAttention"}


def _unadaptable(backbone: nn.Module, targets: list[str]) -> list[str]:
    """``"name (a Type)"`` for each target that matches a module LoRA cannot adapt."""
    found: dict[str, str] = {}
    for name, module in backbone.named_modules():
        kind = type(module).__name__
        for t in targets:
            if t not in found and kind not in _ADAPTABLE and _matches(name, t):
                found[t] = f"{t} (a {kind})"
    return [found[t] for t in targets if t in found]


def _linear_names(backbone: nn.Module) -> list[str]:
    """The short names of ``backbone``'s linear layers (GPT-2's ``Conv1D`` is one), each once,
    in model order."""
    linear = _ADAPTABLE - {"Embedding"}
    names = (
        n.rpartition(".")[2] for n, m in backbone.named_modules() if type(m).__name__ in linear
    )
    return list(dict.fromkeys(names))


def has_adapters(backbone: nn.Module) -> bool:
    """Whether ``backbone`` carries LoRA adapters (a ``peft`` model)."""
    return hasattr(backbone, "peft_config")


def adapter_settings(backbone: nn.Module) -> dict[str, Any]:
    """What ``cselab.json`` records of ``backbone``'s adapters: rank, alpha, dropout, targets."""
    cfg = backbone.peft_config["default"]
    return {
        "r": int(cfg.r),
        "alpha": float(cfg.lora_alpha),
        "dropout": float(cfg.lora_dropout),
        "target_modules": applied_targets(backbone),
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


def merge_first(name_or_path: str) -> str:
    """The one refusal of a training run that starts from a folder of adapters (frozen, they
    would not train; new adapters cannot go on top of them)."""
    folder = Path(name_or_path)
    run = RunFolder(folder.parent)
    if folder.name == RunFolder.BEST and run.merged.is_dir():  # train.save_merged wrote it
        return (
            f"model.name_or_path={name_or_path} holds LoRA adapters; its run merged them "
            f"into the weights already: train {run.merged}"
        )
    return (
        f"model.name_or_path={name_or_path} holds LoRA adapters; merge them into the weights "
        "first (cselab merge FOLDER -o DIR) and train DIR"
    )


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
            tensors only, so nothing in it runs); naming the config and the weights when they
            do not belong together (other modules, another rank, another base model).
    """
    import inspect
    import warnings

    peft = _peft()
    check_adapter_weights(folder)
    config, weights = folder / ADAPTER_CONFIG, _weights_file(folder)
    prefix = _head_model_prefix(weights, backbone)
    # adapters saved on the model with its head: their names without the head's prefix
    mapping = {"key_mapping": {rf"^{prefix}\.": ""}} if prefix else {}
    if (
        mapping
        and "key_mapping" not in inspect.signature(peft.PeftModel.from_pretrained).parameters
    ):
        raise ModelFormatError(
            f"{weights}: adapters saved on the model with its head (names under {prefix}.) need "
            f"a newer peft than {peft.__version__} to load: pip install -U peft"
        )
    try:
        with warnings.catch_warnings():
            # peft only warns when the weights lack adapters the config names: those start at
            # B = 0, and the "loaded" model is the base model
            warnings.filterwarnings("error", message="Found missing adapter keys")
            model = _quietly(
                peft.PeftModel.from_pretrained, backbone, str(folder), is_trainable=False,
                **mapping,
            )  # fmt: skip
    except Exception as err:
        message = _refused_adapters(err, folder, backbone)
        if message is None:
            raise
        raise ModelFormatError(message) from None
    if _stored_adapter_tensors(weights) > sum("lora_" in n for n, _ in model.named_parameters()):
        # peft leaves weights of modules the config does not name unused, without a word
        raise ModelFormatError(
            f"{weights}: holds adapters for more modules than {config} names (target_modules "
            f"{_config_value(config, 'target_modules')}): the two files do not belong together"
        )
    return model


def _refused_adapters(err: Exception, folder: Path, backbone: nn.Module) -> str | None:
    """The one line for what ``peft`` raised loading the adapters of ``folder`` onto
    ``backbone`` (``None``: not a fault of the folder's files)."""
    from safetensors import SafetensorError

    from .hub import pickled_weights_refused, unpickling_failed

    config, weights = folder / ADAPTER_CONFIG, _weights_file(folder)
    text = str(err)
    if unpickling_failed(err):
        return pickled_weights_refused(folder, ADAPTER_PICKLE)
    if isinstance(err, SafetensorError):
        return f"{folder / ADAPTER_WEIGHTS}: cannot be read ({text.splitlines()[0]})"
    if isinstance(err, UserWarning) and "Found missing adapter keys" in text:
        return (
            f"{weights}: holds no weights for some of the adapters {config} names "
            f"(target_modules {_config_value(config, 'target_modules')}): the two files do not "
            "belong together"
        )
    if isinstance(err, ValueError) and "not found in the base model" in text:
        return (
            f"{config}: target_modules {_config_value(config, 'target_modules')} match no module "
            f"of the base model {adapter_base(folder)} ({backbone.config.model_type}): the "
            "adapters belong to another model"
        )
    if isinstance(err, RuntimeError) and "size mismatch" in text:
        return (
            f"{weights}: its tensors' shapes differ from what {config} (r "
            f"{_config_value(config, 'r')}) and the base model {adapter_base(folder)} make: the "
            "adapters belong to another config or model"
        )
    return None


def _stored_keys(weights: Path) -> list[str]:
    """The tensor names of a safetensors adapter file (its header; none for a pickle)."""
    if weights.suffix != ".safetensors":
        return []
    from safetensors import safe_open

    with safe_open(str(weights), framework="pt") as f:
        return list(f.keys())


def _stored_adapter_tensors(weights: Path) -> int:
    """How many LoRA tensors a safetensors adapter file holds (0 for a pickle)."""
    return sum("lora_" in key for key in _stored_keys(weights))


def _head_model_prefix(weights: Path, backbone: nn.Module) -> str | None:
    """The base model's attribute (``model`` of a Llama) under which adapters saved on the
    model with its head (``LlamaForCausalLM``, as most fine-tuning saves them: names
    ``base_model.model.model.layers...``) sit, when ``backbone`` is the base model itself
    (names ``base_model.model.layers...``); ``None`` when the names already fit."""
    prefix = getattr(backbone, "base_model_prefix", "")
    if not prefix or hasattr(backbone, prefix):
        return None
    keys = _stored_keys(weights)
    lead = f"base_model.model.{prefix}."
    return prefix if keys and all(k.startswith(lead) for k in keys) else None


def _weights_file(folder: Path) -> Path:
    """The adapter weights file of ``folder``: the safetensors file, else the pickle."""
    weights = folder / ADAPTER_WEIGHTS
    return weights if weights.is_file() else folder / ADAPTER_PICKLE


def _config_value(path: Path, key: str) -> Any:
    """``key`` of the adapter config ``path`` (for a message; ``?`` where it is absent)."""
    value = (read_json(path) or {}).get(key, "?")
    return sorted(value) if isinstance(value, list) else value


def merge_adapters(backbone: nn.Module) -> nn.Module:
    """The plain ``transformers`` model with the adapters folded into its weights
    (``W₀ + (α/r)·BA``), its parameters trainable again as after a plain load."""
    merged = backbone.merge_and_unload()
    return merged.requires_grad_(True)
