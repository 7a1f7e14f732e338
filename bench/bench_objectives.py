"""Benchmark of the paper objectives on the CPU proxy (a script, not a test).

Trains the packaged all-MiniLM-L6-v2 (CLS pooling, SimCSE's MLP head in training only) for one
epoch over the 11,904 shared wiki sentences (batch 64, lr 3e-5, max_seq_len 32) with each
objective and seed, as the cells of a :mod:`cselab.insight.sweep` (in process), which evaluates the best
checkpoint (STS-B dev) on the 7 STS test tasks with :func:`cselab.evaluation.evaluate`.
``--report-only`` tabulates the kept runs, and ``--stats-out DIR`` adds the paired comparison
to SimCSE of :mod:`cselab.insight.report` (95% CIs, t-test and Wilcoxon p-values). A second, interleaved timing
pass measures the forward+backward time of one step per objective (round-robin, so every
objective sees the same machine load) relative to SimCSE.

These are proxy numbers on a small, already sentence-tuned model, not the papers' BERT-base
setting.

Usage (from the repository root; resumable: runs kept in ``--results-dir`` are skipped, and an
interrupted run continues from its last checkpoint in ``--workdir``)::

    # one process per seed and core, one thread each (seeds 1 and 2 here; then seed 3)
    for s in 1 2; do
        python bench/bench_objectives.py --seeds $s --threads 1 --timing-rounds 0 \\
            --workdir /tmp/cselab-bench-objectives --results-dir docs/results/objectives_runs &
    done; wait
    # the table from the kept runs
    python bench/bench_objectives.py --report-only --seeds 1 2 3 \\
        --results-dir docs/results/objectives_runs --out docs/results/objectives_table.md \\
        --stats-out docs/results/objectives_stats
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import harness

#: name -> (description, objective overrides)
OBJECTIVES: dict[str, tuple[str, list[str]]] = {
    "simcse": ("SimCSE (InfoNCE)", []),
    "focal": ("Focal-InfoNCE (m=0.3)", ["objective.focal.enabled=true"]),
    "gs": ("GS-InfoNCE (M=3×64, λ=1)", ["objective.gaussian.enabled=true"]),
    "off_dropout": ("Off-dropout (m=0.9)", ["objective.off_dropout.enabled=true"]),
    "dcl": ("DCL (λ=0.1, τ_DCL=5)", ["objective.dcl.enabled=true"]),
    "imsimcse": (
        "ImSimCSE (off-dropout + DCL)",
        ["objective.off_dropout.enabled=true", "objective.dcl.enabled=true"],
    ),
    "mixcse": ("MixCSE (λ=0.2, both directions)", ["objective.mixcse.enabled=true"]),
    "focal_mixcse_dcl": (
        "Combination: Focal + MixCSE + DCL",
        [
            "objective.focal.enabled=true",
            "objective.mixcse.enabled=true",
            "objective.dcl.enabled=true",
        ],
    ),
    "esimcse": (
        "ESimCSE (dup_rate 0.32, queue 160, momentum 0.995)",
        ["objective.word_repetition.enabled=true", "objective.momentum_queue.enabled=true"],
    ),
    "esimcse_focal": (
        "ESimCSE + Focal (the queue's columns scored by Focal)",
        [
            "objective.word_repetition.enabled=true",
            "objective.momentum_queue.enabled=true",
            "objective.focal.enabled=true",
        ],
    ),
    # PromptBERT is a pooler: the [MASK] of two templates as the two views, both denoised (the
    # authors' unsupervised setting); max_seq_len stays 32 like every row of the table.
    "promptbert": ("PromptBERT (prompt pooler, template denoising)", ["model.pooler=prompt"]),
}


def base_config(max_steps: int | None, eval_steps: int) -> dict[str, Any]:
    """Every run's config before its objective's overrides (the sweep sets seed and folder)."""
    return {
        "model": {
            "name_or_path": "sentence-transformers/all-MiniLM-L6-v2",
            "pooler": "cls",
            "mlp_only_train": True,
            "max_seq_len": 32,
        },
        "data": {"train_file": str(harness.WIKI)},
        "objective": {"temperature": 0.05},
        "train": {
            "batch_size": 64,
            "lr": 3e-5,
            "epochs": 1,
            "max_steps": max_steps,
            "eval_steps": eval_steps,
            "save_steps": 31,  # resumable checkpoints (6 per epoch)
            "device": "cpu",
            "precision": "fp32",
        },
        "eval": {"data_dir": str(harness.SENTEVAL)},
    }


def make_spec(
    names: list[str], seeds: list[int], workdir: Path, max_steps: int | None, eval_steps: int
) -> Any:
    """The benchmark as a :class:`cselab.insight.sweep.SweepSpec`: one cell per (objective, seed) in
    ``workdir/<objective>-seed<N>``, trained and evaluated in this process."""
    from cselab.insight.sweep import EvalSpec, SweepSpec

    return SweepSpec(
        base=base_config(max_steps, eval_steps),
        configs={n: OBJECTIVES[n][1] for n in names},
        seeds=seeds,
        output_root=workdir,
        baseline="simcse" if "simcse" in names else None,
        launcher="inprocess",
        evaluate=EvalSpec(tasks="sts", mode="test", data_dir=str(harness.SENTEVAL)),
        cell_dir="{config}-seed{seed}",
    )


def make_config(name: str, seed: int, workdir: Path, max_steps: int | None, eval_steps: int) -> Any:
    """The run's :class:`cselab.config.Config` (the same path as ``cselab train``)."""
    spec = make_spec([name], [seed], workdir, max_steps, eval_steps)
    return spec.cells()[0].build_config(spec)


