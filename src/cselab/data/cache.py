"""The token cache: a corpus, or pairs and triplets, are tokenised once into a store entry
found again by their content.

Entries are named by the SHA-256 of the file and the tokenizer and reading settings; a stat
record per (file, settings) lets an unchanged file be found without reading it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from ..core.errors import CorpusError, WriteError
from ..io.files import file_digest, write_error, write_json_atomic
from ..io.runfolder import work_folder
from .config import DataFormat, PairColumns, pair_prompts
from .corpus import CorpusStats, SentenceStream
from .pairs import (
    ROWS_VERSION,
    PairRecords,
    TokenizedPairs,
    load_pairs,
    source_digest,
    stream_pairs,
)
from .store import STORE_FORMAT, TEXT_COLUMN, TokenizedCorpus, pair_columns

log = logging.getLogger(__name__)

_META = "meta.json"
# What opening or locking a lock file raises where no lock can be had: a read-only cache
# (EROFS, or EACCES/EPERM on a folder without write permission) or a filesystem without
# flock (Lustre's noflock: ENOLCK, EOPNOTSUPP)
_UNLOCKABLE = frozenset(
    {errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS}
)
_warned: set[Path] = set()  # the folders whose missing lock was logged (once per process)
# A file modified within this long of being read may change again without changing its
# (size, mtime): its stat record is not trusted and the content digest decides ("racy git").
_RACY_NS = 2_000_000_000


# --------------------------------------------------------------------------------------------
# The cache: entries keyed by content digest + tokenizer; a stat record per (file, tokenizer)


#: the working folder of a cache entry being written, in the cache
TOKENS_WORK_PREFIX = ".cselab-tokens-"


def lock_file(folder: str | os.PathLike[str], name: str) -> Path:
    """The lock file of the cache item ``name`` (a download, a token-cache entry) in ``folder``:
    ``.cselab-<name>.lock``, ``name`` cut to the characters safe in a file name."""
    return Path(folder) / f".cselab-{re.sub(r'[^A-Za-z0-9_.-]', '_', name)[:120]}.lock"


@contextlib.contextmanager
def cache_lock(folder: str | os.PathLike[str], name: str, doing: str) -> Iterator[None]:
    """Hold the cache item ``name`` in ``folder`` (:func:`lock_file`) exclusively while the
    block runs, waiting for it; ``doing`` says what its holder does ("downloading").

    The ranks of a distributed run fill the cache before their process group forms: the first
    to take an item's lock downloads or tokenises it (each entry written into a temporary
    folder and renamed, so a reader sees it whole or not at all), the others wait here, in
    ``flock``, which no collective timeout bounds, and then find the entry cached. One lock per
    item: runs sharing a cache folder wait only for the same corpus, and a wait is logged in
    one line naming the lock file. The operating system releases the lock however its holder
    ends (an error, SIGKILL), so a dead holder never blocks the others; a lock file so left
    behind is reused.

    Where no lock can be had (a read-only cache, a filesystem without ``flock``) one warning
    is logged and the block runs unlocked: the entries are published by rename, so processes
    that race only repeat each other's work.
    """
    path = lock_file(folder, name)
    try:
        fd: int | None = _take(path, doing)
    except OSError as err:
        if err.errno not in _UNLOCKABLE:
            raise
        if path.parent not in _warned:
            _warned.add(path.parent)
            log.warning(
                "%s: no lock can be taken (%s); going on without it (processes sharing this "
                "cache may repeat each other's work)", path, os.strerror(err.errno),
            )  # fmt: skip
        fd = None
    try:
        yield
    finally:
        if fd is not None:
            _release(path, fd)


def _take(path: Path, doing: str) -> int:
    """``path`` opened and locked exclusively; one line logged first if it must wait.

    Its holder removes the file when done (the cache keeps no lock files), so a lock taken on
    a file that has meanwhile left ``path`` is on a name no one else sees: it is let go and
    ``path`` opened again.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    waited = False
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not waited:
                    log.info("waiting for %s (another process is %s it)", path, doing)
                    waited = True
                fcntl.flock(fd, fcntl.LOCK_EX)
            held = os.fstat(fd)
            try:
                now = os.stat(path)
                current = (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)
            except FileNotFoundError:
                current = False
        except BaseException:
            os.close(fd)
            raise
        if current:
            return fd
        os.close(fd)


