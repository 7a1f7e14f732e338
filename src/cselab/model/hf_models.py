"""What cselab reads from models it did not train: Hugging Face checkpoints and
sentence-transformers folders.

* :func:`hf_pooler_head`: ``--pooler cls`` on a plain Hugging Face model means the model's own
  pooler (``pooler_output``: ``tanh(W h_[CLS] + b)`` for BERT and RoBERTa), as SimCSE's
  ``evaluation.py`` does for ``--pooler cls``; a model without one is refused.
* :func:`st_pooler_name`: the cselab pooler of a sentence-transformers folder's Pooling module;
  modes cselab cannot reproduce (max, mean_sqrt_len_tokens, several at once) are refused.
* :func:`max_sequence_length`: the longest input a model really accepts, i.e. the tokenizer's
  ``model_max_length`` capped by the position embeddings usable by tokens (RoBERTa-style models
  start positions after ``padding_idx``: 514 embeddings hold 512 tokens).
* :class:`ExpectedHeadReport`: a decoder's causal-LM checkpoint read as its base model leaves
  its LM head unused, as cselab means it to; transformers' load report of that alone is not
  shown (any other report is).
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from torch import nn

from ..core.errors import ModelFormatError, ModelSettingError  # noqa: F401 - re-exported
from .pooling import LAST_LAYER, POOLER_MEANINGS, MLPHead
from .st_folder import read_json, read_modules


class ExpectedHeadReport(logging.Filter):
    """Drops transformers' "LOAD REPORT" warning when every key it lists is an unused
    ``lm_head.*`` weight (UNEXPECTED): cselab encodes with a decoder's base model, so a
    checkpoint saved with its causal-LM head (any decoder on the Hub, an MNTP run's base) is
    meant to leave the head out. A report of any other key, or of a missing one, is kept."""

    _ANSI = re.compile(r"\x1b\[[0-9;]*m")

    def filter(self, record: logging.LogRecord) -> bool:
        message = self._ANSI.sub("", record.getMessage())
        if "LOAD REPORT" not in message:
            return True
        rows = [
            [cell.strip() for cell in line.split("|")]
            for line in message.splitlines()
            if "|" in line and not set(line) <= set("-+| ")
        ]
        keys = [row for row in rows[1:] if len(row) >= 2]  # rows[0]: the header
        expected = bool(keys) and all(
            key.startswith("lm_head.") and status == "UNEXPECTED" for key, status, *_ in keys
        )
        return not expected


#: transformers' logger of model loading (its load report)
logging.getLogger("transformers.modeling_utils").addFilter(ExpectedHeadReport())


#: sentence-transformers Pooling mode -> cselab pooler (the modes cselab reproduces exactly: the
#: poolers of the last layer alone, without a head)
ST_POOLING_MODES = {
    m.token: name for name, m in POOLER_MEANINGS.items() if m.layers == LAST_LAYER and not m.head
}
# sentence-transformers < 5 stored one boolean per mode
_ST_LEGACY_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


def _pooling_modes(cfg: dict[str, Any]) -> list[str]:
    mode = cfg.get("pooling_mode")
    if mode is not None:
        return [mode] if isinstance(mode, str) else [str(m) for m in mode]
    return [name for key, name in _ST_LEGACY_KEYS.items() if cfg.get(key)]


def st_pooler_name(folder: Path) -> str | None:
    """The cselab pooler that a sentence-transformers folder's Pooling module computes, or
    ``None`` if ``folder`` is not a sentence-transformers folder (no ``modules.json``).

    Raises :class:`ModelFormatError` naming the mode when cselab has no equal pooler.
    """
    modules = read_modules(folder)  # the one reader of modules.json
    if modules is None:
        return None
    for module in modules:
        kind = str(module.get("type", ""))
        if not kind.endswith("Pooling") or "Weighted" in kind:
            continue
        cfg_file = folder / str(module.get("path", "")) / "config.json"
        cfg = read_json(cfg_file) if cfg_file.is_file() else {}
        if not isinstance(cfg, dict):
            raise ModelFormatError(f"{cfg_file}: expected a JSON object, got {type(cfg).__name__}")
        modes = _pooling_modes(cfg) or ["mean"]  # sentence-transformers' default
        if len(modes) == 1 and modes[0] in ST_POOLING_MODES:
            return ST_POOLING_MODES[modes[0]]
        raise ModelSettingError(
            "pooler", "NAME",
            "{file}: pooling mode {modes} is not supported by cselab (it reproduces {known}); "
            "choose one of cselab's with {setting}",
            placeholder=True, key="model.pooler",
            file=cfg_file, modes="+".join(modes), known=", ".join(ST_POOLING_MODES),
        )  # fmt: skip
    return None


def checkpoint_keys(folder: Path) -> set[str]:
    """The tensor names stored in a Hugging Face model folder (safetensors or ``.bin``, single
    or sharded); ``.bin`` files are opened with ``weights_only`` (no code runs) and ``mmap``."""
    import torch
    from safetensors import safe_open

    keys: set[str] = set()
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (folder / index).is_file():
            keys |= set(json.loads((folder / index).read_text(encoding="utf-8"))["weight_map"])
    for file in folder.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as fh:
            keys |= set(fh.keys())
    if not keys:
        for file in folder.glob("pytorch_model*.bin"):
            state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
            keys |= set(state)
    return keys


def _no_pooler_head(source: str, why: str) -> ModelSettingError:
    """The error of ``pooler: cls`` on a model without a usable pooler layer, saying ``why``."""
    return ModelSettingError(
        "pooler", "cls_before_pooler",
        "pooler 'cls' on {source}: " + why + "; choose {setting} (cls_before_pooler: the raw "
        "[CLS] vector)",
        values=("cls_before_pooler", "avg"), key="model.pooler", source=source,
    )  # fmt: skip


def hf_pooler_head(backbone: nn.Module, folder: Path, source: str) -> MLPHead:
    """An :class:`MLPHead` computing ``backbone``'s ``pooler_output`` from the [CLS] vector.

    Raises :class:`ModelFormatError` when the model has no such pooler (``add_pooling_layer``
    off, an architecture without one, a pooler that is not ``tanh(dense(h_[CLS]))``, or one
    whose weights are not in the checkpoint: transformers would have initialised it randomly).
    """
    pooler = getattr(backbone, "pooler", None)
    dense = getattr(pooler, "dense", None)
    activation = getattr(pooler, "activation", None)
    hidden = int(backbone.config.hidden_size)
    if (
        not isinstance(dense, nn.Linear)
        or not isinstance(activation, nn.Tanh)
        or dense.in_features != hidden
        or dense.out_features != hidden
        or dense.bias is None
    ):
        raise _no_pooler_head(source, "the model has no pooler layer (pooler_output) to use")
    if not any(k.endswith("pooler.dense.weight") for k in checkpoint_keys(folder)):
        raise _no_pooler_head(
            source, "the checkpoint has no pooler weights (pooler_output would be random)"
        )
    head = MLPHead(hidden).to(dtype=dense.weight.dtype, device=dense.weight.device)
    head.dense.load_state_dict(dense.state_dict())
    return head


def position_limit(backbone: nn.Module) -> int:
    """How many tokens the backbone's position embeddings can hold.

    RoBERTa-family embeddings number positions from ``padding_idx + 1``, so
    ``max_position_embeddings - padding_idx - 1`` tokens fit (514 → 512).
    """
    limit = int(getattr(backbone.config, "max_position_embeddings", 512))
    padding_idx = getattr(getattr(backbone, "embeddings", None), "padding_idx", None)
    if isinstance(padding_idx, int):
        limit -= padding_idx + 1
    return limit


def max_sequence_length(tokenizer: Any, backbone: nn.Module) -> int:
    """The tokenizer's ``model_max_length`` (unset: a huge sentinel) capped by
    :func:`position_limit`."""
    limit = position_limit(backbone)
    declared = getattr(tokenizer, "model_max_length", None)
    if isinstance(declared, int) and 0 < declared < limit:
        return declared
    return limit
