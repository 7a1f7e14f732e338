"""Benchmark: cselab's unsupervised SimCSE training vs sentence-transformers' recipe, on CPU.

One process, one machine, the same model (the packaged all-MiniLM-L6-v2), the same sentences
(``wiki1m_for_simcse.first11914.txt``), batch 64 with ``drop_last`` (186 steps), lr 3e-5 with a
linear decay and no warm-up, fused AdamW (eps 1e-8, no weight decay), gradient clipping at 1.0,
``max_seq_len`` 32, one epoch, seed 42. Runs, in this order:

* **peer**: sentence-transformers' unsupervised SimCSE recipe: ``SentenceTransformerTrainer`` with
  ``MultipleNegativesRankingLoss(scale=20)`` (τ = 0.05) on ``(s, s)`` pairs, a ``Transformer``
  module with ``max_seq_length=32`` (``sdpa`` attention) and ``Pooling(pooling_mode="cls")`` (no
  MLP head), the default ``BatchSamplers.BATCH_SAMPLER`` (plain random batches, the same kind as
  cselab's; the no-duplicates sampler is not used), ``optim="adamw_torch_fused"`` (the default),
  evaluation and saving disabled. Timed by a callback from ``on_train_begin`` to
  ``on_train_end``: every training step including batch collation (the peer tokenises each batch
  there; cselab tokenises the corpus once before training, outside the timing).
* **cselab fp32** and **cselab bf16** (``train.precision=bf16``, CPU autocast): ``cselab.train``
  with ``model.pooler=cls`` + ``model.mlp_only_train=true`` (SimCSE's default; the peer has no
  MLP head) and ``train.eval_steps=125`` (STS-B dev at steps 0, 125 and 186, excluded from the
  timing by the trainer). ``sentences_per_s`` is the trainer's own (training steps only).

STS-B dev (Spearman x 100, ``cselab.evaluation.sts.stsb_dev_spearman``) is measured with the same
evaluator and the same inference pooler for all runs: the raw ``[CLS]`` vector
(``cls_before_pooler``). "after" is the model after the last step.

On a CPU without native bf16 (no AVX512-BF16/AMX: ``torch.ops.mkldnn._is_mkldnn_bf16_supported()``
is false) bf16 matrix products run on a slow fallback; the bf16 run is then capped at
``--bf16-max-steps`` steps and measures throughput only.

**Throughput** (``--throughput``): the four sides (peer and cselab, fp32 and bf16) each train
``--throughput-steps`` steps in a fresh process, one after the other, for ``--rounds`` rounds; a
side's rate is the sentences of the steps after the first ``--skip-steps`` divided by the time
between their ends (peer: ``on_step_end``, so its per-batch tokenisation counts; cselab: its
``on_step`` callback). The table gives the median over rounds and the ratio cselab / peer at each
precision. cselab sets glibc's malloc to keep freed memory (``retain_freed_memory``);
``--peer-glibc-retain`` gives the peer the same setting, ``--preload`` puts a library such as
tcmalloc under every side.

**Compiled** sides (``cselab-compiled fp32``/``bf16``): the same with ``train.compile=true``
(:func:`cselab.model.encoder.compile_encoder`: the packed forward and its backward as one
graph); their first steps (the compile) fall in the skipped warm-up.

**Memory** (``--memory``): every side at batch 64 and 512 for ``--memory-steps`` steps in a
fresh process; the table gives its resident memory when training starts and its peak
(``VmHWM``), and their difference: what the training steps added.

    nice python bench/bench_train.py --throughput     # both tables, docs/results/train_benchmark.md
    nice python bench/bench_train.py --memory --runs "" --no-eval   # peak memory, batch 64 / 512
    python bench/bench_train.py --smoke              # tiny random BERT, a few steps, < 60 s

Needs ``sentence-transformers`` with its training extras (``datasets``, ``accelerate``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import harness
from harness import make_smoke_assets  # also imported from here by bench_corpus.py

DEFAULT_OUT = harness.RESULTS / "train_benchmark.md"
TARGETS = {"cselab fp32": 1.8}  # x the peer's (fp32) sentences/s over a whole epoch
THROUGHPUT_TARGETS = {"fp32": 2.2, "bf16": 2.5}  # x the peer's sentences/s (the training targets)
MAX_STS_DROP = 0.3  # STS-B dev after training may be at most this much below the peer's
SIDES = ("peer fp32", "cselab fp32", "cselab-compiled fp32",
         "peer bf16", "cselab bf16", "cselab-compiled bf16")  # fmt: skip
#: ``--memory``: the batch sizes at which each side's peak resident memory is measured
MEMORY_BATCHES = (64, 512)
#: glibc settings equal to what ``cselab.training.runtime.retain_freed_memory`` sets in-process
GLIBC_RETAIN = {
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_TRIM_THRESHOLD_": str(2**31 - 1),
    "MALLOC_TOP_PAD_": str(64 << 20),
}


@dataclass
class Run:
    name: str
    precision: str
    steps: int
    sentences_per_s: float
    median_window_sentences_per_s: float | None
    train_time_s: float
    before: float | None = None
    after: float | None = None
    best: float | None = None
    best_step: int | None = None
    max_width: int | None = None
    load_avg: tuple[float, float] | None = None  # 1-min load average at start / end
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)


def stsb_dev(encoder: Any, data_dir: Path) -> float:
    from cselab.evaluation.sts import stsb_dev_spearman

    return float(stsb_dev_spearman(encoder, data_dir, batch_size=128))


# ---------------------------------------------------------------------------------------- peer
def run_peer(args: argparse.Namespace, sentences: list[str], work: Path,
             callbacks: list[Any] | None = None, precision: str = "fp32") -> Run:  # fmt: skip
    """sentence-transformers' SimCSE recipe; evaluation before/after with the cselab evaluator."""
    st = harness.peer_api()
    import transformers
    from transformers import AutoTokenizer, TrainerCallback

    from cselab.model.encoder import SentenceEncoder
    from cselab.model.pooling import Pooler

    transformers.set_seed(args.seed)
    model, module = harness.peer_cls_model(
        args.model, args.max_seq_len, model_kwargs={"attn_implementation": "sdpa"}
    )
    dim = module.get_embedding_dimension()
    # The same evaluator on the same backbone object: raw [CLS] of the last layer. The tokenizer
    # is loaded as cselab loads it: the module's own one has model_max_length 32, which would
    # truncate the evaluation sentences (cselab's encode() does not truncate at the training length).
    tokenizer = AutoTokenizer.from_pretrained(str(args.model))
    pooler = Pooler("cls_before_pooler", dim, mlp_only_train=False)
    probe = SentenceEncoder(module.auto_model, tokenizer, pooler, args.max_seq_len)
    t_wall = time.perf_counter()
    before = stsb_dev(probe, args.data_dir) if args.eval else None

    # sentence-transformers calls ``auto_model.forward`` directly: watch its own module instead.
    widths: list[int] = []
    hook = module.register_forward_pre_hook(
        lambda m, a: widths.append(int(a[0]["input_ids"].shape[1])) if m.training else None
    )

    class Timer(TrainerCallback):
        def on_train_begin(self, *_a: Any, **_k: Any) -> None:
            self.start, self.steps = time.perf_counter(), []
            self.load0 = harness.load1()

        def on_step_end(self, *_a: Any, **_k: Any) -> None:
            self.steps.append(time.perf_counter())

        def on_train_end(self, *_a: Any, **_k: Any) -> None:
            self.end = time.perf_counter()
            self.load1 = harness.load1()

    timer = Timer()
    targs = st.TrainingArguments(
        output_dir=str(work / "peer"), num_train_epochs=1, max_steps=args.max_steps or -1,
        per_device_train_batch_size=args.batch_size, learning_rate=args.lr,
        lr_scheduler_type="linear", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        optim="adamw_torch_fused", seed=args.seed, dataloader_drop_last=True,
        dataloader_num_workers=0, batch_sampler=st.BatchSamplers.BATCH_SAMPLER,
        eval_strategy="no", save_strategy="no", logging_strategy="no", report_to="none",
        use_cpu=True, bf16=precision == "bf16", fp16=False, disable_tqdm=True,
    )  # fmt: skip
    trainer = st.Trainer(
        model=model,
        args=targs,
        train_dataset=st.Dataset.from_dict({"anchor": sentences, "positive": sentences}),
        loss=st.MNRL(model, scale=20.0),
        callbacks=[timer, *(callbacks or [])],
    )
    trainer.train()
    hook.remove()
    steps = len(timer.steps)
    elapsed = timer.end - timer.start
    after = stsb_dev(probe, args.data_dir) if args.eval else None
    sched = trainer.lr_scheduler.get_last_lr()[0]
    widest = max(widths) if widths else None
    return Run(
        name="peer",
        precision="fp32",
        steps=steps,
        sentences_per_s=steps * args.batch_size / elapsed,
        median_window_sentences_per_s=harness.median_window_rate(
            timer.steps, timer.start, args.batch_size
        ),
        train_time_s=elapsed,
        before=before,
        after=after,
        max_width=widest,
        load_avg=(timer.load0, timer.load1),
        wall_s=time.perf_counter() - t_wall,
        notes=[
            f"{len(widths)} forward passes ({len(widths) // max(steps, 1)} per step: anchor and "
            f"positive columns), widest {widest or '?'} tokens; "
            f"optim={getattr(targs.optim, 'value', targs.optim)}; lr after the last step {sched:.2e}"
        ],
    )


