"""The one reader of text and table files (:mod:`cselab.io.readers`): each format's rule on real
files, the same rows for training, dev selection and evaluation, SICK read once for both of its
users, the one-line errors (also through the command line), and Hypothesis properties: any bytes
in a pairs or dev file give rows or the project's own error, never another exception."""

from __future__ import annotations

import csv
import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from conftest import SENTEVAL
from cselab.cli import main
from cselab.core.errors import CorpusError, DataFormatError, UserError
from cselab.data import read_corpus
from cselab.data.pairs import PairColumns, read_pairs, sick_triplets
from cselab.evaluation import custom
from cselab.evaluation import datasets as ds
from cselab.evaluation.api import evaluate
from cselab.io import readers
from cselab.search.index import read_lines

STS_PAIR = PairColumns(anchor="sentence1", positive="sentence2", negative=[])
SICK = SENTEVAL / "SICK"
needs_sick = pytest.mark.skipif(not SICK.is_dir(), reason="shared SICK data not found")
# Rows every format below holds; the TSV's quote marks are text, the CSV's commas are quoted.
ROWS = [
    ('"Hello," he said.', "he greeted them", 4.5),
    ("a man plays a guitar", 'the "guitar" is played', 3.75),
    ("two dogs, both brown, run", "animals are running", 3.0),
    ("the cat sleeps", "a dog barks", 0.5),
    ("rain falls", "it is raining", 4.8),
    ("stocks fell", "'markets' dropped", 2.0),
]
COLS = ("sentence1", "sentence2", "score")


