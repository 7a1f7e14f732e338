"""Users' prompts: the text put before a sentence to say what its vector is for.

E5's ``query: `` / ``passage: ``, nomic's ``search_query: ``, LLM2Vec's task instructions
(BehnamGhader et al. 2024: ``Given a web search query, retrieve relevant passages that answer the
query: ``). A prompt is plain text prepended to the sentence before tokenising, in training
(``data.prompts``), at inference (``encode(prompt_name=..., prompt=...)``), in evaluation and in
mining. It is not PromptBERT's template (:mod:`cselab.model.prompt`), which wraps the sentence
and is read at its ``[MASK]``.

The rules live here, below every layer, because the data layer (the token cache, the pooling
mask of a training batch) and the model layer (``encode``, the saved folder) both apply them:

* :func:`prompt_length`: how many tokens of a prompted row are the prompt's, by
  sentence-transformers' rule (the prompt tokenised alone, without a trailing special token);
* :func:`exclude_prompt`: the pooling mask without those tokens (``model.pool_prompt: false``);
* :func:`resolve_prompt`: which text ``prompt_name`` / ``prompt`` / the default prompt give;
* :func:`check_prompts`: a ``{name: text}`` mapping checked, one line naming a bad key.

This module imports neither torch nor any other cselab layer (tensors are used through their
methods).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .errors import ConfigError, ConfigSettingError

#: the saved prompts that retrieval evaluation and mining use for queries and documents
QUERY = "query"
DOCUMENT = "document"
#: the saved prompts a document is read after, the first one a model has (sentence-transformers'
#: ``encode_document`` rule: an E5-style folder saves ``passage``)
DOCUMENT_NAMES = (DOCUMENT, "passage", "corpus")


def check_prompts(
    value: Any, key: str, allowed: Iterable[str] | None = None, hint: str = ""
) -> dict[str, str]:
    """``value`` as a ``{name: text}`` mapping, every name one of ``allowed`` (if given) and
    every text a string; anything else is a :class:`ConfigError` naming ``key.name`` (``hint``
    says what the names may be)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}: expected a mapping of name to prompt text, got {value!r}")
    names = None if allowed is None else list(allowed)
    out: dict[str, str] = {}
    for name, text in value.items():
        # a name is the user's text: one that would not read as itself on one line is quoted
        plain = isinstance(name, str) and name.isprintable() and name.strip() == name != ""
        named = f"{key}.{name}" if plain else f"{key}[{name!r}]"
        if names is not None and name not in names:
            raise ConfigError(f"{named}: no such column{hint or ''} (valid: {', '.join(names)})")
        if not isinstance(text, str):
            raise ConfigError(f"{named}: expected a string, got {text!r}")
        out[str(name)] = text
    return out


def resolve_prompt(
    prompts: Mapping[str, str],
    default_prompt_name: str | None = None,
    prompt_name: str | None = None,
    prompt: str | None = None,
) -> str | None:
    """The prompt text an encode call uses, as sentence-transformers picks it: ``prompt`` if
    given, else the saved prompt ``prompt_name``, else the default prompt, else none.

    Raises:
        ConfigError: ``prompt_name`` is not one of ``prompts`` (the names are listed).
    """
    if prompt is not None:
        return prompt
    name = prompt_name if prompt_name is not None else default_prompt_name
    if name is None:
        return None
    if name not in prompts:
        known = ", ".join(sorted(prompts)) or "none"
        raise ConfigError(
            f"prompt_name {name!r}: the model has no such prompt (its prompts: {known})"
        )
    return prompts[name]


#: words put after a prompt to see which of its tokens a following text leaves as they are
#: (:func:`prompt_length`); the fewest any of them leaves is the count, so one word that the
#: vocabulary joins to a space is enough
_PROBES = ("the", "The", "a", "x", "1")


def prompt_length(tokenizer: Any, prompt: str | None) -> int:
    """How many tokens at the start of a prompted row are the prompt's, with the tokenizer's
    special tokens: a leading ``[CLS]``/BOS is counted (a prompt-free pooling leaves it out
    too, as sentence-transformers' ``Pooling(include_prompt=False)`` does), a trailing one
    (BERT's ``[SEP]``, an appended EOS) is not. 0 without a prompt.

    The prompt's tokens are those it shares with the prompt followed by a word: tokenised
    alone, a prompt's trailing space is a token of its own in byte-level BPE (GPT-2, Llama 3,
    Qwen: ``Ġ``) and SentencePiece-style tokenizers (Llama 2, Mistral: ``▁``), but in a row it
    is part of the text's first word (``Ġthe``), which counting the prompt alone would leave
    out of the pooling. The count is exact when the tokenizer splits the prompt from the text
    at their boundary (a prompt ending in a space or a colon, as common prompts do), and the
    text's first token takes the space in (a text that begins with a digit, which Llama 3's
    tokenizer splits from the space, pools the space's token too).
    """
    if not prompt:
        return 0
    alone = _ids(tokenizer, prompt)
    kept = len(alone)
    for probe in _PROBES:
        row = _ids(tokenizer, prompt + probe)
        pairs = enumerate(zip(alone, row, strict=False))
        kept = min(kept, next((i for i, (a, b) in pairs if a != b), len(row)))
    return kept