# -------------------------------------------------------------------------------------- cselab
def cselab_overrides(args: argparse.Namespace, precision: str, out: Path, max_steps: int | None,
                     eval_steps: int, compiled: bool = False) -> list[str]:  # fmt: skip
    items = [
        f"model.name_or_path={args.model}",
        "model.pooler=cls",
        "model.mlp_only_train=true",
        f"model.max_seq_len={args.max_seq_len}",
        f"data.train_file={args.train_file}",
        f"data.cache_dir={out.parent / 'cache'}",
        f"train.output_dir={out}",
        f"train.batch_size={args.batch_size}",
        f"train.lr={args.lr}",
        "train.epochs=1",
        "train.warmup_steps=0",
        "train.weight_decay=0.0",
        "train.grad_clip=1.0",
        f"train.seed={args.seed}",
        f"train.precision={precision}",
        "train.device=cpu",
        f"train.eval_steps={eval_steps}",
        f"eval.data_dir={args.data_dir}",
        "eval.batch_size=128",
        f"eval.enabled={'true' if eval_steps else 'false'}",
    ]
    if max_steps:
        items.append(f"train.max_steps={max_steps}")
    if compiled:
        items.append("train.compile=true")
    return items


def cselab_trainer(args: argparse.Namespace, precision: str, out: Path, max_steps: int | None,
                   eval_steps: int, callbacks: list[Any] | None = None,
                   compiled: bool = False) -> Any:  # fmt: skip
    """cselab's trainer for this recipe (a callback on every step: ``log_steps`` 1);
    ``compiled``: ``train.compile=true``."""
    from cselab.app.train import build_trainer
    from cselab.config import load_config

    extra = ["train.log_steps=1"] if callbacks else []
    items = cselab_overrides(args, precision, out, max_steps, eval_steps, compiled)
    return build_trainer(load_config(None, [*items, *extra]), callbacks or ())


