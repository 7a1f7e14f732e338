"""The ``model`` section of a run config: which encoder, pooled how, with what sequence length.

Its defaults are SimCSE's unsupervised BERT-base recipe; :meth:`SentenceEncoder.from_pretrained`
takes the same defaults from here (one home).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import ClassVar, Literal

from ..core.errors import ConfigError
from .choices import PoolerName

#: where the sentence goes in a prompt template, and the token whose state is its vector
SENTENCE_SLOT = "[X]"
MASK_SLOT = "[MASK]"
#: PromptEOL's template (Jiang et al. 2023, "Scaling Sentence Embeddings with Large Language
#: Models", Sec. 3.1): the vector is the state of its last token
PROMPTEOL_TEMPLATE = 'This sentence : "[X]" means in one word:"'


@dataclass
class PromptConfig:
    """PromptBERT's template (Jiang et al. 2022), read with ``model.pooler: prompt``.

    The sentence's tokens are spliced in at ``[X]`` and its vector is the last layer's state at
    ``[MASK]`` (the tokenizer's mask token). The defaults are the authors' unsupervised BERT
    recipe (``run.sh unsup-bert``). A template without ``[MASK]`` reads its last token: PromptEOL
    for decoders (Jiang et al. 2023: :data:`PROMPTEOL_TEMPLATE`, with ``template2: null`` and
    ``denoise: false``).

    Attributes:
        template: the template of the anchor view, of inference and of evaluation; ``[X]``
            exactly once, ``[MASK]`` once (PromptBERT) or not at all (PromptEOL: the last
            token is read).
        template2: the template of the second view in training (the positive, and a pair's
            hard negatives); ``null``: ``template``. Unsupervised PromptBERT uses two templates.
        denoise: template denoising in training: subtract from each vector the ``[MASK]`` state
            of the template alone, its position ids shifted as if the sentence were there.
        denoise_inference: the same in ``encode`` and evaluation (the authors' unsupervised
            models are evaluated without it, their supervised ones with it).
    """

    template: str = 'This sentence of "[X]" means [MASK].'
    template2: str | None = 'This sentence : "[X]" means [MASK].'
    denoise: bool = True
    denoise_inference: bool = False

    def templates(self) -> tuple[str, ...]:
        """The distinct templates: the anchor's, then the second view's if it differs."""
        second = self.template2 if self.template2 is not None else self.template
        return (self.template,) if second == self.template else (self.template, second)

    def validate(self, prefix: str = "model.prompt") -> PromptConfig:
        """Each template holds ``[X]`` exactly once and ``[MASK]`` at most once (without it, some
        text after ``[X]``); raises :class:`ConfigError` naming the key."""
        for key, text in (("template", self.template), ("template2", self.template2)):
            if text is None and key == "template2":
                continue
            if not isinstance(text, str):
                raise ConfigError(f"{prefix}.{key} must be a string, got {text!r}")
            if text.count(SENTENCE_SLOT) != 1:
                raise ConfigError(
                    f"{prefix}.{key} must contain {SENTENCE_SLOT} exactly once, got {text!r}"
                )
            if text.count(MASK_SLOT) > 1:
                raise ConfigError(
                    f"{prefix}.{key} must contain {MASK_SLOT} at most once, got {text!r}"
                )
            if MASK_SLOT not in text and not text.split(SENTENCE_SLOT)[1].strip():
                raise ConfigError(
                    f"{prefix}.{key}: a template without {MASK_SLOT} (PromptEOL) reads its last "
                    f"token, so it needs text after {SENTENCE_SLOT}, got {text!r}"
                )
        return self


@dataclass
class LoRAConfig:
    """LoRA adapters (Hu et al. 2022) through ``peft``, read from ``model.lora``.

    ``W x`` becomes ``W x + (alpha / r) · B A x`` in every target module, with ``A`` (``r × in``)
    random, ``B`` (``out × r``) zero at the start; the backbone's own weights are frozen and only
    ``A``, ``B`` (and the pooler's head, if any) train. Off while ``r`` is 0 (the default).

    Attributes:
        r: the adapters' rank; ``0``: no LoRA (every weight trains). LLM2Vec: 16.
        alpha: the scale's numerator; ``null``: ``2 · r`` (LLM2Vec's ``lora_alpha = 2 · lora_r``).
        dropout: dropout on the adapters' input (LLM2Vec: 0.05).
        target_modules: the module names that get adapters; ``null``: the architecture's
            default (:data:`cselab.model.backbones.BACKBONES`' ``lora_targets``: attention and MLP
            projections), or ``peft``'s own table for an architecture not listed there.
    """

    r: int = 0
    alpha: float | None = None
    dropout: float = 0.05
    target_modules: list[str] | None = None

    @property
    def enabled(self) -> bool:
        return self.r > 0

    @property
    def scale_alpha(self) -> float:
        """``alpha``, or ``2 · r`` when unset."""
        return float(self.alpha) if self.alpha is not None else 2.0 * self.r

    def unused(self, prefix: str = "model.lora") -> list[str]:
        """``key=value`` of each key changed from its default while ``r`` is 0 (LoRA off, so
        it does nothing). Not refused: a sweep compares ``r: [0, 16]`` on one base, a preset
        names its modules, and runs saved so must still resume; a run logs them once
        (:func:`cselab.app.plan.resolve`)."""
        if self.r != 0:
            return []
        default = LoRAConfig()
        return [
            f"{prefix}.{f.name}={getattr(self, f.name)!r}"
            for f in fields(self)
            if f.name != "r" and getattr(self, f.name) != getattr(default, f.name)
        ]

    def validate(self, prefix: str = "model.lora") -> LoRAConfig:
        """Ranges of the keys; raises :class:`ConfigError` naming the key."""
        if self.r < 0:
            raise ConfigError(f"{prefix}.r must be >= 0 (0: no LoRA), got {self.r}")
        if self.alpha is not None and not self.alpha > 0:
            raise ConfigError(f"{prefix}.alpha must be > 0 or null (2 * r), got {self.alpha}")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"{prefix}.dropout must be in [0, 1), got {self.dropout}")
        if self.target_modules is not None and not self.target_modules:
            raise ConfigError(f"{prefix}.target_modules must name at least one module, or be null")
        return self


@dataclass
class ModelConfig:
    """The encoder.

    Attributes:
        name_or_path: Hugging Face Hub name or local folder of any ``AutoModel`` encoder.
        pooler: how a sentence vector is read from the encoder (see :mod:`cselab.model.pooling`);
            ``null``: the architecture's default of the table of backbones
            (:data:`cselab.model.backbones.BACKBONES`: ``cls``, SimCSE's, for the BERT family,
            ``avg`` for ModernBERT and decoders), resolved when the model loads and recorded in
            the run's saved config.
        mlp_only_train: with ``pooler: cls`` (or ``prompt``, where it must be true), use the MLP
            head in training only (SimCSE unsup; PromptBERT unsup).
        max_seq_len: truncation length in tokens (SimCSE: 32).
        dropout: if set, every dropout probability of the backbone (the keys of its row in the
            table of backbones, :mod:`cselab.model.backbones`: BERT's hidden and attention
            dropout, ModernBERT's attention, MLP and embedding dropout, a decoder's attention
            dropout, the only one it has). SimCSE uses 0.1, LLM2Vec 0.3 for decoders.
        attn_implementation: ``sdpa`` (PyTorch scaled-dot-product attention), ``eager`` or
            ``flash_attention_2`` (on a CUDA GPU with the ``flash-attn`` package: attention on
            the real tokens only, variable length, no padding computed; refused where the
            package is missing).
        bidirectional: remove a decoder's causal mask, so every token attends to every token
            (LLM2Vec, BehnamGhader et al. 2024); encoders already are. The saved folder keeps
            the setting (``cselab.load`` applies it; sentence-transformers cannot). ``null``:
            what the starting model records (a folder saved by cselab, e.g. a merged MNTP
            model, in its ``cselab.json``; logged), else false; a run that changes the recorded
            value says so in one warning. ``pooler: null`` reads the same record first.
        dtype: the backbone's weights: ``float32`` (a half-precision checkpoint is upcast; a
            float64 one is kept) or ``bfloat16`` (half the memory, for LoRA: frozen bf16
            weights, adapters and the pooler's head in float32; without LoRA refused, AdamW's
            steps rounding away on bf16 weights: use ``train.precision: bf16`` instead).
        trust_remote_code: only when the user asks for it.
        revision: Hub revision to load.
        prompt: the template of ``pooler: prompt`` (PromptBERT); ignored by other poolers.
        lora: LoRA adapters (:class:`LoRAConfig`); off while ``lora.r`` is 0.
        pool_prompt: pool a user's prompt's tokens with the sentence's (sentence-transformers'
            default); ``false``: the mean poolers, ``weighted_mean`` and ``last`` leave them
            out (LLM2Vec's ``embed_mask``, ``Pooling(include_prompt=False)``;
            ``docs/prompts.md``).
        prompts: the model's named prompts (``{query: "query: ", document: "passage: "}``),
            saved with it (``config_sentence_transformers.json``) for ``encode(prompt_name=)``;
            empty: those of ``data.prompts`` (the anchor's as ``query``, the positive's as
            ``document``).
        default_prompt_name: the saved prompt ``encode`` uses when given none; ``null``: none.
        fast_path: cselab's CPU fast path for the backbone: the forward on the real tokens only
            (for the architectures of :data:`cselab.model.unpad.FAST_PATH_MODEL_TYPES`; others
            run the plain forward) and dropout with a cheaper mask (:mod:`cselab.model.dropout`).
            It changes this model's backbone only (its dropout modules and its attention name);
            ``false`` runs the backbone exactly as ``transformers`` loads it.
        pack_rows: a decoder's training forward on rows packed with several sentences, its
            padding not computed (:mod:`cselab.model.packing`; the decoders of
            :data:`cselab.model.packing.PACKED_ROW_MODEL_TYPES` under SDPA attention):
            ``null`` on the CPU with ``fast_path``; ``true`` on a GPU too (each forward then
            reads the batch's lengths back from the device once); ``false`` never. Equal to the
            padded forward to roundoff; dropout draws other masks.
    """

    name_or_path: str = "bert-base-uncased"
    pooler: PoolerName | None = None
    mlp_only_train: bool = True
    max_seq_len: int = 32
    dropout: float | None = None
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
    bidirectional: bool | None = None
    dtype: Literal["float32", "bfloat16"] = "float32"
    trust_remote_code: bool = False
    revision: str | None = None
    fast_path: bool = True
    pack_rows: bool | None = None
    prompt: PromptConfig = field(default_factory=PromptConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    pool_prompt: bool = True
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None

    #: keys of earlier versions (:data:`cselab.core.schema.REMOVED`)
    removed_keys: ClassVar[dict[str, tuple[object, str]]] = {
        "unpad_cuda": (
            False,
            "varlen attention was slower than padded on the GPUs measured "
            "(docs/results/gpu_benchmark.md)",
        ),
    }

    def validate_prompts(self, from_data: Mapping[str, str] | None = None) -> ModelConfig:
        """``prompts`` are ``{name: text}`` strings, ``default_prompt_name`` one of them, and
        ``pool_prompt: false`` has a pooler that can leave them out; one line naming the key.
        ``from_data``: the prompts a model trained with ``data.prompts`` is saved with when
        ``prompts`` is empty (:func:`~cselab.core.prompts.model_prompts_from_data`), which
        ``default_prompt_name`` may name then."""
        from ..core.prompts import check_prompts

        self.prompts = check_prompts(self.prompts, "model.prompts")
        name = self.default_prompt_name
        names = self.prompts or from_data or {}
        if name is not None and name not in names:
            where = (
                "model.prompts"
                if self.prompts or not from_data
                else "the prompts saved from data.prompts"
            )
            raise ConfigError(
                f"model.default_prompt_name={name!r} is not one of {where} "
                f"({', '.join(names) or 'none'})"
            )
        if self.pool_prompt or self.pooler is None:
            return self
        from .pooling import PROMPT_EXCLUDING  # torch: only for the rare setting

        if self.pooler not in PROMPT_EXCLUDING:
            raise ConfigError(
                f"model.pool_prompt=false: pooler {self.pooler!r} reads one token, which no "
                f"prompt can be left out of; use one of {', '.join(PROMPT_EXCLUDING)}"
            )
        return self