def _release(path: Path, fd: int) -> None:
    """Remove ``path`` while still holding it, then let go (:func:`_take` retries on a lock
    whose file has left)."""
    with contextlib.suppress(OSError):
        path.unlink()
    os.close(fd)  # closing the descriptor releases the lock


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


def _cache_key(tokenizer: Any, max_seq_len: int, **reading: Any) -> dict[str, Any]:
    """What decides an entry's token ids besides the content: the tokenizer, the truncation,
    how the file is read (``reading``) and the store's layout."""
    return {
        "tokenizer": _tokenizer_identity(tokenizer),
        "class": type(tokenizer).__name__,
        "vocab": len(tokenizer),
        "max_seq_len": max_seq_len,
        **reading,
        "format": STORE_FORMAT,
    }


def _sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:24]


def _complete(entry: Path) -> bool:
    # meta.json is written last inside the temporary folder, and the folder is renamed into
    # place whole, so a folder with meta.json under its final name is complete.
    return (entry / _META).is_file()


def _stat_signature(p: Path) -> tuple[dict[str, Any], int]:
    """What tells that ``p`` is unchanged without reading it, and its newest mtime: a file's
    size, mtime and inode; for a folder (a saved dataset), those of every file in it."""
    if not p.is_dir():
        st = p.stat()
        return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}, st.st_mtime_ns
    files = [(q.relative_to(p).as_posix(), q.stat()) for q in sorted(p.rglob("*")) if q.is_file()]
    signature = [[name, st.st_size, st.st_mtime_ns, st.st_ino] for name, st in files]
    return {"files": _sha(signature)}, max((st.st_mtime_ns for _, st in files), default=0)


#: Tokenises a source into a (temporary) store folder; returns the content digest if it hashed
#: the bytes in the same pass (else ``None``), the columns written and the stats to keep.
_Build = Callable[[Path], tuple["str | None", list[str], dict[str, Any]]]


def _cached_entry(
    p: Path, key: dict[str, Any], cache: Path, digest: Callable[[Path], str], build: _Build
) -> tuple[Path, dict[str, Any]]:
    """The complete entry of ``p``'s content under ``key`` in ``cache``, and its ``meta.json``;
    built by ``build`` when there is none (the rules are :func:`tokenize_corpus`'s)."""
    cache.mkdir(parents=True, exist_ok=True)
    record_file = cache / f"file-{_sha({'path': str(p.resolve()), **key})}.json"
    entry = _recorded(p, record_file, cache)
    if entry is not None:  # the common case takes no lock
        log.info("using cached token ids %s", entry)
        return entry, _meta(entry)
    # One lock per source and key (not per cache folder): the processes that need this entry
    # build it once, and those tokenising other files never wait for it.
    with cache_lock(cache, f"{record_file.stem}-{p.name}", "tokenising"):  # unique part first
        return _lookup_or_build(p, key, cache, record_file, digest, build)


def _meta(entry: Path) -> dict[str, Any]:
    return json.loads((entry / _META).read_text(encoding="utf-8"))


def _recorded(p: Path, record_file: Path, cache: Path) -> Path | None:
    """The complete entry that ``p``'s stat record names if the record still holds (the same
    size, mtime and inode, and not modified within 2 s of its reading), else ``None``."""
    if not record_file.is_file():
        return None
    record = json.loads(record_file.read_text())
    stat_now, newest = _stat_signature(p)
    entry = cache / record["entry"]
    same = all(record.get(k) == v for k, v in stat_now.items())
    settled = newest < record["checked_at_ns"] - _RACY_NS
    return entry if same and settled and _complete(entry) else None


