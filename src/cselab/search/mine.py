"""Hard-negative mining: (anchor, positive) pairs in, (anchor, positive, negative) rows out.

For each anchor the corpus (the distinct positives of the pairs, plus the lines of a
``corpus`` file when one is given) is searched with the anchor's vector, and negatives are
picked among the nearest texts that pass filters against false negatives:

* never the anchor's own positive(s) (every positive of an anchor that occurs on several rows)
  nor a text equal to the anchor (the corpus holds each text once, so no duplicate either);
* a rank window ``range_min <= rank < range_max``, counted among the candidates that pass the
  filters (``range_max`` defaults to ``range_min + num_negatives + P``, or ``range_min +
  10 * num_negatives + P`` with a score filter, ``P`` the most distinct positives of an anchor;
  sentence-transformers counts an anchor's rows, duplicated pairs included, so with duplicates
  its default window is deeper: pass ``range_max`` for the same depth);
* ``max_score``: a negative's cosine with the anchor is at most this;
* ``absolute_margin``: at most the positive's cosine minus the margin; ``relative_margin``: at
  most ``pos - |pos| * r`` (NV-Retriever's positive-aware "TopK-PercPos", Moreira et al. 2024,
  "NV-Retriever: Improving text embedding models with effective hard-negative mining", Sec. 3:
  95% of the positive's score is ``relative_margin=0.05``); with several positives the lowest
  positive score is the reference;
* ``num_negatives`` per anchor, the ``top`` ones of the window or a ``random`` sample of it
  (``seed``), kept in score order.

These are the semantics of ``sentence_transformers.util.mine_hard_negatives`` (v5+, where
``margin`` became ``absolute_margin``), and with the same model, corpus and filters the same
negatives come out for ``top`` sampling (tested against sentence-transformers 6.3): the
candidates are the ``range_max + P + 1`` best rows (room for the positives and for the
anchor's own text, which is never a negative; sentence-transformers before 6.3 kept it and
searched one row fewer, so an anchor found in the corpus was its own hardest "negative").
``random`` sampling draws from the same window with a numpy
generator seeded by ``seed`` (sentence-transformers draws with Python's global ``random``).
The output is in sentence-transformers' order too: anchors by first appearance, each
anchor's distinct positives in order, each positive's negatives best first. ``triplet`` gives
one row per negative (an anchor with fewer negatives gives fewer rows); ``n-tuple`` gives one
row with ``negative_1 .. negative_K`` per positive, and leaves out anchors with fewer than K.

Memory: the file is read twice as a stream. The first pass keeps one copy of each distinct
corpus text (a dict from text to row) and, per distinct anchor, a 64-bit digest and its
positives' rows; the texts are then written to a :class:`~cselab.search.index.Index` folder
(texts back to back, vectors encoded chunk by chunk into a memory-mapped float32 matrix) and
dropped. The second pass encodes ``chunk_size`` new anchors at a time, searches the index
(exact top-k over the memory map, or FAISS), filters and writes rows as they come to a
temporary file renamed at the end (:func:`cselab.io.files.write_table`): a failure leaves no
partial output.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..core.errors import ConfigError, ConfigSettingError, CorpusError, check_count
from ..core.prompts import DOCUMENT, QUERY
from ..data.config import DEFAULT_NEGATIVE_COLUMN, DataFormat, PairColumns
from ..evaluation.embed import query_document_prompts, with_prompt
from ..io.files import TABLE_WRITE_SUFFIXES, write_json_atomic, write_table
from ..io.readers import Lines, open_table, reraise_as
from ..io.runfolder import work_folder
from .index import SEARCH_BACKENDS, Index, check_backend, check_new_folder
from .settings import IndexSettings

SAMPLING = ("top", "random")
#: What a missing-column error suggests.
COLUMNS_HINT = "name the columns with columns=cselab.PairColumns(anchor=..., positive=...)"
OUTPUT_FORMATS = ("triplet", "n-tuple")
#: A candidate at least this close to the anchor has its text compared with the anchor's (the
#: same text has cosine 1 up to float rounding; comparing only these keeps the check cheap).
SAME_TEXT_SCORE = 0.99
#: Anchors per search call: exact search scores them against 65,536 rows at a time, so 256
#: anchors hold 64 MiB of scores (and twice that of argpartition's indices), not the GiBs a
#: whole chunk of anchors would.
SEARCH_BATCH = 256
#: Anchors encoded and searched at a time where ``IndexSettings.chunk_size`` is not given
#: (:meth:`IndexSettings.chunk`): a chunk's search results stay small; the corpus is encoded in
#: chunks of the same size, at least 1024 texts.
MINE_CHUNK = 4096


@dataclass(frozen=True)
class MineSettings:
    """The settings of hard-negative mining: the filters (see the module docstring for their
    meaning), and how the corpus is encoded and searched.

    Attributes:
        range_min: candidates skipped at the top (rank counted among those passing the filters).
        range_max: the rank a negative must be below; ``None``: derived as sentence-transformers
            does (``range_min + num_negatives + P``, times 10 for the negatives with a score
            filter).
        max_score: the highest cosine a negative may have with its anchor.
        absolute_margin: a negative's cosine is at most the positive's minus this.
        relative_margin: a negative's cosine is at most ``pos - |pos| * relative_margin``.
        num_negatives: negatives per anchor.
        sampling: ``top`` (the best of the window) or ``random`` (a sample of it).
        seed: the seed of ``random`` sampling.
        output_format: ``triplet`` (a row per negative) or ``n-tuple`` (a row per positive with
            ``num_negatives`` negative columns).
        index: how the corpus is encoded and searched (:class:`IndexSettings`: the backend,
            ``exact``, ``flat``, ``hnsw`` or ``ivf``, with its FAISS settings; the encoder's batch
            size, pooler, device and compiled graph for a model opened by name); its
            ``chunk_size`` is the anchors encoded and searched at a time (and the corpus texts
            per encoded chunk, at least 1024); not given: :data:`MINE_CHUNK`, whatever else
            ``index`` sets. ``dim`` is not taken: mining searches at the
            model's full width.
        query_prompt, document_prompt: the text put before every anchor and every corpus text
            (positives and ``corpus``) when they are encoded (``docs/prompts.md``); ``None``:
            chosen by :func:`~cselab.evaluation.embed.query_document_prompts` (the model's
            saved query / document prompt, else its default); ``""``: none.
    """

    range_min: int = 0
    range_max: int | None = None
    max_score: float | None = None
    absolute_margin: float | None = None
    relative_margin: float | None = None
    num_negatives: int = 3
    sampling: Literal["top", "random"] = "top"
    seed: int = 0
    output_format: Literal["triplet", "n-tuple"] = "triplet"
    index: IndexSettings = IndexSettings()
    query_prompt: str | None = None
    document_prompt: str | None = None

    def prompts(self, encoder: Any) -> tuple[str, str]:
        """The anchors' and the corpus' prompts for ``encoder`` (``""``: none)."""
        return query_document_prompts(encoder, self.query_prompt, self.document_prompt)

    def validate(self) -> None:
        """Refuse a setting that makes no sense, naming it (one line)."""
        self.index.validate(SEARCH_BACKENDS, ConfigSettingError)
        if self.index.dim is not None:
            raise ConfigSettingError(
                "dim", self.index.dim, "{setting}: mining searches at the model's full width"
            )
        check_count("num_negatives", self.num_negatives)
        if self.range_min < 0:
            raise ConfigSettingError(
                "range_min", self.range_min, "{setting} is refused: it must be 0 or more"
            )
        if self.seed < 0:  # numpy's generators take non-negative seeds only
            raise ConfigSettingError(
                "seed", self.seed, "{setting} is refused: it must be 0 or more"
            )
        if self.range_max is not None and self.range_max - self.range_min < self.num_negatives:
            # one setting is named (the command line spells it as its option); the others by
            # their values, which the command line takes under their own options
            raise ConfigSettingError(
                "range_max",
                self.range_max,
                "{setting} leaves {left} candidates after the {skipped} top ranks skipped, "
                "fewer than the {wanted} negatives asked for",
                left=max(0, self.range_max - self.range_min),
                skipped=self.range_min,
                wanted=self.num_negatives,
            )
        for name in ("max_score", "absolute_margin", "relative_margin"):
            value = getattr(self, name)
            if value is not None and not np.isfinite(value):
                raise ConfigSettingError(
                    name, value, "{setting} is refused: it must be a finite number"
                )
        if self.relative_margin is not None and not 0 <= self.relative_margin < 1:
            raise ConfigSettingError(
                "relative_margin",
                self.relative_margin,
                "{setting} is refused: it must be in [0, 1)",
            )
        if self.sampling not in SAMPLING:
            raise ConfigError(
                f"sampling must be one of {', '.join(SAMPLING)}, not {self.sampling!r}"
            )
        if self.output_format not in OUTPUT_FORMATS:
            raise ConfigError(
                f"output_format must be one of {', '.join(OUTPUT_FORMATS)}, "
                f"not {self.output_format!r}"
            )

    def filters(self) -> dict[str, Any]:
        """The filters by name (what the mining record keeps as its ``settings``)."""
        return {k: v for k, v in asdict(self).items() if k != "index"}

    def window_end(self, max_positives: int) -> int:
        """``range_max``, or the default sentence-transformers derives from the settings."""
        if self.range_max is not None:
            return self.range_max
        scored = (self.max_score, self.absolute_margin, self.relative_margin)
        per = 10 if any(v is not None for v in scored) else 1
        return self.range_min + per * self.num_negatives + max_positives

    def header(self) -> list[str]:
        """The output columns, named as ``cselab train`` reads them (``data.columns`` defaults;
        an ``n-tuple`` file needs ``--data.columns.negative=[negative_1,...]``)."""
        base = [PairColumns.anchor, PairColumns.positive]
        if self.output_format == "triplet":
            return [*base, DEFAULT_NEGATIVE_COLUMN]
        return [
            *base,
            *(f"{DEFAULT_NEGATIVE_COLUMN}_{i}" for i in range(1, self.num_negatives + 1)),
        ]


@dataclass
class MineReport:
    """What a mining run did: rows read, distinct anchors, corpus size, rows written, anchors
    that got fewer than ``num_negatives`` negatives; ``rows`` holds the output when no file
    was asked for."""

    pairs: int = 0
    anchors: int = 0
    corpus: int = 0
    written: int = 0
    short: int = 0
    range_max: int = 0
    header: list[str] = field(default_factory=list)
    rows: list[tuple[str, ...]] | None = None


PairsSource = str | os.PathLike[str] | Sequence[Sequence[str]]


def _digest(text: str) -> int:
    """A distinct anchor's key: 64 bits of BLAKE2b (a collision among a million anchors has odds
    of about 3e-8), so the anchors are not held in memory between the two passes."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


