"""Poolers: how one sentence vector is read from an encoder's hidden states.

The one implementation used by training, ``encode`` and evaluation. Names follow SimCSE
(Gao et al. 2021, ``models.py``):

* ``cls``: the ``[CLS]`` vector through a freshly initialised ``Linear + Tanh`` head (not BERT's
  NSP pooler). With ``mlp_only_train`` the head is used in training only, SimCSE's
  unsupervised default.
* ``cls_before_pooler``: the raw ``[CLS]`` vector of the last layer.
* ``avg``: mean of the last layer over non-padding tokens.
* ``avg_top2``: mean over tokens of the average of the last two layers.
* ``avg_first_last``: mean over tokens of the average of the first transformer layer
  (``hidden_states[1]``; ``[0]`` is the embedding layer, the bug SimCSE later fixed) and the
  last layer.
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from typing import Literal

from torch import Tensor, nn

PoolerName = Literal["cls", "cls_before_pooler", "avg", "avg_top2", "avg_first_last"]
POOLERS: tuple[str, ...] = typing.get_args(PoolerName)


def masked_mean(hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """Mean over positions where ``attention_mask`` is 1. ``(N, L, D), (N, L) -> (N, D)``."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1).clamp_min(1.0)


class MLPHead(nn.Module):
    """SimCSE's ``cls`` head: ``tanh(W h + b)``, freshly initialised, same width as the encoder."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.activation = nn.Tanh()

    def forward(self, x: Tensor) -> Tensor:
        return self.activation(self.dense(x))


class Pooler(nn.Module):
    """Pool token states into sentence vectors.

    Args:
        kind: one of :data:`POOLERS`.
        hidden_size: encoder width (for the ``cls`` head).
        mlp_only_train: with ``cls``, skip the head when the pooler is in eval mode.

    Inputs:
        ``last_hidden``: ``(N, L, D)``; ``hidden_states``: the tuple of all layers (embedding
        output first), needed by the ``avg_top2``/``avg_first_last`` poolers;
        ``attention_mask``: ``(N, L)``.

    Returns:
        ``(N, D)`` sentence vectors (not normalised).
    """

    def __init__(self, kind: str, hidden_size: int, mlp_only_train: bool) -> None:
        super().__init__()
        if kind not in POOLERS:
            raise ValueError(f"unknown pooler {kind!r}; choose one of {', '.join(POOLERS)}")
        self.kind = kind
        self.mlp_only_train = mlp_only_train
        self.mlp = MLPHead(hidden_size) if kind == "cls" else None

    @property
    def needs_hidden_states(self) -> bool:
        return self.kind in ("avg_top2", "avg_first_last")

    @property
    def reads_first_token_only(self) -> bool:
        """Whether only the first token of the last layer is read (the ``cls`` poolers)."""
        return self.kind in ("cls", "cls_before_pooler")

    @property
    def uses_head(self) -> bool:
        """Whether the MLP head is applied in the current mode."""
        return self.mlp is not None and (self.training or not self.mlp_only_train)

    def forward(
        self,
        last_hidden: Tensor,
        attention_mask: Tensor,
        hidden_states: Sequence[Tensor] | None = None,
    ) -> Tensor:
        if self.kind in ("cls", "cls_before_pooler"):
            out = last_hidden[:, 0]
            if self.uses_head:
                out = self.mlp(out)
            return out
        if self.kind == "avg":
            return masked_mean(last_hidden, attention_mask)
        if hidden_states is None:
            raise ValueError(f"pooler {self.kind!r} needs all hidden states")
        if self.kind == "avg_top2":
            layers = (hidden_states[-1] + hidden_states[-2]) / 2.0
        else:  # avg_first_last
            layers = (hidden_states[1] + hidden_states[-1]) / 2.0
        return masked_mean(layers, attention_mask)

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, mlp_only_train={self.mlp_only_train}"


def inference_pooler_name(kind: str, mlp_only_train: bool) -> str:
    """The pooler actually applied at inference (``cls`` + ``mlp_only_train`` → raw CLS)."""
    return "cls_before_pooler" if kind == "cls" and mlp_only_train else kind
