"""An index folder's file names and its metadata (``index.json``, checked when an index is
opened), and the corpus lines an index is built from (:mod:`.index`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..core.errors import SearchIndexError
from ..core.prompts import DOCUMENT, QUERY
from ..io.readers import Lines, reraise_as
from ..model.choices import POOLERS

INDEX_FORMAT = 1
META_FILE = "index.json"
TEXTS_FILE = "texts.bin"
OFFSETS_FILE = "offsets.npy"
LINES_FILE = "lines.npy"
VECTORS_FILE = "vectors.npy"
PROGRESS_FILE = "progress.json"
BUILD_BACKENDS = ("exact", "hnsw", "ivf")
SEARCH_BACKENDS = ("exact", "flat", "hnsw", "ivf")
DEFAULT_CHUNK = 8192


# ---------------------------------------------------------------------------------- metadata
def _whole(minimum: int) -> tuple[str, Callable[[Any], bool]]:
    return (
        f"a whole number >= {minimum}",
        lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= minimum,
    )


def _text_or_null(what: str) -> tuple[str, Callable[[Any], bool]]:
    return f"{what} or null", lambda v: v is None or isinstance(v, str)


def _ann_settings(value: Any) -> bool:
    """``{"hnsw"|"ivf": {setting: whole number >= 1}}``, as :meth:`Index.build_ann` writes."""
    return isinstance(value, dict) and all(
        backend in BUILD_BACKENDS[1:]
        and isinstance(params, dict)
        and all(_whole(1)[1](v) for v in params.values())
        for backend, params in value.items()
    )


def _prompts(value: Any) -> bool:
    """``{"query": text, "document": text}``, as :meth:`Index.build` writes (``""``: none)."""
    return (
        isinstance(value, dict)
        and set(value) == {QUERY, DOCUMENT}
        and all(isinstance(v, str) for v in value.values())
    )


#: What opening and searching read from ``index.json``: key -> (what it must be, the check).
#: ``format`` is checked first, on its own (another format may have other keys).
META_REQUIRED: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "model": _text_or_null("a model name or path"),
    "pooler": ("a pooler name", lambda v: isinstance(v, str)),
    "dim": _whole(1),
    "count": _whole(0),
    "chunk_size": _whole(1),
}
#: Keys written by every build but only compared (resuming) or shown: checked when present.
META_OPTIONAL: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "corpus": _text_or_null("a file path"),
    "corpus_sha256": _text_or_null("a SHA-256 digest"),
    "lines": _whole(0),
    "normalized": ("true or false", lambda v: isinstance(v, bool)),
    "ann": ("a mapping of hnsw/ivf to their whole-number settings", _ann_settings),
    # written only by a build at a Matryoshka prefix (``dim`` below the model's width)
    "model_dim": _whole(1),
    # the texts read before queries and documents; an index written without them reads its
    # queries as its model's encode does (its default prompt, if any)
    "prompts": ("a mapping of query and document to their prompts", _prompts),
}


def _shown(value: Any) -> str:
    """A value in a one-line message: its ``repr``, cut short (``repr`` escapes newlines)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def read_meta(file: str | Path) -> dict[str, Any]:
    """The contents of an ``index.json``, checked key by key.

    Raises:
        SearchIndexError: one line naming the file and the first key that is missing or has a
            value of the wrong kind (or saying that the file is not JSON, or not an object).
    """
    file = Path(file)
    try:
        meta = json.loads(file.read_bytes())
    except (ValueError, RecursionError) as err:  # JSONDecodeError and UnicodeDecodeError
        reason = "nested too deeply" if isinstance(err, RecursionError) else str(err)
        raise SearchIndexError(f"{file}: not valid JSON ({reason})") from None
    except OSError as err:
        raise SearchIndexError(f"{file}: cannot be read ({err.strerror or err})") from None
    if not isinstance(meta, dict):
        raise SearchIndexError(
            f"{file}: not an index description (a JSON object was expected, not "
            f"{type(meta).__name__})"
        )
    found = meta.get("format")
    if type(found) is not int or found != INDEX_FORMAT:  # True == 1 and 1.0 == 1 in Python
        raise SearchIndexError(
            f"{file}: index format {_shown(found)}, this cselab reads {INDEX_FORMAT}"
        )
    for key, (what, ok) in META_REQUIRED.items():
        if key not in meta:
            raise SearchIndexError(f"{file}: key {key!r} is missing")
        if not ok(meta[key]):
            raise SearchIndexError(f"{file}: key {key!r} must be {what}, not {_shown(meta[key])}")
    if meta["pooler"] not in POOLERS:
        raise SearchIndexError(
            f"{file}: key 'pooler' must be one of {', '.join(POOLERS)}, not {_shown(meta['pooler'])}"
        )
    for key, (what, ok) in META_OPTIONAL.items():
        if key in meta and not ok(meta[key]):
            raise SearchIndexError(f"{file}: key {key!r} must be {what}, not {_shown(meta[key])}")
    return meta


# ------------------------------------------------------------------------------------ corpus
def read_lines(path: str | Path, what: str = "corpus file") -> tuple[list[str], list[int]]:
    """The non-blank lines of a UTF-8 file and their 1-based line numbers, by the plain-line
    rule of :class:`cselab.io.readers.Lines` (as training and ``cselab encode`` read).

    Only ``\\n`` ends a line (a ``\\r`` before it is dropped): a U+2028 inside a line does not
    split it, so line numbers match what editors and ``sed -n`` show. Blank lines are skipped
    (nothing to find), but numbering counts them.
    """
    p = Path(path)
    texts: list[str] = []
    numbers: list[int] = []
    with reraise_as(SearchIndexError):
        for lineno, text in Lines(p, what=what):
            texts.append(text)
            numbers.append(lineno)
    if not texts:
        raise SearchIndexError(f"{p}: {what} has no non-blank line")
    return texts, numbers


def check_queries(queries: Sequence[str]) -> None:
    """Refuse a blank query (empty or only whitespace): it has no meaning to search for, and
    blank lines are refused everywhere else (corpus files, query files)."""
    for i, query in enumerate(queries, start=1):
        if not query.strip():
            which = "the query" if len(queries) == 1 else f"query {i} of {len(queries)}"
            raise SearchIndexError(f"{which} is blank; give some text to search for")