def _pair_rows(
    pairs: PairsSource, columns: PairColumns, data_format: DataFormat
) -> Iterator[tuple[str, str]]:
    """``(anchor, positive)`` of each row: a file through the training pair reader (the same
    formats and columns as ``cselab train``), or rows given in Python."""
    if isinstance(pairs, str | os.PathLike):
        if data_format != "sick" and Path(pairs).expanduser().exists():
            # the columns first, with this command's way of naming them (training's says data.columns)
            with reraise_as(CorpusError):
                table = open_table(Path(pairs).expanduser(), prefer_split="train")
                table.require((columns.anchor, columns.positive), COLUMNS_HINT)
        from ..data.pairs import stream_pairs  # lazily: the pair reader imports torch

        for anchor, positive, *_ in stream_pairs(pairs, data_format, columns, what="pairs file"):
            yield anchor, positive
        return
    for i, row in enumerate(pairs):
        if len(row) < 2 or not all(isinstance(t, str) and t.strip() for t in row[:2]):
            raise CorpusError(f"pair {i}: expected (anchor, positive) texts, not {row!r:.80}")
        yield row[0], row[1]


def _bar(show: bool, **kwargs: Any) -> Any:
    if not show:
        return None
    from tqdm.auto import tqdm

    return tqdm(**kwargs)


