"""io.files.write_table: what it writes reads back through io.readers.open_table unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cselab.core.errors import WriteError
from cselab.io.files import write_table
from cselab.io.readers import open_table

# Text a table cell can hold for every reader: not blank (the readers refuse empty values and
# skip blank rows), no lone surrogates (not UTF-8).
CELL = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12
).filter(lambda s: bool(s.strip()))
TSV_CELL = CELL.filter(lambda s: not any(c in s for c in "\t\n\r"))
CSV_CELL = CELL.filter(lambda s: "\r\n" not in s)


def _read_back(path: Path, header: list[str]) -> list[list[str]]:
    table = open_table(path)
    assert list(table.columns) == header
    return [[row.text(name) for name in header] for row in table]


@pytest.mark.parametrize(
    ("suffix", "cell"), [(".tsv", TSV_CELL), (".csv", CSV_CELL), (".jsonl", CELL)]
)
def test_rows_read_back_unchanged(
    tmp_path_factory: pytest.TempPathFactory, suffix: str, cell
) -> None:
    folder = tmp_path_factory.mktemp("tables")

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(st.lists(cell, min_size=3, max_size=3), min_size=1, max_size=8))
    def check(rows: list[list[str]]) -> None:
        path = folder / f"t{suffix}"
        header = ["anchor", "positive", "negative"]
        assert write_table(path, header, rows) == len(rows)
        assert _read_back(path, header) == rows

    check()


def test_tsv_refuses_a_tab_and_leaves_the_previous_file(tmp_path: Path) -> None:
    path = tmp_path / "out.tsv"
    write_table(path, ["a", "b"], [["x", "y"]])
    with pytest.raises(WriteError, match=r"row 2, column 'b' holds a tab or a line break"):
        write_table(path, ["a", "b"], iter([["x", "y"], ["x", "y\tz"]]))
    assert path.read_text() == "a\tb\nx\ty\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.tsv"]


def test_a_failing_row_source_leaves_no_output(tmp_path: Path) -> None:
    def rows():
        yield ["x", "y"]
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        write_table(tmp_path / "out.jsonl", ["a", "b"], rows())
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("name", "header", "rows", "message"),
    [
        ("x.txt", ["a"], [["x"]], "unknown table format '.txt'"),
        ("x.csv", ["a", "a"], [["x", "y"]], "column names must be unique"),
        ("x.csv", ["a", "b"], [["x"]], "row 1 has 1 fields, the header 2"),
        ("x.csv", ["a"], [["x\r\ny"]], "row 1, column 'a' holds a CRLF line break"),
    ],
)
def test_bad_tables_are_one_line(tmp_path: Path, name, header, rows, message) -> None:
    with pytest.raises(WriteError, match=message):
        write_table(tmp_path / name, header, rows)
    assert list(tmp_path.iterdir()) == []
