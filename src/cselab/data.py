"""Training corpus: streaming, tokenising once into memory-mapped arrays, a resumable batch order.

* :func:`iter_sentences` / :func:`read_corpus` read one sentence per line (UTF-8); blank lines
  are skipped and counted; invalid UTF-8 is an error naming the file and line unless
  ``errors="replace"``.
* :func:`tokenize_corpus` streams the file once, tokenises it in batched chunks with the fast
  tokenizer and writes the token ids as memory-mappable ``.npy`` arrays (a flat ``int32`` ids
  array and ``int64`` row offsets) into a cache folder found again by the file's content digest.
  Training then needs memory for its batches, not for the corpus.
* :class:`TokenizedCorpus` reads rows as ``ids[offsets[i]:offsets[i+1]]`` (in memory or
  memory-mapped); a cache folder can hold several named columns (e.g. ``anchor``/``positive``).
* :class:`BatchOrder` draws a fresh random permutation per epoch (no length bucketing: grouping
  similar lengths would let length leak into which sentences are in-batch negatives),
  ``drop_last``, and can resume from ``(epoch, batch index)``.
* :func:`collate` pads a batch dynamically to its longest row.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
from torch import Tensor

from .schema import ConfigError

log = logging.getLogger(__name__)

#: Version of the on-disk token store; part of the cache key, so a new layout never reads an old one.
STORE_FORMAT = 1
#: The column name of a plain sentence corpus in a token store.
TEXT_COLUMN = "text"
_META = "meta.json"
# A file modified within this long of being read may change again without changing its
# (size, mtime): its stat record is not trusted and the content digest decides ("racy git").
_RACY_NS = 2_000_000_000


class CorpusError(ValueError):
    """The training corpus is missing, unreadable or too small."""


@dataclass
class CorpusStats:
    path: str
    lines: int
    sentences: int
    blank_lines: int
    replaced_lines: int
    #: SHA-256 of the file's bytes (names the corpus in caches and checkpoints).
    content_sha256: str | None = None


class SentenceStream:
    """Iterate over the sentences of a text file, counting what was skipped.

    Each raw line is fed to ``hasher`` (the content digest is computed in the same pass) and its
    byte count to ``progress`` (a tqdm bar), so the file is read exactly once. After iterating,
    :meth:`stats` gives the counts (and raises :class:`CorpusError` if there was no sentence).
    """

    def __init__(
        self, path: str | Path, errors: str = "strict", hasher: Any = None, progress: Any = None
    ) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise CorpusError(f"{self.path}: training file not found")
        self.errors = errors
        self.hasher = hasher
        self.progress = progress
        self.lines = self.sentences = self.blank = self.replaced = 0

    def __iter__(self) -> Iterator[str]:
        p, pending = self.path, 0
        with p.open("rb") as fh:
            for lineno, raw in enumerate(fh, start=1):
                self.lines = lineno
                if self.hasher is not None:
                    self.hasher.update(raw)
                if self.progress is not None:
                    pending += len(raw)
                    if lineno % 4096 == 0:  # tqdm.update per line would cost more than decoding
                        self.progress.update(pending)
                        pending = 0
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    if self.errors != "replace":
                        raise CorpusError(
                            f"{p}:{lineno}: invalid UTF-8 at byte {err.start} of the line "
                            f"({raw[max(0, err.start - 10) : err.start + 10]!r}); "
                            f"use --data.encoding_errors=replace to substitute bad bytes"
                        ) from None
                    text = raw.decode("utf-8", errors="replace")
                    self.replaced += 1
                text = text.rstrip("\r\n")
                if lineno == 1:
                    text = text.removeprefix("\ufeff")
                if not text.strip():
                    self.blank += 1
                    continue
                self.sentences += 1
                yield text
        if self.progress is not None and pending:
            self.progress.update(pending)

    def stats(self) -> CorpusStats:
        if not self.sentences:
            raise CorpusError(
                f"{self.path}: no sentences (the file has {self.lines} lines, all blank)"
            )
        return CorpusStats(str(self.path), self.lines, self.sentences, self.blank, self.replaced)


def iter_sentences(path: str | Path, errors: str = "strict") -> Iterator[str]:
    """Stream the sentences of ``path`` (the rules of :func:`read_corpus`, without a list)."""
    return iter(SentenceStream(path, errors))


def read_corpus(path: str | Path, errors: str = "strict") -> tuple[list[str], CorpusStats]:
    """Read one sentence per line into memory.

    Args:
        path: UTF-8 text file.
        errors: ``strict`` raises :class:`CorpusError` naming file and line on invalid UTF-8;
            ``replace`` substitutes U+FFFD for bad bytes and counts the lines affected.

    Returns:
        The sentences (line endings removed, blank lines skipped) and counts.
    """
    stream = SentenceStream(path, errors)
    sentences = list(stream)
    return sentences, stream.stats()


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes: names a corpus in caches, checkpoints, search indexes and model
    cards, and checks downloaded evaluation data (the one definition)."""
    if not path.is_file():
        raise CorpusError(f"{path}: training file not found")
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# The token store: per column, a flat ids array and row offsets, as .npy files


