"""Plain lines, values and tables: the rules of :mod:`cselab.io.readers` for plain-line files,
TSV, CSV, JSONL, parquet and saved datasets (read that module's docstring for the rules);
:mod:`.readers` re-exports every name, and reads SICK, JSON and BEIR folders with them."""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..core.errors import DataFormatError, UserError, first_line

log = logging.getLogger("cselab")

TSV_SUFFIXES = (".tsv", ".tab")
CSV_SUFFIXES = (".csv",)
JSONL_SUFFIXES = (".jsonl",)
PARQUET_SUFFIXES = (".parquet",)
#: File endings read as tables (a folder is read as a saved ``datasets`` dataset).
TABLE_SUFFIXES = (*TSV_SUFFIXES, *CSV_SUFFIXES, *JSONL_SUFFIXES, *PARQUET_SUFFIXES)

BOM = "\ufeff"
#: What an invalid-UTF-8 error suggests, unless the caller has a better way out.
UTF8_HINT = "save the file as UTF-8"
#: Lines between two progress updates (a tqdm update per line would cost more than decoding).
_PROGRESS_EVERY = 4096
_ABSENT = object()
#: The first bytes of a compressed file (``.gz``, ``.xz``, ``.zst``, ``.zip``, ``.bz2``), which
#: every reader refuses by name: read as text it would be invalid UTF-8 at its first bytes (or,
#: with ``errors="replace"``, nonsense), and a table ending in ``.gz`` an unknown format.
_COMPRESSED = (
    (b"\x1f\x8b", "gzip"), (b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"PK\x03\x04", "zip"), (b"BZh", "bzip2"),
)  # fmt: skip


@contextlib.contextmanager
def reraise_as(kind: type[UserError]) -> Iterator[None]:
    """Re-raise a :class:`DataFormatError` of the block as ``kind`` with the same message (for
    callers whose documented error type is another :class:`UserError`)."""
    try:
        yield
    except DataFormatError as err:
        if isinstance(err, kind):
            raise
        raise kind(str(err)) from None


def _utf8_error(column: int, byte: int, hint: str) -> str:
    # The byte's place in its line and its value make it findable with `sed -n LINEp | xxd`.
    return f"invalid UTF-8 at byte {column} of the line (0x{byte:02x}); {hint}"


def _check_compressed(path: Path, head: bytes) -> None:
    """Refuse a file whose first bytes ``head`` are a compressed file's (:data:`_COMPRESSED`)."""
    for magic, kind in _COMPRESSED:
        # bzip2's "BZh" is followed by the block size (1-9) and the digits of pi in BCD
        if head.startswith(magic) and (kind != "bzip2" or head[4:10] == b"1AY&SY"):
            if kind == "zip":  # a spreadsheet or a document is one: unzipping gives XML
                raise DataFormatError(
                    path, None, "a zip archive, not text (an .xlsx, .ods or .docx file is one); "
                    "save it as .csv, .tsv or plain text, or unzip the text file it holds",
                )  # fmt: skip
            raise DataFormatError(
                path, None, f"a {kind}-compressed file, not text; decompress it first"
            )


def check_file(path: Path, what: str) -> None:
    """Refuse ``path`` unless it is a file, in the readers' words (``what`` names it: "corpus
    file"): a folder is not "not found"."""
    if path.is_dir():
        raise DataFormatError(path, None, f"{what} is a folder, not a text file")
    if not path.is_file():
        raise DataFormatError(path, None, f"{what} not found")


def read_text(path: str | os.PathLike[str], encoding: str = "utf-8", what: str = "file") -> str:
    """The whole text of ``path`` (``utf-8``, ``utf-8-sig`` or ``latin-1``); invalid UTF-8 is
    the same error as for :class:`Lines`, naming the line and the byte."""
    p = Path(path)
    check_file(p, what)
    try:
        data = p.read_bytes()
    except OSError as err:
        raise DataFormatError(p, None, f"cannot be read ({err.strerror or err})") from None
    _check_compressed(p, data[:10])
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as err:
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1)
        lineno = data.count(b"\n", 0, err.start) + 1
        message = _utf8_error(column, data[err.start], UTF8_HINT)
        raise DataFormatError(p, lineno, message) from None


