"""GPU training throughput of cselab against sentence-transformers' MNRL recipe, same config.

What is measured (one process, one device):

* **cselab**: the real training step of :class:`cselab.training.trainer.Trainer` — the loop's batches (collate,
  pinned memory, non-blocking copy), ``forward_backward`` (the task: unsupervised SimCSE: one forward over
  the doubled batch, InfoNCE) and ``optimizer_step`` (gradient clipping, fused AdamW, schedule).
  bf16 autocast, PyTorch's scaled-dot-product attention, optional ``torch.compile``.
* **peer**: sentence-transformers' ``MultipleNegativesRankingLoss`` — its unsupervised SimCSE
  recipe, (sentence, sentence) pairs — on a ``SentenceTransformer`` built from the *same* random
  weights (Transformer + CLS pooling), with the same precision and the same fused AdamW, data
  pre-tokenised on the device. Tokenisation is excluded on both sides.

Model: a ``bert-base-uncased``-shaped BERT (12 layers, hidden 768, 12 heads, vocabulary 30522)
with random weights and a generated WordPiece vocabulary, so nothing is downloaded. Every
sentence is exactly ``max_seq_len`` tokens (default 32), so tokens/s = 2 views × batch × 32 /
step time.

Reported per batch size: step time (mean over back-to-back timed steps), sentences/s,
tokens/s, model FLOP utilisation (MFU: model FLOPs per step ÷ step time ÷ the GPU's dense bf16
peak), peak memory, host-device synchronisations per step (CUDA's sync debug mode), and
cselab ÷ peer. An optional GradCache table gives peak memory and step time against the chunk
size.

Model FLOPs per step (the usual 3 × forward, backward = 2 × forward): for each of the
``2·B·L`` tokens, ``2·12·d²`` per layer for the dense layers plus ``4·L·d`` per layer for the
attention scores and the weighted sum, plus ``2·d²`` per sentence for the CLS head; the
``2·B·B·d`` of the similarity matrix is added too. GradCache's second forward is *not* counted
(MFU counts useful work).

This is the step alone, on fixed-length rows without padding: the friendliest path.
``bench/gpu_check.py`` measures the real one beside it: ``cselab train`` end to end on
wiki-length batches (the step, then evaluation and checkpoints separately) and a profile with
MFU on the real tokens and on the padded ones, syncs counted outside the timing.

Usage::

    python bench/bench_gpu.py --out docs/results/gpu_benchmark.json \\
        --markdown docs/results/gpu_benchmark_table.md            # on a GPU
    python bench/bench_gpu.py --smoke                              # tiny model on CPU, seconds
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness
import numpy as np
import torch

#: Dense bf16 tensor-core peak (FLOP/s, no sparsity) by device-name fragment, most specific first.
BF16_PEAK = [
    ("H200", 989e12),
    ("H100 NVL", 835e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),  # SXM (HBM3)
    ("GH200", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L40", 181e12),
    ("L4", 121e12),
    ("A10G", 70e12),
    ("A10", 125e12),
    ("RTX 4090", 165e12),
    ("RTX 3090", 71e12),
    ("V100", 125e12),  # fp16 (no bf16 on Volta)
    ("T4", 65e12),  # fp16
]


@dataclass
class ModelShape:
    hidden: int = 768
    layers: int = 12
    heads: int = 12
    intermediate: int = 3072
    vocab: int = 30522

    def forward_flops(self, sentences: int, seq: int, head: bool = True) -> float:
        """Matmul FLOPs of one forward over ``sentences`` rows of ``seq`` tokens."""
        d, i = self.hidden, self.intermediate
        per_token_layer = 2 * (4 * d * d + 2 * d * i) + 4 * seq * d
        flops = sentences * seq * self.layers * per_token_layer
        if head:
            flops += sentences * 2 * d * d
        return float(flops)


BERT_BASE = ModelShape()
TINY = ModelShape(hidden=32, layers=2, heads=2, intermediate=64)


# --------------------------------------------------------------------------------------------
# A random model folder with a generated vocabulary (no download)
# --------------------------------------------------------------------------------------------


def make_model_folder(folder: Path, shape: ModelShape, seq: int, seed: int = 0) -> Path:
    return harness.random_bert(folder, hidden=shape.hidden, layers=shape.layers,
                               heads=shape.heads, intermediate=shape.intermediate,
                               vocab=shape.vocab, max_positions=max(512, seq),
                               generated_vocab=True, seed=seed)  # fmt: skip


def random_corpus(rows: int, seq: int, vocab: int, seed: int = 0):
    """``rows`` sentences of exactly ``seq`` ids: [CLS] w ... w [SEP]."""
    from cselab.data import TokenizedCorpus

    rng = np.random.default_rng(seed)
    body = rng.integers(5, vocab, size=(rows, seq - 2), dtype=np.int32)
    ids = np.concatenate(
        [np.full((rows, 1), 2, np.int32), body, np.full((rows, 1), 3, np.int32)], axis=1
    )
    offsets = np.arange(rows + 1, dtype=np.int64) * seq
    return TokenizedCorpus(ids.reshape(-1), offsets)


# --------------------------------------------------------------------------------------------
# Timing helpers
# --------------------------------------------------------------------------------------------


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_mib(device: torch.device) -> float | None:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return None


@contextlib.contextmanager
def count_syncs(device: torch.device, enabled: bool):
    """Count host-device synchronisations (CUDA sync debug mode 'warn') inside the block."""
    box = {"n": None}
    if not (enabled and device.type == "cuda"):
        yield box
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield box
        finally:
            torch.cuda.set_sync_debug_mode("default")
    box["n"] = sum("synchroniz" in str(w.message).lower() for w in caught)


def timed_steps(step, device: torch.device, warmup: int, steps: int, syncs: bool) -> dict[str, Any]:
    """Mean step time over ``steps`` back-to-back steps (one device sync at each end, none in
    between: the host may run ahead of the GPU exactly as in training)."""
    for i in range(warmup):
        step(i)
    # syncs are counted in one step of their own: the sync debug mode's checks and warnings
    # stay out of the timed steps
    with count_syncs(device, syncs) as counted:
        step(warmup)
    sync(device)
    reset_peak(device)
    t0 = time.perf_counter()
    for i in range(warmup + 1, warmup + 1 + steps):
        step(i)
    sync(device)
    elapsed = time.perf_counter() - t0
    return {
        "step_s": elapsed / steps,
        "steps": steps,
        "peak_mib": peak_mib(device),
        "host_syncs_per_step": counted["n"],
    }


def summarize(rec: dict[str, Any], batch: int, seq: int, flops: float, peak: float | None) -> dict:
    t = rec["step_s"]
    rec.update(
        sentences_per_s=batch / t,
        tokens_per_s=2 * batch * seq / t,
        model_tflop_per_step=flops / 1e12,
        achieved_tflops=flops / t / 1e12,
        mfu=(flops / t / peak) if peak else None,
    )
    return rec


# --------------------------------------------------------------------------------------------
# cselab
# --------------------------------------------------------------------------------------------


def cselab_trainer(
    folder: Path, args: argparse.Namespace, batch: int, chunk: int | None, out: Path
):
    from cselab.app.plan import finish, resolve
    from cselab.app.train import assemble_trainer
    from cselab.config import Config
    from cselab.model.encoder import SentenceEncoder
    from cselab.objectives import build_objective
    from cselab.training.distributed import DistInfo
    from cselab.training.rng import seed_everything

    cfg = Config()
    cfg.model.name_or_path = str(folder)
    cfg.model.max_seq_len = args.seq
    # the run's plan is resolved as a run's is: from a (tiny) training file; the batches are
    # the random corpus below
    train_file = out / "plan-corpus.txt"
    train_file.parent.mkdir(parents=True, exist_ok=True)
    train_file.write_text("a sentence\n", encoding="utf-8")
    cfg.data.train_file = str(train_file)
    cfg.eval.dev = "none"
    t = cfg.train
    t.batch_size, t.max_steps, t.lr = batch, args.warmup + args.steps + 1, 3e-5
    t.precision, t.device, t.compile = args.precision, args.device, args.compile
    t.compile_mode = args.compile_mode  # None: train.compile_mode's null
    t.eval_steps, t.log_steps, t.output_dir = 0, 10**9, str(out)
    t.cache_chunk_size = chunk
    seed_everything(0)
    encoder = SentenceEncoder.from_config(cfg.model)
    corpus = random_corpus(batch * (args.warmup + args.steps + 1), args.seq, args.shape.vocab)
    plan = finish(resolve(cfg, train_file, DistInfo())[0], encoder)
    objective = build_objective(plan.objective, plan.kind)
    trainer = assemble_trainer(cfg, plan, encoder, objective, corpus)
    autocast_dtype(args.precision, trainer.device)  # fp32 on a GPU: TF32, as for the peer
    return trainer


def bench_cselab(
    folder: Path, args: argparse.Namespace, batch: int, chunk: int | None = None
) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        trainer = cselab_trainer(folder, args, batch, chunk, Path(tmp))
        trainer.encoder.train()
        with contextlib.closing(harness.trainer_step(trainer)) as step:
            rec = timed_steps(step, trainer.device, args.warmup, args.steps, args.sync_debug)
        rec["device"] = str(trainer.device)
    return rec


# --------------------------------------------------------------------------------------------
# The peer: sentence-transformers' MultipleNegativesRankingLoss
# --------------------------------------------------------------------------------------------


def bench_peer(folder: Path, args: argparse.Namespace, batch: int) -> dict:
    device = torch.device(args.device if args.device != "auto" else default_device())
    torch.manual_seed(0)
    model, word = harness.peer_cls_model(folder, args.seq, str(device))
    model.train()
    if args.peer_compile:
        attr = "model" if hasattr(word, "model") else "auto_model"  # ST >= 6 / older
        setattr(word, attr, torch.compile(getattr(word, attr)))
    loss_fn = harness.peer_api().MNRL(model, scale=20.0)  # τ = 0.05
    params = [p for p in model.parameters() if p.requires_grad]
    fused = device.type in ("cuda", "cpu")
    optimizer = torch.optim.AdamW(params, lr=3e-5, weight_decay=0.0, fused=fused or None)
    corpus = random_corpus(batch * (args.warmup + args.steps + 1), args.seq, args.shape.vocab)
    pin = device.type == "cuda"
    amp = autocast_dtype(args.precision, device)

    def features(i: int) -> dict[str, torch.Tensor]:
        ids = torch.from_numpy(corpus.ids[i * batch * args.seq : (i + 1) * batch * args.seq]).long()
        ids = ids.view(batch, args.seq)
        f = {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "token_type_ids": torch.zeros_like(ids),
        }
        return {
            k: (v.pin_memory() if pin else v).to(device, non_blocking=pin) for k, v in f.items()
        }

    def step(i: int) -> None:
        f = features(i)
        ctx = torch.autocast(device.type, dtype=amp) if amp else contextlib.nullcontext()
        with ctx:
            # (sentence, sentence) pairs: the anchor and positive columns are the same text.
            loss = loss_fn([f, dict(f)], None)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return timed_steps(step, device, args.warmup, args.steps, args.sync_debug)


# --------------------------------------------------------------------------------------------
# GradCache memory
# --------------------------------------------------------------------------------------------


def bench_gradcache(
    folder: Path, args: argparse.Namespace, batch: int, chunks: list[int]
) -> list[dict]:
    """Peak memory and step time against the chunk size (CUDA: allocator peak; CPU: bytes saved
    for backward, from :class:`saved_tensors.SavedTensorMeter`)."""
    from saved_tensors import SavedTensorMeter

    rows = []
    for chunk in [None, *chunks]:
        with tempfile.TemporaryDirectory() as tmp:
            trainer = cselab_trainer(folder, args, batch, chunk, Path(tmp))
            trainer.encoder.train()
            with contextlib.closing(harness.trainer_step(trainer)) as step:
                rec = timed_steps(step, trainer.device, min(args.warmup, 2),
                                  max(2, args.steps // 4), args.sync_debug)  # fmt: skip
            with SavedTensorMeter(trainer.encoder) as meter:
                trainer.forward_backward(trainer.batch_for(0))
            trainer.optim.optimizer.zero_grad(set_to_none=True)
            rows.append(
                {
                    "chunk": chunk,
                    "batch": batch,
                    "step_s": rec["step_s"],
                    "peak_mib": rec["peak_mib"],
                    "host_syncs_per_step": rec["host_syncs_per_step"],
                    "saved_activations_mib": meter.peak_bytes / 2**20,
                }
            )
    return rows


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    from cselab.model.devices import allow_tf32
    from cselab.training.runtime import autocast_dtype as trainer_autocast

    dtype = trainer_autocast(precision, device)
    if device.type == "cuda" and dtype is None:
        # the benchmark's fp32 is the fast fp32 of both systems (the trainer's explicit fp32
        # turns TF32 off; its `auto` on a GPU without bf16 turns it on)
        allow_tf32()
    return dtype


def bf16_peak(device: torch.device, override_tflops: float | None) -> tuple[float | None, str]:
    if override_tflops:
        return override_tflops * 1e12, "--peak-tflops"
    if device.type != "cuda":
        return None, "unknown (CPU)"
    name = torch.cuda.get_device_name(device)
    for fragment, flops in BF16_PEAK:
        if fragment in name:
            return flops, f"table entry '{fragment}'"
    return None, f"unknown device '{name}' (pass --peak-tflops)"


def environment(device: torch.device) -> dict[str, Any]:
    env = harness.versions(
        ("torch", "transformers", "sentence_transformers", "cselab"), missing=None
    )
    env |= {
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "platform": platform.platform(),
    }
    if device.type == "cuda":
        env["cudnn"] = torch.backends.cudnn.version()
    return env


def markdown(report: dict[str, Any]) -> str:
    from cselab.evaluation.report import markdown_table

    def f(x: Any, fmt: str) -> str:
        return "–" if x is None else format(x, fmt)

    rows = []
    for row in report["results"]:
        for system in ("cselab", "peer"):
            r = row.get(system)
            if r is None:
                continue
            mfu = f"{r['mfu'] * 100:.1f}%" if r["mfu"] is not None else "–"
            rows.append([row["batch"], system, f"{r['step_s'] * 1e3:.1f}",
                         f"{r['sentences_per_s']:.0f}", f"{r['tokens_per_s']:.0f}", mfu,
                         f(r["peak_mib"], ".0f"), f(r["host_syncs_per_step"], ".1f"),
                         f(row.get("speedup") if system == "cselab" else None, ".2f")])  # fmt: skip
    lines = [
        f"Device: {report['env']['device']}; torch {report['env']['torch']}, transformers "
        f"{report['env']['transformers']}, sentence-transformers "
        f"{report['env']['sentence_transformers']}; precision {report['args']['precision']}, "
        f"compile {report['args']['compile']}; peak {report['peak_source']}.",
        "",
        markdown_table(["batch", "system", "step ms", "sentences/s", "tokens/s", "MFU", "peak MiB",
                        "syncs/step", "× peer"], rows, align="rlrrrrrrr"),
    ]  # fmt: skip
    if report.get("gradcache"):
        lines += [
            "",
            f"GradCache (batch {report['gradcache'][0]['batch']}):",
            "",
            markdown_table(
                ["chunk", "step ms", "peak MiB", "saved activations MiB", "syncs/step"],
                [[r["chunk"] or "none", f"{r['step_s'] * 1e3:.1f}", f(r["peak_mib"], ".0f"),
                  f"{r['saved_activations_mib']:.1f}", f(r["host_syncs_per_step"], ".1f")]
                 for r in report["gradcache"]],
                align="rrrrr",
            ),
        ]  # fmt: skip
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny model, CPU, a few steps (a test)")
    p.add_argument("--batch-sizes", default=None, help="comma-separated (default 64,512)")
    p.add_argument("--seq", type=int, default=32, help="tokens per sentence (max_seq_len)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 30)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 10)")
    p.add_argument("--precision", default=None, choices=["bf16", "fp16", "fp32"])
    p.add_argument("--device", default=None, help="cuda, cuda:1, cpu (default: cuda if present)")
    p.add_argument("--compile", action="store_true", help="torch.compile the cselab encoder")
    p.add_argument(
        "--compile-mode",
        default=None,
        choices=["default", "reduce-overhead", "max-autotune"],
        help="with --compile (default: what train.compile_mode: null resolves to; "
        "reduce-overhead: CUDA graphs)",
    )
    p.add_argument("--peer-compile", action="store_true", help="torch.compile the peer's model")
    p.add_argument("--no-peer", action="store_true", help="skip sentence-transformers")
    p.add_argument("--gradcache-chunks", default=None,
                   help="comma-separated chunk sizes for the GradCache memory table (default 64,128 "
                        "at the largest batch; 'none' to skip)")  # fmt: skip
    p.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak of the device")
    p.add_argument("--no-sync-debug", dest="sync_debug", action="store_false",
                   help="do not count host-device syncs")  # fmt: skip
    p.add_argument("--out", default=None, help="write the full report as JSON here")
    p.add_argument("--markdown", default=None, help="write the Markdown table here")
    args = p.parse_args(argv)
    smoke = args.smoke
    args.shape = TINY if smoke else BERT_BASE
    args.batch_sizes = [
        int(b) for b in (args.batch_sizes or ("8,16" if smoke else "64,512")).split(",")
    ]
    args.steps = args.steps or (2 if smoke else 30)
    args.warmup = args.warmup if args.warmup is not None else (1 if smoke else 10)
    args.device = args.device or ("cpu" if smoke else default_device())
    args.precision = args.precision or (
        "fp32" if torch.device(args.device).type == "cpu" else "bf16"
    )
    chunks = args.gradcache_chunks or ("4" if smoke else "64,128")
    args.gradcache_chunks = [] if chunks == "none" else [int(c) for c in chunks.split(",")]
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    device = torch.device(args.device)
    peak, peak_source = bf16_peak(device, args.peak_tflops)
    report: dict[str, Any] = {
        "env": environment(device),
        "args": {k: v for k, v in vars(args).items() if k != "shape"} | {"shape": vars(args.shape)},
        "command": harness.command("bench_gpu.py", argv),
        "peak_flops": peak,
        "peak_source": peak_source,
        "results": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        folder = make_model_folder(Path(tmp) / "model", args.shape, args.seq)
        for batch in args.batch_sizes:
            # cselab's head: the cls MLP (mlp_only_train); the peer pools CLS without a head.
            cselab_flops = 3 * (
                args.shape.forward_flops(2 * batch, args.seq)
                + 2 * batch * batch * args.shape.hidden
            )
            peer_flops = 3 * (
                args.shape.forward_flops(2 * batch, args.seq, head=False)
                + 2 * batch * batch * args.shape.hidden
            )
            row: dict[str, Any] = {"batch": batch}
            row["cselab"] = summarize(
                bench_cselab(folder, args, batch), batch, args.seq, cselab_flops, peak
            )
            if not args.no_peer:
                row["peer"] = summarize(
                    bench_peer(folder, args, batch), batch, args.seq, peer_flops, peak
                )
                row["speedup"] = row["peer"]["step_s"] / row["cselab"]["step_s"]
            report["results"].append(row)
            print(json.dumps(row, default=str), flush=True)
            if args.out:  # each row as it is measured: a run stopped later keeps it
                harness.write_json(args.out, report)
        if args.gradcache_chunks:
            report["gradcache"] = bench_gradcache(
                folder, args, max(args.batch_sizes), args.gradcache_chunks
            )
    text = markdown(report)
    print(text)
    if args.out:
        harness.write_json(args.out, report)
    if args.markdown:
        harness.write_page(args.markdown, text)
    return report


if __name__ == "__main__":
    main()