def write_rows(path: Path, rows: list[tuple[str, str, float]] = ROWS) -> Path:
    """``rows`` in the format of ``path``'s ending, each written by its own format's writer (a
    TSV by hand: tab-joined, nothing quoted)."""
    records = [dict(zip(COLS, r, strict=True)) for r in rows]
    if path.suffix == ".tsv":
        lines = ["\t".join(COLS)] + ["\t".join(map(str, r)) for r in rows]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    elif path.suffix == ".csv":
        with path.open("w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(COLS)
            writer.writerows(rows)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    else:
        datasets = pytest.importorskip("datasets")
        data = datasets.Dataset.from_list(records)
        if path.suffix == ".parquet":
            data.to_parquet(str(path))
        else:
            datasets.DatasetDict({"train": data, "test": data.select([0])}).save_to_disk(path)
    return path


# ---------------------------------------------------------------------------------- lines


def test_plain_lines_rule(tmp_path: Path) -> None:
    """Only "\\n" ends a line; CRs before it go; a BOM goes on line 1 only; blank lines are
    skipped and counted (or kept); the digest and the progress see every byte in one pass."""
    data = (
        "\ufeffone\u2028still one\r\n  \r\ntwo\x0cstill two\n\ufeffthree\r\r\n\n  four  "
    ).encode()
    path = tmp_path / "t.txt"
    path.write_bytes(data)
    hasher, seen = hashlib.sha256(), []

    class Bar:
        def update(self, n: int) -> None:
            seen.append(n)

    lines = readers.Lines(path, hasher=hasher, progress=Bar())
    assert list(lines) == [
        (1, "one\u2028still one"),
        (3, "two\x0cstill two"),
        (4, "\ufeffthree"),
        (6, "  four  "),
    ]
    assert (lines.lines, lines.blank, lines.replaced) == (6, 2, 0)
    assert hasher.hexdigest() == hashlib.sha256(data).hexdigest() and sum(seen) == len(data)
    kept = readers.Lines(path, keep_blank=True)
    assert [n for n, _ in kept] == [1, 2, 3, 4, 5, 6] and kept.blank == 2


def test_invalid_utf8_names_file_line_and_byte_or_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_bytes(b"fine\nstill fine\nbad \xff here\n")
    with pytest.raises(DataFormatError) as err:
        list(readers.Lines(path))
    assert str(err.value) == (
        f"{path}:3: invalid UTF-8 at byte 4 of the line (0xff); save the file as UTF-8"
    )
    lines = readers.Lines(path, errors="replace")
    assert list(lines)[-1] == (3, "bad \ufffd here") and lines.replaced == 1
    # the whole-file reader (SentEval's files) says the same
    with pytest.raises(DataFormatError) as whole:
        readers.read_text(path)
    assert str(whole.value) == str(err.value)


def test_every_plain_line_user_reads_the_same_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The training corpus, a search corpus and `cselab encode` read one rule (encode keeps the
    blank lines: one vector per line)."""
    data = "\ufeffalpha\r\n\nbeta\u2028gamma\r\r\n   \ndelta".encode()
    path = tmp_path / "c.txt"
    path.write_bytes(data)
    want = ["alpha", "beta\u2028gamma", "delta"]
    assert read_corpus(path)[0] == want
    assert read_lines(path) == (want, [1, 3, 5])
    assert [t for _, t in readers.Lines(path, keep_blank=True)] == [
        "alpha", "", "beta\u2028gamma", "   ", "delta"
    ]  # fmt: skip


def _compressed(kind: str, data: bytes) -> bytes:
    import bz2
    import gzip
    import lzma
    import zipfile

    if kind == "zip":
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            archive.writestr("pairs.tsv", data)
        return buffer.getvalue()
    if kind == "zstd":  # no writer before Python 3.14: a frame's magic number and stored bytes
        return b"\x28\xb5\x2f\xfd\x04\x58" + data
    return {"gzip": gzip.compress, "bzip2": bz2.compress, "xz": lzma.compress}[kind](data)


@pytest.mark.parametrize("kind", ["gzip", "bzip2", "xz", "zstd", "zip"])
@pytest.mark.parametrize("name", ["c.tsv.gz", "c.tsv", "c.txt", "c.jsonl"])
def test_a_compressed_file_is_refused_by_name_by_every_reader(
    tmp_path: Path, kind: str, name: str
) -> None:
    """Not 'invalid UTF-8 at byte 1' (whose way out, encoding_errors=replace, would train on the
    compressed bytes) nor an unknown format: what the file is, and what to do."""
    path = tmp_path / name
    path.write_bytes(
        _compressed(kind, b"anchor\tpositive\n" + b"a man plays\ta person plays\n" * 50)
    )
    message = f"{path}: a {kind}-compressed file, not text; decompress it first"
    if kind == "zip":  # a spreadsheet is one: unzipping it gives XML, not a table
        message = (
            f"{path}: a zip archive, not text (an .xlsx, .ods or .docx file is one); save it as "
            ".csv, .tsv or plain text, or unzip the text file it holds"
        )
    readers_of_it = [
        lambda: list(readers.Lines(path)),
        lambda: list(readers.Lines(path, errors="replace")),
        lambda: readers.read_text(path),
        lambda: read_corpus(path, errors="replace"),
        lambda: read_lines(path),
        lambda: read_pairs(path),
    ]
    for read in readers_of_it:
        with pytest.raises(UserError) as err:
            read()
        assert str(err.value) == message


def test_text_that_begins_as_a_compressed_file_s_magic_is_read(tmp_path: Path) -> None:
    """Only a whole signature is a compressed file: bzip2's ``BZh`` must be followed by a block
    size and the digits of pi, which no sentence begins with."""
    path = tmp_path / "c.txt"
    path.write_text("BZh9 is a word here\nPK is another\n", encoding="utf-8")
    assert read_lines(path)[0] == ["BZh9 is a word here", "PK is another"]


# --------------------------------------------------------------------------------- tables


@pytest.mark.parametrize("name", ["r.tsv", "r.csv", "r.jsonl", "r.parquet", "saved"])
def test_every_table_format_gives_the_known_rows(tmp_path: Path, name: str) -> None:
    path = write_rows(tmp_path / name)
    table = readers.open_table(path, prefer_split="train")
    assert table.columns == COLS
    rows = [(r.text("sentence1"), r.text("sentence2"), r.number("score")) for r in table]
    assert rows == ROWS


def test_training_says_which_split_of_a_dataset_dict_it_reads(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A DatasetDict with several splits: training reads ``train``, and says so in one line."""
    import logging

    path = write_rows(tmp_path / "saved")
    with caplog.at_level(logging.INFO, logger="cselab"):
        readers.open_table(path, prefer_split="train")
    assert f"{path}: a DatasetDict with splits train, test; reading its 'train' split" in (
        caplog.text
    )


@pytest.mark.parametrize("name", ["r.tsv", "r.csv", "r.jsonl", "r.parquet", "saved"])
def test_the_same_file_gives_the_same_rows_to_training_dev_and_evaluation(
    tmp_path: Path, name: str, fresh_eval_cache: None
) -> None:
    """Training's pairs, the dev-set reader of model selection and `evaluate --sts-file` (the
    sentences the encoder is asked for) see the same sentences, quote marks included."""
    path = write_rows(tmp_path / name)
    if name == "saved":  # a dev set or evaluation file names one split's folder
        path = path / "train"
    training = read_pairs(path, STS_PAIR)
    dev = custom.read_sts_file(path)
    asked: list[str] = []

    def encoder(sentences: list[str]) -> np.ndarray:
        asked.extend(sentences)
        return np.ones((len(sentences), 2)) + np.arange(len(sentences))[:, None] * [[0.0, 1.0]]

    result = evaluate(encoder, tasks=None, sts_files=[path])
    want1, want2 = [r[0] for r in ROWS], [r[1] for r in ROWS]
    assert (training.anchors, training.positives) == (want1, want2)
    assert (list(dev.sent1), list(dev.sent2), dev.scores.tolist()) == (
        want1, want2, [r[2] for r in ROWS]
    )  # fmt: skip
    assert sorted(asked) == sorted({*want1, *want2})
    assert next(iter(result["results"].values()))["n"] == len(ROWS)


def test_csv_quoting_and_tsv_without_quoting(tmp_path: Path) -> None:
    """The same bytes mean different things in the two formats, each by its own rule."""
    text = 'a\tb\n"x, y"\t"he said ""hi"""\n'
    (tmp_path / "q.tsv").write_text(text)
    (tmp_path / "q.csv").write_text(text.replace("\t", ","))
    (tsv_row,) = readers.open_table(tmp_path / "q.tsv")
    assert tsv_row.values == {"a": '"x, y"', "b": '"he said ""hi"""'}
    (csv_row,) = readers.open_table(tmp_path / "q.csv")
    assert csv_row.values == {"a": "x, y", "b": 'he said "hi"'}
    (tmp_path / "m.csv").write_text('a,b\n"line one\nline two",c\nd,e\n')
    rows = list(readers.open_table(tmp_path / "m.csv"))  # a row is named where it starts
    assert [(r.line, r.values["a"]) for r in rows] == [(2, "line one\nline two"), (4, "d")]


@pytest.mark.parametrize("broken", ['a,"broken here', '"broken, here'])
def test_an_unclosed_csv_quote_is_named_on_the_line_it_opens(tmp_path: Path, broken: str) -> None:
    """A quote never closed is not one field holding the rest of the file (36 rows, silently)
    nor a missing column on the last line: the line the quote opens on is named."""
    lines = ["anchor,positive", *(f"a{i},b{i}" for i in range(2, 61))]
    lines[36] = broken
    path = tmp_path / "open37.csv"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CorpusError) as err:
        read_pairs(path)
    assert str(err.value) == f"{path}:37: a quote opened here is never closed"


