"""Writing files so that a reader never sees half of one, and naming a file by its content.

Every file cselab writes for a user goes through :func:`atomic_path` or the helpers built on it
(:func:`write_text_atomic`, :func:`write_bytes_atomic`, :func:`write_json_atomic`): a temporary
file in the same folder, then ``os.replace``. A log appended during a run goes through
:func:`append_text`, a file written through a memory map reserves its size first
(:func:`reserve`). A failed write is one :class:`~cselab.core.errors.WriteError` naming the path
and the cause, and leaves the previous file as it was.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import hashlib
import json
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..core.errors import CorpusError, WriteError
from .tables import CSV_SUFFIXES, JSONL_SUFFIXES, TSV_SUFFIXES


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


def write_error(
    path: str | os.PathLike[str], err: OSError, what: str = "file", needed: int | None = None
) -> WriteError:
    """The one-line :class:`~cselab.core.errors.WriteError` for a failed write of ``path``:
    ``could not write the {what} {path}: No space left on device``. Raise it ``from err``: the
    original error stays reachable as ``__cause__`` (the checkpoint writer reports its cause).

    ``needed``: the bytes the file takes; on a full disk the message says how many were needed
    and were free. A short write reported without an ``errno`` (numpy's ``tofile``: "19200
    requested and 14304 written", counting items) is named a full disk when the folder's free
    space is short of ``needed`` (or nearly nil)."""
    cause = _cause(err)
    full = err.errno == errno.ENOSPC
    free = _free_bytes(Path(path).parent)
    if err.errno is None and free is not None:
        full = free < needed if needed is not None else free < FULL_DISK_SLACK
    if full:
        cause = os.strerror(errno.ENOSPC)
        if needed is not None:
            room = f", {free:,} free" if free is not None and free < needed else ""
            cause += f" ({needed:,} bytes needed{room})"
    return WriteError(f"could not write the {what} {path}: {cause}")


def file_in_the_way(folder: str | os.PathLike[str]) -> Path | None:
    """The file that keeps ``folder`` from being a folder: ``folder`` itself or the nearest of
    its parents that exists, when that is not a folder (``<file>/sub`` names ``<file>``), else
    ``None``; so a setting is refused in one line before a ``NotADirectoryError`` deep down."""
    path = Path(folder).expanduser()
    for candidate in (path, *path.parents):
        if candidate.exists():
            return None if candidate.is_dir() else candidate
    return None


def refuse_file_in_the_way(
    folder: Path, label: str | None = None, error: Callable[[str], Exception] = WriteError
) -> None:
    """Raise ``error`` (:class:`WriteError`; a setting's: a ``ConfigError``) naming the file
    that keeps ``folder`` from being made (itself, or a parent: ``<file>/sub``), before a
    ``FileExistsError`` or ``NotADirectoryError`` deep in a lock or a working folder's name.
    ``label``: how the line names the folder (``data.cache_dir=DIR``; default its path)."""
    if (blocker := file_in_the_way(folder)) is not None:
        where = "" if blocker == folder else f" is under {blocker}, which"
        raise error(f"{label or folder}{where} is a file, not a folder")


#: Free bytes below which a short write without an ``errno`` is taken for a full disk.
FULL_DISK_SLACK = 1 << 16


def _free_bytes(folder: Path) -> int | None:
    """The bytes an unprivileged process may still write in ``folder``'s filesystem."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


@contextlib.contextmanager
def atomic_path(
    path: str | os.PathLike[str], what: str = "file", needed: int | None = None
) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block ends without an error it replaces
    ``path`` in one rename, so a reader sees the old file or the new one, never half of one.

    A failure while writing (disk full, permission denied, a folder missing) removes the
    temporary file, keeps the previous ``path`` as it was, and raises
    :class:`~cselab.core.errors.WriteError` naming ``path`` and the cause (``what`` says what the
    file is: "vectors", "plot", ...; ``needed``, when known, the file's size, which a full disk's
    message then names, see :func:`write_error`). The temporary name keeps the suffix of
    ``path``, so writers that choose a format by suffix (``np.save``, ``savefig``) write the
    right one.
    """
    target = Path(path)
    tmp = target.with_name(f".{target.stem}.{uuid.uuid4().hex[:12]}.tmp{target.suffix}")
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException as err:
        with contextlib.suppress(OSError):
            tmp.unlink()  # first: the free space measured then is what the write had
        if isinstance(err, OSError) and not isinstance(err, WriteError):
            raise write_error(target, err, what, needed) from err
        raise


def _cause(err: OSError) -> str:
    """``No space left on device`` rather than ``[Errno 28] No space left on device: '/x/.tmp'``."""
    return err.strerror or str(err) or type(err).__name__


def write_json_atomic(
    path: str | os.PathLike[str], data: Any, indent: int | None = None, what: str = "file"
) -> None:
    """Write ``data`` as JSON to ``path`` atomically (see :func:`atomic_path`; the temporary
    name is unique, so concurrent writers do not collide)."""
    with atomic_path(path, what) as tmp:
        tmp.write_text(json.dumps(data, indent=indent), encoding="utf-8")


def write_text_atomic(path: str | os.PathLike[str], text: str, what: str = "file") -> None:
    """Write UTF-8 text to ``path`` atomically (see :func:`atomic_path`)."""
    with atomic_path(path, what) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes, what: str = "file") -> None:
    """Write bytes to ``path`` atomically (see :func:`atomic_path`)."""
    with atomic_path(path, what) as tmp:
        tmp.write_bytes(data)


def umask_mode() -> int | None:
    """The permission bits ``open()`` gives a new file in this process (``0o666`` less the
    umask), read from ``/proc/self/status``: setting the umask to read it back would change it
    for a thread writing at the same moment. ``None`` where the kernel does not say."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            line = next((x for x in fh if x.startswith("Umask:")), None)
    except OSError:
        return None
    return None if line is None else 0o666 & ~int(line.split()[1], 8)


def give_umask_mode(paths: Iterable[str | os.PathLike[str]]) -> None:
    """Give ``paths`` the mode ``open()`` gives a new file (:func:`umask_mode`). safetensors 0.8
    writes every file through a temporary file created ``0600`` whatever the umask (a known
    safetensors behaviour), so a saved model was readable by its writer only: not by a teammate
    sharing the folder, nor by a container running as another user. A symbolic link is left
    alone (its target may be anyone's, e.g. a file of the Hub cache), and so is a file whose
    mode is not known or cannot be changed (one owned by someone else)."""
    mode = umask_mode()
    if mode is None:
        return
    for path in paths:
        with contextlib.suppress(OSError):
            if not os.path.islink(path) and os.stat(path).st_mode & 0o777 != mode:
                os.chmod(path, mode)


def append_text(path: str | os.PathLike[str], text: str, what: str = "file") -> None:
    """Append UTF-8 ``text`` to ``path`` (created if missing), all or nothing: a failed append
    (disk full mid-line) cuts the file back to its previous length and raises
    :class:`~cselab.core.errors.WriteError`, so the file keeps only whole appends."""
    data = text.encode("utf-8")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as err:
        raise write_error(path, err, what) from err
    try:
        start = os.fstat(fd).st_size
        view = memoryview(data)
        try:
            while view:  # a full disk may take part of a write, then refuse the rest
                view = view[os.write(fd, view) :]
        except OSError as err:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise write_error(path, err, what) from err
    finally:
        os.close(fd)


def reserve(fd: int, size: int, path: str | os.PathLike[str], what: str = "file") -> None:
    """Reserve ``size`` bytes for an open file before writing it through a memory map, so that
    a full disk is a :class:`~cselab.core.errors.WriteError` here, not a SIGBUS while the map is
    written. Filesystems without ``fallocate`` fall back to extending the file."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as err:
        if err.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            os.ftruncate(fd, size)
            return
        raise write_error(path, err, what) from err


# ---------------------------------------------------------------------------------- tables
#: Table formats :func:`write_table` writes, by file ending (those :func:`~cselab.io.readers.open_table`
#: reads back as text tables).
TABLE_WRITE_SUFFIXES = (*TSV_SUFFIXES, *CSV_SUFFIXES, *JSONL_SUFFIXES)


def write_table(
    path: str | os.PathLike[str],
    header: Sequence[str],
    rows: Iterable[Sequence[str]],
    what: str = "table",
) -> int:
    """Write text rows under ``header`` to ``path`` atomically, in the format its ending names,
    by the rule :func:`cselab.io.readers.open_table` reads it with; returns the rows written.

    * ``.tsv`` / ``.tab``: fields joined by tabs, no quoting (the readers' TSV rule), so a field
      holding a tab, a line break or a carriage return cannot be written and is refused;
    * ``.csv``: RFC 4180 (Python's :mod:`csv`, lines ended by ``"\\n"``, a field quoted when it
      holds a comma, quote or line break, a row with a ``"\\r"`` quoted whole); a ``"\\r\\n"`` inside a field is refused, as the
      plain-line rule drops a ``"\\r"`` before a line end;
    * ``.jsonl``: one JSON object per line, keys in header order, UTF-8 text unescaped.

    ``rows`` may be a generator: rows are written as they come, into a temporary file renamed
    at the end (:func:`atomic_path`), so an error part-way (a refused field, an exception in
    the generator, a full disk) leaves no output and the previous file as it was.

    Raises:
        WriteError: an unknown ending, a bad header, a row of the wrong width, a field the
            format cannot hold (naming the row and column), or a failed write.
    """
    target = Path(path)
    suffix = target.suffix.lower()
    if suffix not in TABLE_WRITE_SUFFIXES:
        raise WriteError(
            f"cannot write the {what} {target}: unknown table format {suffix or '(no ending)'!r}; "
            f"use one of {', '.join(TABLE_WRITE_SUFFIXES)}"
        )
    names = list(header)
    if not names or len(set(names)) != len(names) or any(n != n.strip() or not n for n in names):
        raise WriteError(
            f"cannot write the {what} {target}: column names must be unique, non-empty and "
            f"without surrounding spaces, not {names!r}"
        )
    kind = "jsonl" if suffix in JSONL_SUFFIXES else "csv" if suffix in CSV_SUFFIXES else "tsv"
    count = 0
    with atomic_path(target, what) as tmp, tmp.open("w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh, lineterminator="\n") if kind == "csv" else None
        # csv quotes a field with a "\n" (the line terminator) but not one with a lone "\r",
        # which the reader would then refuse: such rows are written with every field quoted.
        quoted = csv.writer(fh, lineterminator="\n", quoting=csv.QUOTE_ALL)
        if kind != "jsonl":
            _check_fields(target, what, 0, names, names, kind)
            fh.write("\t".join(names) + "\n") if writer is None else writer.writerow(names)
        for row in rows:
            count += 1
            fields = list(row)
            if len(fields) != len(names):
                raise WriteError(
                    f"cannot write the {what} {target}: row {count} has {len(fields)} fields, "
                    f"the header {len(names)}"
                )
            _check_fields(target, what, count, names, fields, kind)
            if kind == "jsonl":
                fh.write(json.dumps(dict(zip(names, fields, strict=True)), ensure_ascii=False))
                fh.write("\n")
            elif writer is None:
                fh.write("\t".join(fields) + "\n")
            else:
                (quoted if any("\r" in f for f in fields) else writer).writerow(fields)
    return count


def _check_fields(
    target: Path, what: str, row: int, names: Sequence[str], fields: Sequence[str], kind: str
) -> None:
    """Refuse a field the format cannot carry back to the readers unchanged."""
    for name, value in zip(names, fields, strict=True):
        if not isinstance(value, str):
            bad = f"holds {type(value).__name__}, not text"
        elif kind == "tsv" and ("\t" in value or "\n" in value or "\r" in value):
            bad = "holds a tab or a line break, which TSV (no quoting) cannot carry; write .csv or .jsonl"
        elif kind == "csv" and "\r\n" in value:
            bad = "holds a CRLF line break, which does not read back from CSV; write .jsonl"
        else:
            continue
        where = "the header" if row == 0 else f"row {row}"
        raise WriteError(f"cannot write the {what} {target}: {where}, column '{name}' {bad}")
