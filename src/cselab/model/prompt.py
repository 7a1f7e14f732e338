"""PromptBERT's prompt-based representation (Jiang et al., EMNLP 2022, Sec. 4 and 5).

A sentence's vector is the last layer's state at the ``[MASK]`` of a template such as
``This sentence of "[X]" means [MASK].``, with the sentence at ``[X]``. As in the authors' code
(``kongds/Prompt-BERT``, ``train.py`` ``prepare_features``), the sentence is tokenised alone and
its ids are spliced between the template's two pieces, each tokenised alone::

    [CLS] <prefix ids> <sentence ids> <suffix ids> [SEP]

The splice works on token ids (:func:`splice`), so training keeps its one token store (the
sentences tokenised with their special tokens once, whatever the template) and each view can
use its own template: unsupervised PromptBERT takes ``template`` for the anchors and
``template2`` for the positives.

**Template denoising** (Sec. 5, "template denoising"; ``models.py`` ``get_delta``): the template
is run alone, ``[CLS] <prefix> <suffix> [SEP]``, with the position ids of the suffix (and
``[SEP]``) shifted by the sentence's length ``k``, as if the ``k`` sentence tokens were there;
its ``[MASK]`` state is subtracted from the sentence's ``[MASK]`` state. In training the
template's pass runs in training mode with gradients (the authors' default,
``mask_embedding_sentence_delta_freeze=False``); :func:`template_alone` gives its inputs for the
lengths present in a batch (the authors compute lengths 0..49 and index them: the same values).

The splice keeps the special tokens the tokenizer puts around one sentence (BERT's
``[CLS] ... [SEP]``, Llama's ``<s> ...``, none for Qwen), so a row must be one sentence tokenised
with its special tokens (what :meth:`SentenceEncoder.tokenize` and the token store give).

**PromptEOL** (Jiang et al. 2023, "Scaling Sentence Embeddings with Large Language Models",
Sec. 3.1) is the decoder form: the template ``This sentence : "[X]" means in one word:"`` has no
``[MASK]``, and the vector is the state of its last token, the one from which a causal decoder
would predict the word that sums up the sentence. A template without ``[MASK]`` reads so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..core.errors import ConfigError
from ..core.papers import Paper
from . import backbones, unpad
from .config import MASK_SLOT, PROMPTEOL_TEMPLATE, SENTENCE_SLOT, ModelConfig, PromptConfig

PROMPTBERT = Paper(
    key="jiang2022promptbert",
    name="PromptBERT",
    summary="a sentence's vector is the [MASK] state of a template around it, with template "
    "denoising, and two templates as the two views of unsupervised training",
    bibtex="""@inproceedings{jiang2022promptbert,
  title     = {{PromptBERT}: Improving {BERT} Sentence Embeddings with Prompts},
  author    = {Jiang, Ting and Jiao, Jian and Huang, Shaohan and Zhang, Zihan and Wang, Deqing and Zhuang, Fuzhen and Wei, Furu and Huang, Haizhen and Deng, Denvy and Zhang, Qi},
  booktitle = {Proceedings of the 2022 Conference on Empirical Methods in Natural Language Processing (EMNLP)},
  pages     = {8826--8837},
  year      = {2022}
}""",
    tag="promptbert",
)


def model_papers(model: ModelConfig) -> tuple[Paper, ...]:
    """The papers a ``model`` section implements (the objective names its own): the model card
    cites both."""
    return (PROMPTBERT,) if model.pooler == "prompt" else ()


@dataclass(frozen=True)
class Template:
    """A template's token ids around the sentence.

    Attributes:
        prefix: the ids between ``[CLS]`` and the sentence.
        suffix: the ids between the sentence and ``[SEP]``.
        mask_in_prefix: whether ``[MASK]`` is in ``prefix`` (else in ``suffix``).
        mask_offset: its index in that piece.
    """

    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    mask_in_prefix: bool
    mask_offset: int

    @property
    def extra(self) -> int:
        """How many tokens the template adds to a sentence."""
        return len(self.prefix) + len(self.suffix)

    def mask_index(self, length: int, lead: int = 1) -> int:
        """The ``[MASK]`` column of a spliced row whose sentence has ``length`` tokens, after
        ``lead`` special tokens (BERT's ``[CLS]``: 1)."""
        if self.mask_in_prefix:
            return lead + self.mask_offset
        return lead + len(self.prefix) + length + self.mask_offset


def tokenize_template(text: str, tokenizer: Any, key: str = "model.prompt.template") -> Template:
    """Tokenise the two pieces of ``text`` around ``[X]`` alone, without special tokens
    (``[MASK]`` becomes the tokenizer's mask token; without ``[MASK]``, PromptEOL, the read
    token is the template's last). Raises :class:`ConfigError` naming ``key`` when the template
    has ``[MASK]`` and the tokenizer no mask token, or ``[MASK]`` is not one token."""
    if MASK_SLOT not in text:  # PromptEOL: the last token of the suffix
        before, after = text.split(SENTENCE_SLOT)
        prefix = tuple(tokenizer(before, add_special_tokens=False)["input_ids"])
        suffix = tuple(tokenizer(after, add_special_tokens=False)["input_ids"])
        if not suffix:
            raise ConfigError(f"{key}: PromptEOL reads the token after the sentence: {text!r}")
        return Template(prefix, suffix, False, len(suffix) - 1)
    mask = getattr(tokenizer, "mask_token", None)
    if mask is None or tokenizer.mask_token_id is None:
        raise ConfigError(
            f"{key}: the tokenizer has no mask token, which a {MASK_SLOT} template reads; use a "
            "masked-language-model tokenizer (BERT, RoBERTa, MiniLM) or, for a decoder, a "
            f"template without {MASK_SLOT} (PromptEOL: {PROMPTEOL_TEMPLATE!r})"
        )
    before, after = text.replace(MASK_SLOT, mask).split(SENTENCE_SLOT)
    prefix = tuple(tokenizer(before, add_special_tokens=False)["input_ids"])
    suffix = tuple(tokenizer(after, add_special_tokens=False)["input_ids"])
    found = [(True, i) for i, t in enumerate(prefix) if t == tokenizer.mask_token_id]
    found += [(False, i) for i, t in enumerate(suffix) if t == tokenizer.mask_token_id]
    if len(found) != 1:
        raise ConfigError(f"{key}: {MASK_SLOT} must be one token of the template, got {text!r}")
    return Template(prefix, suffix, *found[0])


@dataclass(frozen=True)
class Spliced:
    """Rows spliced into templates: ``input_ids``/``attention_mask`` ``(N, L')``,
    ``mask_index`` ``(N,)`` (the ``[MASK]`` column), ``length`` ``(N,)`` (the sentence's tokens)
    and ``template`` ``(N,)`` (each row's template)."""

    input_ids: Tensor
    attention_mask: Tensor
    mask_index: Tensor
    length: Tensor
    template: Tensor


class Prompt:
    """The templates of a model and its denoising settings, tokenised for its tokenizer.

    Args:
        config: the ``model.prompt`` section.
        tokenizer: the model's tokenizer (with a mask token for a ``[MASK]`` template); the
            special tokens it puts around one sentence stay around the spliced row.
    """

    def __init__(self, config: PromptConfig, tokenizer: Any) -> None:
        config.validate()
        self.config = config
        keys = ("model.prompt.template", "model.prompt.template2")
        self.templates = tuple(
            tokenize_template(text, tokenizer, key)
            for text, key in zip(config.templates(), keys, strict=False)
        )
        self.lead, self.trail = special_tokens_around(tokenizer)
        # The tensor splice (GPU, no host sync) handles the one-token ``[CLS] ... [SEP]`` form
        # of BERT-family tokenizers; other forms (a decoder's ``<s> ...``) splice row by row.
        one = len(self.lead) == 1 and len(self.trail) == 1
        self.cls_id = self.lead[0] if one else None
        self.sep_id = self.trail[0] if one else None
        self.on_device = one
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    @property
    def extra(self) -> int:
        """The most tokens a template adds to a sentence."""
        return max(t.extra for t in self.templates)

    def second(self) -> int:
        """The index of the second view's template (0 when it is the anchor's)."""
        return len(self.templates) - 1

    def denoises(self, training: bool) -> bool:
        return self.config.denoise if training else self.config.denoise_inference

    def splice(
        self, input_ids: Tensor, attention_mask: Tensor, template: Tensor | None = None
    ) -> Spliced:
        """Put each row's sentence (its ids between the tokenizer's special tokens, right
        padding) into template ``template[i]`` (default: all ``0``); pads to the longest
        spliced row.

        On the CPU row by row (checking each row's special tokens); on a GPU, for the
        ``[CLS] ... [SEP]`` form, with :meth:`splice_tensors`, which reads nothing back from the
        device."""
        if input_ids.device.type != "cpu" and self.on_device:
            return self.splice_tensors(input_ids, attention_mask, template)
        n = input_ids.shape[0]
        which = [0] * n if template is None else [int(t) for t in template.tolist()]
        lengths = attention_mask.sum(1).tolist()
        rows, masks, sent = [], [], []
        lead, trail = list(self.lead), list(self.trail)
        for i, (ids, real) in enumerate(zip(input_ids.tolist(), lengths, strict=True)):
            if (
                real < len(lead) + len(trail)
                or ids[: len(lead)] != lead
                or ids[real - len(trail) : real] != trail
            ):
                raise ValueError(
                    "pooler 'prompt' splices one sentence tokenised with its special tokens; "
                    f"row {i} does not start with {lead} and end with {trail}"
                )
            t = self.templates[which[i]]
            body = ids[len(lead) : real - len(trail)]
            rows.append([*lead, *t.prefix, *body, *t.suffix, *trail])
            masks.append(t.mask_index(len(body), len(lead)))
            sent.append(len(body))
        width = max(len(r) for r in rows)
        device = input_ids.device
        ids_out = torch.full((n, width), self.pad_id, dtype=input_ids.dtype)
        att = torch.zeros((n, width), dtype=attention_mask.dtype)
        for i, r in enumerate(rows):
            ids_out[i, : len(r)] = torch.tensor(r, dtype=input_ids.dtype)
            att[i, : len(r)] = 1
        return Spliced(
            ids_out.to(device),
            att.to(device),
            torch.tensor(masks, device=device),
            torch.tensor(sent, device=device),
            torch.tensor(which, device=device),
        )

    def splice_tensors(
        self, input_ids: Tensor, attention_mask: Tensor, template: Tensor | None = None
    ) -> Spliced:
        """:meth:`splice` in tensor operations on the device, without a host sync: every
        output column is chosen by comparing its index with each row's prefix, sentence and
        suffix bounds. The width is the batch's plus the longest template's extra tokens (the
        row-by-row splice pads to the longest spliced row, which is the same whenever the
        rows' templates add equally many tokens; more columns are masked padding). Rows are
        assumed to be ``cls ... sep`` as the tokenizer made them (not checked: that would read
        the device)."""
        n, width_in = input_ids.shape
        dev = input_ids.device
        which = (
            torch.zeros(n, dtype=torch.long, device=dev) if template is None else template.long()
        )
        tables = self._device_tables(dev, input_ids.dtype)
        pre, suf = tables["prefix"][which], tables["suffix"][which]  # (n, widest)
        p, s = tables["prefix_len"][which][:, None], tables["suffix_len"][which][:, None]
        body = attention_mask.sum(1, keepdim=True).long() - 2  # (n, 1)
        j = torch.arange(width_in + self.extra, device=dev)[None, :]  # (1, W)

        def pick(src: Tensor, col: Tensor) -> Tensor:
            return src.gather(1, col.clamp(0, src.shape[1] - 1).expand(n, -1))

        end_body, end_suf = p + body, p + body + s
        ids = torch.full_like(j.expand(n, -1), self.pad_id, dtype=input_ids.dtype)
        ids = torch.where(j == end_suf + 1, self.sep_id, ids)
        ids = torch.where((j > end_body) & (j <= end_suf), pick(suf, j - end_body - 1), ids)
        ids = torch.where((j > p) & (j <= end_body), pick(input_ids, j - p), ids)
        ids = torch.where((j >= 1) & (j <= p), pick(pre, j - 1), ids)
        ids = torch.where(j == 0, self.cls_id, ids)
        mask = (j <= end_suf + 1).to(attention_mask.dtype)
        in_prefix, offset = tables["mask_in_prefix"][which], tables["mask_offset"][which]
        mask_index = torch.where(in_prefix, 1 + offset, 1 + end_body[:, 0] + offset)
        return Spliced(ids, mask, mask_index, body[:, 0], which)

    def _device_tables(self, device: torch.device, dtype: torch.dtype) -> dict[str, Tensor]:
        """The templates as tensors on ``device`` (one row per template), made once: a copy
        from the host in every step would wait for the device's queue."""
        key = (str(device), dtype)
        cache = self.__dict__.setdefault("_tables", {})
        if key not in cache:
            ts = self.templates

            def table(pieces: list[tuple[int, ...]]) -> Tensor:
                wide = max(1, *(len(p) for p in pieces))
                rows = [list(p) + [self.pad_id] * (wide - len(p)) for p in pieces]
                return torch.tensor(rows, dtype=dtype, device=device)

            def column(values: list[int]) -> Tensor:
                return torch.tensor(values, dtype=torch.long, device=device)

            cache[key] = {
                "prefix": table([t.prefix for t in ts]),
                "suffix": table([t.suffix for t in ts]),
                "prefix_len": column([len(t.prefix) for t in ts]),
                "suffix_len": column([len(t.suffix) for t in ts]),
                "mask_in_prefix": column([int(t.mask_in_prefix) for t in ts]).bool(),
                "mask_offset": column([t.mask_offset for t in ts]),
                "alone": [
                    torch.tensor([self.cls_id, *t.prefix, *t.suffix, self.sep_id], device=device)
                    for t in ts
                ],
            }
        return cache[key]

    def template_alone_tensors(self, template: int, lengths: Tensor) -> tuple[Tensor, Tensor, int]:
        """:meth:`template_alone` for a ``(K,)`` tensor of lengths on the device, without reading
        it back: ``input_ids`` and ``position_ids`` ``(K, T)`` and the ``[MASK]`` column."""
        t = self.templates[template]
        row = self._device_tables(lengths.device, torch.long)["alone"][template]  # (T,)
        k = lengths.shape[0]
        positions = torch.arange(row.shape[0], device=lengths.device).expand(k, -1)
        shift = torch.zeros_like(positions)
        shift[:, 1 + len(t.prefix) :] = 1
        return row.expand(k, -1), positions + shift * lengths.long()[:, None], t.mask_index(0)

    def template_alone(
        self, template: int, lengths: Sequence[int], device: torch.device | str = "cpu"
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Inputs of template ``template`` run alone for sentence lengths ``lengths``:
        ``input_ids`` and ``position_ids`` ``(K, T)`` and the ``[MASK]`` column ``(K,)``.

        Row ``k`` is ``[CLS] prefix suffix [SEP]`` with the positions after the prefix shifted
        by ``lengths[k]`` (``get_delta``: ``position_ids[:, len(bs)+1:] += k``)."""
        t = self.templates[template]
        ids = torch.tensor([*self.lead, *t.prefix, *t.suffix, *self.trail], device=device)
        shift = torch.tensor(list(lengths), device=device).unsqueeze(1)
        positions = torch.arange(ids.shape[0], device=device).expand(len(lengths), -1).clone()
        positions[:, len(self.lead) + len(t.prefix) :] += shift
        mask_at = t.mask_index(0, len(self.lead))
        return ids.expand(len(lengths), -1), positions, torch.full_like(shift[:, 0], mask_at)


def special_tokens_around(tokenizer: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The ids the tokenizer puts before and after one sentence (BERT: ``([CLS],), ([SEP],)``;
    Llama: ``(<s>,), ()``), found by tokenising a probe with and without special tokens."""
    probe = "probe"
    bare = list(tokenizer(probe, add_special_tokens=False)["input_ids"])
    full = list(tokenizer(probe)["input_ids"])
    for start in range(len(full) - len(bare) + 1):
        if full[start : start + len(bare)] == bare:
            return tuple(full[:start]), tuple(full[start + len(bare) :])
    raise ConfigError("model.pooler: 'prompt' cannot find the sentence among its special tokens")


def append_end_token(tokenizer: Any, end_id: int) -> Any:
    """``tokenizer``, or a copy of it that ends each sentence with ``end_id`` (the ``last``
    pooler's EOS), keeping the special tokens it already puts around a sentence (the tokenizer
    handed in is left as it is).

    A fast tokenizer gets a ``TemplateProcessing`` post-processor, so the token store, ``encode``
    and the saved ``tokenizer.json`` (what sentence-transformers loads) all end a sentence in it,
    and truncation keeps it (the post-processor's tokens count inside ``max_length``). A slow
    tokenizer is refused with :class:`ConfigError`.
    """
    lead, trail = special_tokens_around(tokenizer)
    if trail and trail[-1] == end_id:
        return tokenizer
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None or not getattr(tokenizer, "is_fast", False):
        raise ConfigError(
            "model.pooler: 'last' needs the tokenizer to end a sentence with its end token, "
            "and this slow tokenizer cannot be told to; use a fast tokenizer"
        )
    import copy

    from tokenizers import processors

    tokenizer = copy.deepcopy(tokenizer)
    backend = tokenizer._tokenizer
    ids = [*lead, *trail, end_id]
    names = [str(tokenizer.convert_ids_to_tokens(i)) for i in ids]
    before = " ".join(names[: len(lead)])
    after = " ".join(names[len(lead) :])
    specials = list(dict.fromkeys(zip(names, ids, strict=True)))
    backend.post_processor = processors.TemplateProcessing(
        single=f"{before} $A:0 {after}".strip(),
        pair=f"{before} $A:0 {after} $B:1 {after}".strip(),
        special_tokens=specials,
    )
    if special_tokens_around(tokenizer)[1][-1:] != (end_id,):
        raise ConfigError("model.pooler: 'last' cannot make the tokenizer append its end token")
    return tokenizer


def template_states(
    backbone: torch.nn.Module, prompt: Prompt, spliced: Spliced, token_types: bool
) -> Tensor:
    """``(N, D)``: each row's template run alone at the row's sentence length, the states that
    template denoising subtracts (one backbone pass per template, one row per distinct length;
    on a GPU one row per row, which needs no host sync: :func:`template_states_on_device`).
    ``token_types``: whether the backbone's forward takes ``token_type_ids``."""
    if spliced.input_ids.device.type != "cpu" and prompt.on_device:
        return template_states_on_device(backbone, prompt, spliced, token_types)
    out: Tensor | None = None
    for t in spliced.template.unique().tolist():
        rows = spliced.template == t
        lengths, inverse = spliced.length[rows].unique(return_inverse=True)
        ids, positions, at = prompt.template_alone(t, lengths.tolist(), spliced.input_ids.device)
        types = {"token_type_ids": torch.zeros_like(ids)} if token_types else {}
        hidden = backbone(
            input_ids=ids,
            position_ids=positions,
            attention_mask=torch.ones_like(ids),
            return_dict=True,
            **types,
            **backbones.no_cache(backbone),
        ).last_hidden_state
        states = hidden[torch.arange(ids.shape[0], device=ids.device), at]
        if out is None:
            out = states.new_zeros(spliced.input_ids.shape[0], states.shape[-1])
        out = out.index_put((rows.nonzero().squeeze(1),), states[inverse])
    assert out is not None
    return out


def template_states_on_device(
    backbone: torch.nn.Module, prompt: Prompt, spliced: Spliced, token_types: bool
) -> Tensor:
    """:func:`template_states` without reading the batch back: every template runs alone for
    every row (at the row's length), and each row keeps its own template's state. The same
    states as the grouped passes, computed for more rows (the templates are ~10 tokens: a
    small fraction of the step)."""
    out: Tensor | None = None
    for t in range(len(prompt.templates)):
        ids, positions, at = prompt.template_alone_tensors(t, spliced.length)
        types = {"token_type_ids": torch.zeros_like(ids)} if token_types else {}
        hidden = backbone(
            input_ids=ids,
            position_ids=positions,
            attention_mask=unpad.padded_attention_mask(backbone, torch.ones_like(ids)),
            return_dict=True,
            **types,
            **backbones.no_cache(backbone),
        ).last_hidden_state
        states = hidden[:, at]
        out = states if out is None else torch.where((spliced.template == t)[:, None], states, out)
    assert out is not None
    return out