def test_a_csv_quote_closed_lines_later_is_named_where_it_opens(tmp_path: Path) -> None:
    lines = ["anchor,positive", *(f"a{i},b{i}" for i in range(2, 61))]
    lines[36], lines[45] = 'a,"broken here', 'x,"y"z'
    path = tmp_path / "late.csv"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CorpusError) as err:
        read_pairs(path)
    assert str(err.value) == (
        f"{path}:37: the quoted field opened here runs to line 46, where the CSV is malformed "
        "(text after a closing quote; a quote inside a quoted field is written twice); is its "
        "closing quote missing?"
    )


@pytest.mark.parametrize("sep", [",", "\t"])
def test_unnamed_columns_of_trailing_separators_are_no_names_given_twice(
    tmp_path: Path, sep: str
) -> None:
    """A spreadsheet's export ends its lines with empty columns: one or two, the same rows
    (two were refused as "column '' appears twice in the header")."""
    for blanks in (1, 2):
        path = tmp_path / f"p{blanks}.{'csv' if sep == ',' else 'tsv'}"
        tail = sep * blanks
        path.write_text(f"anchor{sep}positive{tail}\na{sep}b{tail}\nc{sep}d{tail}\n")
        records = read_pairs(path)
        assert (records.anchors, records.positives) == (["a", "c"], ["b", "d"])


