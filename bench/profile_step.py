"""Eager against compiled training step, in one process: seconds per step and a profile of each.

The step of ``bench/bench_compile.py`` (MiniLM, SimCSE's ``cls`` pooler and head, batch 64,
``max_seq_len`` 32, fp32): ``--rounds`` alternating rounds of 4 steps each (medians), then
``torch.profiler`` over 4 steps of each side (top operators by self CPU time). Take it on a
quiet machine; the profiler's own overhead weighs more on the compiled side's few large calls.

    python bench/profile_step.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import bench_compile
import harness
from torch.profiler import ProfilerActivity, profile


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    from cselab.model.encoder import compile_encoder

    enc = bench_compile.build(harness.minilm_path(), 32)
    data = bench_compile.batches(enc, harness.wiki_lines(), 64, 8)
    steps = {
        "eager": bench_compile.step_fn(enc, enc, "fp32"),
        "compiled": bench_compile.step_fn(enc, compile_encoder(enc), "fp32"),
    }
    t0 = time.perf_counter()
    steps["compiled"](data[0])
    print(f"compile (first step): {time.perf_counter() - t0:.1f} s")
    steps["eager"](data[0])
    times: dict[str, list[float]] = {side: [] for side in steps}
    for _ in range(args.rounds):
        for side, step in steps.items():
            t0 = time.perf_counter()
            for batch in data[1:5]:
                step(batch)
            times[side].append((time.perf_counter() - t0) / 4)
    for side, values in times.items():
        rounds = ", ".join(f"{v:.3f}" for v in values)
        print(f"{side}: {statistics.median(values):.3f} s/step (rounds {rounds})")
    for side, step in steps.items():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for batch in data[2:6]:
                step(batch)
        print(f"### {side}")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))


if __name__ == "__main__":
    main()