#: how a model counts its prompts' tokens when its pooling leaves them out: ``row``, what a
#: row gives the prompt (:func:`prompt_length`; models cselab trains), or ``alone``, the prompt
#: tokenised alone (:func:`prompt_alone_length`; sentence-transformers' count, and cselab's
#: before it counted rows): a model is encoded with the count it was trained with
PROMPT_COUNTS = ("row", "alone")


def check_prompt_count(rule: str) -> str:
    """``rule`` if it is one of :data:`PROMPT_COUNTS`, else a
    :class:`~cselab.core.errors.ConfigSettingError` naming it."""
    if rule not in PROMPT_COUNTS:
        raise ConfigSettingError(
            "prompt_count", rule, f"{{setting}}: expected one of {', '.join(PROMPT_COUNTS)}"
        )
    return rule


def count_prompt(tokenizer: Any, prompt: str | None, rule: str = "row") -> int:
    """The tokens of ``prompt`` at the start of a row by ``rule`` (:data:`PROMPT_COUNTS`)."""
    check_prompt_count(rule)
    return (
        prompt_length(tokenizer, prompt)
        if rule == "row"
        else prompt_alone_length(tokenizer, prompt)
    )


def check_prompt_fits(tokenizer: Any, prompt: str | None, max_seq_len: int, where: str) -> None:
    """Refuse a ``prompt`` that leaves a row of ``max_seq_len`` tokens no room for its text:
    rows are cut at the end, so every sentence would be cut away and the rows (the pooling of
    a prompt left out: empty) would say nothing of their text. ``where``: what set the prompt
    (``data.prompts.anchor``, ``prompt``), named in the one-line
    :class:`~cselab.core.errors.ConfigError`."""
    if not prompt:
        return
    # the prompt and a one-token text with the tokenizer's special tokens, as a row holds them
    need = len(tokenizer(prompt + _PROBES[0])["input_ids"])
    if need > max_seq_len:
        raise ConfigError(
            f"{where}={prompt!r} leaves no room for the text: with it a row needs {need} "
            f"tokens and max_seq_len is {max_seq_len}; shorten the prompt or raise max_seq_len"
        )


def prompt_alone_length(tokenizer: Any, prompt: str | None) -> int:
    """The tokens of ``prompt`` tokenised alone, less a trailing special token: what
    sentence-transformers (6.x, ``Transformer._get_prompt_length``) leaves out of a
    ``Pooling(include_prompt=False)``. One more than :func:`prompt_length` where the prompt's
    trailing space is a token of its own alone but not in a row (subword tokenizers of
    decoders): there sentence-transformers leaves the text's first token out too."""
    return len(_ids(tokenizer, prompt)) if prompt else 0


def _ids(tokenizer: Any, text: str) -> list[int]:
    """``text``'s token ids with the tokenizer's special tokens, less a trailing one."""
    out = list(tokenizer(text)["input_ids"])
    special = set(getattr(tokenizer, "all_special_ids", ()))
    return out[:-1] if out and out[-1] in special else out


def exclude_prompt(attention_mask: Any, prompt_length: Any) -> Any:
    """The pooling mask ``(N, L)`` of rows that begin with a prompt of ``prompt_length`` tokens
    (an int, or a tensor ``(N,)`` of one per row): ``attention_mask`` with each row's first
    ``prompt_length`` real tokens set to 0, for left or right padding."""
    if not isinstance(prompt_length, int):
        prompt_length = prompt_length.to(attention_mask.device).reshape(-1, 1)
    real = attention_mask.long()
    return real * (real.cumsum(1) > prompt_length).long()


def model_prompts_from_data(data_prompts: Mapping[str, str], pairs: bool) -> dict[str, str]:
    """The prompts a model trained with ``data.prompts`` is saved with when ``model.prompts``
    is empty: pairs' anchor prompt as ``query`` and positive prompt as ``document``; a sentence
    corpus's one prompt as both (it is then the default too, see :func:`default_prompt_from_data`)."""
    if not pairs:
        text = data_prompts.get("text")
        return {} if text is None else {QUERY: text, DOCUMENT: text}
    out = {}
    if "anchor" in data_prompts:
        out[QUERY] = data_prompts["anchor"]
    if "positive" in data_prompts:
        out[DOCUMENT] = data_prompts["positive"]
    return out


def default_prompt_from_data(data_prompts: Mapping[str, str], pairs: bool) -> str | None:
    """The default prompt name of a model trained with ``data.prompts``: ``query`` for a
    sentence corpus (its one prompt applies to every sentence), none for pairs (queries and
    documents are encoded with their own prompt names)."""
    return QUERY if not pairs and "text" in data_prompts else None