def mine_hard_negatives(
    model: Any,
    pairs: PairsSource,
    output: str | os.PathLike[str] | None = None,
    settings: MineSettings | None = None,
    *,
    corpus: str | os.PathLike[str] | None = None,
    columns: PairColumns | None = None,
    data_format: DataFormat = "auto",
    index_dir: str | os.PathLike[str] | None = None,
    show_progress: bool = False,
) -> MineReport:
    """Mine hard negatives for the ``(anchor, positive)`` pairs of ``pairs`` and write them to
    ``output`` (``.tsv``, ``.csv`` or ``.jsonl``, columns ``anchor, positive, negative``:
    ``cselab train`` reads the file as it is), or return the rows when ``output`` is ``None``.

    Args:
        model: a model folder or name (loaded with :func:`cselab.model.encoder.load`, with the
            pooler, device and compiled graph of ``settings.index``) or a loaded cselab encoder;
            anchors and corpus are encoded with it, L2-normalised.
        pairs: a pairs file (tsv/csv/jsonl/parquet/saved datasets, read as ``cselab train``
            reads it, ``columns`` naming the anchor and positive), or ``(anchor, positive)`` rows.
        settings: the filters, the output format and how the corpus is encoded and searched
            (:class:`MineSettings`; ``None``: its defaults).
        corpus: a text file, one candidate per line, searched besides the positives.
        index_dir: keep the corpus index in this folder (default: a hidden working folder
            ``.cselab-mine-*`` beside ``output``, removed at the end; one left by a killed run
            is removed by the next run beside the same output).

    Example::

        >>> report = mine_hard_negatives(  # doctest: +SKIP
        ...     "all-MiniLM-L6-v2", "pairs.jsonl", "triplets.jsonl",
        ...     MineSettings(relative_margin=0.05, num_negatives=5))  # NV-Retriever's TopK-PercPos

    Raises:
        ConfigError: a setting out of range (one line naming it).
        CorpusError: the pairs file is missing, lacks a column or has a bad row; the corpus
            file is missing or has no non-blank line.
        WriteError: the output cannot be written (the previous file is kept).
    """
    settings = settings if settings is not None else MineSettings()
    settings.validate()
    search = settings.index
    if output is not None and Path(output).suffix.lower() not in TABLE_WRITE_SUFFIXES:
        raise ConfigError(
            f"{output}: the output must end in {', '.join(TABLE_WRITE_SUFFIXES)} (the format)"
        )
    if output is not None:
        check_output(output, pairs, corpus)
    if index_dir is not None:
        check_new_folder(index_dir)  # before any reading or encoding
    cols = PairColumns(
        anchor=(columns or PairColumns()).anchor,
        positive=(columns or PairColumns()).positive,
        negative=[],  # given negatives are not read: they are what is being mined
    )

    # pass 1: one copy of each corpus text, the positives' rows of each distinct anchor
    rows: dict[str, int] = {}
    if corpus is not None:
        with reraise_as(CorpusError):
            for _, text in Lines(Path(corpus), what="corpus file"):
                rows.setdefault(text, len(rows))
        if not rows:  # nothing to add: a wrong file, refused as index build refuses it
            raise CorpusError(f"{corpus}: corpus file has no non-blank line")
    positives: dict[int, int | list[int]] = {}
    report = MineReport(header=settings.header())
    bar = _bar(show_progress, desc="read pairs", unit="pair")
    try:
        for anchor, positive in _pair_rows(pairs, cols, data_format):
            report.pairs += 1
            row = rows.setdefault(positive, len(rows))
            key = _digest(anchor)
            have = positives.get(key)
            if have is None:
                positives[key] = row
            elif isinstance(have, int):
                if have != row:
                    positives[key] = [have, row]
            elif row not in have:
                have.append(row)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    if not report.pairs:
        raise CorpusError(
            f"{pairs}: no pairs" if isinstance(pairs, str | os.PathLike) else "no pairs"
        )
    max_positives = max(1 if isinstance(v, int) else len(v) for v in positives.values())
    report.anchors, report.corpus = len(positives), len(rows)
    # a range_max given was checked (validate); the default always leaves num_negatives
    report.range_max = settings.window_end(max_positives)

    check_backend(search.backend)  # before the corpus is encoded for it
    settings = replace(settings, range_max=report.range_max)
    encoder = search.load(model) if isinstance(model, str | os.PathLike) else model
    query_prompt, document_prompt = settings.prompts(encoder)

    # beside the output, else in the system's temporary folder
    base = (
        Path(output).expanduser().resolve().parent
        if output is not None
        else Path(tempfile.gettempdir())
    )
    with work_folder(base, WORK_PREFIX) as tmp:
        folder = Path(index_dir) if index_dir is not None else tmp / "corpus.index"
        texts = list(rows)  # the dict's own strings: no second copy of the texts
        index = Index.from_texts(
            folder, texts, encoder, chunk_size=max(search.chunk(MINE_CHUNK), 1024),
            batch_size=search.batch_size, show_progress=show_progress,
            query_prompt=query_prompt, document_prompt=document_prompt,
        )  # fmt: skip
        del texts, rows
        if search.backend in ("hnsw", "ivf"):
            index.build_ann(search.backend, search.ann_params(len(index)))
        mined = _mine(index, with_prompt(encoder, query_prompt), pairs, cols, data_format,
                      positives, settings, report, max_positives, show_progress)  # fmt: skip
        if output is None:
            report.rows = list(mined)
            report.written = len(report.rows)
        else:
            report.written = write_table(output, report.header, mined, "mined triplets")
            record = {
                "tool": "cselab mine",
                "model": str(model) if isinstance(model, str | os.PathLike) else None,
                "pooler": search.pooler,
                "backend": search.backend,
                "settings": settings.filters(),
                **(
                    {"prompts": {QUERY: query_prompt, DOCUMENT: document_prompt}}
                    if query_prompt or document_prompt
                    else {}
                ),  # fmt: skip
                "pairs": report.pairs,
                "anchors": report.anchors,
                "corpus": report.corpus,
                "written": report.written,
                "short": report.short,
            }
            from ..data.pairs import mining_record_path  # lazily: the pair reader imports torch

            write_json_atomic(mining_record_path(output), record, indent=2)
        del index
    return report


