"""The ``model`` section of a run config: which encoder, pooled how, with what sequence length.

Its defaults are SimCSE's unsupervised BERT-base recipe; :meth:`SentenceEncoder.from_pretrained`
takes the same defaults from here (one home).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .pooling import PoolerName


@dataclass
class ModelConfig:
    """The encoder.

    Attributes:
        name_or_path: Hugging Face Hub name or local folder of any ``AutoModel`` encoder.
        pooler: how a sentence vector is read from the encoder (see :mod:`cselab.model.pooling`).
        mlp_only_train: with ``pooler: cls``, use the MLP head in training only (SimCSE unsup).
        max_seq_len: truncation length in tokens (SimCSE: 32).
        dropout: if set, overrides hidden and attention dropout probabilities of the encoder.
        attn_implementation: ``sdpa`` (PyTorch scaled-dot-product attention) or ``eager``.
        trust_remote_code: only when the user asks for it.
        revision: Hub revision to load.
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
