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
* ``prompt``: PromptBERT (Jiang et al. 2022): the sentence is spliced into a template
  (:mod:`cselab.model.prompt`) and its vector is the last layer's state at the template's
  ``[MASK]``, minus the template's own state there with template denoising; the ``cls`` MLP head
  follows, with ``mlp_only_train`` in training only (the authors' unsupervised recipe). A
  template without ``[MASK]`` reads its last token instead: PromptEOL (Jiang et al. 2023,
  ``This sentence : "[X]" means in one word:"``), the decoder form of the prompt pooler.
* ``last``: the last layer's state at the last real token (left or right padding), with the
  sentence's end token (EOS for decoders), which the encoder makes the tokenizer append
  (:func:`cselab.model.prompt.append_end_token`): the token that has seen the whole sentence in
  a causal decoder (LLM2Vec's ``eos_token``).
* ``weighted_mean``: SGPT's position-weighted mean (Muennighoff 2022, Eq. 1): the ``i``-th real
  token (from 1) weighs ``i / (1 + 2 + ... + n)``, so in a causal decoder the tokens that have
  seen more of the sentence count more.

A user's prompt (E5's ``query: ``, LLM2Vec's task instruction; :mod:`cselab.evaluation.instructions`)
is part of the tokens the model reads; with ``model.pool_prompt: false`` the mean poolers,
``weighted_mean`` and ``last`` leave its tokens out of the pooling (a ``pool_mask``,
:func:`exclude_prompt`), as LLM2Vec's ``embed_mask`` (BehnamGhader et al. 2024, ``_skip_instruction``)
and sentence-transformers' ``Pooling(include_prompt=False)`` do: the prompt still shapes every
token's state through attention, but its own states are not averaged in.

:data:`POOLER_MEANINGS` is the one home of what each name means (which token, which layers, a
head): :class:`Pooler` computes it, the sentence-transformers folder writer and reader translate
it, and the model card's usage snippets spell it out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from ..core.prompts import exclude_prompt  # noqa: F401 - re-exported
from .choices import POOLERS, PoolerName  # noqa: F401 - re-exported

#: ``hidden_states`` index of the last layer alone (index 0 is the embedding output).
LAST_LAYER = (-1,)


@dataclass(frozen=True)
class PoolerMeaning:
    """What a pooler computes.

    Attributes:
        token: ``cls`` (the first token's vector), ``mean`` (the mean over real tokens),
            ``lasttoken`` (the last real token), ``weightedmean`` (SGPT's position-weighted
            mean): sentence-transformers' ``Pooling`` mode of the same name; ``mask``: the
            prompt's ``[MASK]`` token (or PromptEOL's last template token), which
            sentence-transformers has no module for.
        layers: the ``hidden_states`` indices averaged before pooling (0 is the embedding
            output); :data:`LAST_LAYER` is the last layer alone.
        head: SimCSE's MLP head ``tanh(W h + b)`` is applied to the pooled vector.
        summary: the pooler in words.
    """

    token: Literal["cls", "mean", "mask", "lasttoken", "weightedmean"]
    layers: tuple[int, ...]
    head: bool
    summary: str


POOLER_MEANINGS: dict[str, PoolerMeaning] = {
    "cls": PoolerMeaning("cls", LAST_LAYER, True, "the [CLS] vector through an MLP head"),
    "cls_before_pooler": PoolerMeaning("cls", LAST_LAYER, False, "the raw [CLS] vector"),
    "avg": PoolerMeaning("mean", LAST_LAYER, False, "the mean of the last layer"),
    "avg_top2": PoolerMeaning("mean", (-1, -2), False, "the mean of the last two layers' average"),
    "avg_first_last": PoolerMeaning(
        "mean", (1, -1), False, "the mean of the first and the last layer's average"
    ),
    "prompt": PoolerMeaning(
        "mask", LAST_LAYER, True, "the [MASK] vector of a PromptBERT template, through an MLP head"
    ),
    "last": PoolerMeaning("lasttoken", LAST_LAYER, False, "the last real token's vector"),
    "weighted_mean": PoolerMeaning(
        "weightedmean", LAST_LAYER, False, "the position-weighted mean of the last layer (SGPT)"
    ),
}
assert set(POOLER_MEANINGS) == set(POOLERS)
#: the poolers that can leave a prompt's tokens out (``model.pool_prompt: false``): the others
#: read one fixed token ([CLS], PromptBERT's [MASK])
PROMPT_EXCLUDING = tuple(k for k, m in POOLER_MEANINGS.items() if m.token not in ("cls", "mask"))


def masked_mean(hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """Mean over positions where ``attention_mask`` is 1. ``(N, L, D), (N, L) -> (N, D)``."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1).clamp_min(1.0)


def last_index(attention_mask: Tensor) -> Tensor:
    """``(N,)``: the column of each row's last real token, for left or right padding."""
    width = attention_mask.shape[1]
    return width - 1 - attention_mask.flip(1).to(torch.int64).argmax(1)


def position_weighted_mean(
    hidden: Tensor, attention_mask: Tensor, pool_mask: Tensor | None = None
) -> Tensor:
    """SGPT's weighted mean (Muennighoff 2022, Eq. 1): ``sum_i w_i h_i`` with
    ``w_i = i / sum_j j`` over the real tokens numbered ``1..n`` from the first real one.

    ``pool_mask`` (a prompt left out, :func:`exclude_prompt`): the tokens it drops weigh 0 and
    the others keep their position ``i`` (sentence-transformers' rule), normalised again."""
    mask = attention_mask.to(hidden.dtype)
    weights = mask.cumsum(1) * mask  # 1..n on real tokens, 0 on padding (either side)
    if pool_mask is not None:
        weights = weights * pool_mask.to(hidden.dtype)
    weights = weights / weights.sum(1, keepdim=True).clamp_min(1.0)
    return (hidden * weights.unsqueeze(-1)).sum(1)


class MLPHead(nn.Module):
    """SimCSE's ``cls`` head: ``tanh(W h + b)``, freshly initialised, same width as the encoder."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.activation = nn.Tanh()

    def forward(self, x: Tensor) -> Tensor:
        # a backbone cast after the head was made (model.to(dtype)) still meets a head it fits
        return self.activation(self.dense(x.to(self.dense.weight.dtype)))


class Pooler(nn.Module):
    """Pool token states into sentence vectors.

    Args:
        kind: one of :data:`POOLERS`.
        hidden_size: encoder width (for the ``cls`` head).
        mlp_only_train: with ``cls``, skip the head when the pooler is in eval mode.
        include_prompt: pool a prompt's tokens too (``model.pool_prompt``); ``False``: the
            callers pass a ``pool_mask`` without them (:func:`exclude_prompt`).

    Inputs:
        ``last_hidden``: ``(N, L, D)``; ``hidden_states``: the tuple of all layers (embedding
        output first), needed by the ``avg_top2``/``avg_first_last`` poolers;
        ``attention_mask``: ``(N, L)``; ``token_index``: ``(N,)`` the ``[MASK]`` column of each
        row (``prompt``); ``offset``: ``(N, D)`` subtracted from the ``[MASK]`` state before the
        head (``prompt``'s template denoising), or ``None``.

    Returns:
        ``(N, D)`` sentence vectors (not normalised).
    """

    def __init__(
        self, kind: str, hidden_size: int, mlp_only_train: bool, include_prompt: bool = True
    ) -> None:
        super().__init__()
        if kind not in POOLERS:
            raise ValueError(f"unknown pooler {kind!r}; choose one of {', '.join(POOLERS)}")
        self.kind = kind
        self.meaning = POOLER_MEANINGS[kind]
        self.mlp_only_train = mlp_only_train
        self.include_prompt = include_prompt
        self.mlp = MLPHead(hidden_size) if self.meaning.head else None

    @property
    def needs_hidden_states(self) -> bool:
        return self.meaning.layers != LAST_LAYER

    @property
    def reads_first_token_only(self) -> bool:
        """Whether only the first token of the last layer is read (the ``cls`` poolers)."""
        return self.meaning.token == "cls" and not self.needs_hidden_states

    @property
    def uses_head(self) -> bool:
        """Whether the MLP head is applied in the current mode."""
        return self.mlp is not None and (self.training or not self.mlp_only_train)

    def forward(
        self,
        last_hidden: Tensor,
        attention_mask: Tensor,
        hidden_states: Sequence[Tensor] | None = None,
        token_index: Tensor | None = None,
        offset: Tensor | None = None,
        pool_mask: Tensor | None = None,
    ) -> Tensor:
        if self.meaning.token == "mask":
            if token_index is None:
                raise ValueError(f"pooler {self.kind!r} needs the [MASK] position of each row")
            rows = torch.arange(last_hidden.shape[0], device=last_hidden.device)
            out = last_hidden[rows, token_index]
            if offset is not None:  # the authors subtract before the head (models.py, cl_forward)
                out = out - offset
            return self.mlp(out) if self.uses_head else out
        if self.meaning.token == "cls":
            out = last_hidden[:, 0]
            if self.uses_head:
                out = self.mlp(out)
            return out
        if self.meaning.token == "lasttoken":
            rows = torch.arange(last_hidden.shape[0], device=last_hidden.device)
            index = last_index(attention_mask)
            out = last_hidden[rows, index]
            if pool_mask is not None:  # the prompt precedes the text: 0 only for an empty text
                out = out * pool_mask[rows, index].unsqueeze(-1).to(out.dtype)
            return out
        if self.meaning.token == "weightedmean":
            return position_weighted_mean(last_hidden, attention_mask, pool_mask)
        pooled = attention_mask if pool_mask is None else pool_mask
        if not self.needs_hidden_states:
            return masked_mean(last_hidden, pooled)
        if hidden_states is None:
            raise ValueError(f"pooler {self.kind!r} needs all hidden states")
        first, *rest = self.meaning.layers
        layers = hidden_states[first]
        for i in rest:
            layers = layers + hidden_states[i]
        return masked_mean(layers / float(len(self.meaning.layers)), pooled)

    def extra_repr(self) -> str:
        prompt = "" if self.include_prompt else ", include_prompt=False"
        return f"kind={self.kind!r}, mlp_only_train={self.mlp_only_train}{prompt}"


def inference_pooler_name(kind: str, mlp_only_train: bool) -> str:
    """The pooler actually applied at inference (``cls`` + ``mlp_only_train`` → raw CLS;
    ``prompt`` stays ``prompt``, its head skipped in eval mode as :attr:`Pooler.uses_head` says)."""
    return "cls_before_pooler" if kind == "cls" and mlp_only_train else kind