@pytest.mark.parametrize(
    ("name", "content", "needle"),
    [
        ("d.tsv", "sentence1\tsentence2\tscore\tscore\na\tb\t1\t2\n",
         "d.tsv:1: column 'score' appears twice in the header"),
        ("d.csv", "sentence1,sentence2,score, score\na,b,1,2\n",
         "d.csv:1: column 'score' appears twice in the header"),
        ("d.jsonl", '{"sentence1": "a", "sentence2": "b", "score": 1, "score": 2}\n',
         "d.jsonl:1: key 'score' appears twice in the object"),
    ],
)  # fmt: skip
def test_duplicated_column_names_are_refused_by_every_user(
    tmp_path: Path, name: str, content: str, needle: str, fresh_eval_cache: None
) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(DataFormatError, match=needle):
        custom.read_sts_file(path)
    with pytest.raises(CorpusError, match=needle):
        read_pairs(path, STS_PAIR)


def test_duplicated_parquet_columns_are_refused(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.Table.from_arrays([pa.array(["a"]), pa.array(["b"])], names=["s", "s"])
    pq.write_table(table, tmp_path / "d.parquet")
    with pytest.raises(DataFormatError, match=r"d\.parquet: column 's' appears twice"):
        readers.open_table(tmp_path / "d.parquet")


@pytest.mark.parametrize(
    ("value", "said"),
    [(3, "a number (3)"), (2.5, "a number (2.5)"), (True, "a boolean (true)"),
     (None, "null"), (["x"], "a list"), ({"k": "v"}, "an object")],
)  # fmt: skip
def test_a_json_value_in_a_text_column_says_what_it_is(
    tmp_path: Path, value: object, said: str
) -> None:
    path = tmp_path / "p.jsonl"
    rows = [{"anchor": "a", "positive": "b"}, {"anchor": "c", "positive": value}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(CorpusError) as err:
        read_pairs(path)
    assert str(err.value) == f"{path}:2: column 'positive' holds {said}, not text"


def test_a_lone_surrogate_is_not_text(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"anchor": "a\\ud800", "positive": "b"}\n')
    with pytest.raises(CorpusError, match=r"p\.jsonl:1: column 'anchor' holds a lone surrogate"):
        read_pairs(path)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("e.tsv", "", "{p}: the file is empty (expected a header row naming the columns)"),
        ("b.csv", "\na,b\n", "{p}:1: line 1 is blank (expected a header row naming the columns)"),
        ("w.tsv", "anchor\tpositive\na\tb\tc\n", "{p}:2: 3 fields, the header names 2"),
        ("s.tsv", "anchor\tpositive\n\n \t \na\n", "{p}:4: column 'positive' is missing"),
        ("r.csv", "anchor,positive\na\rb,c\n",
         "{p}:2: malformed CSV (a carriage return inside an unquoted field)"),
        ("q.csv", 'anchor,positive\na,"b"c\n',
         "{p}:2: malformed CSV (text after a closing quote; a quote inside a quoted field is "
         "written twice)"),
        ("e.jsonl", "\n \n", "{p}: the file is empty (expected one JSON object a line)"),
        ("l.jsonl", '{"anchor": "a", "positive": "b"}\n[1]\n',
         "{p}:2: expected a JSON object, got a list"),
        ("n.jsonl", "[" * 100_000 + "\n", "{p}:1: invalid JSON (nested too deeply)"),
        ("d.jsonl", '{"anchor": "a", "positive": ' + "9" * 5000 + "}\n",
         "{p}:1: invalid JSON (Exceeds the limit (4300 digits) for integer string conversion)"),
        ("k.jsonl", '{"anchor": "a", "positive": "b"}\n{"anchor": "c"}\n',
         "{p}:2: column 'positive' is missing"),
        ("x.txt", "anchor,positive\n",
         "{p}: unknown format: expected .tsv, .tab, .csv, .jsonl, .parquet or a save_to_disk folder"),
        ("f.parquet", "anchor,positive\na,b\n", "{p}: not a parquet file ("),
    ],
)  # fmt: skip
def test_table_errors_are_one_line_naming_file_and_line(
    tmp_path: Path, name: str, content: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(content, newline="")
    with pytest.raises(CorpusError) as err:
        read_pairs(path)
    assert str(err.value).startswith(message.format(p=path)) and "\n" not in str(err.value)


def test_a_parquet_file_that_is_not_parquet_is_one_line_for_cselab_evaluate(
    tmp_path: Path, capsys: pytest.CaptureFixture, fresh_eval_cache: None
) -> None:
    bad = tmp_path / "dev.parquet"
    bad.write_text("sentence1,sentence2,score\n")
    assert main(["evaluate", "no/such/model", "--sts-file", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"cselab evaluate: error: {bad}: not a parquet file (")
    assert len(err.splitlines()) == 1 and "ArrowInvalid" not in err


def test_saved_dataset_splits(tmp_path: Path, fresh_eval_cache: None) -> None:
    path = write_rows(tmp_path / "saved")
    assert len(read_pairs(path, STS_PAIR)) == len(ROWS)  # training takes `train`
    with pytest.raises(DataFormatError, match=r"splits train, test; point at one split's folder"):
        custom.read_sts_file(path)
    with pytest.raises(DataFormatError, match=r"0: not a folder written by save_to_disk \(Dir"):
        readers.open_table(tmp_path)  # a folder of other things


# ----------------------------------------------------------------------------------- SICK


@needs_sick
@pytest.mark.parametrize(
    ("split", "file", "count"),
    [("train", "SICK_train.txt", 4500), ("dev", "SICK_trial.txt", 500),
     ("test", "SICK_test_annotated.txt", 4927)],
)  # fmt: skip
def test_sick_is_read_once_for_evaluation_and_training(
    split: str, file: str, count: int, fresh_eval_cache: None
) -> None:
    rows = readers.read_sick(SICK / file)
    assert len(rows) == count and len({r.pair_id for r in rows}) == count
    assert {r.entailment for r in rows} == {"ENTAILMENT", "CONTRADICTION", "NEUTRAL"}
    assert not any("\r" in r.sentence_b or "\r" in (r.entailment or "") for r in rows)
    # evaluation: the same pairs, as SentEval hands them over (tokens re-joined)
    sick = ds.load_sick(split, SENTEVAL)
    assert len(sick) == count
    assert list(sick.sent1) == [" ".join(r.sentence_a.split()) for r in rows]
    assert sick.scores.tolist() == [r.relatedness for r in rows]
    # training: every triplet is an ENTAILMENT pair and a CONTRADICTION pair of those rows
    pairs = {
        label: {frozenset((r.sentence_a, r.sentence_b)) for r in rows if r.entailment == label}
        for label in ("ENTAILMENT", "CONTRADICTION")
    }
    triplets = sick_triplets(SICK / file)
    assert len(triplets) == {"train": 506, "dev": 8, "test": 621}[split]
    for a, p, n in zip(triplets.anchors, triplets.positives, triplets.negatives[0], strict=True):
        assert frozenset((a, p)) in pairs["ENTAILMENT"]
        assert frozenset((a, n)) in pairs["CONTRADICTION"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("1\tA\tB\t4.5\tNEUTRAL\n", "{p}:1: expected the header line 'pair_ID<TAB>sentence_A"),
        ("pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\r\n"
         "1\tA dog\tA cat\t4.5\tCONTRADICTION\r\n2\tA dog\tA cat\tx\tNEUTRAL\r\n",
         "{p}:3: score 'x' is not a number"),
        ("pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"
         "1\tA dog\tA cat\t4.5\n", "{p}:2: expected at least 5 tab-separated fields, found 4"),
    ],
)  # fmt: skip
def test_a_damaged_sick_file_is_the_same_error_for_both_users(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "SICK_train.txt"
    path.write_bytes(content.encode())
    with pytest.raises(DataFormatError) as evaluation:
        ds.read_sick(path)
    with pytest.raises(CorpusError) as training:
        sick_triplets(path)
    assert str(evaluation.value) == str(training.value)
    assert str(training.value).startswith(message.format(p=path))


# ---------------------------------------------------------------------------- cselab encode


@pytest.mark.parametrize("case", ["folder", "not utf-8", "missing"])
def test_encode_input_errors_are_one_line_before_the_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture, case: str
) -> None:
    path = tmp_path / "in.txt"
    where = str(path)
    if case == "folder":
        path.mkdir()
        problem = "input file is a folder, not a text file"
    elif case == "not utf-8":
        path.write_bytes("one\ncafé\n".encode("latin-1"))
        where, problem = f"{path}:2", "invalid UTF-8 at byte 3 of the line (0xe9)"
    else:
        problem = "input file not found"
    argv = ["encode", "no/such/model", "--input", str(path), "--output", str(tmp_path / "v.npy")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"cselab encode: error: {where}: {problem}")
    assert len(err.splitlines()) == 1 and not (tmp_path / "v.npy").exists()


# ---------------------------------------------------------------- properties (Hypothesis)

PROPERTY = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
# Pieces that reach the formats' rules: separators, quotes, line ends, a BOM, bad UTF-8, JSON.
PIECES = st.sampled_from(
    [b"\t", b",", b'"', b"'", b"\n", b"\r", b"\r\n", b"\xef\xbb\xbf", b"\xff", b"\xc3",
     b"{", b"}", b"[", b":", b"null", b"1", b"3.5", b"nan", b"true", b" ",
     b"sentence1", b"sentence2", b"score", b"anchor", b"positive", b"negative", b"\\ud800"]
)  # fmt: skip
BYTES = st.one_of(
    st.binary(max_size=300),
    st.lists(st.one_of(PIECES, st.binary(max_size=4)), max_size=60).map(b"".join),
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=4,
)
# Mostly well-formed values, so that examples get past the header and reach every row's checks.
WORDS = st.sampled_from(
    ["a man", '"Hello," he said.', "it's", "two, three", "caf\u00e9", "x\ty", "a\nb", " ", ""]
)
NUMBERS = st.sampled_from(["1", "2.5", "-3", "0", "1e3", "nan", "inf", "x", ""])
TEXTISH = st.one_of(WORDS, WORDS, st.text(max_size=8), JSON_VALUES)
SCOREISH = st.one_of(NUMBERS, st.integers(-5, 5), st.floats(), JSON_VALUES)
NAMES = ["anchor", "positive", "negative", "sentence1", "sentence2", "score"]
OBJECTS = st.one_of(
    st.fixed_dictionaries({"anchor": TEXTISH, "positive": TEXTISH}, optional={"negative": TEXTISH}),
    st.fixed_dictionaries({"sentence1": TEXTISH, "sentence2": TEXTISH, "score": SCOREISH}),
    st.dictionaries(st.sampled_from(NAMES), JSON_VALUES),
)
JSONL = st.lists(OBJECTS, max_size=9).map(
    lambda objs: "".join(json.dumps(o) + "\n" for o in objs).encode()
)


CLEAN_TEXT = st.sampled_from(["a man", '"Hello," he said.', "it's", "the 2 dogs"])
CLEAN_SCORE = st.sampled_from(["1", "2.5", "0", "4", "-1"])


@st.composite
def tables(draw: st.DrawFn) -> tuple[bytes, str]:
    """A header of (mostly) known names and rows of (mostly) plain cells, a number in a score
    column, written with tabs, with commas as they are, or by the csv module (quoting), with LF
    or CRLF line ends; the file's ending mostly matches how it was written."""
    header = draw(
        st.one_of(
            st.sampled_from([["anchor", "positive"], ["sentence1", "sentence2", "score"],
                             ["anchor", "positive", "negative", "score"]]),
            st.lists(st.sampled_from([*NAMES, "", " anchor", '"score"']), min_size=1, max_size=5),
        )
    )  # fmt: skip
    odd = st.one_of(WORDS, NUMBERS, st.text(max_size=5))
    clean = [CLEAN_SCORE if name == "score" else CLEAN_TEXT for name in header]
    if draw(st.booleans()):  # a tidy table: every row well-formed (results, not only refusals)
        rows = draw(st.lists(st.tuples(*clean).map(list), min_size=5, max_size=9))
    else:
        exact = st.tuples(*[st.one_of(c, c, c, odd) for c in clean]).map(list)
        ragged = st.lists(odd, min_size=len(header) - 1, max_size=len(header) + 1)
        rows = draw(st.lists(st.one_of(exact, exact, exact, ragged), max_size=9))
    end = draw(st.sampled_from(["\n", "\r\n"]))
    how = draw(st.sampled_from(["tab", "comma", "csv"]))
    if how == "csv":
        out = io.StringIO(newline="")
        csv.writer(out, lineterminator=end).writerows([header, *rows])
        text = out.getvalue()
    else:
        sep = "\t" if how == "tab" else ","
        text = "".join(sep.join(r) + end for r in [header, *rows])
    suffix = draw(st.sampled_from([".tsv" if how == "tab" else ".csv"] * 4 + [".jsonl"]))
    return text.encode("utf-8", errors="surrogatepass"), suffix


SUFFIXES = st.sampled_from([".tsv", ".csv", ".jsonl"])


def _one_line_from(path: Path, err: UserError) -> None:
    assert str(err).startswith(str(path)) and "\n" not in str(err)
    # --hypothesis-show-statistics: which refusals the examples reach
    event(str(err)[len(str(path)) :].lstrip(":0123456789 ").split("(")[0][:40])


@PROPERTY
@given(st.one_of(st.tuples(BYTES, SUFFIXES), st.tuples(JSONL, st.just(".jsonl")), tables()))
@example((b'anchor\tpositive\n"Hello," he said.\tx\n', ".tsv"))
@example((b'{"anchor": 1e999, "positive": "b"}\n', ".jsonl"))
@example((b'{"anchor": "a", "positive": ' + b"9" * 5000 + b"}\n", ".jsonl"))
@example((b"[" * 100_000, ".jsonl"))  # json.loads raises RecursionError
@example((b'{"anchor": "a\\ud800", "positive": "b"}\n', ".jsonl"))  # no tokenizer can encode it
@example((b"anchor,positive\na\rb,c\n", ".csv"))  # csv.Error: a lone CR
@example((b"anchor,positive\na,\x00\n", ".csv"))  # csv.Error: a NUL byte
@example((b"1\n", ".jsonl"))  # JSON, but not an object
def test_pairs_reader_on_any_bytes(tmp_path: Path, file: tuple[bytes, str]) -> None:
    data, suffix = file
    path = tmp_path / f"pairs{suffix}"
    path.write_bytes(data)
    try:
        records = read_pairs(path)
    except UserError as err:
        assert isinstance(err, CorpusError)
        _one_line_from(path, err)
        return
    event("rows read")
    assert len(records) >= 1 and len(records.positives) == len(records)
    for column in (records.anchors, records.positives, *records.negatives):
        assert all(isinstance(t, str) and t.strip() for t in column)
        assert all(t.encode("utf-8") for t in column)  # encodable: a tokenizer can take it


@PROPERTY
@given(st.one_of(st.tuples(BYTES, SUFFIXES), st.tuples(JSONL, st.just(".jsonl")), tables()))
@example((b"sentence1\tsentence2\tscore\n" + b"a\tb\t1\n" * 3 + b"c\td\t2\n" * 3, ".tsv"))
@example((b'{"sentence1": "a", "sentence2": "b", "score": 1e999}\n', ".jsonl"))
@example((b"sentence1,sentence2,score\n" + b"a,b,1\n" * 4 + b'"c,d,2\n', ".csv"))  # unclosed
@example((b'{"sentence1": "a", "sentence2": "b", "score": ' + b"9" * 400 + b"}\n", ".jsonl"))
def test_dev_set_reader_on_any_bytes(tmp_path: Path, file: tuple[bytes, str]) -> None:
    data, suffix = file
    ds.clear_cache()  # every example rewrites the same file
    path = tmp_path / f"dev{suffix}"
    path.write_bytes(data)
    try:
        pairs = custom.read_sts_file(path)
    except UserError as err:
        _one_line_from(path, err)
        return
    event("rows read")
    assert len(pairs) >= custom.MIN_PAIRS and np.isfinite(pairs.scores).all()
    assert all(isinstance(t, str) and t.strip() for t in pairs.sent1 + pairs.sent2)


def test_a_cut_cselab_json_or_adapter_config_is_one_line_naming_the_file(tmp_path: Path) -> None:
    """The model folder's JSON files go through the one reader: a file cut while being written
    is a :class:`DataFormatError` naming it, not a JSON traceback."""
    from cselab.model.loader import load
    from cselab.model.lora import adapter_base

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "cselab.json").write_text('{"pooler": "cls", ')
    with pytest.raises(DataFormatError, match=r"cselab\.json.*not valid JSON"):
        load(str(folder))
    (folder / "adapter_config.json").write_bytes(b'{"base_model_name_or_path": "\xff"}')
    with pytest.raises(DataFormatError, match=r"adapter_config\.json"):
        adapter_base(folder)


