"""A decoder's training step on packed rows against the padded step, on the CPU.

LLM2Vec's SimCSE recipe trains a bidirectional decoder on wiki sentences with 128 tokens a
row; padded to the longest of each batch, most positions are padding. cselab's fast path
packs the sentences into rows (:mod:`cselab.model.packing`); ``model.pack_rows: false`` runs
the padded forward. Both sides are the trainer's own step (``build_trainer``, the batches as
the loop takes them, AdamW), in one process, alternating rounds (ABBA), on a random decoder of
Qwen2-0.5B's layer shape (width 896, MLP 4864, 14 query and 2 key/value heads, fewer layers:
two by default) with the MiniLM tokenizer, dropout 0.1, mean pooling, bidirectional. Reports
sentences/s per side, their ratio, the batches' padding and the packed rows' fill, in fp32 and
(where the CPU has it) bf16. Writes ``docs/results/packing_benchmark.md``::

    python bench/bench_packing.py                  # ~3 minutes on 2 cores
    python bench/bench_packing.py --smoke          # tiny shapes, a few seconds
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_backbones  # noqa: E402
import harness  # noqa: E402

DEFAULT_OUT = harness.RESULTS / "packing_benchmark.md"
SIDES = ("packed", "padded")


def trainer(model: Path, train: Path, work: Path, args: argparse.Namespace, side: str,
            precision: str) -> Any:  # fmt: skip
    """The trainer of one side (``model.pack_rows`` true: packed rows; false: padded)."""
    from cselab.app.train import build_trainer
    from cselab.config import load_config

    overrides = [
        f"--model.name_or_path={model}", "--model.pooler=avg", "--model.bidirectional=true",
        f"--model.max_seq_len={args.max_seq_len}", f"--model.pack_rows={side == 'packed'}",
        f"--data.train_file={train}", f"--data.cache_dir={work / 'cache'}",
        f"--train.output_dir={work / side}", f"--train.batch_size={args.batch_size}",
        "--train.max_steps=1000", "--train.eval_steps=0", "--train.report_to=[]",
        f"--train.precision={precision}",
    ]  # fmt: skip
    built = build_trainer(load_config(None, overrides))
    built.encoder.train()
    return built


def shares(t: Any, steps: int) -> tuple[float, float]:
    """The padding share of ``steps`` batches' doubled rows and the packed rows' fill."""
    from cselab.model.packing import row_layout

    padded, fill = [], []
    with contextlib.closing(t.batches(0)) as batches:
        for _ in range(steps):
            mask = next(batches).inputs.anchors["attention_mask"].cpu().numpy()
            padded.append(1 - mask.mean())
            fill.append(row_layout(mask.repeat(2, 0)).filled)
    return sum(padded) / steps, sum(fill) / steps


def measure(args: argparse.Namespace, precision: str, model: Path, train: Path,
            work: Path) -> dict[str, Any]:  # fmt: skip
    """Sentences/s of each side over ``args.rounds`` ABBA rounds of ``args.steps`` steps."""
    trainers = {side: trainer(model, train, work, args, side, precision) for side in SIDES}
    steps = {side: harness.trainer_step(t) for side, t in trainers.items()}
    for side in SIDES:  # warm-up: the allocator, the first step's one-off costs
        steps[side](0)
    seconds: dict[str, list[float]] = {side: [] for side in SIDES}
    for r, side in harness.alternation(SIDES, args.rounds, abba=True):
        start = time.perf_counter()
        for i in range(args.steps):
            steps[side](1 + r * args.steps + i)
        seconds[side].append(time.perf_counter() - start)
    for step in steps.values():
        step.close()
    rates = {s: [args.steps * args.batch_size / x for x in v] for s, v in seconds.items()}
    padding, fill = shares(trainers["packed"], 8)
    return {
        "precision": precision,
        "sentences_per_s": {s: harness.median(v) for s, v in rates.items()},
        "ratio": harness.ratio(rates["packed"], rates["padded"]),
        "round_ratios": harness.round_ratios(rates["packed"], rates["padded"]),
        "padding": padding,
        "packed_fill": fill,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny shapes, one round")
    p.add_argument("--layers", type=int, default=2, help="decoder layers (Qwen2-0.5B: 24)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=2, help="steps per round")
    p.add_argument("--rounds", type=int, default=2, help="ABBA rounds")
    p.add_argument("--precisions", default=None, help="comma-separated (default fp32, and bf16 "
                   "where the CPU has it)")  # fmt: skip
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    if args.smoke:
        args.batch_size, args.steps, args.rounds = 8, 1, 1
    bf16 = harness.cpu_description()["native_bf16"]
    precisions = (args.precisions or ("fp32,bf16" if bf16 and not args.smoke else "fp32")).split(
        ","
    )
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        # Qwen2-0.5B's layer shape, fewer layers, the MiniLM tokenizer's vocabulary
        overrides = {"num_hidden_layers": args.layers, "vocab_size": 30522,
                     "tie_word_embeddings": False}  # fmt: skip
        model = bench_backbones.make_model("qwen2-0.5b", work / "model", args.smoke, overrides)
        train = bench_backbones.corpus(work, 20 * args.batch_size)
        load = harness.load1()
        rows = [measure(args, precision, model, train, work) for precision in precisions]
    report = {
        "command": harness.command("bench_packing.py", argv),
        "cpu": harness.cpu_description(),
        "load1_before": load,
        "versions": harness.versions(),
        "settings": {k: v for k, v in vars(args).items() if k != "out"} | {"out": str(args.out)},
        "results": rows,
    }
    text = page(report)
    print(text)
    if not args.smoke:
        harness.write_page(args.out, text)
        harness.write_json(args.out.with_suffix(".json"), report)
    return report


def page(report: dict[str, Any]) -> str:
    s = report["settings"]
    lines = [
        "# A decoder's training step on packed rows against the padded step (CPU)",
        "",
        f"`{report['command']}`; CPU: {report['cpu'].get('model', '?')}, load average "
        f"{report['load1_before']:.2f} before the run; a random decoder of Qwen2-0.5B's layer "
        f"shape with {s['layers']} layers, bidirectional, mean pooling, dropout 0.1, batch "
        f"{s['batch_size']} on the wiki sample at `max_seq_len` {s['max_seq_len']}; "
        f"{s['rounds']} ABBA rounds of {s['steps']} steps per side after a warm-up step.",
        "",
        "| precision | packed sent/s | padded sent/s | packed ÷ padded (per round) | padding "
        "of the batches | packed rows filled |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in report["results"]:
        rate = r["sentences_per_s"]
        rounds = ", ".join(f"{x:.2f}" for x in r["round_ratios"])
        lines.append(
            f"| {r['precision']} | {rate['packed']:.1f} | {rate['padded']:.1f} | "
            f"**{r['ratio']:.2f}×** ({rounds}) | {100 * r['padding']:.0f}% | "
            f"{100 * r['packed_fill']:.0f}% |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
