"""``metrics.csv`` has one reader, beside its writer (:func:`cselab.training.metrics.read_metrics`),
used by a resumed run, the model card and ``cselab plot``: a last line cut while the run was
appending it is left out with a warning, a file that is not the writer's format is one line
naming the file and line, and a resumed run rewrites the kept rows byte for byte. Property
tests: any bytes give a table or the project's own error; a valid file cut anywhere gives
exactly its complete rows."""

from __future__ import annotations

import contextlib
import logging
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cselab.cli import main
from cselab.core.errors import DataFormatError, UserError
from cselab.insight.plots import read_run
from cselab.publish import card
from cselab.training.metrics import MetricsLog, read_metrics

SETTINGS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

#: Rows as the trainer logs them: step 0 holds only the evaluation, training rows add the loss,
#: its terms and the throughput; ``tokens`` is an integer column.
ROWS = [
    {"step": 0, "stsb_dev": 61.25, "align": 0.31, "uniform": -2.1},
    *(
        {
            "step": s,
            "epoch": round(s / 7, 4),
            "lr": 3e-5 * (1 - s / 8),
            "loss": 2.0 / s,
            "infonce": 1.5 / s,
            "dcl": 0.5 / s,
            "tokens": 512 * s,
            "sentences_per_s": 123.456789 + s,
            **({"stsb_dev": 60 + s / 3, "align": 0.3, "uniform": -2.2} if s % 4 == 0 else {}),
        }
        for s in range(2, 9, 2)
    ),
]


def write_log(folder: Path, rows: list[dict] = ROWS) -> Path:
    """Write ``rows`` with the trainer's own writer."""
    folder.mkdir(parents=True, exist_ok=True)
    log = MetricsLog(folder)
    for row in rows:
        log.write(row)
    return log.path


def test_a_written_file_reads_back_exactly(tmp_path: Path) -> None:
    path = write_log(tmp_path)
    table = read_metrics(path)
    assert table.columns[:4] == ["step", "stsb_dev", "align", "uniform"]
    assert table.rows == ROWS
    assert all(type(r["step"]) is int for r in table.rows)
    assert type(table.rows[1]["tokens"]) is int and type(table.rows[1]["loss"]) is float


@pytest.mark.parametrize("keep", ["-3", "cells"])
def test_a_last_line_cut_while_appending_is_left_out_with_a_warning(
    tmp_path: Path, caplog, keep: str
) -> None:
    """A crash while appending the step-8 row: cut inside its last number (``131.45`` of
    ``131.456789``: a number that still parses) or before its last cells. The reader, and through it the
    plot and the model card, leave the row out and say so."""
    path = write_log(tmp_path)
    text = path.read_bytes()
    last_start = text.rstrip(b"\r\n").rfind(b"\n") + 1
    cut = len(text) - 6 if keep == "-3" else last_start + 12
    path.write_bytes(text[:cut])
    assert not path.read_bytes().endswith(b"\n")
    with caplog.at_level(logging.WARNING, logger="cselab"):
        table = read_metrics(path)
    assert [r["step"] for r in table.rows] == [0, 2, 4, 6]
    assert table.rows == read_metrics_of(ROWS[:4], tmp_path / "whole")
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"{path}:6:" in warning and "left out" in warning
    # the plot and the card read the same rows
    run = read_run(tmp_path)
    assert run.series["loss"][0] == [2, 4, 6] and run.series["stsb_dev"][0] == [0, 4]
    assert card.read_metrics(path) == table.rows
    assert [p[0] for p in card.dev_curve(card.read_metrics(path))] == [0, 4]


def read_metrics_of(rows: list[dict], folder: Path) -> list[dict]:
    return read_metrics(write_log(folder, rows)).rows


