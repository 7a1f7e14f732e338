"""Similarity search over a text corpus: a memory-mapped vector index built with a cselab encoder.

An index is a folder::

    my.index/
      index.json     what was built: model, pooler, prompts, corpus digest, sizes, ANN settings
      texts.bin      the corpus lines, UTF-8, back to back
      offsets.npy    int64 (N + 1,): line i is texts.bin[offsets[i]:offsets[i + 1]]
      lines.npy      int64 (N,): the 1-based line number of each entry in the corpus file
      vectors.npy    float32 (N, D), L2-normalised, so a dot product is a cosine
      progress.json  how many chunks of vectors are written (resuming reads it)
      faiss-*.index  the approximate index, when one was built (backend ``hnsw`` or ``ivf``)

Documents are encoded after the document prompt and queries after the query prompt, both
recorded in ``index.json`` (chosen as retrieval evaluation and mining choose them:
:func:`~cselab.evaluation.embed.query_document_prompts`).

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

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import IndexSettingError, SearchIndexError, WriteError, check_count
from ..core.prompts import DOCUMENT, QUERY
from ..evaluation.embed import (
    default_prompt,
    query_document_prompts,
    unprompted,
    with_prompt,
)
from ..io.files import (  # the corpus digest is training's
    atomic_path,
    file_digest,
    write_json_atomic,
)
from ..io.readers import check_file, reraise_as
from ..io.runfolder import RunFolder
from ..model.similarity import (  # exact_topk: the one exact search
    check_prefix,
    exact_topk,
    normalize_rows,
)
from .ann import (  # noqa: F401 - the FAISS search, re-exported
    _ann_file,
    _faiss,
    _set_search_params,
    ann_params,
    build_faiss,
    check_backend,
    vector_search,
)
from .build import (  # noqa: F401 - the build steps, re-exported
    _allocate_vectors,
    _check_resumable,
    _chunk_texts,
    _encode_chunks,
    _progress,
    _start,
    _write_layout,
    check_new_folder,
    encode_at,
)
from .layout import (  # noqa: F401 - the folder layout, re-exported
    BUILD_BACKENDS,
    DEFAULT_CHUNK,
    INDEX_FORMAT,
    LINES_FILE,
    META_FILE,
    OFFSETS_FILE,
    PROGRESS_FILE,
    SEARCH_BACKENDS,
    TEXTS_FILE,
    VECTORS_FILE,
    _ann_settings,
    _shown,
    _text_or_null,
    _whole,
    check_queries,
    read_lines,
    read_meta,
)
from .settings import IndexSettings  # noqa: F401 - the build settings, re-exported

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------- results
@dataclass(frozen=True)
class Hit:
    """One search result: ``row`` in the index, ``line`` in the corpus file, cosine ``score``."""

    rank: int
    score: float
    row: int
    line: int
    text: str


# ------------------------------------------------------------------------------------- index
class Index:
    """A corpus' vectors and texts on disk, searchable by cosine.

    Example::

        >>> idx = Index.build("corpus.txt", "runs/simcse/best", "my.index")  # doctest: +SKIP
        >>> for hit in Index.open("my.index").search("a man plays a guitar", k=3):  # doctest: +SKIP
        ...     print(hit.score, hit.line, hit.text)
    """

    def __init__(
        self,
        path: str | Path,
        encoder: Any = None,
        device: str | None = None,
        query_prompt: str | None = None,
    ) -> None:
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
        self._query_prompt = query_prompt
        self._device = device
        self._ann: dict[str, Any] = {}

    # ---------------------------------------------------------------------------- building
    @classmethod
    def build(
        cls,
        corpus: str | Path,
        model: Any,
        path: str | Path,
        settings: IndexSettings | None = None,
        *,
        overwrite: bool = False,
        show_progress: bool = False,
        query_prompt: str | None = None,
        document_prompt: str | None = None,
    ) -> Index:
        """Encode every non-blank line of ``corpus`` into an index folder at ``path``.

        ``model``: a model folder or name (opened with :func:`cselab.load` and ``settings``'
        pooler, device and compiled graph) or a loaded
        :class:`~cselab.model.encoder.SentenceEncoder`. ``settings``: how the index is built
        (:class:`~cselab.search.settings.IndexSettings`; ``None``: its defaults). If ``path``
        holds an unfinished build of the same corpus, model, pooler and chunk size, the build
        resumes from the first chunk not recorded; one with other settings is an error unless
        ``overwrite``. A ``backend`` of ``hnsw`` or ``ivf`` also builds that FAISS index (on a
        finished index, only that is built).

        ``settings.dim``: store the first ``dim`` coordinates of each vector, re-normalised (a
        model trained with ``objective.matryoshka.dims``, :meth:`SentenceEncoder.encode
        <cselab.model.encoder.SentenceEncoder.encode>`'s ``dim``): a smaller, faster index.
        ``index.json`` records it (``dim`` and the model's width ``model_dim``), queries are
        encoded at the same prefix, and a query model of another width is refused.

        ``query_prompt``, ``document_prompt``: the texts put before every query and every line
        (``docs/prompts.md``); ``None``: the model's saved ``query`` / ``document`` prompt, else
        its default prompt; ``""``: none (a default turned off). ``index.json`` records both, and
        searches of the index, reopened or not, read their queries after its query prompt. A
        prompted view of a model (``with_prompt(model, p)``) reads the lines after ``p``, as
        ``document_prompt=p`` does, and not the queries.
        """
        settings = settings if settings is not None else IndexSettings()
        settings.validate(BUILD_BACKENDS)
        check_backend(settings.backend)  # before the corpus is encoded for it
        out = Path(path)
        corpus = Path(corpus)
        with reraise_as(SearchIndexError):  # missing or a folder: before the model loads
            check_file(corpus, "corpus file")
        if out.exists() and not out.is_dir():  # before the model loads
            raise SearchIndexError(
                f"{out}: exists and is not a folder (an index is a folder); choose another output"
            )
        # One build at a time in a folder, as one run in a run folder: a second build would
        # encode everything again beside the first (the lock is released however this ends).
        with RunFolder(out).lock():
            encoder = model if not isinstance(model, str | os.PathLike) else None
            encoder, document_prompt = unprompted(encoder, document_prompt)
            # A loaded encoder is recorded by its source (None: queries then need model=...).
            model_name = getattr(encoder, "source", None) if encoder is not None else str(model)
            if model_name and Path(model_name).exists():
                model_name = str(Path(model_name).resolve())  # searching from another folder works
            if encoder is None:
                encoder = settings.load(model_name)
            width = int(encoder.dim)
            dim = settings.dim
            stored = width if dim is None else check_prefix(dim, width, "dim")
            chunk_size = settings.chunk()
            prompts = query_document_prompts(encoder, query_prompt, document_prompt)
            want = {
                "format": INDEX_FORMAT,
                "model": model_name,
                "pooler": encoder.pooler.kind,
                "corpus": str(corpus.resolve()),
                "corpus_sha256": file_digest(corpus),
                "dim": stored,
                "chunk_size": int(chunk_size),
                "prompts": dict(zip((QUERY, DOCUMENT), prompts, strict=True)),
            }
            if stored != width:  # a Matryoshka prefix: queries are encoded at it too
                want["model_dim"] = width
            if (out / META_FILE).is_file() and not overwrite:
                # the vectors depend on the document prompt only (an index built before prompts
                # were recorded read its model's default); the query prompt is what searches
                # read, recorded anew
                document = f"prompts.{DOCUMENT}"
                stored = {k: v for k, v in want.items() if k != "prompts"}
                meta = _check_resumable(
                    out, {**stored, document: prompts[1]}, {document: default_prompt(encoder)}
                )
                if "prompts" in meta and meta["prompts"] != want["prompts"]:  # an older one: kept
                    meta["prompts"] = want["prompts"]
                    write_json_atomic(out / META_FILE, meta, indent=2, what="index")
            else:
                meta = _start(out, corpus, want)
            total = -(-int(meta["count"]) // chunk_size)
            done, _ = _progress(out, meta)
            if done < total:
                documents = with_prompt(encoder, meta.get("prompts", {}).get(DOCUMENT))
                _encode_chunks(
                    out, meta, documents, done, total, settings.batch_size, show_progress
                )
            index = cls(out, encoder=encoder, device=settings.device)
            if settings.backend != "exact":
                index.build_ann(settings.backend, settings.ann_params(len(index)))
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
        batch_size: int = IndexSettings.batch_size,
        show_progress: bool = False,
        query_prompt: str | None = None,
        document_prompt: str | None = None,
    ) -> Index:
        """An index over texts the caller holds (any text, line breaks included: e.g. the
        positives of a pairs file), encoded with a loaded ``encoder`` chunk by chunk into the
        memory-mapped vector file; row ``i`` is ``texts[i]``. The index records the encoder's
        ``source`` as its model (``None`` for an encoder built in Python), and the prompts as
        :meth:`build` does (the texts read after ``document_prompt``, its searches' queries
        after ``query_prompt``)."""
        if not texts:
            raise SearchIndexError("no texts to index")
        check_new_folder(path)
        encoder, document_prompt = unprompted(encoder, document_prompt)
        prompts = query_document_prompts(encoder, query_prompt, document_prompt)
        want = {"format": INDEX_FORMAT, "model": getattr(encoder, "source", None),
                "pooler": encoder.pooler.kind, "corpus": None, "corpus_sha256": None,
                "dim": int(encoder.dim), "chunk_size": int(chunk_size),
                "prompts": dict(zip((QUERY, DOCUMENT), prompts, strict=True))}  # fmt: skip
        out = Path(path)
        meta = _write_layout(out, texts, range(1, len(texts) + 1), want)
        total = -(-len(texts) // chunk_size)
        documents = with_prompt(encoder, prompts[1])
        _encode_chunks(out, meta, documents, 0, total, batch_size, show_progress)
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
    def open(
        cls,
        path: str | Path,
        model: Any = None,
        device: str | None = None,
        query_prompt: str | None = None,
    ) -> Index:
        """Open a finished index; ``model`` overrides the encoder used for text queries and
        ``query_prompt`` the prompt they are read after (``""``: none; ``None``: the index's,
        :meth:`query_prompt`; a prompted view of a model, ``with_prompt(model, p)``, reads them
        after ``p``)."""
        model, query_prompt = unprompted(model, query_prompt)
        if isinstance(model, str | os.PathLike):
            from ..model.encoder import load

            index = cls(path, device=device, query_prompt=query_prompt)
            index._encoder = load(str(model), pooler=index.meta["pooler"], device=device)
            return index
        return cls(path, encoder=model, device=device, query_prompt=query_prompt)

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
                    f"{self.path}: {META_FILE} names no model; pass model=... to encode the queries"
                )

            self._encoder = load(
                self.meta["model"], pooler=self.meta["pooler"], device=self._device
            )
        return self._encoder

    def query_prompt(self) -> str | None:
        """The text put before every text query: the one this index was opened with, else its
        recorded query prompt (``""``: none); ``None`` for an index that records no prompts
        (built before they were recorded, or from vectors or texts): queries are then encoded
        as the model's ``encode`` does, its default prompt included."""
        if self._query_prompt is not None:
            return self._query_prompt
        return self.meta.get("prompts", {}).get(QUERY)

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
        k = check_count("k", k, IndexSettingError)
        # 0 searched at the default depth without a word
        nprobe, ef_search = (
            None if v is None else check_count(name, v, IndexSettingError)
            for name, v in (("nprobe", nprobe), ("ef_search", ef_search))
        )
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
        given = (("nprobe", nprobe), ("ef_search", ef_search))
        params.update({name: value for name, value in given if value is not None})
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
                    raise IndexSettingError(
                        "backend", backend,
                        "{path}: no {kind} index was built; build one with {setting} "
                        "(available: {built})",
                        command="index build", call="Index.build(..., IndexSettings({}))",
                        path=self.path, kind=backend, built=", ".join(self.backends()),
                    )  # fmt: skip
                self._ann[backend] = _faiss().read_index(str(file))
        return self._ann[backend]

    def search(
        self,
        queries: str | Sequence[str],
        k: int = 10,
        backend: str | None = None,
        batch_size: int = IndexSettings.batch_size,
        **kwargs: Any,
    ) -> list[Hit] | list[list[Hit]]:
        """Text queries -> hits, best first (one list for a string, a list of lists for a list).
        Queries are read after :meth:`query_prompt`."""
        single = isinstance(queries, str)
        texts = [queries] if single else list(queries)
        if not texts:
            return []
        check_queries(texts)
        queries_encoder = with_prompt(self.encoder, self.query_prompt())
        vectors = encode_at(queries_encoder, texts, batch_size, self.query_dim())
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
