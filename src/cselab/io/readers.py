"""The one reader of text and table files: one rule per format and one set of one-line errors.

Every file a user hands to cselab as text or a table is read here: the training corpus, pairs
and triplets for training, own STS dev and test files, SICK, SentEval's text files, a search
corpus or queries file and the input of ``cselab encode``. The rules:

**Plain lines** (:class:`Lines`). UTF-8; only ``"\\n"`` ends a line, so a U+2028 or a form
feed inside a line does not split it and line numbers are those editors and ``sed -n`` show;
trailing ``"\\r"`` are dropped (CRLF files); a byte-order mark at the start of line 1 is dropped.
Blank (whitespace-only) lines are skipped and counted, unless the caller keeps them. Invalid UTF-8
is an error naming the file, the line and the byte, unless ``errors="replace"`` (U+FFFD, and the
line is counted). The file is read in one streaming pass that can feed a hasher and a progress bar.

**TSV** (``.tsv``, ``.tab``). The plain-line rule, then the fields are what lies between tabs:
no quoting at all, so a field may begin or end with a quote mark and keeps it (SentEval's files
and most NLP TSV files are written this way: ``"Hello," he said.`` is one field).

**CSV** (``.csv``). RFC 4180 as Python's :mod:`csv` reads it: comma-separated, a field in double
quotes may hold commas, line breaks and doubled quotes.

For both, line 1 is a header naming the columns (names stripped of surrounding spaces); a name
given twice is refused (naming it), a row with more fields than the header is refused, a row with
fewer lacks the last columns, and blank rows are skipped.

**JSONL** (``.jsonl``). The plain-line rule; every non-blank line is one JSON object; a key given
twice in one object is refused; the first object's keys stand for the header.

**Parquet** (``.parquet``, read with pyarrow) and **saved datasets** (a folder written by
``datasets``' ``save_to_disk``: a ``Dataset``, or a ``DatasetDict`` whose one split, or the
split the caller prefers, is read). Rows are numbered from 0, as ``ds[i]`` counts them.

**SICK** (:func:`read_sick`): SemEval 2014 task 1's release files as SentEval ships them;
see there.

A value is checked where it is used (:meth:`Row.text`, :meth:`Row.number`): an absent or empty
value, a JSON number where text is expected, a score that is not a finite number.

Every error is a :class:`~cselab.core.errors.DataFormatError`, one line beginning with
``FILE:LINE:`` for text files or ``FILE: row N:`` for parquet and saved datasets. A caller that
promises another :class:`~cselab.core.errors.UserError` type (training data raises
``CorpusError``) re-raises it with :func:`reraise_as`, keeping the message.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..core.errors import DataFormatError, UserError

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


def _check_file(path: Path, what: str) -> None:
    if path.is_dir():
        raise DataFormatError(path, None, f"{what} is a folder, not a text file")
    if not path.is_file():
        raise DataFormatError(path, None, f"{what} not found")


def read_text(path: str | os.PathLike[str], encoding: str = "utf-8", what: str = "file") -> str:
    """The whole text of ``path`` (``utf-8``, ``utf-8-sig`` or ``latin-1``); invalid UTF-8 is
    the same error as for :class:`Lines`, naming the line and the byte."""
    p = Path(path)
    _check_file(p, what)
    try:
        data = p.read_bytes()
    except OSError as err:
        raise DataFormatError(p, None, f"cannot be read ({err.strerror or err})") from None
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
            _check_file(self.path, what)
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


def _csv_error(path: Path, line: int, err: csv.Error) -> DataFormatError:
    reason = str(err)
    if "new-line character seen in unquoted field" in reason:  # csv's advice names its own API
        reason = "a carriage return inside an unquoted field"
    return DataFormatError(path, line, f"malformed CSV ({reason})")


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
    # lets a quoted field span lines. line_num counts the strings read: the record's last line.
    reader = csv.reader(text + "\n" for _, text in lines)
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            raise _csv_error(path, reader.line_num, err) from None
        yield reader.line_num, fields


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


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return (text.splitlines() or [type(err).__name__])[0][:200]


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
        raise DataFormatError(path, None, f"not a parquet file ({_first_line(err)})") from None
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
                    path, None, f"row {index}: unreadable parquet data ({_first_line(err)})"
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
            path, None, f"not a folder written by save_to_disk ({_first_line(err)})"
        ) from None
    if isinstance(ds, datasets.DatasetDict):
        splits = list(ds)
        if len(splits) == 1:
            ds = ds[splits[0]]
        elif prefer_split is not None and prefer_split in ds:
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
                    path, None, f"row {index}: unreadable data ({_first_line(err)})"
                ) from None
            if batch is None:
                return
            for values in zip(*(batch[name] for name in names), strict=True):
                yield Row(path, None, index, dict(zip(names, values, strict=True)))
                index += 1

    return Table(path, "dataset", names, rows(), None)


# ------------------------------------------------------------------------------------ SICK

#: SICK's header (SemEval 2014 task 1 files, as SentEval's ``data/downstream/SICK`` ships them).
SICK_HEADER = ("pair_ID", "sentence_A", "sentence_B", "relatedness_score", "entailment_judgment")


@dataclass(frozen=True)
class SickPair:
    """One line of a SICK file; ``entailment`` is ``None`` when the file has no such column."""

    line: int
    pair_id: str
    sentence_a: str
    sentence_b: str
    relatedness: float
    entailment: str | None


def read_sick(path: str | os.PathLike[str]) -> list[SickPair]:
    """Every pair of a SICK file (``SICK_train.txt``, ``SICK_trial.txt``,
    ``SICK_test_annotated.txt``: 4,500 / 500 / 4,927 pairs), read as SentEval reads it.

    UTF-8; CR, LF and CRLF end a line (``SICK_test_annotated.txt`` has CRLF endings); line 1 is a
    header beginning with ``pair_ID`` and naming ``sentence_A``, ``sentence_B`` and
    ``relatedness_score`` (``entailment_judgment`` is optional); every other line is stripped of
    surrounding white space and split at tabs (no quoting) and must have a field for each of
    these columns and a finite relatedness score. Sentences are returned as written.
    """
    p = Path(path)
    lines = universal_lines(read_text(p, "utf-8", what="SICK file"))
    header = [f.strip() for f in tsv_fields(lines[0].removeprefix(BOM).strip())] if lines else []
    if not header or header[0] != SICK_HEADER[0] or not set(SICK_HEADER[:4]) <= set(header):
        raise DataFormatError(p, 1, "expected the header line '" + "<TAB>".join(SICK_HEADER) + "'")
    _check_names(p, 1, header, "header")
    col = {name: header.index(name) for name in SICK_HEADER if name in header}
    need = max(col.values()) + 1
    out: list[SickPair] = []
    for lineno, line in enumerate(lines[1:], start=2):
        parts = tsv_fields(line.strip())
        if len(parts) < need:
            raise DataFormatError(
                p, lineno, f"expected at least {need} tab-separated fields, found {len(parts)}"
            )
        label = col.get(SICK_HEADER[4])
        out.append(
            SickPair(
                line=lineno,
                pair_id=parts[col["pair_ID"]],
                sentence_a=parts[col["sentence_A"]],
                sentence_b=parts[col["sentence_B"]],
                relatedness=score_field(p, lineno, parts[col["relatedness_score"]]),
                entailment=None if label is None else parts[label],
            )
        )
    return out


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path`` (what cselab writes beside a run: ``results.json``, a sweep's
    ``sweep.json``, a cell's ``cell.json`` or ``eval.json``); ``None`` if there is no such file. A file that is not a
    JSON object (cut while being written, not UTF-8, not JSON) raises
    :class:`~cselab.core.errors.DataFormatError` naming it and the line."""
    if not path.is_file():
        return None
    text = read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataFormatError(
            path, err.lineno, f"not valid JSON ({err.msg}, column {err.colno}; cut while it was "
            "being written?)",
        ) from None  # fmt: skip
    except RecursionError:  # the decoder recurses once per nesting level
        raise DataFormatError(path, None, "not valid JSON (nested too deeply)") from None
    if not isinstance(data, dict):
        raise DataFormatError(path, None, f"expected a JSON object, found {type(data).__name__}")
    return data