def _npy_header(dtype: np.dtype, n: int) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf,
        {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (n,)},
    )
    return buf.getvalue()


class _NpyAppender:
    """A 1-D ``.npy`` file written by appending, its length filled in when closed.

    numpy pads ``.npy`` headers so that the shape can grow to 21 digits in place, so the header
    written for length 0 has the same size as the final one and the data never moves.
    """

    def __init__(self, path: Path, dtype: type) -> None:
        self.dtype = np.dtype(dtype)
        self.n = 0
        self.fh: BinaryIO = path.open("wb")
        self.header_len = len(_npy_header(self.dtype, 0))
        self.fh.write(_npy_header(self.dtype, 0))

    def append(self, values: np.ndarray) -> None:
        self.fh.write(np.ascontiguousarray(values, dtype=self.dtype).tobytes())
        self.n += len(values)

    def close(self) -> None:
        header = _npy_header(self.dtype, self.n)
        if len(header) != self.header_len:  # cannot happen with numpy's growth padding
            raise RuntimeError("npy header size changed while appending")
        self.fh.seek(0)
        self.fh.write(header)
        self.fh.flush()
        os.fsync(self.fh.fileno())  # the data is on disk before the folder is published
        self.fh.close()


class ColumnWriter:
    """Streams token-id rows of one column into ``<column>.ids.npy`` and ``<column>.offsets.npy``."""

    def __init__(self, folder: Path, column: str = TEXT_COLUMN) -> None:
        self.ids = _NpyAppender(folder / f"{column}.ids.npy", np.int32)
        self.offsets = _NpyAppender(folder / f"{column}.offsets.npy", np.int64)
        self.offsets.append(np.zeros(1, dtype=np.int64))
        self.total = 0

    def append(self, rows: Sequence[Sequence[int]]) -> None:
        lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
        count = int(lengths.sum())
        flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int32, count=count)
        self.ids.append(flat)
        self.offsets.append(self.total + np.cumsum(lengths))
        self.total += count

    def close(self) -> None:
        self.ids.close()
        self.offsets.close()


def _chunks(items: Iterable[str], size: int) -> Iterator[list[str]]:
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def encode_chunks(
    sentences: Iterable[str], tokenizer: Any, max_seq_len: int, chunk: int = 8192
) -> Iterator[list[list[int]]]:
    """Token ids of ``sentences``, one batched fast-tokenizer call per ``chunk`` sentences."""
    for batch in _chunks(sentences, chunk):
        yield tokenizer(
            batch,
            truncation=True,
            max_length=max_seq_len,
            padding=False,
            return_attention_mask=False,
            return_token_type_ids=False,
        )["input_ids"]


class TokenizedCorpus:
    """Token ids of every sentence, stored flat: ``ids[offsets[i]:offsets[i+1]]``.

    The arrays may be in memory or memory-mapped (:meth:`open`); only the rows a batch asks for
    are read.
    """

    def __init__(self, ids: np.ndarray, offsets: np.ndarray) -> None:
        self.ids = ids
        self.offsets = offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def rows(self, indices: Sequence[int]) -> list[np.ndarray]:
        return [self.ids[self.offsets[i] : self.offsets[i + 1]] for i in indices]

    @property
    def nbytes(self) -> int:
        """Size of the ids and offsets arrays (on disk when memory-mapped)."""
        return int(self.ids.nbytes + self.offsets.nbytes)

    @classmethod
    def build(
        cls,
        sentences: Iterable[str],
        tokenizer: Any,
        max_seq_len: int,
        chunk: int = 8192,
        out_dir: Path | None = None,
    ) -> TokenizedCorpus:
        """Tokenise in chunks with the fast tokenizer, truncating to ``max_seq_len``.

        ``sentences`` may be a stream. With ``out_dir`` the ids are appended to ``.npy`` files
        there as they are produced (memory: one chunk) and the result is memory-mapped;
        otherwise the arrays are built in memory.
        """
        if out_dir is not None:
            writer = ColumnWriter(Path(out_dir))
            for rows in encode_chunks(sentences, tokenizer, max_seq_len, chunk):
                writer.append(rows)
            writer.close()
            return cls.open(out_dir)
        pieces: list[np.ndarray] = []
        lengths: list[np.ndarray] = []
        for rows in encode_chunks(sentences, tokenizer, max_seq_len, chunk):
            lens = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
            pieces.append(
                np.fromiter(itertools.chain.from_iterable(rows), np.int32, int(lens.sum()))
            )
            lengths.append(lens)
        offsets = np.zeros(sum(len(x) for x in lengths) + 1, dtype=np.int64)
        if lengths:
            np.cumsum(np.concatenate(lengths), out=offsets[1:])
        ids = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)
        return cls(ids, offsets)

    @classmethod
    def open(cls, folder: str | Path, column: str = TEXT_COLUMN) -> TokenizedCorpus:
        """Memory-map one column of a token store folder (nothing is read until used)."""
        folder = Path(folder)
        ids = np.load(folder / f"{column}.ids.npy", mmap_mode="r")
        offsets = np.load(folder / f"{column}.offsets.npy", mmap_mode="r")
        return cls(ids, offsets)