def run_cselab(args: argparse.Namespace, precision: str, work: Path, max_steps: int | None,
               evaluate: bool, compiled: bool = False) -> Run:  # fmt: skip
    who = "cselab-compiled" if compiled else "cselab"
    out = work / f"{who}-{precision}"
    t_wall = time.perf_counter()
    trainer = cselab_trainer(args, precision, out, max_steps, args.eval_steps if evaluate else 0,
                             compiled=compiled)  # fmt: skip
    widths: list[int] = []
    hook = trainer.encoder.register_forward_pre_hook(
        lambda m, a, kw: widths.append(int((kw["input_ids"] if "input_ids" in kw else a[0]).shape[1]))
        if m.training else None,
        with_kwargs=True,
    )  # fmt: skip
    load0 = harness.load1()
    results = trainer.train()
    load_end = harness.load1()
    hook.remove()
    rows = harness.logged_rows(out)
    window_rates = [r["sentences_per_s"] for r in rows if "sentences_per_s" in r]
    dev = {int(r["step"]): r["stsb_dev"] for r in rows if "stsb_dev" in r}
    return Run(
        name=f"{who} {precision}",
        precision=precision,
        steps=int(results["steps"]),
        sentences_per_s=float(results["sentences_per_s"]),
        median_window_sentences_per_s=harness.median(window_rates) if window_rates else None,
        train_time_s=float(results["train_time_s"]),
        before=results.get("initial_stsb_dev"),
        after=dev.get(int(results["steps"])),
        best=results.get("best_stsb_dev"),
        best_step=results.get("best_step") if results.get("best_stsb_dev") is not None else None,
        max_width=max(widths) if widths else None,
        load_avg=(load0, load_end),
        wall_s=time.perf_counter() - t_wall,
        notes=[
            f"unpadded training forward: {trainer.encoder.unpad_training}; "
            f"attention: {trainer.encoder.backbone.config._attn_implementation}; "
            f"widest padded batch {max(widths) if widths else '?'} tokens"
        ],
    )