def keep(out: Path, results_dir: Path | None) -> None:
    """Copy a finished run's ``bench.json`` and ``metrics.csv`` (a few KB) to ``results_dir``,
    which is committed: the full table takes longer than one session on the CPU proxy, and a
    later session continues from what is kept there."""
    from cselab.io.runfolder import RunFolder

    if results_dir is None:
        return
    dest = results_dir / out.name
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("bench.json", RunFolder.METRICS):
        if (out / name).is_file():
            shutil.copyfile(out / name, dest / name)


def run_one(
    name: str,
    seed: int,
    workdir: Path,
    max_steps: int | None,
    eval_steps: int,
    results_dir: Path | None = None,
) -> dict:
    """Train + STS test of one (objective, seed); cached in ``<run>/bench.json`` (and in
    ``results_dir``, when given, where a finished run is also looked up first)."""
    out = workdir / f"{name}-seed{seed}"
    done = out / "bench.json"
    if results_dir is not None and (results_dir / out.name / "bench.json").is_file():
        return json.loads((results_dir / out.name / "bench.json").read_text(encoding="utf-8"))
    if done.is_file():
        keep(out, results_dir)
        return json.loads(done.read_text(encoding="utf-8"))
    from cselab.insight.sweep import run_cell
    from cselab.io.runfolder import RunFolder

    spec = make_spec([name], [seed], workdir, max_steps, eval_steps)
    t0 = time.perf_counter()
    run_cell(spec, spec.cells()[0])  # resumes an interrupted run from its last checkpoint
    run = RunFolder(out)
    results = json.loads(run.results.read_text(encoding="utf-8"))
    sts = json.loads(run.evaluation.read_text(encoding="utf-8"))
    row = {
        "objective": name,
        "seed": seed,
        "best_stsb_dev": results["best_stsb_dev"],
        "initial_stsb_dev": results["initial_stsb_dev"],
        "best_step": results["best_step"],
        "steps": results["steps"],
        "train_time_s": results["train_time_s"],
        "s_per_step": median_step_seconds(out),
        "sts_test": sts["headline"]["sts"],
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    # keep results and metrics, drop the large model folders
    for folder in (run.checkpoint, run.last, run.best):
        shutil.rmtree(folder, ignore_errors=True)
    harness.write_json(done, row)
    keep(out, results_dir)
    print(
        f"[{name} seed {seed}] dev {row['best_stsb_dev']:.2f} (step {row['best_step']}) "
        f"test avg {row['sts_test']['Avg']:.2f}  {row['s_per_step']:.3f} s/step",
        flush=True,
    )
    return row


def median_step_seconds(run_folder: Path, batch_size: int = 64) -> float:
    """Median training seconds per step over the logged windows (robust to resumes and to
    load spikes on a shared machine; evaluation is not part of any window)."""
    rows = harness.logged_rows(run_folder)
    return harness.median(
        batch_size / r["sentences_per_s"] for r in rows if r.get("sentences_per_s")
    )


def interleaved_timing(
    names: list[str], rounds: int, warmup: int = 1, loss_rounds: int = 300
) -> dict:
    """Per-objective step costs, measured round-robin so that machine-load drift affects every
    objective alike.

    ``step_s``: median seconds of one training forward+backward (the task's step: views +
    objective, and its after-step work such as ESimCSE's momentum update) on a fixed batch of 64
    wiki sentences, objectives alternating step by step for ``rounds`` rounds; the encoder is
    the run's (one per model setting: PromptBERT's prompt pooler is part of its step).
    ``loss_ms``: median milliseconds of the objective's own forward+backward on fixed
    ``(64, 384)`` views (a stateful objective with its queue full), objectives alternating call by
    call for ``loss_rounds`` rounds: the cost the objective adds on top of the encoder passes it
    requests. ``state_mb``: what the task keeps across steps (ESimCSE: the queue and the momentum
    encoder's weights), in MiB, as saved in the checkpoint.
    """
    import torch

    load_start = harness.load1()
    from cselab.data import collate, tokenize_corpus
    from cselab.model.encoder import SentenceEncoder
    from cselab.objectives import ObjectiveContext, build_objective, total_loss
    from cselab.training.task import Batch, Task

    configs = {n: make_config(n, 0, Path("/tmp/unused"), None, 0) for n in names}
    encoders: dict[str, Any] = {}  # one encoder per model setting (PromptBERT's is its own)
    for cfg in configs.values():
        if repr(cfg.model) not in encoders:
            torch.manual_seed(0)
            encoders[repr(cfg.model)] = SentenceEncoder.from_config(cfg.model).train()
    encoder = next(iter(encoders.values()))
    corpus, _ = tokenize_corpus(harness.WIKI, encoder.tokenizer, 32)
    batch = collate(corpus.rows(list(range(64))), int(encoder.tokenizer.pad_token_id or 0))
    objectives = {n: build_objective(cfg.objective) for n, cfg in configs.items()}
    gen = torch.Generator()

    views = ("z1", "z2", "off", "momentum")
    fixed = {k: torch.randn(64, encoder.dim, generator=gen) for k in views}
    for obj in objectives.values():  # a queue as after a few steps (others keep nothing)
        for _ in range(4):
            obj.on_step_end(fixed, ObjectiveContext())
    loss: dict[str, list[float]] = {n: [] for n in names}
    for r in range(loss_rounds + 5):
        for name, obj in objectives.items():
            leaves = {
                k: v.clone().requires_grad_() for k, v in fixed.items() if k in obj.required_views
            }
            gen.manual_seed(r)
            t0 = time.perf_counter()
            total_loss(obj(leaves, ObjectiveContext(generator=gen))).backward()
            if r >= 5:
                loss[name].append((time.perf_counter() - t0) * 1e3)

    tasks = {
        n: Task(encoders[repr(configs[n].model)], obj, ObjectiveContext(generator=gen), seed=0)
        for n, obj in objectives.items()
    }
    step: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds + warmup):
        for name, task in tasks.items():
            t0 = time.perf_counter()
            total_loss(task(Batch(r, batch))).backward()
            task.after_step()
            elapsed = time.perf_counter() - t0
            task.encoder.zero_grad(set_to_none=True)
            if r >= warmup:
                step[name].append(elapsed)
    return {
        "cpu": harness.cpu_model(),
        "load1_at_start": load_start,
        "load1_at_end": harness.load1(),
        "rounds": rounds,
        "loss_rounds": loss_rounds,
        "step_s": {n: harness.median(t) for n, t in step.items()},
        "loss_ms": {n: harness.median(t) for n, t in loss.items()},
        "state_mb": {
            n: sum(v.numel() * v.element_size() for v in t.state_dict().values()) / 2**20
            for n, t in tasks.items()
        },
    }


