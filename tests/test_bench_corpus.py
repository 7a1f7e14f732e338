"""The corpus benchmark script runs end to end on a small corpus (slow: it spawns 3 processes)."""

from __future__ import annotations

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
