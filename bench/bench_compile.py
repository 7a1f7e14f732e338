"""Benchmark: cselab's training step eager vs ``train.compile`` (one graph), on CPU.

One process, the same encoder (default: the packaged all-MiniLM-L6-v2 with SimCSE's ``cls``
pooler and MLP head), the same batches of wiki sentences (``--batch-size``, ``max_seq_len``
``--max-seq-len``): a SimCSE step is two training forwards of the batch, InfoNCE (τ = 0.05),
backward and AdamW. Reports:

* ``torch._dynamo.explain`` of the two training forwards: graphs and graph breaks;
* operators dispatched per forward+backward (``torch.profiler`` events named ``aten::*`` or
  ``cselab::*``, counted, not timed: the same on a loaded machine as on a quiet one), eager and
  compiled;
* the peak bytes autograd keeps for the backward in one eager step
  (``saved_tensors.SavedTensorMeter``);
* seconds per step, eager and compiled, alternating ``--rounds`` rounds of ``--steps`` steps
  after the compile (medians), with the load average: timings are only meaningful on a quiet
  machine.

    nice python bench/bench_compile.py                    # MiniLM, batch 64, fp32
    nice python bench/bench_compile.py --precision bf16   # CPU autocast
    python bench/bench_compile.py --smoke                 # tiny random BERT, for the test
"""

from __future__ import annotations

import argparse
import collections
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
from saved_tensors import SavedTensorMeter


def build(model: str, max_seq_len: int) -> Any:
    from cselab.model.encoder import SentenceEncoder

    enc = SentenceEncoder.from_pretrained(
        model, pooler="cls", mlp_only_train=True, max_seq_len=max_seq_len
    )
    return enc.train()


def batches(enc: Any, sentences: list[str], size: int, count: int) -> list[dict[str, Any]]:
    return [enc.tokenize(sentences[i * size : (i + 1) * size]) for i in range(count)]


def step_fn(enc: Any, forward: Any, precision: str) -> Any:
    """One SimCSE step with ``forward`` (the encoder or its compiled wrapper)."""
    import torch
    import torch.nn.functional as F

    optim = torch.optim.AdamW(enc.parameters(), lr=3e-5)

    def step(batch: dict[str, Any], optimize: bool = True) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            z1 = forward(batch["input_ids"], batch["attention_mask"]).float()
            z2 = forward(batch["input_ids"], batch["attention_mask"]).float()
        sim = F.normalize(z1, dim=-1) @ F.normalize(z2, dim=-1).T / 0.05
        F.cross_entropy(sim, torch.arange(len(sim))).backward()
        if optimize:
            optim.step()
        optim.zero_grad(set_to_none=True)

    return step


def op_counts(step: Any, batch: dict[str, Any]) -> collections.Counter:
    """Operators dispatched in one forward+backward (the optimizer is the same for both sides):
    ``aten::``/``cselab::`` profiler events by name."""
    prof = harness.cpu_profiler()
    with prof:
        step(batch, optimize=False)
    names = [e.name for e in prof.events() if e.name.startswith(("aten::", "cselab::"))]
    return collections.Counter(names)


def explain(enc: Any, batch: dict[str, Any]) -> tuple[int, int, list[str]]:
    import torch

    def two_views(ids: Any, mask: Any) -> Any:
        return (enc(ids, mask) * enc(ids, mask)).sum()

    torch._dynamo.reset()
    torch._dynamo.config.capture_dynamic_output_shape_ops = True  # as compile_encoder sets it
    out = torch._dynamo.explain(two_views)(batch["input_ids"], batch["attention_mask"])
    return out.graph_count, out.graph_break_count, [r.reason for r in out.break_reasons]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="default: the packaged all-MiniLM-L6-v2")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-seq-len", type=int, default=32)
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--steps", type=int, default=10, help="timed steps per side and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--mode", default=None, help="torch.compile mode, e.g. max-autotune")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--smoke", action="store_true", help="tiny random BERT, 2 steps, 1 round")
    args = p.parse_args(argv)
    import torch

    from cselab.model.encoder import compile_encoder

    threads_before = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        return _run(args, compile_encoder)
    finally:  # a caller (the smoke test) keeps its own thread count
        torch.set_num_threads(threads_before)


def _run(args: argparse.Namespace, compile_encoder: Any) -> dict[str, Any]:

    with tempfile.TemporaryDirectory(prefix="bench-compile-") as tmp:
        if args.smoke:
            model_dir, train = harness.make_smoke_assets(Path(tmp))
            args.model, args.batch_size, args.steps, args.rounds = str(model_dir), 8, 2, 1
            sentences = train.read_text(encoding="utf-8").splitlines()
        else:
            args.model = args.model or harness.minilm_path()
            sentences = harness.wiki_lines()
        print(f"device: {harness.cpu_description()}", flush=True)
        enc = build(args.model, args.max_seq_len)
        data = batches(enc, sentences, args.batch_size, args.steps + 3)
        graphs, breaks, reasons = explain(enc, data[0])
        print(f"explain: {graphs} graph(s), {breaks} graph break(s) {reasons}", flush=True)
        eager = step_fn(enc, enc, args.precision)
        with SavedTensorMeter(enc) as meter:
            eager(data[0])
        saved_mib = meter.peak_bytes / 2**20
        compiled = step_fn(enc, compile_encoder(enc, mode=args.mode), args.precision)
        t0 = time.perf_counter()
        compiled(data[0])  # the compile
        compile_s = time.perf_counter() - t0
        counts = {"eager": op_counts(eager, data[1]), "compiled": op_counts(compiled, data[1])}
        times: dict[str, list[float]] = {"eager": [], "compiled": []}
        loads = []
        for _ in range(args.rounds):
            for side, step in (("eager", eager), ("compiled", compiled)):
                step(data[2])  # warm
                t0 = time.perf_counter()
                for batch in data[3:]:
                    step(batch)
                times[side].append((time.perf_counter() - t0) / args.steps)
                loads.append(harness.load1())
    result = {
        "graphs": graphs,
        "graph_breaks": breaks,
        "saved_for_backward_mib": saved_mib,
        "compile_s": compile_s,
        "ops_per_step": {k: sum(v.values()) for k, v in counts.items()},
        "top_ops": {k: v.most_common(8) for k, v in counts.items()},
        "s_per_step": {k: statistics.median(v) for k, v in times.items()},
        "s_per_step_rounds": times,
        "load1": loads,
        "peak_rss_mib": harness.peak_rss_mib(),
    }
    speedup = result["s_per_step"]["eager"] / result["s_per_step"]["compiled"]
    print(
        f"{args.precision}, batch {args.batch_size}: explain {graphs} graph(s), {breaks} breaks; "
        f"ops/step eager {result['ops_per_step']['eager']}, compiled "
        f"{result['ops_per_step']['compiled']}; saved for backward (eager) {saved_mib:.1f} MiB; "
        f"compile {compile_s:.0f} s; s/step eager {result['s_per_step']['eager']:.3f}, compiled "
        f"{result['s_per_step']['compiled']:.3f} (compiled {speedup:.2f}x); "
        f"load {min(loads):.1f}-{max(loads):.1f}",
        flush=True,
    )
    for side, top in result["top_ops"].items():
        print(f"  {side} top ops: {top}")
    return result


if __name__ == "__main__":
    main()
