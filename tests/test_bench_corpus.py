"""The corpus benchmark script runs end to end on a small corpus (slow: it spawns 3 processes)."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_corpus.py"


@pytest.mark.slow
def test_bench_corpus_small_run_writes_the_tables(tmp_path: Path, wiki_file: Path) -> None:
    pytest.importorskip("datasets")
    spec = importlib.util.spec_from_file_location("bench_corpus", BENCH)
    bench = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules["bench_corpus"] = bench
    spec.loader.exec_module(bench)
    out = tmp_path / "corpus.md"
    argv = ["--lines", "3000", "--steps", "2", "--work-dir", str(tmp_path / "w"), "--out", str(out)]
    assert bench.main(argv) == 0
    text = out.read_text()
    assert "| 3,000 |" in text and "## Training 2 steps (tiny random BERT" in text
    lines = (tmp_path / "w" / "synthetic-3000.txt").read_text().splitlines()
    wiki = wiki_file.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 3000 and sorted(lines[0].split()) == sorted(wiki[0].split())


def _bench():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("bench_corpus", BENCH)
    bench = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules["bench_corpus"] = bench
    spec.loader.exec_module(bench)
    return bench


def test_a_section_replaces_its_namesake_or_goes_before_the_notes() -> None:
    put = _bench().put_section
    doc = "# T\n\nintro\n\n## A\n\na\n\n## Notes\n\n* n\n"
    once = put(doc, "## B\n\nb1\n")
    assert once == "# T\n\nintro\n\n## A\n\na\n\n## B\n\nb1\n\n## Notes\n\n* n\n"
    assert put(once, "## B\n\nb2\n") == once.replace("b1", "b2")
    assert put("# T\n", "## B\n\nb\n") == "# T\n\n## B\n\nb\n"


@pytest.mark.slow
def test_bench_corpus_triplets_only_run_adds_its_section(tmp_path: Path, wiki_file: Path) -> None:
    bench = _bench()
    out = tmp_path / "corpus.md"
    out.write_text("# Corpus\n\n## Training 20 steps\n\n| 1 |\n\n## Notes\n\n* kept\n")
    argv = ["--lines", "--triplets", "2000", "--steps", "2", "--work-dir", str(tmp_path / "w"),
            "--out", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    text = out.read_text()
    assert text.startswith("# Corpus\n\n## Training 20 steps\n\n| 1 |\n\n" + bench.TRIPLETS_HEADING)
    assert text.endswith("## Notes\n\n* kept\n") and "| 2,000 | " in text
    with (tmp_path / "w" / "triplets-2000.csv").open(encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == ["anchor", "positive", "negative"] and len(rows) == 2001
    assert sorted(rows[1][0].split()) == sorted(rows[1][1].split()) != sorted(rows[1][2].split())
    assert bench.main([*argv, "--reuse"]) == 0  # the section is replaced, not added again
    again = out.read_text()
    assert again.count(bench.TRIPLETS_HEADING) == 1 and again.endswith("## Notes\n\n* kept\n")
