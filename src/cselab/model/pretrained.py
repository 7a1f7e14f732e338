"""The steps of :meth:`SentenceEncoder.from_pretrained <cselab.model.sentence_encoder.SentenceEncoder.from_pretrained>`:
a model's config, its backbone, its tokenizer and the settings a starting folder records.

Each step refuses a bad setting in one line before the next, heavier one runs: the LoRA section
and the rank before any weight is read, the pooler of a causal decoder before the model is
wrapped. The table of backbones (:mod:`.backbones`) says what each architecture is.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..core.errors import ConfigError, ModelFormatError, first_line
from . import backbones
from . import lora as adapters
from .config import LoRAConfig
from .hub import pickled_weights_refused, unpickling_failed
from .st_folder import CSELAB_FILE, recorded_settings

log = logging.getLogger(__name__)

#: ``model.dtype`` -> the weights' dtype
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def starting_defaults(
    root: Path, pooler: str | None, bidirectional: bool | None
) -> tuple[str | None, bool]:
    """``(pooler, bidirectional)`` of a load from ``root``: a setting left unset (``None``) is
    what the folder's ``cselab.json`` records (a merged MNTP model stays bidirectional when the
    SimCSE run starts from it), logged in one line; a setting that differs from the record is
    kept, and one warning says that the run changes it. Another folder: ``bidirectional``
    false unless given."""
    recorded = recorded_settings(root)
    if not recorded:
        return pooler, bool(bidirectional)
    said_pooler, said_bidirectional = recorded["pooler"], recorded["bidirectional"]
    adopted = bidirectional is None or (pooler is None and said_pooler is not None)
    changed = []
    if bidirectional is None:
        bidirectional = said_bidirectional
    elif bidirectional != said_bidirectional:
        changed.append(
            f"model.bidirectional={str(bidirectional).lower()} (it records "
            f"{str(said_bidirectional).lower()})"
        )
    if pooler is None:
        pooler = said_pooler
    elif said_pooler is not None and pooler != said_pooler:
        changed.append(f"model.pooler={pooler} (it records {said_pooler})")
    if adopted:
        log.info(
            "model: bidirectional %s, pooler %s, as %s records (the starting model's)",
            str(bidirectional).lower(), pooler, root / CSELAB_FILE,
        )  # fmt: skip
    if changed:
        log.warning(
            "%s: %s; not how the model was trained to run",
            root / CSELAB_FILE, ", ".join(changed),
        )  # fmt: skip
    return pooler, bidirectional


def unreadable_model(path: str, err: BaseException) -> ModelFormatError:
    """The one line for a folder ``transformers`` cannot read as a model: no ``config.json``,
    one without a model type or not JSON, weights missing or cut (``err``: what it raised)."""
    if not (Path(path) / "config.json").is_file():
        return ModelFormatError(f"{path}: not a model folder (no config.json)")
    said = first_line(err)
    return ModelFormatError(
        f"{path}: not a model transformers can read ({type(err).__name__}: {said})"
    )


def load_config(
    path: str,
    name_or_path: str,
    *,
    trust_remote_code: bool,
    lm_head: bool,
    dropout: float | None,
    dtype: str,
    lora: LoRAConfig | None,
) -> Any:
    """The model's ``transformers`` config with ``model.dropout`` set, after the checks that
    need only it: MNTP on an encoder, the dtype, the LoRA rank against the width."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:  # a folder that is no model, or a broken config.json
        raise unreadable_model(path, err) from None
    row = backbones.lookup(getattr(config, "model_type", None))  # an unknown type: one note
    if lm_head and row is not None and not row.is_decoder:
        # transformers would build BERT's BertLMHeadModel: a causal head on an encoder
        raise ConfigError(
            f"objective.mntp: {name_or_path} is {config.model_type}, an encoder; MNTP "
            "predicts the next token: a decoder of the table of backbones"
        )
    if dtype not in DTYPES:
        raise ConfigError(f"model.dtype={dtype!r}: choose one of {', '.join(DTYPES)}")
    if lora is not None and lora.enabled:
        adapters.check_rank(lora, config)
    if dropout is not None:
        backbones.set_dropout(config, dropout)
    return config