# ------------------------------------------------------------------------------------- profile
def profile_cselab(
    args: argparse.Namespace, precision: str, work: Path, steps: int, unpad: bool = True
) -> tuple[float, str]:
    """Seconds per step and the top ops (self CPU time) over ``steps`` cselab training steps.

    The trainer's hot path only (batch → forward/backward → optimizer step), after one warm-up
    step; logging, evaluation and checkpoints are not part of it. ``unpad=False`` turns the
    unpadded training forward off (the ablation of :mod:`cselab.model.unpad`).
    """
    out = work / f"profile-{precision}{'' if unpad else '-padded'}"
    trainer = cselab_trainer(args, precision, out, steps + 1, 0)
    trainer.encoder.unpad_training = trainer.encoder.unpad_training and unpad
    trainer.encoder.train()
    with contextlib.closing(harness.trainer_step(trainer)) as step:
        return harness.profile_steps(step, steps, args.profile_rows)


def profile_peer(
    args: argparse.Namespace, sentences: list[str], work: Path, steps: int
) -> tuple[float, str]:
    """The same for the peer: ``steps`` steps of ``trainer.train()`` after its first step."""
    from transformers import TrainerCallback

    prof = harness.cpu_profiler()
    marks: dict[str, float] = {}

    class Profiler(TrainerCallback):
        def on_step_end(self, _args: Any, state: Any, *_a: Any, **_k: Any) -> None:
            if state.global_step == 1:
                prof.start()
                marks["start"] = time.perf_counter()

        def on_train_end(self, *_a: Any, **_k: Any) -> None:
            marks["end"] = time.perf_counter()
            prof.stop()

    sub = argparse.Namespace(**{**vars(args), "max_steps": steps + 1, "eval": False})
    run_peer(sub, sentences, work, callbacks=[Profiler()])
    return (marks["end"] - marks["start"]) / steps, harness.top_ops(prof, args.profile_rows)


# ---------------------------------------------------------------------------------- throughput
def worker(args: argparse.Namespace, side: str, work: Path) -> dict[str, Any]:
    """One side trained for ``args.max_steps`` steps in this process; the end time of each step,
    the resident memory when training starts and this process's peak (``VmHWM``) at the end."""
    from cselab.data import read_corpus

    who, precision = side.split()
    ends: list[float] = []
    start_rss: list[float] = []
    if who == "peer":
        from transformers import TrainerCallback

        class Ends(TrainerCallback):
            def on_train_begin(self, *_a: Any, **_k: Any) -> None:
                start_rss.append(harness.rss_mib()[0])

            def on_step_end(self, *_a: Any, **_k: Any) -> None:
                ends.append(time.perf_counter())

        sentences, _ = read_corpus(args.train_file)
        sub = argparse.Namespace(**{**vars(args), "eval": False})
        run_peer(sub, sentences, work, callbacks=[Ends()], precision=precision)
    else:
        from cselab.training.callbacks import Callback

        class Ends(Callback):
            def on_step(self, step: int, metrics: Any) -> None:
                ends.append(time.perf_counter())

        trainer = cselab_trainer(args, precision, work / "cselab", args.max_steps, 0, [Ends()],
                                 compiled=who == "cselab-compiled")  # fmt: skip
        start_rss.append(harness.rss_mib()[0])
        trainer.train()
    return {"side": side, "ends": ends, "start_rss_mib": start_rss[0],
            "peak_rss_mib": harness.peak_rss_mib()}  # fmt: skip


def run_throughput(args: argparse.Namespace, sides: list[str]) -> dict[str, list[float]]:
    """Each side in a fresh process, alternating, ``args.rounds`` rounds; rates per side."""
    results = _run_workers(args, sides, args.batch_size, args.throughput_steps, args.rounds)
    return {
        side: [harness.window_rate(r["ends"], args.batch_size, args.skip_steps) for r in runs]
        for side, runs in results.items()
    }


def run_memory(args: argparse.Namespace, sides: list[str]) -> list[list[str]]:
    """Peak resident memory of each side at each of :data:`MEMORY_BATCHES` (``--memory-steps``
    steps in a fresh process): rows for :func:`memory_table`."""
    rows = []
    for batch in MEMORY_BATCHES:
        results = _run_workers(args, sides, batch, args.memory_steps, 1)
        for side, (r,) in results.items():
            step_peak = r["peak_rss_mib"] - r["start_rss_mib"]
            rows.append([str(batch), side, f"{r['start_rss_mib']:.0f}",
                         f"{r['peak_rss_mib']:.0f}", f"{step_peak:.0f}"])  # fmt: skip
    return rows


def memory_table(rows: list[list[str]]) -> str:
    from cselab.evaluation.report import markdown_table

    header = ["batch", "side", "RSS at start of training (MiB)", "peak RSS, VmHWM (MiB)",
              "peak − start (MiB)"]  # fmt: skip
    return markdown_table(header, rows)


