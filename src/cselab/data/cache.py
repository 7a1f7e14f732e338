"""The token cache: a corpus is tokenised once into a store entry found again by its content.

Entries are named by the SHA-256 of the file and the tokenizer settings; a stat record per
(file, tokenizer) lets an unchanged file be found without reading it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from ..core.errors import CorpusError, WriteError
from ..io.files import file_digest, write_error, write_json_atomic
from .corpus import CorpusStats, SentenceStream
from .store import STORE_FORMAT, TEXT_COLUMN, TokenizedCorpus

log = logging.getLogger(__name__)

_META = "meta.json"
# A file modified within this long of being read may change again without changing its
# (size, mtime): its stat record is not trusted and the content digest decides ("racy git").
_RACY_NS = 2_000_000_000


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


def _names(err: OSError, path: Path) -> bool:
    """Whether ``err`` was raised on ``path`` (opening or reading it), not on another file."""
    return err.filename is not None and Path(err.filename) == path


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
    complete, so an interrupted run never leaves an entry that a later run would use; a write
    that fails (disk full) removes the temporary folder and raises one
    :class:`~cselab.core.errors.WriteError` naming the cache folder and the cause.

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
            record_file,
            {**stat_now, "checked_at_ns": checked_at, "entry": entry.name},
            what="token cache record",
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
    try:
        tmp.mkdir()
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
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        # an OSError here is a write into the cache (a read of the corpus names the corpus)
        if isinstance(err, OSError) and not isinstance(err, WriteError) and not _names(err, p):
            raise write_error(cache, err, "token cache") from err
        raise
    remember(entry, checked_at)
    return TokenizedCorpus.open(entry), stats
