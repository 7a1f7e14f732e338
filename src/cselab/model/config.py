"""The ``model`` section of a run config: which encoder, pooled how, with what sequence length.

Its defaults are SimCSE's unsupervised BERT-base recipe; :meth:`SentenceEncoder.from_pretrained`
takes the same defaults from here (one home).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..core.errors import ConfigError
from .pooling import PoolerName

#: where the sentence goes in a prompt template, and the token whose state is its vector
SENTENCE_SLOT = "[X]"
MASK_SLOT = "[MASK]"


@dataclass
class PromptConfig:
    """PromptBERT's template (Jiang et al. 2022), read with ``model.pooler: prompt``.

    The sentence's tokens are spliced in at ``[X]`` and its vector is the last layer's state at
    ``[MASK]`` (the tokenizer's mask token). The defaults are the authors' unsupervised BERT
    recipe (``run.sh unsup-bert``).

    Attributes:
        template: the template of the anchor view, of inference and of evaluation; ``[X]`` and
            ``[MASK]`` each exactly once.
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
        """Each template holds ``[X]`` and ``[MASK]`` exactly once; raises :class:`ConfigError`
        naming the key."""
        for key, text in (("template", self.template), ("template2", self.template2)):
            if text is None and key == "template2":
                continue
            if not isinstance(text, str):
                raise ConfigError(f"{prefix}.{key} must be a string, got {text!r}")
            for slot in (SENTENCE_SLOT, MASK_SLOT):
                if text.count(slot) != 1:
                    raise ConfigError(
                        f"{prefix}.{key} must contain {slot} exactly once, got {text!r}"
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
            default (:data:`cselab.model.lora.DEFAULT_TARGET_MODULES`: attention and MLP
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
        pooler: how a sentence vector is read from the encoder (see :mod:`cselab.model.pooling`).
        mlp_only_train: with ``pooler: cls`` (or ``prompt``, where it must be true), use the MLP
            head in training only (SimCSE unsup; PromptBERT unsup).
        max_seq_len: truncation length in tokens (SimCSE: 32).
        dropout: if set, overrides hidden and attention dropout probabilities of the encoder.
        attn_implementation: ``sdpa`` (PyTorch scaled-dot-product attention) or ``eager``.
        trust_remote_code: only when the user asks for it.
        revision: Hub revision to load.
        prompt: the template of ``pooler: prompt`` (PromptBERT); ignored by other poolers.
        lora: LoRA adapters (:class:`LoRAConfig`); off while ``lora.r`` is 0.
        fast_path: cselab's CPU fast path for the backbone: the forward on the real tokens only
            (for the architectures of :data:`cselab.model.unpad.FAST_PATH_MODEL_TYPES`; others
            run the plain forward) and dropout with a cheaper mask (:mod:`cselab.model.dropout`).
            It changes this model's backbone only (its dropout modules and its attention name);
            ``false`` runs the backbone exactly as ``transformers`` loads it.
    """

    name_or_path: str = "bert-base-uncased"
    pooler: PoolerName = "cls"
    mlp_only_train: bool = True
    max_seq_len: int = 32
    dropout: float | None = None
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"
    trust_remote_code: bool = False
    revision: str | None = None
    fast_path: bool = True
    prompt: PromptConfig = field(default_factory=PromptConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