def _run_workers(args: argparse.Namespace, sides: list[str], batch: int, steps: int,
                 rounds: int) -> dict[str, list[dict[str, Any]]]:  # fmt: skip
    """Each side for ``steps`` steps at ``batch`` in a fresh process, alternating, ``rounds``."""
    common = [
        "--model", str(args.model), "--train-file", str(args.train_file),
        "--batch-size", str(batch), "--lr", str(args.lr),
        "--max-seq-len", str(args.max_seq_len), "--seed", str(args.seed),
        "--max-steps", str(steps),
        *(["--threads", str(args.threads)] if args.threads else []),
    ]  # fmt: skip

    def env(side: str) -> dict[str, str]:
        env = dict(os.environ)
        if args.preload:
            env["LD_PRELOAD"] = args.preload
        if args.peer_glibc_retain and side.startswith("peer"):
            env.update(GLIBC_RETAIN)
        return env

    def done(rnd: int, side: str, result: dict[str, Any]) -> None:
        ends, skip = result["ends"], min(args.skip_steps, steps - 2)
        rate = harness.window_rate(ends, batch, skip) if len(ends) >= skip + 2 else float("nan")
        print(f"batch {batch} round {rnd + 1} {side}: {len(ends)} steps, {rate:.1f} sentences/s, "
              f"peak RSS {result['peak_rss_mib']:.0f} MiB (load {harness.load1():.1f})",
              flush=True)  # fmt: skip

    def argv(side: str, tmp: Path) -> list[str]:
        return ["--worker", side, "--work-dir", str(tmp), *common]

    return harness.run_sides(__file__, sides, rounds, argv, env, done)