def test_yaml_numbers_and_keys_given_twice_in_every_yaml_file(tmp_path: Path) -> None:
    """The one YAML reader reads YAML 1.2's exponents as numbers (``1e-5``: text in YAML 1.1)
    and refuses a key given twice in one mapping (PyYAML keeps the last); YAML's merge key
    still overrides, and the instruction tables cselab ships read as PyYAML reads them."""
    import yaml

    from cselab.evaluation.instructions import BUILTIN
    from cselab.io.readers import read_yaml

    f = tmp_path / "n.yaml"
    f.write_text("a: [1e-5, 5E-5, 1e3, 1.5e3, -.5, 1.0, 1, 1e, e5, '1e5', 0x10]\n")
    assert read_yaml(f) == {"a": [1e-5, 5e-5, 1000.0, 1500.0, -0.5, 1.0, 1, "1e", "e5", "1e5", 16]}
    f.write_text("base: &b {x: 1, y: 2}\nitem:\n  <<: *b\n  y: 3\n")
    assert read_yaml(f)["item"] == {"x": 1, "y": 3}
    f.write_text("instructions:\n  STS12: a\n  STS13: b\n  STS12: c\n")
    with pytest.raises(DataFormatError) as err:
        read_yaml(f)
    assert str(err.value) == (
        f"{f}:4:3: key 'STS12' appears twice in one mapping (first on line 2); names must be unique"
    )
    f.write_text("train: {lr: 1, lr: 2}\n")  # on one line too
    with pytest.raises(DataFormatError, match=r":1:16: key 'lr' appears twice"):
        read_yaml(f)
    # a mapping with a merge key, aliased again: its merged keys are no second key
    f.write_text("b: &b\n  x: 1\nm: &m\n  <<: *b\n  x: 2\nc:\n  <<: *m\n  y: 3\nd: *m\n")
    assert read_yaml(f)["d"] == {"x": 2}
    for path in BUILTIN.values():
        assert read_yaml(path) == yaml.safe_load(path.read_text(encoding="utf-8"))


def test_yaml_files_are_read_with_one_line_errors(tmp_path: Path) -> None:
    """The one YAML reader: values as written; a broken file names itself and the line (not
    PyYAML's several-line drawing), a non-UTF-8 one the line of the byte."""
    from cselab.io.readers import read_yaml

    good = tmp_path / "config.yaml"
    good.write_text("train:\n  lr: 3.0e-05\n  steps: [1, 2]\n", encoding="utf-8")
    assert read_yaml(good) == {"train": {"lr": 3e-05, "steps": [1, 2]}}
    bad = tmp_path / "cselab_config.yaml"
    bad.write_text("model:\n  name: x\n   pooler: [cls\n", encoding="utf-8")
    with pytest.raises(DataFormatError) as err:
        read_yaml(bad)
    assert str(err.value).startswith(f"{bad}:3:10: invalid YAML: ")
    assert "\n" not in str(err.value)
    from cselab.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=rf"^{bad}:3:10: invalid YAML: "):  # same line via config
        load_config(bad)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"a: 1\nb: caf\xe9\n")
    with pytest.raises(DataFormatError, match=r"latin\.yaml:2: "):
        read_yaml(latin)