def universal_lines(text: str) -> list[str]:
    """Lines as Python's text mode (``for line in open(f)``) gives them: CR, LF and CRLF each end
    a line, the ends removed. SentEval reads STS-B, SICK, SST, TREC and MRPC this way (unlike
    :class:`Lines`, and unlike ``str.splitlines``, which also splits on U+2028 and others)."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def tsv_fields(line: str) -> list[str]:
    """The fields of one TSV line: split at every tab, no quoting (the one TSV field rule)."""
    return line.split("\t")


class Lines:
    """The lines of a UTF-8 text file (or a binary stream such as ``sys.stdin.buffer``),
    as ``(line number, text)`` in one streaming pass (see the module docstring for the rule).

    Each raw line is fed to ``hasher`` (a content digest in the same pass) and its byte count to
    ``progress`` (a tqdm bar). After iterating, ``lines``, ``blank`` and ``replaced`` count the
    lines read, the blank ones and those whose bad bytes were replaced.

    Args:
        source: a path, or a binary stream (then ``name`` names it in errors).
        errors: ``strict`` (invalid UTF-8 is an error) or ``replace``.
        keep_blank: yield blank lines too (one output per line, e.g. one vector per line).
        what: what the file is, for the not-found message ("training file", "queries file").
        hint: what the invalid-UTF-8 error suggests.
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | IO[bytes],
        *,
        errors: str = "strict",
        keep_blank: bool = False,
        hasher: Any = None,
        progress: Any = None,
        what: str = "file",
        hint: str = UTF8_HINT,
        name: str = "<stdin>",
    ) -> None:
        if errors not in ("strict", "replace"):
            raise ValueError(f"errors must be 'strict' or 'replace', not {errors!r}")
        self.stream = None if isinstance(source, (str, os.PathLike)) else source
        self.path = Path(name) if self.stream is not None else Path(source)  # type: ignore[arg-type]
        if self.stream is None:
            check_file(self.path, what)
        self.errors, self.keep_blank = errors, keep_blank
        self.hasher, self.progress, self.hint = hasher, progress, hint
        self.lines = self.blank = self.replaced = 0

    def __iter__(self) -> Iterator[tuple[int, str]]:
        if self.stream is not None:
            yield from self._read(self.stream)
            return
        try:
            fh = self.path.open("rb")
        except OSError as err:
            raise DataFormatError(self.path, None, f"cannot be read ({err.strerror})") from None
        with fh:
            yield from self._read(fh)

    def _read(self, fh: Iterable[bytes]) -> Iterator[tuple[int, str]]:
        pending = 0
        for lineno, raw in enumerate(fh, start=1):
            self.lines = lineno
            if lineno == 1:
                _check_compressed(self.path, raw[:10])
            if self.hasher is not None:
                self.hasher.update(raw)
            if self.progress is not None:
                pending += len(raw)
                if lineno % _PROGRESS_EVERY == 0:
                    self.progress.update(pending)
                    pending = 0
            body = raw[:-1] if raw.endswith(b"\n") else raw
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError as err:
                if self.errors != "replace":
                    message = _utf8_error(err.start, body[err.start], self.hint)
                    raise DataFormatError(self.path, lineno, message) from None
                text = body.decode("utf-8", errors="replace")
                self.replaced += 1
            text = text.rstrip("\r")
            if lineno == 1:
                text = text.removeprefix(BOM)
            if not text.strip():
                self.blank += 1
                if not self.keep_blank:
                    continue
            yield lineno, text
        if self.progress is not None and pending:
            self.progress.update(pending)


# ---------------------------------------------------------------------------------- values