def check_output(
    output: str | os.PathLike[str],
    pairs: PairsSource,
    corpus: str | os.PathLike[str] | None = None,
) -> None:
    """Refuse an output that cannot be written, before anything is read or encoded: its folder
    missing, a folder in its place, or the pairs or corpus file itself (the same path, a
    symbolic link to it or a hard link: writing it would replace the input)."""
    out = Path(output).expanduser()
    if not out.resolve().parent.is_dir():
        raise ConfigError(f"{output}: its folder does not exist")
    if out.is_dir():
        endings = ", ".join(TABLE_WRITE_SUFFIXES)
        raise ConfigError(f"{output}: is a folder; name the output file ({endings})")
    if not os.access(out.resolve().parent, os.W_OK):
        raise ConfigError(f"{output}: its folder is not writable")
    inputs = [("pairs", pairs), ("corpus", corpus)]
    for what, source in inputs:
        if not isinstance(source, str | os.PathLike):
            continue
        given = Path(source).expanduser()
        same = out.resolve() == given.resolve()
        if not same and out.exists() and given.exists():
            same = os.path.samefile(out, given)  # a hard link: another name, the same file
        if same:
            raise ConfigError(
                f"{output}: is the {what} file {source} (writing it would replace the input); "
                "choose another output file"
            )