def load_backbone(
    path: str,
    name_or_path: str,
    config: Any,
    *,
    trust_remote_code: bool,
    attn_implementation: str | None,
    dtype: str,
    lm_head: bool,
) -> tuple[nn.Module, nn.Module | None]:
    """``(backbone, LM head or None)``: the base model of ``path`` (``AutoModel``, or the base of
    ``AutoModelForCausalLM`` with ``lm_head``), in float32 unless ``dtype`` says otherwise;
    an architecture without ``sdpa`` falls back to ``eager``. Pickled weights holding code are
    refused (:class:`ModelFormatError`), nothing in them run."""
    from transformers import AutoModel, AutoModelForCausalLM

    auto = AutoModelForCausalLM if lm_head else AutoModel
    kwargs: dict[str, Any] = {"config": config, "trust_remote_code": trust_remote_code}
    if dtype != "float32":  # float32: the saved dtype, half precision upcast below
        kwargs["dtype"] = DTYPES[dtype]
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    if lm_head:  # which weights the folder lacked: a missing LM head would start random
        kwargs["output_loading_info"] = True
    try:
        try:
            backbone = auto.from_pretrained(path, **kwargs)
        except (ValueError, ImportError) as err:
            if not attn_implementation or unpickling_failed(err):
                raise
            # Some architectures have no SDPA path; eager attention is always available.
            kwargs["attn_implementation"] = "eager"
            backbone = auto.from_pretrained(path, **kwargs)
    except Exception as err:
        if unpickling_failed(err):
            raise ModelFormatError(pickled_weights_refused(Path(path))) from None
        if lm_head and isinstance(err, ValueError) and "Unrecognized configuration" in str(err):
            raise ModelFormatError(
                f"{name_or_path} ({config.model_type}) has no causal language-modelling head "
                "(AutoModelForCausalLM), which token prediction (MNTP) needs"
            ) from None
        # weights missing, cut or of other shapes: the files, not the code, are at fault
        if isinstance(err, OSError | ValueError) or type(err).__name__ == "SafetensorError":
            raise unreadable_model(path, err) from None
        raise
    head: nn.Module | None = None
    if lm_head:  # keep the base model as the backbone and the head beside it
        backbone, info = backbone
        backbones.refuse_missing_lm_head(backbone, info["missing_keys"], name_or_path)
    if dtype == "float32" and backbone.dtype in (torch.bfloat16, torch.float16):
        backbone.float()  # a half-precision checkpoint trains in float32 unless asked
    if lm_head:
        head = backbone.get_output_embeddings()
        backbone = backbone.base_model
    return backbone, head


def load_tokenizer(path: str, trust_remote_code: bool) -> Any:
    """The folder's tokenizer; a decoder's missing pad token is its EOS (the mask hides it)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def attention_and_pooler(
    backbone: nn.Module, config: Any, pooler: str | None, bidirectional: bool
) -> str:
    """Make the decoder bidirectional when asked and return the pooler (``None``: the
    architecture's default, logged); a causal decoder's first-token pooler is refused, its first
    token having seen nothing of the sentence."""
    if bidirectional and not backbones.make_bidirectional(backbone):
        raise ConfigError(
            f"model.bidirectional: cselab cannot remove the causal mask of "
            f"{config.model_type} (not a decoder of cselab's table of backbones)"
        )
    pooler = pooler or backbones.default_pooler(config)  # null: resolved once, here (logged)
    if (
        backbones.is_decoder(config)
        and not bidirectional
        and pooler in ("cls", "cls_before_pooler")
    ):
        raise ConfigError(
            f"model.pooler={pooler}: {config.model_type} is a causal decoder, whose first "
            f"token sees no other token; use pooler {backbones.default_pooler(config, say=False)} "
            "(its default), last or "
            "weighted_mean, or bidirectional attention (model.pooler and model.bidirectional in "
            "a config; pooler= and bidirectional= in cselab.load)"
        )
    return pooler
