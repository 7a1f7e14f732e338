"""Encoding for evaluation: each distinct sentence once, longest first, in large batches.

SentEval encodes every file of a task separately in its own sorted order, so a sentence that
occurs in several pairs or files (STS-B reuses STS12-16 pairs; many STS sentences repeat) is
encoded again each time. :class:`EmbeddingCache` keeps one row per distinct sentence instead.
The encoder sees the same strings SentEval's batcher builds, so the vectors are the same up to
float noise from a different padding length.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from ..core.prompts import DOCUMENT_NAMES, QUERY
from ..model.choices import BATCH_SIZE

if TYPE_CHECKING:
    import torch


@runtime_checkable
class Encoder(Protocol):
    """Anything with ``encode(list[str], batch_size=...) -> (N, D) array`` in input order."""

    def encode(self, sentences: list[str], batch_size: int = ...) -> np.ndarray: ...


EncodeFn = Callable[[list[str]], np.ndarray]
EncoderLike = Encoder | EncodeFn


@contextlib.contextmanager
def inference_mode(encoder: object) -> Iterator[None]:
    """Eval mode and no autograd while encoding; the module's train/eval state is restored.

    The trainer scores STS-B dev in the middle of training, so dropout must be off for the
    scoring and back on afterwards.
    """
    import torch

    module = encoder if isinstance(encoder, torch.nn.Module) else None
    was_training = bool(module is not None and module.training)
    if module is not None:
        module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        if module is not None and was_training:
            module.train()


def call_encoder(encoder: EncoderLike, sentences: list[str], batch_size: int) -> np.ndarray:
    """Run ``encoder`` on ``sentences`` and check it returned one float row per sentence."""
    with inference_mode(encoder):
        if hasattr(encoder, "encode"):
            out = encoder.encode(sentences, batch_size=batch_size)
        elif callable(encoder):
            out = encoder(sentences)
        else:
            raise TypeError(
                f"{type(encoder).__name__} is not an encoder: expected an object with "
                "encode(list[str], batch_size=...) or a callable list[str] -> array"
            )
    if hasattr(out, "detach"):  # a torch tensor
        out = out.detach().float().cpu().numpy()
    arr = np.asarray(out, dtype=np.float32)
    if arr.ndim != 2 or arr.shape[0] != len(sentences):
        raise ValueError(
            f"encoder returned an array of shape {arr.shape} for {len(sentences)} sentences; "
            "expected (num_sentences, dim)"
        )
    return arr


class RepeatedSentences:
    """The same sentences encoded at every call (a dev set scored every ``eval_steps``): for a
    :class:`~cselab.model.sentence_encoder.SentenceEncoder`, tokenised, sorted and batched once
    and kept on its device (:func:`~cselab.model.inference.tokenized_batches`; made again if
    the sentences, batch size, tokenizer or device change), the vectors copied to the host
    once per call. The vectors are those of ``encoder.encode(sentences, batch_size)``: the same
    batches through the same forward. Any other encoder is called as :func:`call_encoder`
    calls it."""

    def __init__(self) -> None:
        self._sentences: tuple[str, ...] | None = None
        self._batches: Any = None

    def __call__(
        self,
        encoder: EncoderLike,
        sentences: Sequence[str],
        batch_size: int,
        on_device: bool = False,
        precision: str = "fp32",
    ) -> np.ndarray | torch.Tensor:
        """The vectors, on the host; ``on_device``: a SentenceEncoder's stay on its device
        (any other encoder's are the host array it gives). ``precision``: a SentenceEncoder
        runs under that autocast (``fp32``: none; the vectors are float32 either way); any
        other encoder is called as it is."""
        if not _plain_sentence_encoder(encoder):
            return call_encoder(encoder, list(sentences), batch_size)
        from ..model.inference import batches_key, encode_batches, tokenized_batches

        sentences = tuple(sentences)
        if (
            self._batches is None
            or self._sentences != sentences
            or self._batches.key != batches_key(encoder, batch_size)
        ):
            self._batches = tokenized_batches(encoder, sentences, batch_size)
            self._sentences = sentences
        with inference_mode(encoder):
            return encode_batches(encoder, self._batches, on_device=on_device, autocast=precision)


def _plain_sentence_encoder(encoder: object) -> bool:
    """Whether ``encoder`` is a SentenceEncoder whose ``encode`` is the library's own."""
    import sys

    module = sys.modules.get("cselab.model.sentence_encoder")  # not loaded: not one
    encode = getattr(type(encoder), "encode", None)
    return module is not None and encode is module.SentenceEncoder.encode


class AtDimension:
    """An encoder seen at its first ``dim`` coordinates, re-normalised (Matryoshka evaluation,
    Kusupati et al. 2022): every evaluation (STS, transfer, retrieval) scores the prefix as a
    vector of its own. Build it with :func:`at_dimension`."""

    def __init__(self, encoder: EncoderLike, dim: int) -> None:
        self.encoder = encoder
        self.dim = int(dim)
        self.source = getattr(encoder, "source", None)

    def encode(self, sentences: list[str], batch_size: int = BATCH_SIZE) -> np.ndarray:
        from ..model.similarity import truncate_rows

        return truncate_rows(call_encoder(self.encoder, sentences, batch_size), self.dim)


def at_dimension(encoder: EncoderLike, dim: int | None) -> EncoderLike:
    """``encoder`` at its first ``dim`` coordinates (:class:`AtDimension`); ``None``: unchanged."""
    return encoder if dim is None else AtDimension(encoder, dim)


class Prompted:
    """An encoder that reads every sentence after a prompt (``docs/prompts.md``): a cselab
    model is asked with ``encode(..., prompt=)`` (its pooler then leaves the prompt's tokens out
    where the model says so; other keywords, ``normalize``, pass through, and its attributes
    are the model's); any other encoder is given the prompted text. Build it with
    :func:`with_prompt`."""

    def __init__(self, encoder: EncoderLike, prompt: str) -> None:
        self.encoder = encoder
        self.prompt = prompt

    def __getattr__(self, name: str) -> Any:
        if name == "encoder":  # not set yet (copying): no recursion through the lookup below
            raise AttributeError(name)
        return getattr(self.encoder, name)

    def encode(
        self, sentences: list[str], batch_size: int = BATCH_SIZE, **kwargs: Any
    ) -> np.ndarray:
        if _takes_prompt(self.encoder):
            with inference_mode(self.encoder):
                out = self.encoder.encode(
                    sentences, batch_size=batch_size, prompt=self.prompt, **kwargs
                )
            return np.asarray(out, dtype=np.float32)
        return call_encoder(self.encoder, [self.prompt + s for s in sentences], batch_size)


def _takes_prompt(encoder: object) -> bool:
    encode = getattr(encoder, "encode", None)
    if encode is None:
        return False
    try:
        return "prompt" in inspect.signature(encode).parameters
    except (TypeError, ValueError):
        return False


def with_prompt(encoder: EncoderLike, prompt: str | None) -> EncoderLike:
    """``encoder`` reading every sentence after ``prompt`` (:class:`Prompted`); ``None``:
    unchanged (a model with a default prompt reads its sentences after it); ``""``: after no
    prompt, the model's default turned off. A Matryoshka view (:class:`AtDimension`) keeps its
    prefix outside."""
    if isinstance(encoder, Prompted):  # a new prompt replaces the one it reads after
        encoder = encoder.encoder
    if prompt is None or (prompt == "" and not default_prompt(encoder)):
        return encoder
    if isinstance(encoder, AtDimension):
        return AtDimension(with_prompt(encoder.encoder, prompt), encoder.dim)
    return Prompted(encoder, prompt)


def unprompted(encoder: Any, prompt: str | None) -> tuple[Any, str | None]:
    """A prompted view of a model (:func:`with_prompt`) as the model and its prompt (``prompt``, where given, wins); any other encoder as it is."""
    if isinstance(encoder, Prompted):
        return encoder.encoder, (encoder.prompt if prompt is None else prompt)
    return encoder, prompt


def default_prompt(encoder: object) -> str:
    """The text a model puts before every sentence it is asked to encode with no prompt named:
    a prompted view's prompt (:func:`with_prompt`), else the model's ``default_prompt_name``'s
    saved prompt (sentence-transformers' rule), also through a Matryoshka view; ``""``: none."""
    while isinstance(encoder, AtDimension | Prompted):
        if isinstance(encoder, Prompted):
            return encoder.prompt
        encoder = encoder.encoder
    name = getattr(encoder, "default_prompt_name", None)
    return saved_prompts(encoder).get(name, "") if isinstance(name, str) else ""


def effective_prompt(encoder: object, prompt: str | None) -> str:
    """What ``with_prompt(encoder, prompt)`` reads every sentence after (``""``: nothing): the
    text given, else the model's :func:`default_prompt`. What a results file records."""
    return prompt if prompt is not None else default_prompt(encoder)


def saved_prompts(encoder: object) -> dict[str, str]:
    """The model's saved prompts by name (``query``, ``document``, ...), also through a view of
    it (:class:`AtDimension`, :class:`Prompted`); ``{}``: none."""
    inner = getattr(encoder, "encoder", None)
    if isinstance(encoder, AtDimension | Prompted) and inner is not None:
        return saved_prompts(inner)
    prompts = getattr(encoder, "prompts", None)
    return dict(prompts) if isinstance(prompts, dict) else {}


def saved_prompt(encoder: object, name: str) -> str | None:
    """The model's saved prompt ``name`` (``query``, ``document``), or ``None``
    (:func:`saved_prompts`)."""
    return saved_prompts(encoder).get(name)


def query_document_prompts(
    encoder: object, query_prompt: str | None, document_prompt: str | None
) -> tuple[str, str]:
    """The prompts put before queries and before documents (``""``: none): each one given
    (``""`` turns the model's off), else the model's saved ``query`` prompt / the first of its
    :data:`~cselab.core.prompts.DOCUMENT_NAMES` (``document``, ``passage``, ``corpus``), else
    its default prompt (:func:`default_prompt`: what its ``encode`` would put there, as
    sentence-transformers' ``encode_query``/``encode_document`` do; ``docs/prompts.md``).
    Retrieval and mining choose them here, and record them: the texts really read."""
    q = query_prompt if query_prompt is not None else saved_prompt(encoder, QUERY)
    saved = saved_prompts(encoder)
    d = (
        document_prompt
        if document_prompt is not None
        else next((saved[n] for n in DOCUMENT_NAMES if n in saved), None)
    )
    fallback = default_prompt(encoder)
    return (fallback if q is None else q), (fallback if d is None else d)


class EmbeddingCache:
    """Sentence -> vector store that encodes each distinct sentence at most once.

    ``embed(sentences)`` encodes the sentences not seen yet in one encoder call, ordered by
    length (longest first, so the first batch shows the peak memory and padding is minimal),
    and returns the rows for ``sentences`` in their order.
    """

    def __init__(self, encoder: EncoderLike, batch_size: int = BATCH_SIZE) -> None:
        self.encoder = encoder
        self.batch_size = batch_size
        self._index: dict[str, int] = {}
        self._blocks: list[np.ndarray] = []
        self._matrix: np.ndarray | None = None
        self.encoded = 0  # number of sentences sent to the encoder
        self.requested = 0  # number of sentence occurrences asked for
        self.encode_seconds = 0.0

    def __len__(self) -> int:
        return len(self._index)

    def _all(self) -> np.ndarray:
        if self._matrix is None or self._matrix.shape[0] != len(self._index):
            self._matrix = (
                np.concatenate(self._blocks) if len(self._blocks) > 1 else self._blocks[0]
            )
            self._blocks = [self._matrix]
        return self._matrix

    def add(self, sentences: Iterable[str]) -> None:
        """Encode the sentences that are not cached yet (one encoder call)."""
        new = list(dict.fromkeys(s for s in sentences if s not in self._index))
        if not new:
            return
        # Longest first by character count: a cheap proxy for token count that needs no
        # tokenizer; encoders that sort by token length internally are unaffected.
        new.sort(key=len, reverse=True)
        t0 = time.perf_counter()
        vectors = call_encoder(self.encoder, new, self.batch_size)
        self.encode_seconds += time.perf_counter() - t0
        start = len(self._index)
        for offset, sentence in enumerate(new):
            self._index[sentence] = start + offset
        self._blocks.append(vectors)
        self.encoded += len(new)

    def embed(self, sentences: Sequence[str]) -> np.ndarray:
        """``(len(sentences), D)`` float32 rows, encoding whatever is missing first."""
        self.add(sentences)
        self.requested += len(sentences)
        if not sentences:
            dim = self._all().shape[1] if self._index else 0
            return np.zeros((0, dim), dtype=np.float32)
        rows = np.fromiter(
            (self._index[s] for s in sentences), dtype=np.int64, count=len(sentences)
        )
        return self._all()[rows]
