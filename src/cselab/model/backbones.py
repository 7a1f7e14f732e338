"""The table of backbones: what cselab knows of each architecture (``config.model_type``).

One home for every per-architecture fact the model layer acts on, read by the encoder
(:mod:`.sentence_encoder`), by the CPU fast path (:data:`FAST_PATH_MODEL_TYPES`, used by
:mod:`.unpad`), by ``cselab config`` (the ``model`` keys' help) and by ``docs/backbones.md``
(whose table ``tests/test_backbones.py`` checks against :func:`table_rows`):

* which config keys are its dropout probabilities (``model.dropout`` sets all of them, and an
  objective whose positive is a second dropout view refuses a backbone where all are 0);
* the attention implementations ``transformers`` has for it;
* whether cselab's packed CPU forward applies;
* its default pooler;
* whether it is already bidirectional (encoders) or can be made so (decoders: LLM2Vec,
  BehnamGhader et al. 2024, Sec. 2: the causal mask is replaced by an all-ones mask);
* the special token that ends a sentence (``last`` pooling reads it; EOS for decoders, whose
  tokenizers often do not add it).

An architecture not in the table runs the plain ``transformers`` forward with the dropout keys it
happens to have; :func:`lookup` logs one line saying so.

Decoders have no dropout outside attention: Llama, Mistral, Qwen2/3 and Gemma apply dropout only
to the attention probabilities (``attention_dropout``); there is no hidden-state or MLP dropout to
set. LLM2Vec does the same: its SimCSE step passes ``attention_dropout=simcse_dropout`` (0.3) when
it loads the model (``experiments/run_simcse.py``), and nothing else.
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..core.errors import ModelFormatError

log = logging.getLogger("cselab")

#: what ``model.bidirectional`` means for an architecture
ALREADY = "already"  # an encoder: every token attends to every token
SWITCHABLE = "switchable"  # a decoder whose causal mask cselab can remove (LLM2Vec)


@dataclass(frozen=True)
class Backbone:
    """What cselab knows of one architecture.

    Attributes:
        model_type: ``config.model_type``.
        dropout_keys: the config keys that are dropout probabilities inside the backbone (not
            classifier heads); ``model.dropout`` sets each of them.
        attention: the ``attn_implementation`` values ``transformers`` has for it (``eager`` is
            what cselab falls back to when ``sdpa`` is missing).
        fast_path: cselab's packed CPU forward (:mod:`.unpad`) applies.
        default_pooler: the pooler to use with it (encoders with a trained ``[CLS]``: ``cls``,
            as SimCSE; ModernBERT and decoders: ``avg``, LLM2Vec's mean pooling).
        is_decoder: a causal language model (its attention is causal as loaded).
        bidirectional: :data:`ALREADY` (an encoder) or :data:`SWITCHABLE` (a decoder whose
            causal mask cselab removes with ``model.bidirectional``).
        end_token: the tokenizer attribute of the token that ends a sentence, read by the
            ``last`` pooler (appended to a row whose tokenizer did not add it).
        mask_4d: its ``transformers`` forward (``masking_utils``) takes a prepared 4D mask as
            given, so cselab hands it one and the forward reads nothing back from the device
            (:func:`cselab.model.unpad.padded_attention_mask`).
        lora_targets: the modules that get LoRA adapters when ``model.lora.target_modules`` is
            null: the attention and MLP projections (for decoders LLM2Vec's list,
            ``initialize_peft`` of ``McGill-NLP/llm2vec``).
    """

    model_type: str
    dropout_keys: tuple[str, ...]
    attention: tuple[str, ...]
    fast_path: bool
    default_pooler: str
    is_decoder: bool
    bidirectional: str
    end_token: str
    lora_targets: tuple[str, ...]
    mask_4d: bool = False


_BERT_DROPOUT = ("hidden_dropout_prob", "attention_probs_dropout_prob")
_ALL_ATTENTION = ("sdpa", "eager", "flash_attention_2", "flex_attention")
_DECODER_DROPOUT = ("attention_dropout",)
_BERT_LORA = ("query", "key", "value", "dense")
_DECODER_LORA = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _encoder(kind: str, dropout: tuple[str, ...] = _BERT_DROPOUT, **kw: Any) -> Backbone:
    fields: dict[str, Any] = {
        "model_type": kind,
        "dropout_keys": dropout,
        "attention": _ALL_ATTENTION,
        "fast_path": False,
        "default_pooler": "cls",
        "is_decoder": False,
        "bidirectional": ALREADY,
        "end_token": "sep_token",
        "lora_targets": _BERT_LORA,
    }
    return Backbone(**{**fields, **kw})


def _decoder(kind: str, **kw: Any) -> Backbone:
    fields: dict[str, Any] = {
        "model_type": kind,
        "dropout_keys": _DECODER_DROPOUT,
        "attention": _ALL_ATTENTION,
        "fast_path": False,
        "default_pooler": "avg",
        "is_decoder": True,
        "bidirectional": SWITCHABLE,
        "end_token": "eos_token",
        "lora_targets": _DECODER_LORA,
    }
    return Backbone(**{**fields, **kw})


#: ``model_type`` -> :class:`Backbone`: the one table (attention implementations as declared by
#: the ``_supports_*`` flags of ``transformers`` 5's model classes)
BACKBONES: dict[str, Backbone] = {
    b.model_type: b
    for b in (
        _encoder("bert", fast_path=True, mask_4d=True),
        _encoder("roberta", mask_4d=True),
        _encoder("xlm-roberta", mask_4d=True),
        _encoder("mpnet", attention=("eager",), lora_targets=("q", "k", "v", "o", "dense")),
        _encoder(
            "deberta-v2",
            attention=("eager",),
            lora_targets=("query_proj", "key_proj", "value_proj", "dense"),
        ),
        _encoder("electra", mask_4d=True),
        _encoder(
            "distilbert",
            dropout=("dropout", "attention_dropout"),
            lora_targets=("q_lin", "k_lin", "v_lin", "out_lin", "lin1", "lin2"),
        ),
        _encoder(
            "modernbert",
            dropout=("attention_dropout", "mlp_dropout", "embedding_dropout"),
            default_pooler="avg",
            lora_targets=("Wqkv", "Wo", "Wi"),
            mask_4d=True,
        ),
        _decoder("llama", mask_4d=True),
        _decoder("mistral", mask_4d=True),
        _decoder("qwen2", mask_4d=True),
        _decoder("qwen3", mask_4d=True),
        _decoder("gemma"),
        _decoder("gemma2", attention=("eager", "flash_attention_2", "flex_attention")),
    )
}

#: The architectures that get the packed CPU forward (:mod:`.unpad`): embeddings that take
#: ``position_ids`` counted from 0, token-wise layers apart from self-attention and BERT's
#: attribute names. Every other architecture runs the plain padded forward.
FAST_PATH_MODEL_TYPES = frozenset(k for k, b in BACKBONES.items() if b.fast_path)

#: a config key of an architecture outside the table that is a dropout probability inside the
#: backbone: its name holds ``dropout`` (BERT's, T5's, ...) or ``pdrop`` (GPT-2's ``attn_pdrop``,
#: ``resid_pdrop``, ``embd_pdrop``), ...
DROPOUT_KEY = re.compile(r"dropout|pdrop")
#: ... unless it belongs to a head cselab does not load (a classifier, GPT-2's summary head)
HEAD_DROPOUT_KEY = re.compile(r"^(classif|summary|head_)")


_noted: set[str] = set()


def lookup(model_type: str | None) -> Backbone | None:
    """The table's row for ``model_type``; ``None`` (and one logged line, once per type) for an
    architecture cselab has no row for, which then runs the plain ``transformers`` forward."""
    row = BACKBONES.get(str(model_type))
    if row is None and str(model_type) not in _noted:
        _noted.add(str(model_type))
        log.info(
            "model_type %r is not in cselab's table of backbones (cselab.model.backbones): the "
            "plain transformers forward, dropout keys as found",
            model_type,
        )
    return row


def dropout_keys(config: Any) -> tuple[str, ...]:
    """The dropout keys of a ``transformers`` config: the table's, else its keys named like a
    dropout probability (:data:`DROPOUT_KEY`, not a head's) whose value is a number."""
    row = lookup(getattr(config, "model_type", None))
    if row is not None:
        return row.dropout_keys
    return tuple(
        key
        for key, value in vars(config).items()
        if DROPOUT_KEY.search(key)
        and not HEAD_DROPOUT_KEY.match(key)
        and isinstance(value, int | float)
        and not isinstance(value, bool)
    )


def set_dropout(config: Any, p: float) -> tuple[str, ...]:
    """Set every dropout probability of ``config`` to ``p`` (before the model is built); returns
    the keys set and logs them once."""
    keys = dropout_keys(config)
    for key in keys:
        setattr(config, key, float(p))
    kind = getattr(config, "model_type", "?")
    if keys:
        note = " (no hidden-state dropout in this architecture)" if is_decoder(config) else ""
        log.info("model.dropout=%s set %s of %s%s", p, ", ".join(keys), kind, note)
    else:
        log.warning("model.dropout=%s: %s has no dropout key cselab knows; nothing set", p, kind)
    return keys


def dropout_probabilities(config: Any) -> dict[str, float]:
    """``key -> p`` for every dropout key of ``config`` (a missing key counts as 0)."""
    return {k: float(getattr(config, k, 0.0) or 0.0) for k in dropout_keys(config)}


def noise_free(config: Any) -> str | None:
    """``None`` when the backbone applies dropout; else the one line refusing a dropout-view
    objective on it (SimCSE's positive is a second dropout mask: without dropout it is the
    anchor itself and the loss is 0 from the first step)."""
    probs = dropout_probabilities(config)
    if any(p > 0.0 for p in probs.values()):
        return None
    kind = getattr(config, "model_type", "this model")
    keys = ", ".join(probs) or "it has no dropout key"
    verb = "is" if len(probs) == 1 else "are"
    named = f"{keys} {verb} 0" if probs else keys
    return (
        f"{kind} applies no dropout ({named}): set model.dropout "
        "(SimCSE: 0.1; LLM2Vec uses 0.3 for decoders)"
    )


def is_decoder(config: Any) -> bool:
    """Whether the architecture is a causal decoder: the table's row; outside the table,
    ``config.is_decoder``, else whether ``transformers`` builds a causal LM of its type and no
    masked LM (BERT-like encoders have both; GPT-2, OPT, Phi, Falcon... only the causal one)."""
    kind = str(getattr(config, "model_type", None))
    row = BACKBONES.get(kind)
    if row is not None:
        return row.is_decoder
    if getattr(config, "is_decoder", False):
        return True
    if getattr(config, "is_encoder_decoder", False):
        return False
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    return (
        kind in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and kind not in MODEL_FOR_MASKED_LM_MAPPING_NAMES
    )


def default_pooler(config: Any, say: bool = True) -> str:
    """``model.pooler: null`` for this architecture: its row's ``default_pooler``; outside the
    table ``avg`` for a decoder (its first token sees nothing) and SimCSE's ``cls`` otherwise.
    ``say``: log the choice (a run resolving its pooler), not when a message only names it."""
    row = BACKBONES.get(str(getattr(config, "model_type", None)))
    kind = row.default_pooler if row is not None else "avg" if is_decoder(config) else "cls"
    if say:
        log.info("model.pooler: %s (the default of %s)", kind, getattr(config, "model_type", None))
    return kind


def end_token_id(tokenizer: Any, config: Any) -> int | None:
    """The id of the token that ends a sentence for ``last`` pooling: the table's
    ``end_token`` (EOS for decoders, SEP for encoders), else the other one; ``None``: none."""
    row = BACKBONES.get(str(getattr(config, "model_type", None)))
    first = row.end_token if row is not None else "eos_token"
    for name in (first, "eos_token" if first == "sep_token" else "sep_token"):
        if getattr(tokenizer, name, None) is not None:
            value = getattr(tokenizer, f"{name}_id", None)
            if value is not None:
                return int(value)
    return None


def make_bidirectional(backbone: Any) -> bool:
    """Remove a decoder's causal mask; ``True`` if the backbone is bidirectional afterwards.

    ``config.is_causal = False`` is the one switch in ``transformers`` 5: the model's mask
    builders (``masking_utils.create_causal_mask`` and its sliding-window form) build the
    padding-only (bidirectional) mask, and the models' input decorator
    (``utils/generic.py``) passes ``is_causal=False`` from the config to every attention call, so
    ``sdpa`` and flash attention do not apply their own causal flag when no mask is built (a
    batch without padding). Setting each attention module's ``is_causal`` too is dead on
    ``transformers`` 5.24 (tested: an unpadded sentence under ``sdpa`` and ``eager`` is
    bidirectional without it, ``tests/test_backbones.py``), so it is not done. The weights are
    untouched; this is LLM2Vec's bidirectional attention (BehnamGhader et al. 2024, Sec. 2.1)
    without subclassing each model class.
    """
    config = backbone.config
    row = lookup(getattr(config, "model_type", None))
    if row is not None and row.bidirectional == ALREADY:
        return True
    if row is None and not getattr(config, "is_decoder", False):
        return False  # outside the table only a config that says so: cselab knows no switch
    config.is_causal = False
    if hasattr(config, "use_bidirectional_attention"):
        config.use_bidirectional_attention = True
    return True


#: the columns of :func:`table_rows`
TABLE_HEADER = (
    "model_type",
    "dropout keys (`model.dropout`)",
    "attention",
    "CPU fast path",
    "default pooler",
    "decoder",
    "bidirectional",
    "`last` reads",
)


def table_rows(rows: Mapping[str, Backbone] = BACKBONES) -> list[tuple[str, ...]]:
    """The table as rows of text under :data:`TABLE_HEADER` (``docs/backbones.md`` holds them
    as a markdown table, ``cselab config`` names the architectures; a test compares)."""
    return [
        (
            b.model_type,
            ", ".join(b.dropout_keys),
            ", ".join(b.attention),
            "yes" if b.fast_path else "no",
            b.default_pooler,
            "yes" if b.is_decoder else "no",
            "yes" if b.bidirectional == ALREADY else "with model.bidirectional",
            b.end_token.removesuffix("_token").upper(),
        )
        for b in rows.values()
    ]


def summary() -> str:
    """One line naming the architectures of the table (``cselab config``'s header)."""
    encoders = [k for k, b in BACKBONES.items() if not b.is_decoder]
    decoders = [k for k, b in BACKBONES.items() if b.is_decoder]
    return (
        f"Backbones cselab knows (cselab.model.backbones, docs/backbones.md): encoders "
        f"{', '.join(encoders)}; decoders (model.bidirectional, pooler avg/last/weighted_mean) "
        f"{', '.join(decoders)}; any other AutoModel runs the plain forward."
    )


def refuse_missing_lm_head(model: Any, missing: Iterable[str], name_or_path: str) -> None:
    """Refuse a causal LM whose folder held no LM head weights (an untied head missing from the
    checkpoint, a base model saved alone): MNTP would train a random head. Tied heads are the
    embeddings, never reported missing."""
    head = model.get_output_embeddings()
    name = next((n for n, m in model.named_modules() if m is head), None)
    if name and any(key.startswith(f"{name}.") for key in missing):
        raise ModelFormatError(
            f"{name_or_path}: the folder holds no weights of the language-modelling head "
            f"({name}), which MNTP predicts tokens with; save the model with its head "
            "(AutoModelForCausalLM) or start from the released causal LM"
        )


def forward_takes(backbone: Any, name: str) -> bool:
    """Whether ``backbone``'s forward (a ``peft`` wrapper's: its base model's) takes keyword
    ``name`` by name: token types (decoders take none), ``use_cache`` (a remote-code decoder
    may not)."""
    base = backbone.get_base_model() if hasattr(backbone, "get_base_model") else backbone
    return name in _forward_parameters(type(base))


@functools.cache
def _forward_parameters(cls: type) -> frozenset[str]:
    try:
        return frozenset(inspect.signature(cls.forward).parameters)
    except (TypeError, ValueError):
        return frozenset()


def no_cache(backbone: Any) -> dict[str, Any]:
    """The keyword a decoder's forward takes to build no key/value cache (``use_cache=False``;
    ``{}`` for an encoder): cselab never generates, so a cache would only hold every layer's
    keys and values to the end of the forward (and, with checkpointing, make ``transformers``
    warn that it turns it off)."""
    config = getattr(backbone, "config", None)
    if config is None or not is_decoder(config) or not forward_takes(backbone, "use_cache"):
        return {}
    return {"use_cache": False}


def checkpoint_layers(backbone: Any, enabled: bool) -> None:
    """Turn the backbone's non-reentrant activation checkpointing on or off (the recomputation
    restores the forward's random state, so dropout draws the same masks)."""
    # transformers 5 renamed gradient_* to activation_checkpointing_* (the old names warn)
    new = hasattr(backbone, "activation_checkpointing_enable")
    if enabled and new:
        backbone.activation_checkpointing_enable({"use_reentrant": False})
    elif enabled:
        backbone.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False}
        )
    elif new:
        backbone.activation_checkpointing_disable()
    else:
        backbone.gradient_checkpointing_disable()
