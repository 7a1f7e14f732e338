"""``bench/bench_lora_memory.py --smoke``: every side on the tiny shape, one step each."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _load_bench():
    sys.path.insert(0, str(REPO / "bench"))  # its harness
    spec = importlib.util.spec_from_file_location(
        "bench_lora_memory", REPO / "bench" / "bench_lora_memory.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_bench_lora_memory_smoke(tmp_path: Path) -> None:
    bench = _load_bench()
    page = tmp_path / "page.md"
    argv = ["--smoke", "--sides", "full,lora,lora+gc", "--out", str(page)]
    runs = {r["side"]: r for r in bench.main(argv)}
    assert list(runs) == ["full", "lora", "lora+gc"]
    full, lora = runs["full"], runs["lora"]
    # LoRA adds the adapters' weights and trains only those: fewer gradients and AdamW moments
    assert lora["params_mib"] > full["params_mib"]
    assert lora["trainable_params"] < full["trainable_params"]
    assert 0 < lora["grads_mib"] < full["grads_mib"]
    # exp_avg and exp_avg_sq, each the size of the gradients, and a 4-byte step per tensor
    steps_mib = 0.01  # a few hundred tensors at most
    assert 2 * lora["grads_mib"] <= lora["optimizer_mib"] <= 2 * lora["grads_mib"] + steps_mib
    assert runs["lora+gc"]["trainable_params"] == lora["trainable_params"]
    assert all(r["peak_rss_mib"] > 0 for r in runs.values())
    assert "| lora |" in page.read_text(encoding="utf-8")