# ------------------------------------------------------------------------------------ BEIR

#: The three parts of a BEIR retrieval collection (Thakur et al. 2021, "BEIR: A Heterogeneous
#: Benchmark for Zero-shot Evaluation of Information Retrieval Models", Sec. 3 / its data loader).
BEIR_CORPUS, BEIR_QUERIES, BEIR_QRELS = "corpus", "queries", "qrels"
#: The largest qrels relevance: the last integer a float64 holds exactly (2**53), so that the
#: relevance, read as a number, is the integer written, and its gain sums stay exact enough.
MAX_RELEVANCE = 2**53
#: The qrels columns (the header line of ``qrels/<split>.tsv``).
BEIR_QRELS_COLUMNS = ("query-id", "corpus-id", "score")


@dataclass(frozen=True)
class BeirCollection:
    """One split of a BEIR collection: the whole corpus, the queries the split's qrels judge,
    and the judgements as ``(query index, document index, relevance)`` triples."""

    folder: Path
    split: str
    doc_ids: tuple[str, ...]
    doc_texts: tuple[str, ...]
    query_ids: tuple[str, ...]
    query_texts: tuple[str, ...]
    qrels: tuple[tuple[int, int, int], ...]


def _beir_part(folder: Path, name: str) -> Path | None:
    """``folder/name.jsonl``, else a saved ``datasets`` folder ``folder/name``, else ``None``."""
    file = folder / f"{name}.jsonl"
    if file.is_file():
        return file
    return folder / name if (folder / name).is_dir() else None


