"""The ``model`` section of a run config: which encoder, pooled how, with what sequence length.

Its defaults are SimCSE's unsupervised BERT-base recipe; :meth:`SentenceEncoder.from_pretrained`
takes the same defaults from here (one home).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..core.errors import ConfigError
from .choices import PoolerName

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
