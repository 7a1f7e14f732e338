"""Similarity search over a text corpus: a memory-mapped vector index built with a cselab encoder.

An index is a folder::

    my.index/
      index.json     what was built: model, pooler, corpus digest, sizes, ANN settings
      texts.bin      the corpus lines, UTF-8, back to back
      offsets.npy    int64 (N + 1,): line i is texts.bin[offsets[i]:offsets[i + 1]]
      lines.npy      int64 (N,): the 1-based line number of each entry in the corpus file
      vectors.npy    float32 (N, D), L2-normalised, so a dot product is a cosine
      progress.json  how many chunks of vectors are written (resuming reads it)
      faiss-*.index  the approximate index, when one was built (``--backend hnsw|ivf``)

Every array is opened with ``mmap_mode="r"``: opening a 1M-line index reads only ``index.json``,
and a search touches the pages it needs. Vectors are encoded in chunks of ``chunk_size`` lines;
after each chunk the rows are flushed before ``progress.json`` is replaced (atomically), so an
interrupted build resumes at the first chunk not recorded and gives the same index. Every file
is written atomically, and ``vectors.npy`` has its whole size reserved on disk before the first
row is written: a full disk is one :class:`~cselab.core.errors.WriteError` naming the file,
never a SIGBUS in the memory map.

Search is exact by default: the cosine of each query with every row (a matrix product, block by
block over the memory map) and a top-k. With ``faiss-cpu`` installed (``pip install
cselab[faiss]``) ``flat`` runs the same exact search in FAISS, and ``hnsw`` (Malkov & Yashunin
2018, "Efficient and robust approximate nearest neighbor search using Hierarchical Navigable
Small World graphs") or ``ivf`` (an inverted file over k-means cells, Jégou et al. 2011,
"Product quantization for nearest neighbor search", Sec. 4) trade recall for speed.
"""

from __future__ import annotations

import io
import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import SearchIndexError, WriteError
from ..io.files import (  # the corpus digest is training's
    atomic_path,
    file_digest,
    reserve,
    write_json_atomic,
)
from ..io.readers import Lines, reraise_as
from ..model.choices import POOLERS
from ..model.similarity import (  # exact_topk: the one exact search
    TopK,
    check_prefix,
    exact_topk,
    normalize_rows,
    truncate_rows,
)

log = logging.getLogger(__name__)

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


# ----------------------------------------------------------------------------------- results
@dataclass(frozen=True)
class Hit:
    """One search result: ``row`` in the index, ``line`` in the corpus file, cosine ``score``."""

    rank: int
    score: float
    row: int
    line: int
    text: str


# ------------------------------------------------------------------------------------- faiss
def _faiss() -> Any:
    try:
        import faiss
    except ImportError:
        raise SearchIndexError(
            "this backend needs FAISS: pip install 'cselab[faiss]' (faiss-cpu)"
        ) from None
    return faiss


def _ann_file(backend: str) -> str:
    return f"faiss-{backend}.index"