def test_a_cut_after_the_carriage_return_keeps_the_row(tmp_path: Path) -> None:
    """The writer ends rows with \\r\\n: a cut between the two leaves a complete row."""
    path = write_log(tmp_path)
    path.write_bytes(path.read_bytes()[:-1])
    assert [r["step"] for r in read_metrics(path).rows] == [0, 2, 4, 6, 8]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            b"step,loss\n2,0.5\n4,0.25\xff\n",
            r"metrics.csv:3: invalid UTF-8 at byte 6 of the line \(0xff\)",
        ),
        (b"", r"metrics.csv: empty file: no header row"),
        (b"loss,lr\n0.5,1\n", r"metrics.csv:1: no 'step' column"),
        (b"step,loss,loss\n2,0.5,0.4\n", r"metrics.csv:1: column 'loss' appears twice"),
        (b"step,,loss\n2,,0.4\n", r"metrics.csv:1: column 2 of the header has no name"),
        (b"step,loss\n2,0.5,7\n", r"metrics.csv:2: 3 cell\(s\), but the header names 2 columns"),
        (b"step,loss\n2\n4,0.3\n", r"metrics.csv:2: 1 cell\(s\), but the header names 2 columns"),
        (b"step,loss\n2.5,0.5\n", r"metrics.csv:2: step '2.5' is not an integer"),
        (b"step,loss\n2,0.5\n4,oops\n", r"metrics.csv:3: column 'loss' has non-number 'oops'"),
        (b"step,loss\n2," + b"1" * 200_000 + b"\n", r"metrics.csv:2: not a CSV table"),
    ],
)
def test_files_not_in_the_writers_format_are_one_line(
    tmp_path: Path, capsys, content: bytes, message: str
) -> None:
    path = tmp_path / "metrics.csv"
    path.write_bytes(content)
    with pytest.raises(DataFormatError, match=message):
        read_metrics(path)
    assert main(["plot", str(tmp_path), "-o", str(tmp_path / "x.png")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("cselab plot: error: ") and str(path) in line


def test_a_resumed_run_rewrites_the_kept_rows_byte_for_byte(tmp_path: Path) -> None:
    path = write_log(tmp_path)
    lines = path.read_bytes().splitlines(keepends=True)
    MetricsLog(tmp_path, resume_step=4)
    # header, step 0, 2 and 4: exactly as the interrupted run wrote them
    assert path.read_bytes() == b"".join(lines[:4])


def test_the_card_without_a_file_has_no_rows(tmp_path: Path) -> None:
    assert card.read_metrics(None) == card.read_metrics(tmp_path / "metrics.csv") == []


# ------------------------------------------------------------------------------ properties

# CSV-like text reaches the header, row and number checks far more often than raw bytes.
cells = st.one_of(
    st.sampled_from(["step", "loss", "lr", "stsb_dev", "0", "4", "-2", "0.5", "1e-5", "nan",
                     "inf", "", " ", "x", '"', '"a,b"', "7.", "1_0", "\ufeff"]),
    st.text(max_size=4),
)  # fmt: skip
csv_like = st.lists(st.lists(cells, max_size=5).map(",".join), max_size=6).flatmap(
    lambda lines: st.sampled_from(["\n", "\r\n", "\r"]).map(lambda end: end.join(lines).encode())
)


@SETTINGS
@given(data=st.one_of(st.binary(max_size=200), csv_like))
@example(data=b"step,loss\n2,0.5\n4,0.2")
@example(data=b"step\n\x00\n")
@example(data=b"step,loss\n" + b"9" * 5000 + b",1\n")
def test_any_bytes_give_a_table_or_a_user_error(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "metrics.csv"
    path.write_bytes(data)
    try:
        table = read_metrics(path)
    except UserError as err:
        assert isinstance(err, DataFormatError) and str(path) in str(err)
        assert "\n" not in str(err)
        return
    assert "step" in table.columns and len(set(table.columns)) == len(table.columns)
    for row in table.rows:
        assert type(row["step"]) is int
        assert set(row) <= set(table.columns)
        assert all(isinstance(v, int | float) for v in row.values())


@SETTINGS
@given(cut=st.integers(min_value=0, max_value=10_000))
def test_a_valid_file_cut_anywhere_gives_exactly_its_complete_rows(
    tmp_path: Path, cut: int
) -> None:
    path = write_log(tmp_path / "full")
    text = path.read_bytes()
    cut = cut % (len(text) + 1)
    short = tmp_path / "metrics.csv"
    short.write_bytes(text[:cut])
    header_end = text.index(b"\r\n")
    if cut <= header_end:  # cut inside the header: at best a header without rows
        with contextlib.suppress(DataFormatError):
            assert read_metrics(short).rows == []
        return
    # a row is complete once its line end has begun (\r of \r\n)
    complete = text[header_end + 2 : cut].count(b"\r")
    table = read_metrics(short)
    expected = read_metrics(path).rows[:complete]
    assert len(table.rows) == complete
    for got, want in zip(table.rows, expected, strict=True):
        assert got.keys() == want.keys()
        assert all(got[k] == want[k] or (math.isnan(got[k]) and math.isnan(want[k])) for k in got)