# --------------------------------------------------------------------------------------------
# The cache: entries keyed by content digest + tokenizer; a stat record per (file, tokenizer)


def _tokenizer_identity(tokenizer: Any) -> str:
    """What decides the token ids: the fast tokenizer's full definition, else its name.

    The definition (vocabulary, normaliser, pre-tokeniser, special-token template) makes the
    same tokenizer saved in two folders share cache entries, and an edited one in the same
    folder get a new entry. Truncation and padding are dropped: a call sets them on the backend.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return str(getattr(tokenizer, "name_or_path", type(tokenizer).__name__))
    spec = json.loads(backend.to_str())
    spec.pop("truncation", None)
    spec.pop("padding", None)
    return "sha256:" + hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def _tokenizer_key(tokenizer: Any, max_seq_len: int, errors: str) -> dict[str, Any]:
    return {
        "tokenizer": _tokenizer_identity(tokenizer),
        "class": type(tokenizer).__name__,
        "vocab": len(tokenizer),
        "max_seq_len": max_seq_len,
        "errors": errors,
        "format": STORE_FORMAT,
    }


def _sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:24]


def _complete(entry: Path) -> bool:
    # meta.json is written last inside the temporary folder, and the folder is renamed into
    # place whole, so a folder with meta.json under its final name is complete.
    return (entry / _META).is_file()


def write_json_atomic(path: Path, data: Any, indent: int | None = None) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file and a rename, so a reader
    never sees half a file (the temporary name is unique: concurrent writers do not collide)."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(json.dumps(data, indent=indent), encoding="utf-8")
    os.replace(tmp, path)


def _load_entry(entry: Path, path: Path) -> tuple[TokenizedCorpus, CorpusStats]:
    meta = json.loads((entry / _META).read_text(encoding="utf-8"))
    stats = CorpusStats(
        **{**meta["stats"], "path": str(path), "content_sha256": meta["content_sha256"]}
    )
    log.info("using cached token ids %s", entry)
    return TokenizedCorpus.open(entry), stats


def tokenize_corpus(
    path: str | Path,
    tokenizer: Any,
    max_seq_len: int,
    errors: str = "strict",
    cache_dir: str | Path | None = None,
    progress: bool = True,
) -> tuple[TokenizedCorpus, CorpusStats]:
    """Tokenise ``path`` once into a memory-mapped cache entry; reuse it when content matches.

    The entry ``cache_dir/tokens-<key>/`` is named by the SHA-256 of the file's bytes and the
    tokenizer settings. It is written into a temporary folder and renamed into place when
    complete, so an interrupted run never leaves an entry that a later run would use.

    How often the text is read:

    * a file seen before with the same size, mtime and inode (and not modified within 2 s of
      that reading): not at all;
    * a file seen before but changed (or touched), or a new path while the cache holds entries
      of this tokenizer: once, to compute its digest; if that content is cached it is used,
      else it is tokenised (a second read, at a small fraction of the tokenising time);
    * otherwise (an empty cache for this tokenizer): once, tokenising and hashing in one pass.

    Without ``cache_dir`` the corpus is tokenised into memory and nothing is written.
    """
    p = Path(path)
    if not p.is_file():
        raise CorpusError(f"{p}: training file not found")
    tok_key = _tokenizer_key(tokenizer, max_seq_len, errors)
    if cache_dir is None:
        hasher = hashlib.sha256()
        stream = SentenceStream(p, errors, hasher=hasher)
        corpus = TokenizedCorpus.build(stream, tokenizer, max_seq_len)
        return corpus, replace(stream.stats(), content_sha256=hasher.hexdigest())

    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    st = p.stat()
    stat_now = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}
    record_file = cache / f"file-{_sha({'path': str(p.resolve()), **tok_key})}.json"
    record = json.loads(record_file.read_text()) if record_file.is_file() else None

    # tokens-<tokenizer settings>-<content>: the entries of one tokenizer are found by a glob
    tok_part = _sha(tok_key)[:16]

    def entry_for(digest: str) -> Path:
        return cache / f"tokens-{tok_part}-{digest[:32]}"

    def remember(entry: Path, checked_at: int) -> None:
        write_json_atomic(
            record_file, {**stat_now, "checked_at_ns": checked_at, "entry": entry.name}
        )

    if record is not None:
        entry = cache / record["entry"]
        same = all(record.get(k) == v for k, v in stat_now.items())
        settled = st.st_mtime_ns < record["checked_at_ns"] - _RACY_NS
        if same and settled and _complete(entry):
            return _load_entry(entry, p)
    if record is not None or any(cache.glob(f"tokens-{tok_part}-*")):
        # Seen before but changed, touched or too recently written to trust its stat, or a
        # new path while this tokenizer has entries (a copy, a move): the content may well be
        # cached, which one hashing pass tells (hashing is ~100x faster than tokenising).
        checked_at = time.time_ns()
        entry = entry_for(file_digest(p))
        if _complete(entry):
            remember(entry, checked_at)
            return _load_entry(entry, p)

    checked_at = time.time_ns()
    tmp = cache / f".tokens-tmp-{os.getpid()}-{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        from tqdm.auto import tqdm

        hasher = hashlib.sha256()
        with tqdm(
            total=st.st_size,
            unit="B",
            unit_scale=True,
            desc=f"tokenising {p.name}",
            disable=not progress,
            mininterval=1.0,
        ) as bar:
            stream = SentenceStream(p, errors, hasher=hasher, progress=bar)
            TokenizedCorpus.build(stream, tokenizer, max_seq_len, out_dir=tmp)
            stats = stream.stats()
        digest = hasher.hexdigest()
        stats = replace(stats, content_sha256=digest)
        meta = {
            "format": STORE_FORMAT,
            "columns": [TEXT_COLUMN],
            "content_sha256": digest,
            "tokenizer": tok_key,
            "stats": asdict(stats),
        }
        (tmp / _META).write_text(json.dumps(meta, indent=1), encoding="utf-8")
        entry = entry_for(digest)
        if _complete(entry):  # the same content under another name, or another process won
            shutil.rmtree(tmp)
        else:
            if entry.exists():  # a stale incomplete entry (cannot be produced by this code)
                shutil.rmtree(entry)
            try:
                os.replace(tmp, entry)
            except OSError:  # another process published the same entry meanwhile
                if not _complete(entry):
                    raise
                shutil.rmtree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    remember(entry, checked_at)
    return TokenizedCorpus.open(entry), stats


class BatchOrder:
    """Random batches over ``n`` items, one permutation per epoch, ``drop_last``, resumable.

    The permutation of epoch ``e`` depends only on ``(seed, e)``, so a resumed run sees exactly
    the batches an uninterrupted one would. Under data parallelism every rank draws the same
    global batch and takes its own contiguous slice (no overlap between ranks).
    """

    def __init__(self, n: int, batch_size: int, seed: int) -> None:
        if n < batch_size:
            raise CorpusError(f"the corpus has {n} sentences, fewer than one batch of {batch_size}")
        self.n = n
        self.batch_size = batch_size
        self.seed = seed

    @property
    def batches_per_epoch(self) -> int:
        return self.n // self.batch_size

    def epoch_order(self, epoch: int) -> np.ndarray:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.n, generator=g).numpy()

    def batch(self, epoch: int, index: int, order: np.ndarray | None = None) -> np.ndarray:
        order = self.epoch_order(epoch) if order is None else order
        return order[index * self.batch_size : (index + 1) * self.batch_size]


def shard_bounds(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """``(start, end)`` of rank ``rank``'s contiguous, equal slice of a global batch of ``n``.

    The one definition of a rank's rows: the data slice (:func:`shard`) and the objective's
    ``ctx.offset`` both come from it.
    """
    if n % world_size:
        raise ConfigError(f"train.batch_size={n} must be divisible by the {world_size} ranks")
    per = n // world_size
    return rank * per, (rank + 1) * per


def shard(indices: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """This rank's contiguous slice of a global batch."""
    start, end = shard_bounds(len(indices), rank, world_size)
    return indices[start:end]


def collate(rows: Sequence[np.ndarray], pad_id: int) -> dict[str, Tensor]:
    """Pad rows to the longest one: ``input_ids`` and ``attention_mask`` of shape ``(B, L)``."""
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
        mask[i, : len(r)] = 1
    return {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}