def mean_std(values: list[float]) -> str:
    from cselab.insight.stats import mean_std as _mean_std

    mean, std = _mean_std(values)
    return f"{mean:.2f}" if len(values) == 1 else f"{mean:.2f} ± {std:.2f}"


def write_stats(rows: list[dict], out_dir: Path) -> str:
    """The paired comparison of every objective to SimCSE with the same seed
    (:mod:`cselab.insight.report`): ``objectives_stats.{md,csv,png}`` in ``out_dir``."""
    from cselab.insight.report import DEV_COLUMN, CellScores, build_report, headline_scores
    from cselab.insight.report import markdown as report_markdown
    from cselab.insight.report import write_report as write_files

    cells = [
        CellScores(
            r["objective"],
            r["seed"],
            {DEV_COLUMN: r["best_stsb_dev"], **headline_scores({"sts": r["sts_test"]})},
        )
        for r in rows
    ]
    report = build_report(cells, "simcse")
    write_files(report, out_dir, stem="objectives_stats")
    return report_markdown(report)


def write_report(
    rows: list[dict], timing: dict[str, float] | None, args: argparse.Namespace
) -> str:
    if not rows:
        return "No finished runs.\n"
    from cselab.evaluation.report import markdown_table

    seeds = sorted({r["seed"] for r in rows})
    by = {(r["objective"], r["seed"]): r for r in rows}
    header = ["objective", "seeds", "STS-B dev (best)", "STS test avg (7 tasks)", "best step",
              "median s/step", "step time vs SimCSE, same seed"]  # fmt: skip
    if timing:  # the interleaved columns only when timing.json was measured
        header += ["step time vs SimCSE, interleaved", "objective's own fwd+bwd (vs SimCSE step)"]
    table = []
    for name, (label, _) in OBJECTIVES.items():
        mine = [by[(name, s)] for s in seeds if (name, s) in by]
        if not mine:
            continue
        dev = [r["best_stsb_dev"] for r in mine]
        test = [r["sts_test"]["Avg"] for r in mine]
        steps = ", ".join(str(r["best_step"]) for r in mine)
        sps = [r["s_per_step"] for r in mine]
        ratios = [
            by[(name, r["seed"])]["s_per_step"] / by[("simcse", r["seed"])]["s_per_step"]
            for r in mine
            if ("simcse", r["seed"]) in by
        ]
        ratio = mean_std(ratios) if ratios else "–"
        row = [label, len(mine), mean_std(dev), mean_std(test), steps,
               f"{statistics.mean(sps):.3f}", ratio]  # fmt: skip
        if timing and name in timing["step_s"]:
            extra = (timing["loss_ms"][name] - timing["loss_ms"]["simcse"]) / (
                1e3 * timing["step_s"]["simcse"]
            )
            row += [f"{timing['step_s'][name] / timing['step_s']['simcse']:.2f}",
                    f"{timing['loss_ms'][name]:.1f} ms ({100 * extra:+.2f}%)"]  # fmt: skip
        elif timing:
            row += ["–", "–"]
        table.append(row)
    # the untrained model's score depends on the pooler (PromptBERT reads the [MASK] state):
    # one figure per distinct starting point, naming the objectives that start elsewhere
    starts: dict[float, list[str]] = {}
    for r in rows:
        if r["initial_stsb_dev"] is not None:
            starts.setdefault(round(r["initial_stsb_dev"], 2), [])
            if r["objective"] not in starts[round(r["initial_stsb_dev"], 2)]:
                starts[round(r["initial_stsb_dev"], 2)].append(r["objective"])
    common = max(starts, key=lambda v: len(starts[v])) if starts else None
    initial = "; ".join(
        f"{v:.2f}" if v == common else f"{v:.2f} ({', '.join(OBJECTIVES[n][0] for n in names)})"
        for v, names in starts.items()
    )
    cols = list(rows[0]["sts_test"])
    per_task = []
    for name, (label, _) in OBJECTIVES.items():
        mine = [by[(name, s)] for s in seeds if (name, s) in by]
        if mine:
            vals = [statistics.mean(r["sts_test"][c] for r in mine) for c in cols]
            per_task.append([label, *(f"{v:.2f}" for v in vals)])
    lines = [
        markdown_table(header, table),
        "",
        "Per-task STS test (mean over seeds):",
        "",
        markdown_table(["objective", *cols], per_task),
    ]
    header = [
        f"Seeds: {', '.join(map(str, seeds))}; mean ± sample std over seeds. "
        f"Untrained model (step 0) STS-B dev: {initial}."
        if initial
        else "",
    ]
    timing_note = (
        f"Interleaved timing: median of {timing['rounds']} round-robin training forward+backward "
        "passes per objective on one fixed batch of 64 (same process, same encoder); the last "
        f"column is the median of {timing.get('loss_rounds', '?')} round-robin forward+backward "
        "passes of the objective alone on fixed (64, 384) views, and in brackets its extra cost "
        "over SimCSE's InfoNCE as a fraction of the interleaved SimCSE step."
        if timing
        else ""
    )
    return "\n".join([*header, "", *lines, "", timing_note]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument(
        "--objectives", nargs="+", default=list(OBJECTIVES), choices=list(OBJECTIVES)
    )
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/cselab-bench-objectives"))
    parser.add_argument("--out", type=Path, default=None, help="write the markdown table here")
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=None,
        help="also keep each finished run's bench.json + metrics.csv here (and skip runs found "
        "here); with --report-only, tabulate from here instead of --workdir",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: torch's); on a 2-core machine two --threads 1 processes, "
        "one per seed, train about 1.2x more sentences/s than one two-thread process",
    )
    parser.add_argument("--max-steps", type=int, default=None, help="smoke runs only")
    parser.add_argument("--eval-steps", type=int, default=93)
    parser.add_argument("--timing-rounds", type=int, default=5, help="0: no interleaved timing")
    parser.add_argument("--timing-only", action="store_true", help="only the interleaved timing")
    parser.add_argument("--report-only", action="store_true", help="only tabulate finished runs")
    parser.add_argument(
        "--stats-out",
        type=Path,
        default=None,
        help="also write the paired comparison to SimCSE (objectives_stats.md/.csv/.png) here",
    )
    args = parser.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    timing_wanted = args.timing_only or (args.timing_rounds and not args.report_only)
    if timing_wanted and "simcse" not in args.objectives:
        # the interleaved timing is relative to SimCSE; the training runs are not, so that two
        # processes can split one seed's objectives (`--objectives`) without both running SimCSE
        args.objectives.insert(0, "simcse")
    # tabulating kept runs needs no data; training and timing do
    if not args.report_only and (not harness.WIKI.is_file() or not harness.SENTEVAL.is_dir()):
        print(f"shared data not found under {harness.SHARED}", file=sys.stderr)
        return 2
    args.workdir.mkdir(parents=True, exist_ok=True)
    timing_file = args.workdir / "timing.json"
    if args.timing_only:
        timing = interleaved_timing(args.objectives, args.timing_rounds)
        harness.write_json(timing_file, timing)
        print(json.dumps(timing, indent=2))
        return 0
    rows = []
    for seed in args.seeds:  # objectives inside seeds: one seed's runs see similar machine load
        for name in args.objectives:
            if args.report_only:
                source = args.results_dir or args.workdir
                done = source / f"{name}-seed{seed}" / "bench.json"
                if done.is_file():
                    rows.append(json.loads(done.read_text(encoding="utf-8")))
                continue
            rows.append(
                run_one(name, seed, args.workdir, args.max_steps, args.eval_steps, args.results_dir)
            )
    if timing_file.is_file():
        timing = json.loads(timing_file.read_text(encoding="utf-8"))
    elif args.timing_rounds and not args.report_only:
        timing = interleaved_timing(args.objectives, args.timing_rounds)
        harness.write_json(timing_file, timing)
    else:
        timing = None
    report = write_report(rows, timing, args)
    print(report)
    if args.out:
        harness.write_page(args.out, report)
    if args.stats_out and rows:
        print(write_stats(rows, args.stats_out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