def describe(value: Any) -> str:
    """What a non-text value is, in words: ``a number (3)``, ``a boolean (true)``, ``null``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({'true' if value else 'false'})"
    if isinstance(value, int | float):
        return f"a number ({value!r:.40})"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


@dataclass(slots=True)
class Row:
    """One row of a table: its values by column name, and where it is (``line`` in a text file,
    ``index`` from 0 in a parquet file or saved dataset)."""

    path: Path
    line: int | None
    index: int | None
    values: dict[str, Any]

    def error(self, message: str) -> DataFormatError:
        """An error about this row, naming the file and the line or row."""
        if self.index is not None:
            message = f"row {self.index}: {message}"
        return DataFormatError(self.path, self.line, message)

    def text(self, column: str) -> str:
        """The text in ``column``; absent, empty or not-text values are errors naming the column."""
        value = self.values.get(column, _ABSENT)
        if value is _ABSENT:
            raise self.error(f"column '{column}' is missing")
        if not isinstance(value, str):
            raise self.error(f"column '{column}' holds {describe(value)}, not text")
        if not value.strip():
            raise self.error(f"column '{column}' is empty")
        if not value.isascii():
            try:  # a JSON "\ud800" escape decodes to a lone surrogate no tokenizer can encode
                value.encode("utf-8")
            except UnicodeEncodeError as err:
                raise self.error(
                    f"column '{column}' holds a lone surrogate (U+{ord(value[err.start]):04X}), "
                    "not valid Unicode text"
                ) from None
        return value

    def key(self, column: str) -> str:
        """The text in ``column`` as :meth:`text` reads it, or an integer as its digits: an id
        (BEIR's are strings, often written as JSON integers) or a class label (a saved dataset's
        ``ClassLabel`` column holds integers)."""
        value = self.values.get(column, _ABSENT)
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return self.text(column)

    def number(self, column: str) -> float:
        """The finite number in ``column`` (a JSON number, or text such as ``"3.5"``)."""
        raw = self.values.get(column)
        if raw is None:
            raise self.error(f"column '{column}' is missing")
        value = math.nan
        if not isinstance(raw, bool):  # float(True) is 1.0, but a boolean is no score
            with contextlib.suppress(TypeError, ValueError, OverflowError):
                value = float(raw)
        if not math.isfinite(value):
            raise self.error(f"column '{column}': {raw!r:.60} is not a finite number")
        return value


def score_field(path: Path, line: int, field: str) -> float:
    """A score written as text in a headerless file (SentEval's STS files, SICK), or an error
    naming the file and line."""
    try:
        value = float(field)
    except ValueError:
        raise DataFormatError(path, line, f"score {field!r} is not a number") from None
    if not math.isfinite(value):
        raise DataFormatError(path, line, f"score {field!r} is not a finite number")
    return value


# ---------------------------------------------------------------------------------- tables


class Table:
    """A table's column names and its rows (one pass over the rows, read as they are iterated).

    Open one with :func:`open_table`; check the columns a caller needs with :meth:`require`.
    """

    def __init__(
        self,
        path: Path,
        kind: str,
        columns: Sequence[str],
        rows: Iterator[Row],
        header_line: int | None,
    ) -> None:
        self.path, self.kind, self.columns = path, kind, tuple(columns)
        self.header_line = header_line
        self._rows = rows

    def __iter__(self) -> Iterator[Row]:
        return self._rows

    def require(self, names: Iterable[str], hint: str = "") -> None:
        """Refuse the table unless it has every column of ``names`` (naming the first absent one,
        the columns the file has, and ``hint``: how to name other columns)."""
        where = {
            "tsv": "in the header ",
            "csv": "in the header ",
            "jsonl": "in the first object ",
        }.get(self.kind, "")
        has = "the dataset has" if self.kind == "dataset" else "the file has"
        for name in names:
            if name not in self.columns:
                message = (
                    f"no column '{name}' {where}({has} columns: {', '.join(self.columns)})"
                    + (f"; {hint}" if hint else "")
                )
                raise DataFormatError(self.path, self.header_line, message)


def _check_names(path: Path, line: int | None, names: Sequence[str], what: str) -> None:
    seen: set[str] = set()
    for name in names:
        if not name:  # an unnamed column (a spreadsheet's trailing separators): never asked for
            continue
        if name in seen:
            raise DataFormatError(
                path, line, f"column '{name}' appears twice in the {what}; names must be unique"
            )
        seen.add(name)


def open_table(path: str | os.PathLike[str], *, prefer_split: str | None = None) -> Table:
    """Open a table file or saved dataset folder by its ending (see the module docstring).

    ``prefer_split`` picks the split of a ``DatasetDict`` with several (training reads
    ``train``); without it such a folder is refused, naming its splits.
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if p.is_dir():
        return _dataset_table(p, prefer_split)
    if not p.exists():
        raise DataFormatError(p, None, "file not found")
    if suffix in TSV_SUFFIXES:
        return _delimited_table(p, "tsv")
    if suffix in CSV_SUFFIXES:
        return _delimited_table(p, "csv")
    if suffix in JSONL_SUFFIXES:
        return _jsonl_table(p)
    if suffix in PARQUET_SUFFIXES:
        return _parquet_table(p)
    with contextlib.suppress(OSError), p.open("rb") as fh:  # e.g. "pairs.tsv.gz"
        _check_compressed(p, fh.read(10))
    raise DataFormatError(
        p,
        None,
        "unknown format: expected .tsv, .tab, .csv, .jsonl, .parquet or a save_to_disk folder",
    )


def _header(path: Path, first: tuple[int, list[str]] | None) -> list[str]:
    """The column names of a TSV/CSV file's first record, which must be a header on line 1."""
    if first is None:
        raise DataFormatError(
            path, None, "the file is empty (expected a header row naming the columns)"
        )
    if all(not f.strip() for f in first[1]):
        raise DataFormatError(path, 1, "line 1 is blank (expected a header row naming the columns)")
    names = [name.strip() for name in first[1]]
    _check_names(path, 1, names, "header")
    return names


def _csv_error(path: Path, start: int, end: int, err: csv.Error) -> DataFormatError:
    """The error of a CSV record on lines ``start``..``end``, named at the line it starts on.

    A record runs past its first line only inside a quoted field, so an error there comes from
    a quote opened on line ``start``: named where it was opened, not where csv noticed it."""
    reason = str(err)
    if reason == "unexpected end of data":  # strict: the file ends inside a quoted field
        return DataFormatError(path, start, "a quote opened here is never closed")
    if "new-line character seen in unquoted field" in reason:  # csv's advice names its own API
        reason = "a carriage return inside an unquoted field"
    elif reason == "',' expected after '\"'":
        reason = "text after a closing quote; a quote inside a quoted field is written twice"
    if end > start:
        return DataFormatError(
            path, start,
            f"the quoted field opened here runs to line {end}, where the CSV is malformed "
            f"({reason}); is its closing quote missing?",
        )  # fmt: skip
    return DataFormatError(path, start, f"malformed CSV ({reason})")


def _delimited_table(path: Path, kind: str) -> Table:
    lines = Lines(path, keep_blank=True)
    if kind == "tsv":
        records: Iterator[tuple[int, list[str]]] = ((n, tsv_fields(t)) for n, t in lines)
    else:
        records = _csv_records(path, lines)
    header = _header(path, next(records, None))
    return Table(path, kind, header, _delimited_rows(path, header, records), 1)


def _csv_records(path: Path, lines: Lines) -> Iterator[tuple[int, list[str]]]:
    # csv reads from the decoded lines (so invalid UTF-8 names its line); the "\n" given back
    # lets a quoted field span lines. line_num counts the strings read: the record's last line,
    # so a record starts on the line after the previous one's last. Strict: a file that ends
    # inside a quoted field (an unclosed quote) is an error, not one field holding the rest of
    # the file, and so is text after a closing quote.
    reader = csv.reader((text + "\n" for _, text in lines), strict=True)
    end = 0
    while True:
        start = end + 1
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            raise _csv_error(path, start, max(start, reader.line_num), err) from None
        end = reader.line_num
        yield start, fields


def _delimited_rows(
    path: Path, header: list[str], records: Iterator[tuple[int, list[str]]]
) -> Iterator[Row]:
    width = len(header)
    for line, fields in records:
        if all(not f.strip() for f in fields):
            continue  # a blank row
        if len(fields) > width:
            raise DataFormatError(path, line, f"{len(fields)} fields, the header names {width}")
        yield Row(path, line, None, dict(zip(header, fields, strict=False)))


class _DuplicateKey(Exception):
    """A key given twice in one JSON object (raised from inside ``json.loads``)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _jsonl_objects(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    for lineno, line in Lines(path):
        try:
            value = json.loads(line, object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as err:
            raise DataFormatError(path, lineno, f"invalid JSON ({err.msg})") from None
        except _DuplicateKey as err:
            raise DataFormatError(
                path,
                lineno,
                f"key '{err.args[0]}' appears twice in the object; names must be unique",
            ) from None
        except RecursionError:
            raise DataFormatError(path, lineno, "invalid JSON (nested too deeply)") from None
        except ValueError as err:  # an integer of more digits than Python converts
            reason = str(err).split(":")[0]
            raise DataFormatError(path, lineno, f"invalid JSON ({reason})") from None
        if not isinstance(value, dict):
            raise DataFormatError(path, lineno, f"expected a JSON object, got {describe(value)}")
        yield lineno, value


def _jsonl_table(path: Path) -> Table:
    objects = _jsonl_objects(path)
    first = next(objects, None)
    if first is None:
        raise DataFormatError(path, None, "the file is empty (expected one JSON object a line)")

    def rows() -> Iterator[Row]:
        yield Row(path, first[0], None, first[1])
        for lineno, value in objects:
            yield Row(path, lineno, None, value)

    return Table(path, "jsonl", list(first[1]), rows(), first[0])


def _needs_datasets(path: Path, what: str) -> DataFormatError:
    return DataFormatError(
        path, None, f"reading {what} needs the `datasets` library (pip install 'cselab[data]')"
    )


def _arrow_errors() -> tuple[type[BaseException], ...]:
    """What pyarrow and ``datasets`` raise on a damaged or foreign file (``ArrowInvalid`` is a
    ``ValueError``, ``ArrowIOError`` an ``OSError``, ``ArrowKeyError`` a ``KeyError``...)."""
    import pyarrow as pa

    return (pa.ArrowException, OSError, ValueError, KeyError, TypeError, IndexError)


def _parquet_table(path: Path) -> Table:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise _needs_datasets(path, "parquet files") from None
    errors = _arrow_errors()
    try:
        parquet = pq.ParquetFile(str(path))
        names = list(parquet.schema_arrow.names)
    except errors as err:
        raise DataFormatError(path, None, f"not a parquet file ({first_line(err)})") from None
    _check_names(path, None, names, "file's schema")

    def rows() -> Iterator[Row]:
        index = 0
        batches = parquet.iter_batches(batch_size=4096)
        while True:
            try:
                batch = next(batches, None)
                values = [] if batch is None else batch.to_pylist()
            except errors as err:
                raise DataFormatError(
                    path, None, f"row {index}: unreadable parquet data ({first_line(err)})"
                ) from None
            if batch is None:
                return
            for row in values:
                yield Row(path, None, index, row)
                index += 1

    return Table(path, "parquet", names, rows(), None)


def _dataset_table(path: Path, prefer_split: str | None) -> Table:
    try:
        import datasets
    except ImportError:
        raise _needs_datasets(path, "saved datasets") from None
    errors = _arrow_errors()
    try:
        ds = datasets.load_from_disk(str(path))
    except errors as err:
        raise DataFormatError(
            path, None, f"not a folder written by save_to_disk ({first_line(err)})"
        ) from None
    if isinstance(ds, datasets.DatasetDict):
        splits = list(ds)
        if len(splits) == 1:
            ds = ds[splits[0]]
        elif prefer_split is not None and prefer_split in ds:
            log.info(
                "%s: a DatasetDict with splits %s; reading its '%s' split",
                path, ", ".join(splits), prefer_split,
            )  # fmt: skip
            ds = ds[prefer_split]
        else:
            wanted = f" and no '{prefer_split}' split" if prefer_split is not None else ""
            example = f", e.g. {path / splits[0]}" if splits else ""
            raise DataFormatError(
                path,
                None,
                f"a DatasetDict with splits {', '.join(splits) or '(none)'}{wanted}; point at "
                f"one split's folder{example}",
            )
    ds = ds.with_format(None)  # plain Python values, whatever format the folder was saved with
    names = list(ds.column_names)
    _check_names(path, None, names, "dataset's columns")

    def rows() -> Iterator[Row]:
        index = 0
        batches = ds.iter(batch_size=4096)
        while True:
            try:
                batch = next(batches, None)
            except errors as err:
                raise DataFormatError(
                    path, None, f"row {index}: unreadable data ({first_line(err)})"
                ) from None
            if batch is None:
                return
            for values in zip(*(batch[name] for name in names), strict=True):
                yield Row(path, None, index, dict(zip(names, values, strict=True)))
                index += 1

    return Table(path, "dataset", names, rows(), None)