# ------------------------------------------------------------------------------------- report
def fmt(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def throughput_table(rates: dict[str, list[float]]) -> str:
    from cselab.evaluation.report import markdown_table

    rows = []
    for precision in ("fp32", "bf16"):
        for who in ("cselab", "cselab-compiled"):
            peer, ours = rates.get(f"peer {precision}"), rates.get(f"{who} {precision}")
            if not peer or not ours:
                continue
            r, target = harness.ratio(ours, peer), THROUGHPUT_TARGETS[precision]
            rounds = ", ".join(f"{x:.2f}" for x in harness.round_ratios(ours, peer))
            rows.append([precision, who, f"{harness.median(peer):.1f}",
                         f"{harness.median(ours):.1f}", f"**{r:.2f}×**", rounds, f"≥ {target}×",
                         "yes" if r >= target else "no"])  # fmt: skip
    header = ["precision", "side", "peer sent/s", "side sent/s", "ratio", "per-round ratios",
              "target", "met"]  # fmt: skip
    return markdown_table(header, rows)


def table(runs: list[Run]) -> str:
    """The full runs. Speed targets are against the peer's fp32 run; the bf16 and compiled runs'
    speed targets are in the throughput table, so here they are judged on quality only: STS-B
    dev within ``MAX_STS_DROP`` of cselab's eager fp32 run."""
    from cselab.evaluation.report import markdown_table

    peer = next((r for r in runs if r.name == "peer"), None)
    fp32 = next((r for r in runs if r.name == "cselab fp32"), None)
    rows = []
    for r in runs:
        vs_peer = r.sentences_per_s / peer.sentences_per_s if peer and r is not peer else None
        target, met = "—", "—"
        if r.name in TARGETS and vs_peer is not None:
            speed_ok = vs_peer >= TARGETS[r.name]
            quality_ok = None
            if r.after is not None and peer is not None and peer.after is not None:
                quality_ok = r.after >= peer.after - MAX_STS_DROP
            target = f"≥ {TARGETS[r.name]}×, STS ≥ peer − {MAX_STS_DROP}"
            met = "yes" if speed_ok and quality_ok is not False else (
                "no (speed)" if quality_ok is not False else ("no (STS)" if speed_ok else "no (speed, STS)"))  # fmt: skip
            if quality_ok is None:
                met += " (speed only)"
        elif (
            (r.precision == "bf16" or r.name.startswith("cselab-compiled"))
            and fp32 is not None
            and r is not fp32
            and r.after is not None
            and fp32.after is not None
        ):
            target = f"STS ≥ cselab fp32 − {MAX_STS_DROP} (speed: throughput table)"
            met = "yes" if r.after >= fp32.after - MAX_STS_DROP else "no (STS)"
        best = f"{fmt(r.best)} ({r.best_step})" if r.best is not None else "n/a"
        shown = f"{fmt(vs_peer)}×" if vs_peer else ("1.00× (reference)" if r is peer else "n/a")
        rows.append([r.name, r.steps, fmt(r.before), fmt(r.after), best, fmt(r.sentences_per_s, 1),
                     fmt(r.median_window_sentences_per_s, 1), shown, target, met])  # fmt: skip
    header = ["run", "steps", "STS-B dev before", "STS-B dev after", "best (step)",
              "train sentences/s", "median 10-step window sent/s", "ratio vs peer fp32",
              "target", "met"]  # fmt: skip
    return markdown_table(header, rows)


def write_report(path: Path, args: argparse.Namespace, runs: list[Run], cpu: dict[str, Any],
                 vers: dict[str, str], profiles: dict[str, tuple[float, str]], total_s: float,
                 argv: list[str], throughput: dict[str, list[float]] | None = None,
                 memory: list[list[str]] | None = None) -> None:  # fmt: skip
    from cselab.evaluation.report import markdown_table

    parts = [
        "# Training throughput: cselab vs sentence-transformers (unsupervised SimCSE, CPU)",
        "",
        "Produced by `bench/bench_train.py` (see its docstring for the exact recipe of each side).",
        "",
        "## Setup",
        "",
        f"- device: {cpu['model']}, {cpu['logical_cpus']} logical CPUs ({cpu['usable_cpus']} usable), "
        f"torch threads {cpu['torch_threads']}, SIMD {', '.join(cpu['simd']) or 'n/a'} "
        f"(torch CPU capability {cpu['torch_cpu_capability']}), native bf16 matmul: "
        f"{'yes' if cpu['native_bf16'] else 'no'}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in vers.items()),
        f"- model: `{args.model}` (all-MiniLM-L6-v2); data: `{args.train_file}`; "
        f"batch {args.batch_size}, lr {args.lr}, max_seq_len {args.max_seq_len}, one epoch, seed {args.seed}"
        + (f", max_steps {args.max_steps}" if args.max_steps else ""),
        f"- command: `{harness.command('bench_train.py', argv, prefix='nice python')}` "
        f"(whole run {total_s / 60:.1f} min)",
        "- the 1-minute load average at the start and end of each training is listed below (the "
        "benchmark alone keeps it near the number of threads); the median 10-step window rate is "
        "less sensitive to bursts of other load than the mean over the whole run.",
        "",
        "## Results",
        "",
    ]
    if memory:
        parts += [
            f"### Peak memory per step ({args.memory_steps} steps in a fresh process per side)",
            "",
            memory_table(memory),
            "",
        ]
    if throughput:
        env = []
        if args.preload:
            env.append(f"every process with `LD_PRELOAD={args.preload}`")
        if args.peer_glibc_retain:
            env.append(
                "the peer with cselab's glibc malloc settings (`"
                + " ".join(f"{k}={v}" for k, v in GLIBC_RETAIN.items())
                + "`)"
            )
        parts += [
            f"### Throughput, side by side ({args.rounds} rounds, each side in a fresh process, "
            f"alternating; steps {args.skip_steps + 2}–{args.throughput_steps} timed; medians)",
            "",
            throughput_table(throughput),
            "",
            "Allocator: "
            + (
                "; ".join(env)
                if env
                else "each side as it runs by default (cselab "
                "sets glibc's malloc to keep freed memory, `cselab.training.runtime.retain_freed_memory`; "
                "the peer runs with glibc's defaults)"
            )
            + ".",
            "",
        ]
    if runs:
        loads = [
            f"{r.load_avg[0]:.1f} → {r.load_avg[1]:.1f}" if r.load_avg else "n/a" for r in runs
        ]
        parts += [
            "### Full runs",
            "",
            table(runs),
            "",
            "STS-B dev: Spearman × 100 of cosine similarities, `cselab.evaluation.sts.stsb_dev_spearman`, "
            'raw [CLS] (`cls_before_pooler`) for every model. "after" is the model after the last step. '
            "Sentences/s: training steps only (cselab: the trainer's own `sentences_per_s`, evaluation "
            "and checkpointing excluded; peer: `on_train_begin` → `on_train_end`, evaluation and saving "
            "disabled).",
            "",
            markdown_table(
                ["run", "train time (s)", "wall incl. evaluation (s)", "load avg start → end",
                 "notes"],
                [[r.name, f"{r.train_time_s:.1f}", f"{r.wall_s:.1f}", la, "; ".join(r.notes)]
                 for r, la in zip(runs, loads, strict=True)],
            ),
        ]  # fmt: skip
    if profiles:
        parts += ["", "## Profile (torch.profiler, top ops by self CPU time)", ""]
        for name, (per_step, text) in profiles.items():
            parts += [f"### {name}: {per_step:.2f} s/step while profiled", "", "```", text.strip(),
                      "```", ""]  # fmt: skip
    if args.notes_file and Path(args.notes_file).is_file():
        parts += ["", Path(args.notes_file).read_text(encoding="utf-8").strip(), ""]
    harness.write_page(path, "\n".join(parts) + "\n")


# ---------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> list[Run]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--smoke", action="store_true", help="tiny random BERT, 200 sentences, 3 steps; < 60 s"
    )
    p.add_argument("--model", default=None, help="default: the packaged all-MiniLM-L6-v2")
    p.add_argument("--train-file", type=Path, default=harness.WIKI)
    p.add_argument(
        "--data-dir", type=Path, default=harness.SENTEVAL, help="SentEval data/downstream"
    )
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-5)
    p.add_argument("--max-seq-len", type=int, default=32)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--max-steps", type=int, default=None, help="cap every run (exploration only)")
    p.add_argument("--eval-steps", type=int, default=125)
    p.add_argument("--bf16-max-steps", type=int, default=6,
                   help="cap for the bf16 run on CPUs without native bf16 (0: no cap)")  # fmt: skip
    p.add_argument(
        "--runs",
        default="peer,fp32,bf16",
        help="comma-separated subset of peer,fp32,bf16,compiled-fp32,compiled-bf16 "
        "(compiled: train.compile=true; its STS-B dev is the quality check)",
    )
    p.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)"
    )
    p.add_argument(
        "--profile-steps", type=int, default=0, help="profile this many cselab fp32 and peer steps"
    )
    p.add_argument(
        "--profile-bf16-steps", type=int, default=0, help="profile this many cselab bf16 steps"
    )
    p.add_argument("--profile-rows", type=int, default=15)
    p.add_argument("--profile-padded", action="store_true",
                   help="also profile cselab fp32 with the unpadded forward off (ablation)")  # fmt: skip
    p.add_argument("--profile-peer", action="store_true",
                   help="profile the peer even when it is not among --runs")  # fmt: skip
    p.add_argument("--no-eval", dest="eval", action="store_false", help="skip STS-B dev")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"results page (default {DEFAULT_OUT}; none in smoke mode)",
    )
    p.add_argument("--json", type=Path, default=None, help="also write the runs as JSON")
    p.add_argument(
        "--notes-file", type=Path, default=None, help="markdown appended to the results page"
    )
    p.add_argument(
        "--work-dir", type=Path, default=None, help="outputs of the runs (default: a temp dir)"
    )
    p.add_argument("--throughput", action="store_true",
                   help="the side-by-side throughput table: every side in a fresh process, "
                        "alternating, --rounds rounds of --throughput-steps steps")  # fmt: skip
    p.add_argument(
        "--sides", default=",".join(SIDES), help="comma-separated subset of " + ", ".join(SIDES)
    )
    p.add_argument("--memory", action="store_true",
                   help="peak resident memory of every side at batch 64 and 512, each in a "
                        "fresh process for --memory-steps steps")  # fmt: skip
    p.add_argument("--memory-steps", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--throughput-steps", type=int, default=30)
    p.add_argument("--skip-steps", type=int, default=3, help="warm-up steps left out of the rate")
    p.add_argument("--preload", default=None,
                   help="LD_PRELOAD for every side's process (e.g. a tcmalloc library)")  # fmt: skip
    p.add_argument("--peer-glibc-retain", action="store_true",
                   help="give the peer the glibc settings cselab sets for itself (equal allocator)")  # fmt: skip
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--render", type=Path, default=None,
                   help="only re-write the results page from a --json file of an earlier run")  # fmt: skip
    args = p.parse_args(argv)
    argv = list(sys.argv[1:] if argv is None else argv)

    if args.render:
        saved = json.loads(args.render.read_text(encoding="utf-8"))
        runs = [
            Run(**{**r, "load_avg": tuple(r["load_avg"]) if r["load_avg"] else None})
            for r in saved["runs"]
        ]
        for key, value in saved["args"].items():
            if key not in ("render", "out", "notes_file"):
                setattr(args, key, Path(value) if key in ("train_file", "data_dir") else value)
        profiles = {k: (v[0], v[1]) for k, v in saved["profiles"].items()}
        write_report(args.out or DEFAULT_OUT, args, runs, saved["cpu"], saved["versions"], profiles,
                     saved["total_s"], saved["argv"], saved.get("throughput") or {},
                     saved.get("memory") or [])  # fmt: skip
        print(f"wrote {args.out or DEFAULT_OUT}")
        return runs

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    if args.smoke:
        args.threads = args.threads or 1
    threads_before = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        return _run(args, argv)
    finally:
        torch.set_num_threads(threads_before)