def _lookup_or_build(
    p: Path,
    key: dict[str, Any],
    cache: Path,
    record_file: Path,
    digest: Callable[[Path], str],
    build: _Build,
) -> tuple[Path, dict[str, Any]]:
    """:func:`_cached_entry`'s lookup by content and its build, under the entry's lock."""
    stat_now, _ = _stat_signature(p)
    record = record_file.is_file()

    # tokens-<tokenizer and reading settings>-<content>: the entries of one key, found by a glob
    key_part = _sha(key)[:16]

    def entry_for(content: str) -> Path:
        return cache / f"tokens-{key_part}-{content[:32]}"

    def found(entry: Path, checked_at: int | None) -> tuple[Path, dict[str, Any]]:
        if checked_at is not None:
            write_json_atomic(
                record_file,
                {**stat_now, "checked_at_ns": checked_at, "entry": entry.name},
                what="token cache record",
            )
        return entry, _meta(entry)

    entry = _recorded(p, record_file, cache)
    if entry is not None:  # another process built it while this one waited
        log.info("using cached token ids %s", entry)
        return found(entry, None)
    known: str | None = None
    if record or any(cache.glob(f"tokens-{key_part}-*")):
        # Seen before but changed, touched or too recently written to trust its stat, or a
        # new path while this key has entries (a copy, a move): the content may well be
        # cached, which one hashing pass tells (hashing is ~100x faster than tokenising).
        checked_at = time.time_ns()
        known = digest(p)
        if _complete(entry_for(known)):
            log.info("using cached token ids %s", entry_for(known))
            return found(entry_for(known), checked_at)

    checked_at = time.time_ns()
    # written in a held working folder, then renamed into place: one a killed run left
    # (SIGKILL while tokenising) is removed by the next (io.runfolder.work_folder)
    try:
        with work_folder(cache, TOKENS_WORK_PREFIX) as work:
            tmp = work / "entry"
            tmp.mkdir()
            content, columns, stats = build(tmp)
            if content is None:
                # A separate pass hashes the bytes; they name what was tokenised only if the
                # file did not change from the first look at it (``stat_now``) to now.
                content = known or digest(p)
                if _stat_signature(p)[0] != stat_now:
                    raise CorpusError(f"{p}: the file changed while it was tokenised; run again")
            meta = {
                "format": STORE_FORMAT,
                "columns": columns,
                "content_sha256": content,
                "tokenizer": key,
                "stats": stats,
            }
            (tmp / _META).write_text(json.dumps(meta, indent=1), encoding="utf-8")
            entry = entry_for(content)
            if not _complete(entry):  # else: the same content under another name, or another
                if entry.exists():  # process won; a stale incomplete entry (not this code's)
                    shutil.rmtree(entry)
                try:
                    os.replace(tmp, entry)
                except OSError:  # another process published the same entry meanwhile
                    if not _complete(entry):
                        raise
    except OSError as err:  # the working folder is gone: nothing half-written is left
        # an OSError here is a write into the cache (a read of the source names the source)
        if not isinstance(err, WriteError) and not _names(err, p):
            raise write_error(cache, err, "token cache") from err
        raise
    return found(entry, checked_at)


def _names(err: OSError, path: Path) -> bool:
    """Whether ``err`` was raised on ``path`` or a file inside it (opening or reading the
    source), not on another file."""
    if err.filename is None:
        return False
    f = Path(err.filename)
    return f == path or path in f.parents


def _bar(**kwargs: Any) -> Any:
    from tqdm.auto import tqdm

    return tqdm(unit_scale=True, mininterval=1.0, **kwargs)