def ann_params(backend: str, n: int, **given: int | None) -> dict[str, int]:
    """Settings of a FAISS index over ``n`` vectors: those given, defaults for the rest.

    ``hnsw``: ``m`` 32 links per node, ``ef_construction`` 80, ``ef_search`` 64 (FAISS's own
    16 loses recall at k=10). ``ivf``: ``nlist`` about sqrt(N) cells and ``nprobe`` nlist/64
    (at least 8) cells visited per query.
    """
    if backend == "hnsw":
        defaults = {"m": 32, "ef_construction": 80, "ef_search": 64}
    elif backend == "ivf":
        nlist = given.get("nlist") or max(1, min(n, round(float(np.sqrt(n)))))
        defaults = {"nlist": nlist, "nprobe": min(nlist, max(8, nlist // 64))}
    else:
        return {}
    return {key: int(given.get(key) or value) for key, value in defaults.items()}


def build_faiss(vectors: np.ndarray, backend: str, params: dict[str, int], seed: int = 0) -> Any:
    """A FAISS inner-product index over ``vectors``: ``flat``, ``hnsw`` or ``ivf``.

    ``ivf`` trains its k-means cells on at most ``64 * nlist`` rows drawn with ``seed`` (FAISS
    asks for at least 39 per cell; more only slows the training on a large corpus).
    """
    faiss = _faiss()
    dim = int(vectors.shape[1])
    if backend == "flat":
        index = faiss.IndexFlatIP(dim)
    elif backend == "hnsw":
        index = faiss.IndexHNSWFlat(dim, params["m"], faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = params["ef_construction"]
    elif backend == "ivf":
        nlist = params["nlist"]
        if nlist > len(vectors):
            raise SearchIndexError(
                f"ivf: nlist {nlist} is more than the {len(vectors)} vectors; pass a smaller --nlist"
            )
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
        rng = np.random.default_rng(seed)
        rows = np.sort(rng.choice(len(vectors), min(len(vectors), 64 * nlist), replace=False))
        index.train(np.ascontiguousarray(vectors[rows], dtype=np.float32))
    else:
        raise SearchIndexError(f"unknown FAISS backend {backend!r}")
    for start in range(0, len(vectors), 1 << 17):  # add in blocks: the memory map stays a map
        index.add(np.ascontiguousarray(vectors[start : start + (1 << 17)], dtype=np.float32))
    _set_search_params(index, backend, params)
    return index


def _set_search_params(index: Any, backend: str, params: dict[str, int]) -> None:
    if backend == "hnsw" and params.get("ef_search"):
        index.hnsw.efSearch = int(params["ef_search"])
    if backend == "ivf" and params.get("nprobe"):
        index.nprobe = int(params["nprobe"])


def vector_search(backend: str = "exact", **given: int | None) -> TopK:
    """``(queries, vectors, k) -> (scores, rows)`` over unit vectors held in memory, best first,
    as :meth:`Index.search_vectors` searches an index: ``exact`` (:func:`exact_topk`) or a FAISS
    index built on the vectors of each call (``flat``, ``hnsw``, ``ivf``; :func:`ann_params`
    fills the settings not ``given``). Retrieval evaluation takes it (``cselab evaluate
    --retrieval --backend``). A place FAISS leaves empty has row ``-1`` and score ``-inf``.
    """
    if backend not in SEARCH_BACKENDS:
        raise SearchIndexError(
            f"unknown backend {backend!r}; choose one of {', '.join(SEARCH_BACKENDS)}"
        )
    if backend == "exact":
        return exact_topk

    def search(queries: np.ndarray, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        params = ann_params(backend, len(vectors), **given)
        index = build_faiss(vectors, backend, params)
        q = np.ascontiguousarray(queries, dtype=np.float32)
        scores, rows = index.search(q, min(k, len(vectors)))
        return np.where(rows < 0, -np.inf, scores).astype(np.float32), rows.astype(np.int64)

    return search


# ------------------------------------------------------------------------------------- index
class Index:
    """A corpus' vectors and texts on disk, searchable by cosine.

    Example::

        >>> idx = Index.build("corpus.txt", "runs/simcse/best", "my.index")  # doctest: +SKIP
        >>> for hit in Index.open("my.index").search("a man plays a guitar", k=3):  # doctest: +SKIP
        ...     print(hit.score, hit.line, hit.text)
    """

    def __init__(self, path: str | Path, encoder: Any = None, device: str | None = None) -> None:
        self.path = Path(path)
        meta_file = self.path / META_FILE
        if not meta_file.is_file():
            raise SearchIndexError(f"{self.path}: not a cselab index (no {META_FILE})")
        self.meta = read_meta(meta_file)
        done, total = _progress(self.path, self.meta)
        if done < total:
            raise SearchIndexError(
                f"{self.path}: incomplete index ({done} of {total} chunks encoded); run the same "
                "`cselab index build` command again to finish it"
            )
        try:
            self.vectors = np.load(self.path / VECTORS_FILE, mmap_mode="r")
            self.offsets = np.load(self.path / OFFSETS_FILE, mmap_mode="r")
            self.lines = np.load(self.path / LINES_FILE, mmap_mode="r")
            self._texts = np.memmap(self.path / TEXTS_FILE, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as err:
            raise SearchIndexError(f"{self.path}: unreadable index file ({err})") from None
        shape = (int(self.meta["count"]), int(self.meta["dim"]))
        if self.vectors.shape != shape or len(self.offsets) != shape[0] + 1:
            raise SearchIndexError(
                f"{self.path}: {VECTORS_FILE} is {self.vectors.shape}, {META_FILE} says {shape}"
            )
        self._encoder = encoder
        self._device = device
        self._ann: dict[str, Any] = {}

    # ---------------------------------------------------------------------------- building
    @classmethod
    def build(
        cls,
        corpus: str | Path,
        model: Any,
        path: str | Path,
        *,
        pooler: str | None = None,
        backend: str = "exact",
        chunk_size: int = DEFAULT_CHUNK,
        batch_size: int = 128,
        hnsw_m: int | None = None,
        ef_construction: int | None = None,
        nlist: int | None = None,
        overwrite: bool = False,
        device: str | None = None,
        show_progress: bool = False,
        dim: int | None = None,
        compile_inference: bool = False,
    ) -> Index:
        """Encode every non-blank line of ``corpus`` into an index folder at ``path``.

        ``model``: a model folder or name (opened with :func:`cselab.load`) or a loaded
        :class:`~cselab.model.encoder.SentenceEncoder`. If ``path`` holds an unfinished build of the
        same corpus, model, pooler and chunk size, the build resumes from the first chunk not
        recorded; one with other settings is an error unless ``overwrite``. ``backend`` ``hnsw``
        or ``ivf`` also builds that FAISS index (on a finished index, only that is built).

        ``dim``: store the first ``dim`` coordinates of each vector, re-normalised (a model
        trained with ``objective.matryoshka.dims``, :meth:`SentenceEncoder.encode
        <cselab.model.encoder.SentenceEncoder.encode>`'s ``dim``): a smaller, faster index.
        ``index.json`` records it (``dim`` and the model's width ``model_dim``), queries are
        encoded at the same prefix, and a query model of another width is refused.

        ``compile_inference``: a model opened here encodes through a compiled graph
        (:meth:`SentenceEncoder.compile_inference
        <cselab.model.encoder.SentenceEncoder.compile_inference>`).
        """
        if backend not in BUILD_BACKENDS:
            raise SearchIndexError(
                f"unknown backend {backend!r}; choose one of {', '.join(BUILD_BACKENDS)}"
            )
        if chunk_size < 1 or batch_size < 1:
            raise SearchIndexError("chunk size and batch size must be positive")
        out = Path(path)
        corpus = Path(corpus)
        if not corpus.is_file():
            raise SearchIndexError(f"{corpus}: corpus file not found")
        if out.exists() and not out.is_dir():  # before the model loads
            raise SearchIndexError(
                f"{out}: exists and is not a folder (an index is a folder); choose another output"
            )
        encoder = model if not isinstance(model, str | os.PathLike) else None
        # A loaded encoder is recorded by its source (None: queries then need model=...).
        model_name = getattr(encoder, "source", None) if encoder is not None else str(model)
        if model_name and Path(model_name).exists():
            model_name = str(Path(model_name).resolve())  # searching from another folder works
        if encoder is None:
            from ..model.encoder import load

            encoder = load(
                model_name, pooler=pooler, device=device, compile_inference=compile_inference
            )
        width = int(encoder.dim)
        stored = width if dim is None else check_prefix(dim, width, "--dim")
        want = {
            "format": INDEX_FORMAT,
            "model": model_name,
            "pooler": encoder.pooler.kind,
            "corpus": str(corpus.resolve()),
            "corpus_sha256": file_digest(corpus),
            "dim": stored,
            "chunk_size": int(chunk_size),
        }
        if stored != width:  # a Matryoshka prefix: queries are encoded at it too
            want["model_dim"] = width
        if (out / META_FILE).is_file() and not overwrite:
            meta = _check_resumable(out, want)
        else:
            meta = _start(out, corpus, want)
        total = -(-int(meta["count"]) // chunk_size)
        done, _ = _progress(out, meta)
        if done < total:
            _encode_chunks(out, meta, encoder, done, total, batch_size, show_progress)
        index = cls(out, encoder=encoder, device=device)
        if backend != "exact":
            params = ann_params(
                backend, len(index), m=hnsw_m, ef_construction=ef_construction, nlist=nlist
            )
            index.build_ann(backend, params)
        return index

    @classmethod
    def from_vectors(
        cls,
        path: str | Path,
        vectors: np.ndarray,
        texts: Sequence[str],
        model: str,
        pooler: str,
        *,
        block_rows: int = 1 << 16,
    ) -> Index:
        """An index from vectors encoded elsewhere (normalised here) and their texts.

        ``model`` and ``pooler`` say how text queries are to be encoded; the vectors must come
        from that model. Rows are written block by block, so ``vectors`` may be a memory map.
        """
        n, dim = (int(x) for x in vectors.shape)
        if len(texts) != n:
            raise SearchIndexError(f"{n} vectors but {len(texts)} texts")
        out = Path(path)
        want = {"format": INDEX_FORMAT, "model": model, "pooler": pooler, "corpus": None,
                "corpus_sha256": None, "dim": dim, "chunk_size": n}  # fmt: skip
        _write_layout(out, texts, range(1, n + 1), want)
        rows = np.load(out / VECTORS_FILE, mmap_mode="r+")
        for start in range(0, n, block_rows):
            rows[start : start + block_rows] = normalize_rows(vectors[start : start + block_rows])
        rows.flush()
        del rows
        write_json_atomic(out / PROGRESS_FILE, {"chunks_done": 1}, what="index progress")
        return cls(out)

    @classmethod
    def from_texts(
        cls,
        path: str | Path,
        texts: Sequence[str],
        encoder: Any,
        *,
        chunk_size: int = DEFAULT_CHUNK,
        batch_size: int = 128,
        show_progress: bool = False,
    ) -> Index:
        """An index over texts the caller holds (any text, line breaks included: e.g. the
        positives of a pairs file), encoded with a loaded ``encoder`` chunk by chunk into the
        memory-mapped vector file; row ``i`` is ``texts[i]``. The index records the encoder's
        ``source`` as its model (``None`` for an encoder built in Python)."""
        if not texts:
            raise SearchIndexError("no texts to index")
        check_new_folder(path)
        want = {"format": INDEX_FORMAT, "model": getattr(encoder, "source", None),
                "pooler": encoder.pooler.kind, "corpus": None, "corpus_sha256": None,
                "dim": int(encoder.dim), "chunk_size": int(chunk_size)}  # fmt: skip
        out = Path(path)
        meta = _write_layout(out, texts, range(1, len(texts) + 1), want)
        total = -(-len(texts) // chunk_size)
        _encode_chunks(out, meta, encoder, 0, total, batch_size, show_progress)
        return cls(out, encoder=encoder)

    def build_ann(self, backend: str, params: dict[str, int]) -> None:
        """Build and save a FAISS ``hnsw`` or ``ivf`` index over the vectors (kept if present
        with the same parameters)."""
        built = self.meta.get("ann", {})
        same = {k: v for k, v in built.get(backend, {}).items() if k not in ("ef_search", "nprobe")}
        if (
            same == {k: v for k, v in params.items() if k not in ("ef_search", "nprobe")}
            and (self.path / _ann_file(backend)).is_file()
        ):
            return
        log.info("building FAISS %s index %s over %d vectors", backend, params, len(self))
        index = build_faiss(self.vectors, backend, params)
        target = self.path / _ann_file(backend)
        with atomic_path(target, "FAISS index") as tmp:
            try:
                _faiss().write_index(index, str(tmp))
            except RuntimeError as err:  # FAISS reports a failed write (disk full) this way
                cause = str(err).strip().splitlines()[-1] if str(err).strip() else "write error"
                raise WriteError(f"could not write the FAISS index {target}: {cause}") from err
        self.meta.setdefault("ann", {})[backend] = params
        write_json_atomic(self.path / META_FILE, self.meta, indent=2, what="index")
        self._ann[backend] = index

    @classmethod
    def open(cls, path: str | Path, model: Any = None, device: str | None = None) -> Index:
        """Open a finished index; ``model`` overrides the encoder used for text queries."""
        if isinstance(model, str | os.PathLike):
            from ..model.encoder import load

            index = cls(path, device=device)
            index._encoder = load(str(model), pooler=index.meta["pooler"], device=device)
            return index
        return cls(path, encoder=model, device=device)

    # ------------------------------------------------------------------------------ access
    def __len__(self) -> int:
        return int(self.vectors.shape[0])

    def text(self, row: int) -> str:
        return bytes(self._texts[self.offsets[row] : self.offsets[row + 1]]).decode("utf-8")

    @property
    def encoder(self) -> Any:
        """The encoder for text queries: the one the index was built with, loaded on first use."""
        if self._encoder is None:
            from ..model.encoder import load

            if not self.meta.get("model"):
                raise SearchIndexError(
                    f"{self.path}: {META_FILE} names no model; pass model= (or --model) to "
                    "encode the queries"
                )

            self._encoder = load(
                self.meta["model"], pooler=self.meta["pooler"], device=self._device
            )
        return self._encoder

    def query_dim(self) -> int | None:
        """The ``dim`` text queries are encoded at (``encode(..., dim=)``): the stored prefix
        of an index built at a Matryoshka dimension, else ``None`` (the full width). A query
        encoder whose width is not the one the index was built from is an error."""
        prefix = "model_dim" in self.meta
        built_from = int(self.meta["model_dim" if prefix else "dim"])
        if int(self.encoder.dim) != built_from:
            raise SearchIndexError(
                f"{self.path}: the index was built from a model of width {built_from}"
                + (f" (stored at its first {self.meta['dim']} dimensions)" if prefix else "")
                + f"; the query model's width is {self.encoder.dim}"
            )
        return int(self.meta["dim"]) if prefix else None

    def backends(self) -> list[str]:
        """Backends this index can search with now."""
        out = ["exact"]
        try:
            _faiss()
        except SearchIndexError:
            return out
        return [*out, "flat", *[b for b in self.meta.get("ann", {}) if b in SEARCH_BACKENDS]]

    def default_backend(self) -> str:
        """The approximate index if one was built (the newest), else exact search."""
        ann = list(self.meta.get("ann", {}))
        return ann[-1] if ann else "exact"

    # ------------------------------------------------------------------------------ search
    def search_vectors(
        self,
        queries: np.ndarray,
        k: int = 10,
        backend: str | None = None,
        nprobe: int | None = None,
        ef_search: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(Q, D)`` query vectors -> ``(scores, rows)``, each ``(Q, min(k, N))``, best first.

        Queries are L2-normalised, so scores are cosines. An approximate backend may find fewer
        than ``k`` rows for a query: the missing places have row ``-1`` and score ``-inf``.
        """
        backend = backend or self.default_backend()
        if backend not in SEARCH_BACKENDS:
            raise SearchIndexError(
                f"unknown backend {backend!r}; choose one of {', '.join(SEARCH_BACKENDS)}"
            )
        if k < 1:
            raise SearchIndexError(f"k must be at least 1, not {k}")
        q = np.atleast_2d(np.asarray(queries, dtype=np.float32))
        if q.ndim != 2 or q.shape[1] != self.vectors.shape[1]:
            raise SearchIndexError(
                f"query vectors have shape {q.shape}; this index holds width {self.vectors.shape[1]}"
            )
        q = normalize_rows(q)
        if backend == "exact":
            return exact_topk(q, self.vectors, k)
        index = self._faiss_index(backend)
        params = {**self.meta.get("ann", {}).get(backend, {})}
        params.update({k: v for k, v in (("nprobe", nprobe), ("ef_search", ef_search)) if v})
        _set_search_params(index, backend, params)
        scores, rows = index.search(np.ascontiguousarray(q), min(k, len(self)))
        scores = np.where(rows < 0, -np.inf, scores).astype(np.float32)
        return scores, rows.astype(np.int64)

    def _faiss_index(self, backend: str) -> Any:
        if backend not in self._ann:
            if backend == "flat":
                self._ann[backend] = build_faiss(self.vectors, "flat", {})
            else:
                file = self.path / _ann_file(backend)
                if backend not in self.meta.get("ann", {}) or not file.is_file():
                    raise SearchIndexError(
                        f"{self.path}: no {backend} index was built; run `cselab index build ... "
                        f"--backend {backend}` (built: {', '.join(self.backends())})"
                    )
                self._ann[backend] = _faiss().read_index(str(file))
        return self._ann[backend]

    def search(
        self,
        queries: str | Sequence[str],
        k: int = 10,
        backend: str | None = None,
        batch_size: int = 128,
        **kwargs: Any,
    ) -> list[Hit] | list[list[Hit]]:
        """Text queries -> hits, best first (one list for a string, a list of lists for a list)."""
        single = isinstance(queries, str)
        texts = [queries] if single else list(queries)
        if not texts:
            return []
        check_queries(texts)
        vectors = encode_at(self.encoder, texts, batch_size, self.query_dim())
        scores, rows = self.search_vectors(vectors, k, backend=backend, **kwargs)
        hits = [
            [
                Hit(rank, float(s), int(r), int(self.lines[r]), self.text(int(r)))
                for rank, (s, r) in enumerate(
                    ((s, r) for s, r in zip(srow, rrow, strict=True) if r >= 0), start=1
                )
            ]
            for srow, rrow in zip(scores, rows, strict=True)
        ]
        return hits[0] if single else hits


# ------------------------------------------------------------------------------- build steps
def check_new_folder(path: str | Path) -> None:
    """Refuse to write an index over texts the caller holds into a folder that holds an index
    already (:meth:`Index.from_texts` has no corpus file to resume from, so it would replace
    that index without a word); :meth:`Index.build` resumes or refuses by its own rules."""
    if (Path(path) / META_FILE).is_file():
        raise SearchIndexError(
            f"{path} holds an index already ({META_FILE}); choose a new folder or remove it"
        )


def encode_at(encoder: Any, texts: Sequence[str], batch_size: int, dim: int | None) -> np.ndarray:
    """Unit vectors of ``texts`` at prefix ``dim`` (``None``: the full width). The prefix is cut
    here (:func:`~cselab.model.similarity.truncate_rows`), so any object with
    ``encode(texts, batch_size=, normalize=)`` serves as the index's encoder."""
    vectors = encoder.encode(list(texts), batch_size=batch_size, normalize=True)
    return vectors if dim is None else truncate_rows(vectors, dim)


def _progress(path: Path, meta: dict) -> tuple[int, int]:
    total = -(-int(meta["count"]) // int(meta["chunk_size"]))
    file = path / PROGRESS_FILE
    if not file.is_file():
        return 0, total
    try:
        done = int(json.loads(file.read_text(encoding="utf-8"))["chunks_done"])
    except (ValueError, KeyError, TypeError):
        raise SearchIndexError(f"{file}: unreadable; rebuild with --overwrite") from None
    return min(done, total), total


def _check_resumable(out: Path, want: dict) -> dict:
    try:
        meta = read_meta(out / META_FILE)
    except SearchIndexError as err:
        raise SearchIndexError(f"{err}; pass --overwrite (overwrite=True) to start over") from None
    for key, value in want.items():
        if meta.get(key) != value:
            raise SearchIndexError(
                f"{out}: an index with {key} {meta.get(key)!r} is there, not {value!r}; "
                "pass --overwrite (overwrite=True) or another output folder"
            )
    return meta


def _start(out: Path, corpus: Path, want: dict) -> dict:
    texts, numbers = read_lines(corpus)
    return _write_layout(out, texts, numbers, want)


def _write_layout(out: Path, texts: Sequence[str], numbers: Sequence[int], want: dict) -> dict:
    """Texts, offsets, line numbers and an allocated vector file; ``index.json`` written last."""
    out.mkdir(parents=True, exist_ok=True)
    for name in (PROGRESS_FILE, META_FILE):
        (out / name).unlink(missing_ok=True)  # a half-written old build must not be resumed
    for old in out.glob("faiss-*.index"):
        old.unlink()
    # the vectors first: the largest file, so a full disk stops the build before anything else
    _allocate_vectors(out / VECTORS_FILE, len(texts), int(want["dim"]))
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    # text by text, so the corpus is never held a second time as bytes (a 1M-text corpus)
    with atomic_path(out / TEXTS_FILE, "index texts") as tmp, tmp.open("wb") as fh:
        end = 0
        for i, text in enumerate(texts, start=1):
            end += fh.write(text.encode("utf-8"))
            offsets[i] = end
    with atomic_path(out / OFFSETS_FILE, "index offsets") as tmp:
        np.save(tmp, offsets)
    with atomic_path(out / LINES_FILE, "index line numbers") as tmp:
        np.save(tmp, np.asarray(numbers, dtype=np.int64))
    meta = {**want, "count": len(texts), "lines": int(numbers[-1]), "normalized": True}
    write_json_atomic(out / PROGRESS_FILE, {"chunks_done": 0}, what="index progress")
    # last: its presence means the layout is complete
    write_json_atomic(out / META_FILE, meta, indent=2, what="index")
    return meta


def _allocate_vectors(path: Path, rows: int, dim: int) -> None:
    """A zero ``(rows, dim)`` float32 ``.npy`` file with all its bytes reserved on disk
    (:func:`~cselab.io.files.reserve`): the memory map written chunk by chunk later can then
    never meet a full disk, where a write through it would be a SIGBUS without a message."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": (rows, dim)}
    )
    with atomic_path(path, "index vectors") as tmp, tmp.open("wb") as fh:
        fh.write(header.getvalue())
        fh.flush()
        reserve(fh.fileno(), len(header.getvalue()) + 4 * rows * dim, path, "index vectors")


def _chunk_texts(out: Path, meta: dict, chunk: int) -> list[str]:
    offsets = np.load(out / OFFSETS_FILE, mmap_mode="r")
    start = chunk * int(meta["chunk_size"])
    stop = min(start + int(meta["chunk_size"]), int(meta["count"]))
    blob = (out / TEXTS_FILE).open("rb")
    with blob:
        blob.seek(int(offsets[start]))
        data = blob.read(int(offsets[stop]) - int(offsets[start]))
    cuts = np.asarray(offsets[start : stop + 1]) - int(offsets[start])
    return [data[a:b].decode("utf-8") for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


def _encode_chunks(
    out: Path,
    meta: dict,
    encoder: Any,
    done: int,
    total: int,
    batch_size: int,
    show_progress: bool,
) -> None:
    vectors = np.load(out / VECTORS_FILE, mmap_mode="r+")
    size = int(meta["chunk_size"])
    bar = None
    if show_progress:
        from tqdm.auto import tqdm

        bar = tqdm(
            total=int(meta["count"]), initial=min(done * size, int(meta["count"])),
            desc="index", unit="line",
        )  # fmt: skip
    try:
        for chunk in range(done, total):
            texts = _chunk_texts(out, meta, chunk)
            start = chunk * size
            vectors[start : start + len(texts)] = encode_at(
                encoder, texts, batch_size, int(meta["dim"]) if "model_dim" in meta else None
            )
            vectors.flush()  # the rows reach the file before the progress record says so
            write_json_atomic(
                out / PROGRESS_FILE, {"chunks_done": chunk + 1}, what="index progress"
            )
            if bar is not None:
                bar.update(len(texts))
    finally:
        if bar is not None:
            bar.close()
        del vectors
