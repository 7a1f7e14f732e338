"""Training throughput and peak memory on modern backbones: cselab next to sentence-transformers.

Two random models of real shapes, built in code (no weights are downloaded):

* ``modernbert-base``: ModernBERT-base's shape (22 layers, width 768, MLP 1152, 12 heads);
* ``qwen2-0.5b``: Qwen2-0.5B's shape (24 layers, width 896, MLP 4864, 14 query and 2 key/value
  heads, vocabulary 151,936, tied embeddings).

Both are saved with dropout 0.1 on every dropout key of their row in cselab's table of backbones
(the released models have none, and SimCSE needs it), and the MiniLM tokenizer. Sides, each in
a fresh process so that its peak resident set (``VmHWM``) is its own:

* ``cselab``: ``cselab train`` (unsupervised SimCSE, mean pooling; the decoder bidirectional);
* ``cselab-gc``: the same with ``train.gradient_checkpointing``;
* ``st``: sentence-transformers' SimCSE recipe on the same folder: ``Transformer`` + mean
  ``Pooling`` and ``MultipleNegativesRankingLoss(scale=20)`` on ``(s, s)`` pairs (the decoder
  stays causal there: sentence-transformers has no bidirectional switch).

Batch 32, ``max_seq_len`` 32, the shared wiki sentences; throughput is sentences per second over
the steps after the first (the warm-up). Writes ``docs/results/backbones_benchmark.md``::

    python bench/bench_backbones.py                 # both shapes, every side (minutes)
    python bench/bench_backbones.py --smoke         # tiny shapes, 3 steps, in one process
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

DEFAULT_OUT = harness.RESULTS / "backbones_benchmark.md"
SIDES = ("cselab", "cselab-gc", "st")
#: name -> (model_type, config keys): the real models' shapes
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "modernbert-base": (
        "modernbert",
        {"hidden_size": 768, "num_hidden_layers": 22, "num_attention_heads": 12,
         "intermediate_size": 1152, "vocab_size": 50368, "max_position_embeddings": 8192},
    ),
    "qwen2-0.5b": (
        "qwen2",
        {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
         "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936,
         "max_position_embeddings": 32768, "tie_word_embeddings": True},
    ),
}  # fmt: skip
#: the smoke mode's toy sizes (same architectures)
SMOKE = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
         "intermediate_size": 64}  # fmt: skip


def make_model(
    name: str, folder: Path, smoke: bool, overrides: dict[str, Any] | None = None
) -> Path:
    """Save the random ``name``-shaped model (dropout 0.1 on its table row's keys) with the
    MiniLM tokenizer to ``folder``; ``overrides``: config keys changed from the shape's."""
    import torch
    import transformers as tf
    from transformers import AutoModel, AutoTokenizer

    from cselab.model.backbones import BACKBONES

    kind, shape = SHAPES[name]
    shape = {**shape, **(overrides or {}), **(SMOKE if smoke else {})}
    if smoke and kind == "qwen2":
        shape["num_key_value_heads"] = 1
    if kind == "modernbert":  # MiniLM's special-token ids
        shape.update(pad_token_id=0, cls_token_id=101, sep_token_id=102, bos_token_id=101,
                     eos_token_id=102)  # fmt: skip
    else:
        shape.update(bos_token_id=101, eos_token_id=102)
    config = tf.AutoConfig.for_model(kind, **shape)
    for key in BACKBONES[kind].dropout_keys:
        setattr(config, key, 0.1)
    torch.manual_seed(0)
    AutoModel.from_config(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(harness.minilm_path()).save_pretrained(folder)
    return folder


def corpus(folder: Path, n: int) -> Path:
    """``n`` training sentences: the shared wiki lines, or generated ones where absent."""
    lines = (
        harness.wiki_lines(n)
        if harness.WIKI.is_file()
        else [f"sentence number {i} of the benchmark corpus" for i in range(n)]
    )
    path = folder / "corpus.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def run_cselab(model: Path, train: Path, work: Path, args: argparse.Namespace, gc: bool) -> float:
    """Sentences per second of ``cselab train`` after its first step."""
    from cselab.app.train import build_trainer
    from cselab.config import load_config
    from cselab.model.backbones import is_decoder
    from cselab.training.callbacks import Callback

    ends: list[float] = []

    class Clock(Callback):
        def on_step(self, step: int, metrics: Any) -> None:
            ends.append(time.perf_counter())

    overrides = [
        f"--model.name_or_path={model}", "--model.pooler=avg",
        f"--model.max_seq_len={args.max_seq_len}", f"--data.train_file={train}",
        f"--data.cache_dir={work / 'cache'}", f"--train.output_dir={work / 'out'}",
        f"--train.batch_size={args.batch_size}", f"--train.max_steps={args.steps}",
        "--train.eval_steps=0", "--train.report_to=[]", "--train.log_steps=1",
        f"--train.gradient_checkpointing={str(gc).lower()}",
    ]  # fmt: skip
    from transformers import AutoConfig

    if is_decoder(AutoConfig.from_pretrained(model)):
        overrides.append("--model.bidirectional=true")
    build_trainer(load_config(None, overrides), callbacks=[Clock()]).train()
    return harness.window_rate(ends, args.batch_size, 1)


def run_st(model: Path, train: Path, work: Path, args: argparse.Namespace) -> float:
    """Sentences per second of sentence-transformers' SimCSE recipe after its first step."""
    st = harness.peer_api()
    from transformers import TrainerCallback

    module = st.Transformer(str(model), max_seq_length=args.max_seq_len)
    pooling = st.Pooling(module.get_embedding_dimension(), pooling_mode="mean")
    model_ = st.SentenceTransformer(modules=[module, pooling], device="cpu")
    ends: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, *_a: Any, **_k: Any) -> None:
            ends.append(time.perf_counter())

    sentences = [s for s in train.read_text(encoding="utf-8").split("\n") if s]
    targs = st.TrainingArguments(
        output_dir=str(work / "st"), max_steps=args.steps, per_device_train_batch_size=args.batch_size,
        learning_rate=3e-5, warmup_steps=0, optim="adamw_torch_fused", seed=42,
        dataloader_drop_last=True, batch_sampler=st.BatchSamplers.BATCH_SAMPLER,
        eval_strategy="no", save_strategy="no", logging_strategy="no", report_to="none",
        use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    trainer = st.Trainer(
        model=model_, args=targs, loss=st.MNRL(model_, scale=20.0), callbacks=[Clock()],
        train_dataset=st.Dataset.from_dict({"anchor": sentences, "positive": sentences}),
    )  # fmt: skip
    trainer.train()
    return harness.window_rate(ends, args.batch_size, 1)


def measure(side: str, model: Path, train: Path, work: Path, args: argparse.Namespace) -> dict:
    """One side's figures: throughput and the process's peak resident set."""
    import torch

    torch.set_num_threads(args.threads)
    rate = (
        run_st(model, train, work, args)
        if side == "st"
        else run_cselab(model, train, work, args, gc=side == "cselab-gc")
    )
    return {"sentences_per_s": rate, "peak_rss_mib": harness.peak_rss_mib()}


def page(results: dict[str, dict[str, dict]], args: argparse.Namespace, cpu: dict) -> str:
    from cselab.evaluation.report import markdown_table

    rows = []
    for shape, sides in results.items():
        st = sides.get("st", {}).get("sentences_per_s")
        for side, r in sides.items():
            ratio = f"{r['sentences_per_s'] / st:.2f}" if st else ""
            rows.append((shape, side, f"{r['sentences_per_s']:.1f}", ratio,
                         f"{r['peak_rss_mib']:.0f}"))  # fmt: skip
    table = markdown_table(
        ("model shape", "side", "sentences/s", "vs st", "peak RSS (MiB)"), rows, "llrrr"
    )
    return (
        "# Training throughput and memory on modern backbones\n\n"
        f"Command: `{harness.command('bench_backbones.py')}`\n\n"
        f"CPU: {cpu.get('model', '?')}, {args.threads} thread(s); batch {args.batch_size}, "
        f"max_seq_len {args.max_seq_len}, {args.steps} steps (the first is a warm-up and not "
        "counted). Random models of the real shapes with dropout 0.1 on every key of their "
        "table row; `cselab-gc` is `train.gradient_checkpointing`; `st` is "
        "sentence-transformers' SimCSE recipe (MultipleNegativesRankingLoss on (s, s), mean "
        "pooling), where the decoder stays causal. Peak RSS is each side's own process "
        "(VmHWM).\n\n" + table + "\n"
    )


def main(argv: list[str] | None = None) -> dict[str, dict[str, dict]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny shapes, 3 steps, one process")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--sides", default=",".join(SIDES))
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-seq-len", type=int, default=32)
    p.add_argument("--steps", type=int, default=21)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--out", type=Path, default=None, help=f"results page (default {DEFAULT_OUT})")
    p.add_argument("--worker", nargs=4, metavar=("SIDE", "MODEL", "CORPUS", "WORK"),
                   help=argparse.SUPPRESS)  # fmt: skip
    args = p.parse_args(argv)
    if args.smoke:
        args.steps, args.threads, args.batch_size = 3, 1, 8
    if args.worker:
        side, model, train, work = args.worker
        harness.reply(measure(side, Path(model), Path(train), Path(work), args))
        return {}
    sides = harness.pick_sides(args.sides, SIDES)
    results: dict[str, dict[str, dict]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-backbones-") as tmp:
        root = Path(tmp)
        train = corpus(root, args.batch_size * (args.steps + 1))
        for shape in [s for s in args.shapes.split(",") if s]:
            model = make_model(shape, root / shape, args.smoke)
            results[shape] = {}
            for side in sides:
                work = root / f"{shape}-{side}"
                if args.smoke:  # in process: the figures are only checked to exist
                    results[shape][side] = measure(side, model, train, work, args)
                    continue
                cli = ["--worker", side, str(model), str(train), str(work)]
                cli += [
                    "--batch-size",
                    str(args.batch_size),
                    "--max-seq-len",
                    str(args.max_seq_len),
                ]
                cli += ["--steps", str(args.steps), "--threads", str(args.threads)]
                results[shape][side] = harness.run_worker(__file__, cli, what=side)
    out = args.out if args.out else (None if args.smoke else DEFAULT_OUT)
    if out is not None:
        harness.write_page(out, page(results, args, harness.cpu_description()))
    print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