def _run(args: argparse.Namespace, argv: list[str]) -> list[Run]:
    t_start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        work = args.work_dir or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-train-"))
        )
        work.mkdir(parents=True, exist_ok=True)
        if args.worker:  # one side of the throughput table, in its own process
            harness.reply(worker(args, args.worker, work))
            return []
        if args.smoke:
            model_dir, train = make_smoke_assets(work / "smoke")
            args.model, args.train_file = str(model_dir), train
            args.batch_size, args.max_steps, args.eval_steps = 16, 3, 2
            args.throughput_steps, args.skip_steps, args.rounds = 4, 1, 1
            args.bf16_max_steps = 2
            args.profile_steps = min(args.profile_steps, 2)
            args.profile_bf16_steps = min(args.profile_bf16_steps, 1)
        elif args.model is None:
            args.model = harness.minilm_path()
        if args.eval and not (args.data_dir / "STS" / "STSBenchmark").is_dir():
            raise SystemExit(f"STS-B not found under {args.data_dir}; pass --data-dir or --no-eval")
        from cselab.data import read_corpus

        sentences, _ = read_corpus(args.train_file)
        cpu, vers = harness.cpu_description(), harness.versions()
        print(f"device: {cpu}\nversions: {vers}", flush=True)
        throughput: dict[str, list[float]] = {}
        memory: list[list[str]] = []
        if args.throughput:
            throughput = run_throughput(args, harness.pick_sides(args.sides, SIDES))
            print(throughput_table(throughput), flush=True)
        if args.memory:
            memory = run_memory(args, harness.pick_sides(args.sides, SIDES))
            print(memory_table(memory), flush=True)
        wanted = [w.strip() for w in args.runs.split(",") if w.strip()]
        runs: list[Run] = []
        for what in wanted:
            print(f"--- {what} (load {harness.load1():.1f})", flush=True)
            if what == "peer":
                run = run_peer(args, sentences, work)
            elif what.removeprefix("compiled-") in ("fp32", "bf16"):
                precision = what.removeprefix("compiled-")
                cap = args.max_steps
                if precision == "bf16" and not cpu["native_bf16"] and args.bf16_max_steps:
                    cap = min(cap or args.bf16_max_steps, args.bf16_max_steps)
                capped = precision == "bf16" and cap != args.max_steps
                run = run_cselab(args, precision, work, cap, evaluate=args.eval and not capped,
                                 compiled=what.startswith("compiled-"))  # fmt: skip
                if capped:
                    run.notes.append(
                        f"capped at {cap} steps (no native bf16 on this CPU: throughput only; "
                        f"STS-B not measured)"
                    )
                    run.before = next((r.before for r in runs if r.name == "cselab fp32"), None)
            else:
                raise SystemExit(
                    f"unknown run {what!r}; choose from peer, fp32, bf16, compiled-fp32, "
                    "compiled-bf16"
                )
            runs.append(run)
            print(json.dumps(asdict(run)), flush=True)
        profiles: dict[str, tuple[float, str]] = {}
        if args.profile_steps:
            n = args.profile_steps
            print(f"--- profiling {n} steps", flush=True)
            profiles[f"cselab fp32, {n} steps"] = profile_cselab(args, "fp32", work, n)
            if args.profile_padded:
                profiles[f"cselab fp32 with the unpadded forward off, {n} steps"] = profile_cselab(
                    args, "fp32", work, n, unpad=False
                )
            if "peer" in wanted or args.profile_peer:
                profiles[f"peer, {n} steps"] = profile_peer(
                    args, sentences, work / "peer-profile", n
                )
        if args.profile_bf16_steps:
            profiles[f"cselab bf16, {args.profile_bf16_steps} steps"] = profile_cselab(
                args, "bf16", work, args.profile_bf16_steps
            )
        print(table(runs), flush=True)
        for name, (per_step, text) in profiles.items():
            print(f"\n{name}: {per_step:.2f} s/step\n{text}")
        total_s = time.perf_counter() - t_start
        out = args.out if args.out else (None if args.smoke else DEFAULT_OUT)
        if out is not None:
            write_report(out, args, runs, cpu, vers, profiles, total_s, argv, throughput, memory)
            print(f"wrote {out}")
        if args.json:
            harness.write_json(args.json, {
                "runs": [asdict(r) for r in runs],
                "profiles": {k: list(v) for k, v in profiles.items()},
                "throughput": throughput,
                "memory": memory,
                "cpu": cpu,
                "versions": vers,
                "total_s": total_s,
                "argv": argv,
                "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            })  # fmt: skip
    return runs


if __name__ == "__main__":
    main()