#: The working folder beside the output (the corpus index while mining); a run killed before
#: its end leaves one, which the next run beside the same output removes
#: (:func:`~cselab.io.runfolder.work_folder`).
WORK_PREFIX = ".cselab-mine-"


def _mine(
    index: Index,
    encoder: Any,
    pairs: PairsSource,
    columns: PairColumns,
    data_format: DataFormat,
    positives: dict[int, int | list[int]],
    settings: MineSettings,
    report: MineReport,
    max_positives: int,
    show_progress: bool,
) -> Iterator[tuple[str, ...]]:
    """Pass 2: the output rows, anchors in order of first appearance, ``settings.index
    .chunk_size`` at a time."""
    backend, batch_size = settings.index.backend, settings.index.batch_size
    chunk_size = settings.index.chunk(MINE_CHUNK)
    rng = np.random.default_rng(settings.seed)
    # sentence-transformers' candidates: room for the positives and the anchor's own text
    pool = report.range_max + max_positives + 1
    k = min(pool, len(index))
    bar = _bar(show_progress, total=report.pairs, desc="mine", unit="pair")
    pending: list[tuple[str, list[int]]] = []

    def flush() -> Iterator[tuple[str, ...]]:
        vectors = encoder.encode([a for a, _ in pending], batch_size=batch_size, normalize=True)
        found_parts = [
            index.search_vectors(vectors[i : i + SEARCH_BATCH], k, backend=backend)
            for i in range(0, len(vectors), SEARCH_BATCH)
        ]
        scores = np.concatenate([s for s, _ in found_parts])
        found = np.concatenate([r for _, r in found_parts])
        for i, (anchor, own) in enumerate(pending):
            own_scores = np.asarray(index.vectors[sorted(own)], dtype=np.float32) @ vectors[i]
            chosen = select_negatives(
                scores[i], found[i], own, float(own_scores.min()), pool, settings, rng,
                same_text=lambda row, anchor=anchor: index.text(row) == anchor,
            )  # fmt: skip
            if len(chosen) < settings.num_negatives:
                report.short += 1
                if settings.output_format == "n-tuple":
                    continue
            negatives = [index.text(int(r)) for r in chosen]
            for p in own:
                positive = index.text(p)
                if settings.output_format == "n-tuple":
                    yield (anchor, positive, *negatives)
                else:
                    for negative in negatives:
                        yield (anchor, positive, negative)
        pending.clear()

    try:
        for anchor, _ in _pair_rows(pairs, columns, data_format):
            if bar is not None:
                bar.update(1)
            own = positives.pop(_digest(anchor), None)
            if own is None:
                continue  # a repeated anchor: mined, with all its positives, at its first row
            pending.append((anchor, [own] if isinstance(own, int) else own))
            if len(pending) >= chunk_size:
                yield from flush()
        if pending:
            yield from flush()
    finally:
        if bar is not None:
            bar.close()