def beir_splits(folder: str | os.PathLike[str]) -> list[str]:
    """The splits with qrels in a BEIR folder: ``qrels/<split>.tsv`` files or ``qrels/<split>``
    saved-dataset folders, sorted."""
    qrels = Path(folder) / BEIR_QRELS
    if not qrels.is_dir():
        return []
    return sorted(
        {p.stem for p in qrels.glob("*.tsv")}
        | {p.name for p in qrels.iterdir() if p.is_dir() and not p.name.startswith(".")}
    )


def is_beir_folder(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is laid out as a BEIR collection: a folder with ``corpus`` and
    ``queries`` (``.jsonl`` files or saved ``datasets`` folders) and a ``qrels`` folder. The one
    check of that layout (``eval.dev``, ``cselab evaluate --retrieval``)."""
    p = Path(path)
    return (
        p.is_dir()
        and _beir_part(p, BEIR_CORPUS) is not None
        and _beir_part(p, BEIR_QUERIES) is not None
        and (p / BEIR_QRELS).is_dir()
    )


def _beir_id(row: Row, column: str) -> str:
    """An id as text: BEIR's ids are strings, but a JSON integer is taken as its digits."""
    value = row.values.get(column, _ABSENT)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return row.text(column)


def _beir_optional_text(row: Row, column: str) -> str:
    value = row.values.get(column)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise row.error(f"column '{column}' holds {describe(value)}, not text")
    return value


def _beir_rows(path: Path, columns: Sequence[str]) -> Iterator[Row]:
    table = open_table(path)
    table.require(columns, "a BEIR file has these columns")
    seen: dict[str, str] = {}
    for row in table:
        key = _beir_id(row, columns[0])
        if key in seen:
            raise row.error(f"{columns[0]} '{key}' appears twice (first on {seen[key]})")
        seen[key] = f"line {row.line}" if row.index is None else f"row {row.index}"
        yield row


def read_beir(folder: str | os.PathLike[str], split: str = "test") -> BeirCollection:
    """One split of a BEIR folder: ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/<split>.tsv``,
    or the same parts as saved ``datasets`` folders (``corpus/``, ``queries/``,
    ``qrels/<split>/``).

    ``corpus`` rows have ``_id``, ``text`` and an optional ``title``; a document's text is
    ``title + " " + text`` stripped, as BEIR's dense models (``models.SentenceBERT``) join them
    (so an empty title gives the text alone). ``queries`` rows have ``_id`` and ``text``. The
    qrels have the columns ``query-id``, ``corpus-id`` and ``score`` (the header BEIR writes),
    ``score`` a non-negative integer relevance. Only the queries the split's qrels name are
    returned, in the order they first appear there.

    Raises:
        DataFormatError: naming the file and line: a missing part or split, an id given twice, a
            qrels line naming a document or query the collection does not have, a judgement
            given twice, a relevance that is not a non-negative integer (or above 2**53), a document
            without text.
    """
    root = Path(folder)
    if not root.is_dir():
        raise DataFormatError(root, None, "BEIR folder not found")
    parts = {}
    for name in (BEIR_CORPUS, BEIR_QUERIES):
        parts[name] = _beir_part(root, name)
        if parts[name] is None:
            raise DataFormatError(
                root / f"{name}.jsonl", None, f"file not found (a BEIR folder has {name}.jsonl)"
            )
    qrels_path = root / BEIR_QRELS / f"{split}.tsv"
    if not qrels_path.is_file():
        if (root / BEIR_QRELS / split).is_dir():
            qrels_path = root / BEIR_QRELS / split
        else:
            have = ", ".join(beir_splits(root)) or "none"
            raise DataFormatError(
                qrels_path, None, f"file not found: no qrels for split '{split}' (splits: {have})"
            )
    doc_ids: list[str] = []
    doc_texts: list[str] = []
    for row in _beir_rows(parts[BEIR_CORPUS], ("_id", "text")):
        text = (_beir_optional_text(row, "title") + " " + _beir_optional_text(row, "text")).strip()
        if not text:
            raise row.error("the document has no text (columns 'title' and 'text' are empty)")
        doc_ids.append(_beir_id(row, "_id"))
        doc_texts.append(text)
    queries = {
        _beir_id(row, "_id"): row.text("text")
        for row in _beir_rows(parts[BEIR_QUERIES], ("_id", "text"))
    }
    doc_index = {d: i for i, d in enumerate(doc_ids)}
    query_index: dict[str, int] = {}
    judged: set[tuple[int, int]] = set()
    qrels: list[tuple[int, int, int]] = []
    table = open_table(qrels_path)
    table.require(BEIR_QRELS_COLUMNS, "BEIR's qrels header is 'query-id<TAB>corpus-id<TAB>score'")
    for row in table:
        qid, did = _beir_id(row, "query-id"), _beir_id(row, "corpus-id")
        if qid not in queries:
            raise row.error(f"query-id '{qid}' is not in {parts[BEIR_QUERIES].name}")
        if did not in doc_index:
            raise row.error(f"corpus-id '{did}' is not in {parts[BEIR_CORPUS].name}")
        score = row.number("score")
        if not score.is_integer() or score < 0:
            raise row.error(f"score {row.values.get('score')!r:.40} is not a non-negative integer")
        if score > MAX_RELEVANCE:
            raise row.error(
                f"score {row.values.get('score')!r:.40} is too large (a relevance is at most "
                f"2**53 = {MAX_RELEVANCE})"
            )
        q = query_index.setdefault(qid, len(query_index))
        if (q, doc_index[did]) in judged:
            raise row.error(f"query '{qid}' and document '{did}' are judged twice")
        judged.add((q, doc_index[did]))
        qrels.append((q, doc_index[did], int(score)))
    if not qrels:
        raise DataFormatError(qrels_path, None, "no judgements in the qrels")
    return BeirCollection(
        folder=root,
        split=split,
        doc_ids=tuple(doc_ids),
        doc_texts=tuple(doc_texts),
        query_ids=tuple(query_index),
        query_texts=tuple(queries[q] for q in query_index),
        qrels=tuple(qrels),
    )
