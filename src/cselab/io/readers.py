"""The one reader of text and table files: one rule per format and one set of one-line errors.

Every file a user hands to cselab as text or a table is read here: the training corpus, pairs
and triplets for training, own STS dev and test files, SICK, SentEval's text files, a search
corpus or queries file and the input of ``cselab encode``. The rules:

**Plain lines** (:class:`Lines`). UTF-8; only ``"\\n"`` ends a line, so a U+2028 or a form
feed inside a line does not split it and line numbers are those editors and ``sed -n`` show;
trailing ``"\\r"`` are dropped (CRLF files); a byte-order mark at the start of line 1 is dropped.
Blank (whitespace-only) lines are skipped and counted, unless the caller keeps them. Invalid UTF-8
is an error naming the file, the line and the byte, unless ``errors="replace"`` (U+FFFD, and the
line is counted). A compressed file (gzip, bzip2, xz, zstd, zip, known by its first bytes) is
refused as such, whatever its ending (``pairs.tsv.gz`` too). The file is read in one streaming
pass that can feed a hasher and a progress bar.

**TSV** (``.tsv``, ``.tab``). The plain-line rule, then the fields are what lies between tabs:
no quoting at all, so a field may begin or end with a quote mark and keeps it (SentEval's files
and most NLP TSV files are written this way: ``"Hello," he said.`` is one field).

**CSV** (``.csv``). RFC 4180 as Python's :mod:`csv` reads it (strict): comma-separated, a field
in double quotes may hold commas, line breaks and doubled quotes; a row is named by the line it
starts on. A quote never closed (the file ends inside the field) or text after a closing quote
is refused, naming the line the quoted field opens on.

For both, line 1 is a header naming the columns (names stripped of surrounding spaces); a name
given twice is refused (naming it; an empty name, as a spreadsheet's trailing separators leave,
names no column), a row with more fields than the header is refused, a row with fewer lacks the
last columns, and blank rows are skipped.

**JSONL** (``.jsonl``). The plain-line rule; every non-blank line is one JSON object; a key given
twice in one object is refused; the first object's keys stand for the header.

**Parquet** (``.parquet``, read with pyarrow) and **saved datasets** (a folder written by
``datasets``' ``save_to_disk``: a ``Dataset``, or a ``DatasetDict`` whose one split, or the
split the caller prefers, is read). Rows are numbered from 0, as ``ds[i]`` counts them.

**YAML** (:func:`read_yaml`, :func:`parse_yaml`: config files, instruction tables, a model
folder's ``cselab_config.yaml``). PyYAML's safe loader with YAML 1.2's numbers (``1e-5`` and
``5E-5`` are numbers, as in a ``--key=value`` override, not text as in YAML 1.1); a key given twice
in one mapping is refused, naming the line (PyYAML keeps the last silently).

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

import functools
import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import DataFormatError
from .tables import (  # noqa: F401 - the line and table rules, re-exported
    _ABSENT,
    _PROGRESS_EVERY,
    BOM,
    CSV_SUFFIXES,
    JSONL_SUFFIXES,
    PARQUET_SUFFIXES,
    TABLE_SUFFIXES,
    TSV_SUFFIXES,
    UTF8_HINT,
    Lines,
    Row,
    Table,
    _arrow_errors,
    _check_names,
    _csv_error,
    _csv_records,
    _dataset_table,
    _delimited_rows,
    _delimited_table,
    _header,
    _jsonl_objects,
    _jsonl_table,
    _needs_datasets,
    _parquet_table,
    _unique_keys,
    _utf8_error,
    check_file,
    describe,
    open_table,
    read_text,
    reraise_as,
    score_field,
    tsv_fields,
    universal_lines,
)

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


#: YAML 1.2's numbers that YAML 1.1 (PyYAML's resolver) reads as text: an exponent without a
#: dot or without a sign (``1e-5``, ``5E-5``, ``1e3``, ``1.5e3``) and a signed leading dot
#: (``-.5``). What people write for a learning rate, as Python and JSON read it.
YAML_FLOAT = re.compile(
    r"^(?:[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+|[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?)$"
)


@functools.cache
def yaml_loader() -> Any:
    """The loader of every YAML text cselab reads (files and ``--key=value`` overrides alike):
    PyYAML's safe loader, with :data:`YAML_FLOAT` read as a number and a key given twice in one
    mapping refused (PyYAML keeps the last silently) by raising ``Loader.DuplicateKey(key,
    first line, mark)``, a ``YAMLError``. Built on first use: only the readers of YAML pay for
    importing PyYAML."""
    import yaml

    class Loader(yaml.SafeLoader):
        class DuplicateKey(yaml.YAMLError):
            """A key given twice in one mapping: ``(key, its first line, the second's mark)``."""

        def compose_mapping_node(self, anchor: Any) -> Any:
            # checked as written, once per mapping (an alias reuses the node) and before
            # ``<<: *base`` merges keys in, which the mapping may override
            node = super().compose_mapping_node(anchor)
            first: dict[tuple[str, str], int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(
                    key_node, yaml.ScalarNode
                ):
                    continue
                key = (key_node.tag, key_node.value)
                if key in first:
                    raise Loader.DuplicateKey(key_node.value, first[key], key_node.start_mark)
                first[key] = key_node.start_mark.line + 1
            return node

    Loader.add_implicit_resolver("tag:yaml.org,2002:float", YAML_FLOAT, list("-+0123456789."))
    return Loader


@functools.cache
def yaml_dumper() -> Any:
    """PyYAML's safe dumper that quotes text :func:`yaml_loader` would read as a number (the
    string ``"1e5"``), so what cselab writes reads back the same."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_implicit_resolver("tag:yaml.org,2002:float", YAML_FLOAT, list("-+0123456789."))
    return Dumper


def dump_yaml(data: Any, **options: Any) -> str:
    """``data`` as YAML text that :func:`yaml_loader` reads back the same (``options``: PyYAML's
    ``dump`` keywords, e.g. ``sort_keys=False``)."""
    import yaml

    return yaml.dump(data, Dumper=yaml_dumper(), **options)


def parse_yaml(text: str, path: Path) -> Any:
    """What the YAML ``text`` read from ``path`` holds (``None`` if empty), read by
    :func:`yaml_loader`; invalid YAML or a key given twice in one mapping raises
    :class:`~cselab.core.errors.DataFormatError` naming ``path`` and the line: PyYAML's own
    message spans several lines (context, a caret drawing), of which the line and the problem
    are kept."""
    import yaml  # only the readers of YAML files pay for it

    try:
        return yaml.load(text, Loader=yaml_loader())  # noqa: S506 - a SafeLoader
    except yaml_loader().DuplicateKey as err:
        key, first, mark = err.args
        raise DataFormatError(
            path, mark.line + 1,
            f"key {str(key)!r} appears twice in one mapping (first on line {first}); names "
            "must be unique",
            column=mark.column + 1,
        ) from None  # fmt: skip
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        if mark is None:
            raise DataFormatError(path, None, f"invalid YAML: {problem}") from None
        raise DataFormatError(
            path, mark.line + 1, f"invalid YAML: {problem}", column=mark.column + 1
        ) from None
    except RecursionError:  # PyYAML recurses once per nesting level
        raise DataFormatError(path, None, "invalid YAML: nested too deeply") from None


def read_yaml(path: Path) -> Any:
    """What the YAML file ``path`` holds (a run's ``config.yaml``, a model folder's
    ``cselab_config.yaml``); a missing, unreadable, non-UTF-8 or invalid file raises
    :class:`~cselab.core.errors.DataFormatError` naming it and the line."""
    return parse_yaml(read_text(path, what="YAML file"), path)


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
        key = row.key(columns[0])
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
        doc_ids.append(row.key("_id"))
        doc_texts.append(text)
    queries = {
        row.key("_id"): row.text("text") for row in _beir_rows(parts[BEIR_QUERIES], ("_id", "text"))
    }
    doc_index = {d: i for i, d in enumerate(doc_ids)}
    query_index: dict[str, int] = {}
    judged: set[tuple[int, int]] = set()
    qrels: list[tuple[int, int, int]] = []
    table = open_table(qrels_path)
    table.require(BEIR_QRELS_COLUMNS, "BEIR's qrels header is 'query-id<TAB>corpus-id<TAB>score'")
    for row in table:
        qid, did = row.key("query-id"), row.key("corpus-id")
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