def select_negatives(
    scores: np.ndarray,
    rows: np.ndarray,
    own: Iterable[int],
    positive_score: float,
    pool: int,
    settings: MineSettings,
    rng: np.random.Generator | None = None,
    same_text: Any = None,
) -> np.ndarray:
    """The negatives of one anchor from its search results (``scores``, ``rows``: best first,
    row ``-1`` for a place an approximate search left empty).

    ``own`` are the anchor's positives' rows, ``positive_score`` the lowest positive cosine
    (the margins' reference), ``pool`` how many results are candidates (``range_max`` + the
    most positives of an anchor + 1, the place of the anchor's own text, as
    sentence-transformers searches), ``same_text(row)`` whether a row's text is the anchor's
    (never a negative).
    Returns the chosen rows, best first.
    """
    scores = np.asarray(scores, dtype=np.float32)
    rows = np.asarray(rows)
    keep = (rows >= 0) & ~np.isin(rows, np.fromiter(own, dtype=np.int64))
    if same_text is not None:
        for j in np.flatnonzero(keep & (scores >= SAME_TEXT_SCORE)):
            if same_text(int(rows[j])):
                keep[j] = False
                break  # the corpus holds each text once
    keep[pool:] = False
    # the same float32 comparisons as sentence-transformers (the score + margin > positive test)
    pos = np.float32(positive_score)
    if settings.absolute_margin is not None:
        keep &= ~(scores + np.float32(settings.absolute_margin) > pos)
    if settings.relative_margin is not None:
        keep &= ~(scores > pos - abs(pos) * np.float32(settings.relative_margin))
    if settings.max_score is not None:
        keep &= ~(scores > np.float32(settings.max_score))
    end = settings.range_max if settings.range_max is not None else settings.window_end(1)
    window = np.flatnonzero(keep)[settings.range_min : end]
    n = settings.num_negatives
    if settings.sampling == "random" and len(window) > n:
        rng = rng if rng is not None else np.random.default_rng(settings.seed)
        window = np.sort(window[rng.choice(len(window), size=n, replace=False)])
    return rows[window[:n]]


__all__ = [
    "MINE_CHUNK",
    "OUTPUT_FORMATS",
    "SAMPLING",
    "MineReport",
    "MineSettings",
    "mine_hard_negatives",
    "select_negatives",
]
