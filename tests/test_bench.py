"""The GPU benchmark script runs (``--smoke``: tiny random BERT on CPU, cselab and the
sentence-transformers peer, plus the GradCache table). Never a GPU measurement in tests."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_gpu.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_gpu", BENCH)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules["bench_gpu"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_bench_smoke_runs_and_reports(tmp_path: Path, one_thread: None) -> None:
    """The report's derived figures are the measured ones recombined, not placeholders."""
    pytest.importorskip("sentence_transformers")
    bench = load_bench()
    out, table = tmp_path / "bench.json", tmp_path / "bench.md"
    argv = ["--smoke", "--batch-sizes", "8", "--steps", "2", "--warmup", "1",
            "--gradcache-chunks", "4", "--out", str(out), "--markdown", str(table)]  # fmt: skip
    report = bench.main(argv)
    assert json.loads(out.read_text())["results"][0]["batch"] == 8
    row = report["results"][0]
    for system in ("cselab", "peer"):
        assert 0 < row[system]["step_s"] < 60
        assert row[system]["tokens_per_s"] == pytest.approx(2 * 8 * 32 / row[system]["step_s"])
        assert row[system]["mfu"] is None  # no peak known for a CPU
    assert row["speedup"] == pytest.approx(row["peer"]["step_s"] / row["cselab"]["step_s"])
    chunks = {r["chunk"]: r for r in report["gradcache"]}
    assert chunks[4]["saved_activations_mib"] < chunks[None]["saved_activations_mib"]
    assert "| 8 | cselab |" in table.read_text()
    assert report["command"].startswith("python bench/bench_gpu.py --smoke")


def test_bench_flop_count_of_bert_base() -> None:
    bench = load_bench()
    shape = bench.BERT_BASE
    # 12 layers × (2·12·d² + 4·L·d) per token, d = 768, L = 32; plus the 2·d² head per sentence.
    per_token = 12 * (24 * 768**2 + 4 * 32 * 768)
    assert shape.forward_flops(1, 32) == 32 * per_token + 2 * 768**2
    assert shape.forward_flops(1, 32, head=False) == 32 * per_token
    assert bench.bf16_peak(torch.device("cpu"), 500.0) == (500e12, "--peak-tflops")


def test_the_benchmarks_take_the_batches_as_the_loop_does(
    tiny_bert: Path, tmp_path: Path, one_thread: None
) -> None:
    """``harness.trainer_step``: one batch iterator for the consecutive steps (on a GPU its
    thread collates ahead, as in the loop), not a new one each step; its batches are the
    loop's, and closing it stops the iterator."""
    sys.path.insert(0, str(BENCH.parent))
    import harness

    from cselab.app.train import build_trainer
    from test_trainer import tiny_config

    trainer = build_trainer(tiny_config(tiny_bert, tmp_path, "--train.max_steps=4"))
    opened, seen, real = [], [], trainer.batches

    def batches(start: int):  # noqa: ANN202
        opened.append(start)
        for batch in real(start):
            seen.append(batch.step)
            yield batch

    trainer.batches = batches
    with harness.trainer_step(trainer) as step:
        for i in range(3):
            step(i)
    assert opened == [0] and seen == [0, 1, 2]


def test_the_packing_benchmark_runs_both_sides(one_thread: None) -> None:
    """``bench/bench_packing.py --smoke``: the packed and the padded step, their ratio, the
    batches' padding and the packed rows' fill (shares, not placeholders)."""
    sys.path.insert(0, str(BENCH.parent))
    import bench_packing

    report = bench_packing.main(["--smoke"])
    (row,) = report["results"]
    assert set(row["sentences_per_s"]) == {"packed", "padded"}
    assert all(v > 0 for v in row["sentences_per_s"].values()) and row["ratio"] > 0
    assert 0 < row["padding"] < 1 and 1 - row["padding"] < row["packed_fill"] <= 1  # fuller