def tokenize_corpus(
    path: str | Path,
    tokenizer: Any,
    max_seq_len: int,
    errors: str = "strict",
    cache_dir: str | Path | None = None,
    progress: bool = True,
    prompt: str | None = None,
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

    ``prompt`` (``data.prompts.text``) is put before every sentence; it is part of the key.
    """
    p = Path(path)
    if not p.is_file():
        raise CorpusError(f"{p}: training file not found")
    if cache_dir is None:
        hasher = hashlib.sha256()
        stream = SentenceStream(p, errors, hasher=hasher)
        corpus = TokenizedCorpus.build(_prompted(stream, prompt), tokenizer, max_seq_len)
        return corpus, replace(stream.stats(), content_sha256=hasher.hexdigest())

    def build(tmp: Path) -> tuple[str, list[str], dict[str, Any]]:
        # One pass tokenises and hashes: the digest names exactly the bytes tokenised.
        hasher = hashlib.sha256()
        total = p.stat().st_size
        with _bar(total=total, unit="B", desc=f"tokenising {p.name}", disable=not progress) as bar:
            stream = SentenceStream(p, errors, hasher=hasher, progress=bar)
            TokenizedCorpus.build(_prompted(stream, prompt), tokenizer, max_seq_len, out_dir=tmp)
            stats = stream.stats()
        return hasher.hexdigest(), [TEXT_COLUMN], asdict(stats)

    key = _cache_key(tokenizer, max_seq_len, errors=errors, **_prompt_key(prompt))
    entry, meta = _cached_entry(p, key, Path(cache_dir), file_digest, build)
    stats = CorpusStats(
        **{**meta["stats"], "path": str(p), "content_sha256": meta["content_sha256"]}
    )
    return TokenizedCorpus.open(entry), stats


def tokenize_pairs(
    path: str | Path,
    tokenizer: Any,
    max_seq_len: int,
    data_format: DataFormat = "auto",
    columns: PairColumns | None = None,
    cache_dir: str | Path | None = None,
    progress: bool = True,
    prompts: dict[str, str] | None = None,
) -> tuple[TokenizedPairs, str]:
    """Tokenise the pairs or triplets of ``path`` (a file or a saved dataset folder) once into
    a memory-mapped cache entry, one store column per text column, and reuse it when the
    content matches; returns the columns and the content digest (:func:`~.pairs.source_digest`).

    The entry is named, written and found as in :func:`tokenize_corpus`, its key adding how the
    file is read (``data_format``, ``columns``). Building one streams the rows three times: a
    hashing pass, a pass that counts them (checking every row, so a bad row fails before any
    tokenising, and giving the progress bar its total) and the tokenising pass; only one
    chunk of rows is held in memory. Without ``cache_dir`` the rows are read and tokenised in
    memory and nothing is written.

    ``prompts`` (``data.prompts``: ``anchor``, ``positive``, ``negative``) are put before the
    texts of their columns; they are part of the key.
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise CorpusError(f"{p}: training file not found")
    columns = columns or PairColumns()
    if cache_dir is None:
        records = _prompted_records(load_pairs(p, data_format, columns), prompts)
        return TokenizedPairs.build(records, tokenizer, max_seq_len), source_digest(p)

    def build(tmp: Path) -> tuple[None, list[str], dict[str, Any]]:
        with _bar(desc=f"reading {p.name}", unit=" rows", disable=not progress) as bar:
            total = 0
            for _ in stream_pairs(p, data_format, columns):
                total += 1
                if total % 4096 == 0:  # tqdm.update per row would cost more than the row
                    bar.update(4096)
            bar.update(total % 4096)
        desc = f"tokenising {p.name}"
        with _bar(total=total, unit=" rows", desc=desc, disable=not progress) as bar:
            rows, negatives = TokenizedPairs.write(
                tmp,
                _prompted_rows(stream_pairs(p, data_format, columns), prompts),
                tokenizer,
                max_seq_len,
                progress=bar,
            )
        return None, pair_columns(negatives), {"rows": rows, "negatives": negatives}

    # How the rows are read is part of the key: SICK's reader has fixed columns, the others
    # read the configured ones, and a new reading rule (ROWS_VERSION) is a new entry.
    reading = (
        {"reader": "sick"}
        if data_format == "sick"
        else {"reader": "pairs", "columns": asdict(columns)}
    )
    key = _cache_key(
        tokenizer, max_seq_len, rows={**reading, "version": ROWS_VERSION}, **_prompt_key(prompts)
    )
    entry, meta = _cached_entry(p, key, Path(cache_dir), source_digest, build)
    return TokenizedPairs.open(entry, meta["stats"]["negatives"]), meta["content_sha256"]


def _prompt_key(prompts: str | dict[str, str] | None) -> dict[str, Any]:
    """The prompts' part of a cache key: nothing without prompts (the entries tokenised before
    prompts existed keep their key), else the prompts themselves."""
    return {"prompts": prompts} if prompts else {}


def _prompted(sentences: Iterable[str], prompt: str | None) -> Iterable[str]:
    """``sentences`` with ``prompt`` before each (as they are without one)."""
    return sentences if not prompt else (prompt + s for s in sentences)


def _prompted_rows(
    rows: Iterable[tuple[str, ...]], prompts: dict[str, str] | None
) -> Iterator[tuple[str, ...]]:
    """``(anchor, positive, *negatives)`` rows with each column's prompt before its text."""
    if not prompts:
        yield from rows
        return
    a, p, n = pair_prompts(prompts, "")
    for anchor, positive, *negatives in rows:
        yield (a + anchor, p + positive, *(n + x for x in negatives))


def _prompted_records(records: PairRecords, prompts: dict[str, str] | None) -> PairRecords:
    """Pairs read whole, with each column's prompt before its text (:func:`_prompted_rows`)."""
    if not prompts:
        return records
    a, p, n = pair_prompts(prompts, "")
    anchors = [a + t for t in records.anchors]
    positives = [p + t for t in records.positives]
    negatives = [[n + t for t in column] for column in records.negatives]
    return PairRecords(records.path, anchors, positives, negatives)
