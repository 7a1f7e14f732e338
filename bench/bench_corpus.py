"""Benchmark: tokenising a large corpus into memory-mapped arrays, and training on it.

Measures, each in a fresh child process (so that peak RSS is that phase's own):

* **tokenise, cselab**: ``tokenize_corpus`` streaming the file into the token store (cold cache);
* **tokenise, datasets**: ``load_dataset("text")`` + ``Dataset.map(batched=True)`` with the same
  tokenizer, the same truncation and the same batch size (the peer: the usual way to do this);
* **train 20 steps**: ``cselab.app.train.build_trainer`` + ``train`` on the cached store
  (unsupervised SimCSE, batch 64, no evaluation), for each corpus size, with ``--model tiny``
  (a random 2-layer BERT, hidden 32, MiniLM's vocabulary: the memory is then mostly the data
  path's) or ``--model minilm`` (all-MiniLM-L6-v2, whose activations dominate);

and prints the wall time, lines/s, peak RSS (``VmHWM``) and the size of the token arrays.

With ``--triplets N``, the same for N generated ``(anchor, positive, negative)`` rows in a CSV
file: ``tokenize_pairs`` into the token store (cold cache, the tiny model's tokenizer), then a
supervised run with one hard negative per row on the cached columns. A run with ``--lines``
given no sizes measures only the triplets and puts their section into ``--out``, keeping the
rest of the file.

The synthetic corpus repeats the shared wiki sentences (``../shared/data/wiki``) with their
words shuffled by a seeded RNG, so every line is new text of a realistic length. It is written
under ``--work-dir`` (default ``outputs/bench_corpus``, git-ignored) and never committed.

    python bench/bench_corpus.py --lines 1000000 5000000 --peer-lines 1000000 \
        --train-lines 1000000 5000000 --model tiny
    python bench/bench_corpus.py --lines --triplets 1000000
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import shutil
import time
from pathlib import Path

import harness

from cselab.evaluation.report import markdown_table

CHUNK = 8192  # cselab's tokenisation chunk; datasets.map gets the same batch size
TRIPLETS_HEADING = "## Triplets: memory of tokenising and training (tiny random BERT)"


def synthetic_corpus(folder: Path, lines: int, seed: int = 0) -> Path:
    """``lines`` wiki sentences, cycled, each with its words shuffled (written once, reused)."""
    path = folder / f"synthetic-{lines}.txt"
    if path.is_file():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    source = [line.split() for line in harness.wiki_lines()]
    rng = random.Random(seed)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for i in range(lines):
            words = source[i % len(source)][:]
            rng.shuffle(words)
            fh.write(" ".join(words) + "\n")
    os.replace(tmp, path)
    return path


def synthetic_triplets(folder: Path, rows: int, seed: int = 0) -> Path:
    """``rows`` CSV triplets: a wiki sentence's words shuffled twice (anchor, positive) and
    another sentence's shuffled (negative), cycling through the sentences (written once)."""
    path = folder / f"triplets-{rows}.csv"
    if path.is_file():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    source = [line.split() for line in harness.wiki_lines()]
    rng = random.Random(seed)

    def shuffled(i: int) -> str:
        words = source[i % len(source)][:]
        rng.shuffle(words)
        return " ".join(words)

    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["anchor", "positive", "negative"])
        for i in range(rows):
            writer.writerow([shuffled(i), shuffled(i), shuffled(i + rng.randrange(1, len(source)))])
    os.replace(tmp, path)
    return path


def tiny_model(work: Path) -> str:
    """The tiny random BERT of ``bench_train --smoke`` (MiniLM's tokenizer), saved under ``work``."""
    return str(harness.make_smoke_assets(work / "tiny")[0])


# ------------------------------------------------------------------------------ child phases


def child_tokenize(corpus: Path, cache: Path) -> dict:
    from transformers import AutoTokenizer

    from cselab.data import tokenize_corpus

    tok = AutoTokenizer.from_pretrained(harness.minilm_path())
    shutil.rmtree(cache, ignore_errors=True)
    t0 = time.perf_counter()
    store, stats = tokenize_corpus(corpus, tok, 32, cache_dir=cache, progress=False)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "lines": stats.sentences, "store_mb": store.nbytes / 2**20}


def child_datasets(corpus: Path, cache: Path) -> dict:
    import datasets
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(harness.minilm_path())
    shutil.rmtree(cache, ignore_errors=True)
    datasets.disable_progress_bars()
    t0 = time.perf_counter()
    ds = datasets.load_dataset("text", data_files=str(corpus), split="train", cache_dir=str(cache))
    loaded = time.perf_counter() - t0
    ds = ds.map(
        lambda batch: tok(
            batch["text"],
            truncation=True,
            max_length=32,
            padding=False,
            return_attention_mask=False,
            return_token_type_ids=False,
        ),
        batched=True,
        batch_size=CHUNK,
        remove_columns=["text"],
    )
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "load_seconds": loaded, "lines": len(ds)}


def child_train(corpus: Path, cache: Path, out: Path, steps: int, model: str) -> dict:
    import torch

    from cselab.app.train import build_trainer
    from cselab.config import Config
    from cselab.data import tokenize_corpus

    torch.set_num_threads(2)
    config = Config()
    if model == "tiny":
        config.model.name_or_path = tiny_model(out.parent)
    else:
        config.model.name_or_path = harness.minilm_path()
    config.data.train_file = str(corpus)
    config.data.cache_dir = str(cache)
    config.train.output_dir = str(out)
    config.train.max_steps = steps
    config.train.eval_steps = 0
    config.train.device = "cpu"
    config.eval.enabled = False
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    trainer = build_trainer(config.validate())
    built = time.perf_counter() - t0
    results = trainer.train()
    # the size of the arrays the trainer reads (memory-mapped, not loaded)
    store, _ = tokenize_corpus(
        corpus, trainer.encoder.tokenizer, 32, cache_dir=cache / "tokens", progress=False
    )
    return {
        "build_seconds": built,
        "train_seconds": results["train_time_s"],
        "steps": results["steps"],
        "sentences": len(trainer.batches.corpus),
        "store_mb": store.nbytes / 2**20,
    }


def child_tokenize_pairs(triplets: Path, cache: Path) -> dict:
    from transformers import AutoTokenizer

    from cselab.data import tokenize_pairs

    # The tiny model's tokenizer is this one (a saved copy): the cache key is its definition,
    # so the training child finds these token ids without building the model here.
    tok = AutoTokenizer.from_pretrained(harness.minilm_path())
    shutil.rmtree(cache, ignore_errors=True)
    t0 = time.perf_counter()
    pairs, _ = tokenize_pairs(triplets, tok, 32, cache_dir=cache, progress=False)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "rows": len(pairs), "store_mb": pairs.nbytes / 2**20}


def child_train_pairs(triplets: Path, cache: Path, out: Path, steps: int) -> dict:
    import torch

    from cselab.app.train import build_trainer
    from cselab.config import Config

    torch.set_num_threads(2)
    config = Config()
    config.model.name_or_path = tiny_model(out.parent)
    config.data.train_file = str(triplets)
    config.data.cache_dir = str(cache)
    config.train.output_dir = str(out)
    config.train.max_steps = steps
    config.train.eval_steps = 0
    config.train.device = "cpu"
    config.eval.enabled = False
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    trainer = build_trainer(config.validate())
    built = time.perf_counter() - t0
    results = trainer.train()
    pairs = trainer.batches.corpus
    return {
        "build_seconds": built,
        "train_seconds": results["train_time_s"],
        "steps": results["steps"],
        "rows": len(pairs),
        "negatives": pairs.num_negatives,
        "store_mb": pairs.nbytes / 2**20,
        "cache_entries": len(list((cache / "tokens").glob("tokens-*"))),  # 1: nothing re-tokenised
    }


def put_section(doc: str, section: str) -> str:
    """``doc`` with ``section`` (a ``## `` heading and its text) in place of the section of the
    same heading, else before ``## Notes``, else at the end."""
    heading = section.splitlines()[0]
    lines = doc.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("## ")]
    own = [i for i in starts if lines[i] == heading]
    if own:
        end = next((i for i in starts if i > own[0]), len(lines))
        lines[own[0] : end] = section.rstrip("\n").splitlines() + [""]
    else:
        at = next((i for i in starts if lines[i] == "## Notes"), len(lines))
        gap = [""] if at and lines[at - 1] else []
        lines[at:at] = gap + section.rstrip("\n").splitlines() + [""]
    return "\n".join(lines).rstrip("\n") + "\n"


def run_child(args: list[str], record: Path | None = None) -> dict:
    """Run one phase in a fresh process; its result is also saved to ``record`` (``--reuse``)."""
    if record is not None and REUSE and record.is_file():
        return json.loads(record.read_text())
    result = harness.run_worker(__file__, ["--child", *args], what=f"child {args[0]}")
    if record is not None:
        harness.write_json(record, result)
    return result


REUSE = False


# ------------------------------------------------------------------------------------ driver


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, nargs="*", default=[1_000_000, 5_000_000])
    parser.add_argument("--train-lines", type=int, nargs="*", default=None,
                        help="corpus sizes to train 20 steps on (default: --lines)")  # fmt: skip
    parser.add_argument("--peer-lines", type=int, nargs="*", default=None,
                        help="corpus sizes to run the datasets.map peer on (default: --lines)")  # fmt: skip
    parser.add_argument("--triplets", type=int, nargs="*", default=[],
                        help="generated triplet counts to tokenise and train on (tiny model)")  # fmt: skip
    parser.add_argument("--model", choices=("tiny", "minilm"), default="tiny")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--work-dir", default=str(harness.REPO / "outputs" / "bench_corpus"))
    parser.add_argument("--out", default=str(harness.RESULTS / "corpus_benchmark.md"))
    parser.add_argument("--reuse", action="store_true",
                        help="take phases already measured in --work-dir from their results files")  # fmt: skip
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    work = Path(args.work_dir)
    global REUSE
    REUSE = args.reuse

    if args.child:
        phase, *rest = args.child
        corpus, cache = Path(rest[0]), Path(rest[1])
        if phase == "tokenize":
            result = child_tokenize(corpus, cache)
        elif phase == "datasets":
            result = child_datasets(corpus, cache)
        elif phase == "tokenize-pairs":
            result = child_tokenize_pairs(corpus, cache)
        elif phase == "train-pairs":
            result = child_train_pairs(corpus, cache, Path(rest[2]), int(rest[3]))
        else:
            result = child_train(corpus, cache, Path(rest[2]), int(rest[3]), rest[4])
        result["peak_rss_mb"] = harness.peak_rss_mib()
        harness.reply(result)
        return 0

    rows_tok, rows_train = [], []
    load = harness.load1()
    for n in args.lines:
        t0 = time.perf_counter()
        corpus = synthetic_corpus(work, n)
        print(f"{n:,} lines: {corpus} ({corpus.stat().st_size / 2**20:.0f} MiB, "
              f"{time.perf_counter() - t0:.0f}s to generate)", flush=True)  # fmt: skip
        ours = run_child(
            ["tokenize", str(corpus), str(work / f"cache-{n}" / "tokens")],
            work / f"result-tokenize-{n}.json",
        )
        print(f"  cselab tokenize_corpus: {ours}", flush=True)
        peer = None
        if args.peer_lines is None or n in args.peer_lines:
            peer = run_child(
                ["datasets", str(corpus), str(work / f"hf-{n}")], work / f"result-datasets-{n}.json"
            )
            shutil.rmtree(work / f"hf-{n}", ignore_errors=True)  # several GB of arrow files
            print(f"  datasets load+map:      {peer}", flush=True)
        rows_tok.append((n, corpus.stat().st_size, ours, peer))
    for n in args.lines if args.train_lines is None else args.train_lines:
        corpus = synthetic_corpus(work, n)
        res = run_child(["train", str(corpus), str(work / f"cache-{n}"), str(work / f"run-{n}"),
                         str(args.steps), args.model], work / f"result-train-{n}-{args.model}.json")  # fmt: skip
        print(f"  train {args.steps} steps on {n:,} lines: {res}", flush=True)
        rows_train.append((n, res))
    rows_pairs = []
    for n in args.triplets:
        triplets = synthetic_triplets(work, n)
        cache = work / f"cache-triplets-{n}"
        tok = run_child(["tokenize-pairs", str(triplets), str(cache / "tokens")],
                        work / f"result-tokenize-triplets-{n}.json")  # fmt: skip
        print(f"  cselab tokenize_pairs on {n:,} triplets: {tok}", flush=True)
        res = run_child(["train-pairs", str(triplets), str(cache), str(work / f"run-triplets-{n}"),
                         str(args.steps)], work / f"result-train-triplets-{n}.json")  # fmt: skip
        print(f"  train {args.steps} steps on {n:,} triplets: {res}", flush=True)
        if res["cache_entries"] != 1:
            raise SystemExit("the training run did not find the tokenised triplets in the cache")
        rows_pairs.append((n, triplets.stat().st_size, tok, res))

    import torch

    model_name = {
        "tiny": "tiny random BERT: 2 layers, hidden 32, MiniLM vocabulary",
        "minilm": "all-MiniLM-L6-v2",
    }[args.model]
    command = harness.command("bench_corpus.py", argv)
    machine = f"CPU: {harness.cpu_model()}, {os.cpu_count()} cores seen, shared with other jobs"
    triplet_section = [
        TRIPLETS_HEADING,
        "",
        f"Command: `{command}`  ",
        f"{machine} (load average {load:.1f} at the start, {harness.load1():.1f} at the "
        f"end); torch {torch.__version__}.  ",
        "Rows: generated CSV triplets (`anchor,positive,negative`: a wiki sentence's words "
        "shuffled twice, and another sentence's, seeded), tokenised by `tokenize_pairs` into the "
        "token store (cold cache; MiniLM's fast tokenizer, which the tiny model carries; "
        f"max_seq_len 32), then {args.steps} supervised SimCSE steps (`build_trainer` + `train`) "
        "on the cached, memory-mapped columns, found without re-tokenising (tiny random BERT, "
        "batch 64, the negative column in every denominator, fp32, CPU, 2 threads, no eval). "
        "Peak RSS: `VmHWM` of a fresh child process per phase (it includes Python, torch and "
        "transformers). Times under this load are not results and are not shown.",
        "",
        markdown_table(
            ["triplets", "CSV MiB", "token arrays MiB", "tokenise peak RSS MiB",
             "train peak RSS MiB"],
            [[f"{n:,}", f"{size / 2**20:.0f}", f"{tok['store_mb']:.0f}",
              f"{tok['peak_rss_mb']:.0f}", f"{res['peak_rss_mb']:.0f}"]
             for n, size, tok, res in rows_pairs],
            align="rrrrr",
        ),
        "",
    ]  # fmt: skip
    if not (rows_tok or rows_train):  # triplets only: the rest of the file stays as measured
        out = Path(args.out)
        doc = out.read_text(encoding="utf-8") if out.is_file() else ""
        text = put_section(doc, "\n".join(triplet_section))
        print(text)
        harness.write_page(out, text)
        return 0
    lines = [
        "# Corpus benchmark: streaming tokenisation into memory-mapped arrays",
        "",
        f"Command: `{command}`  ",
        f"{machine} (load average {load:.1f} at the start); torch {torch.__version__}.  ",
        "Corpus: the shared wiki sentences cycled with their words shuffled (seeded). "
        "Tokenizer: all-MiniLM-L6-v2's fast BERT tokenizer (packaged), max_seq_len 32, "
        f"batches of {CHUNK} lines for both. Peak RSS: `VmHWM` of a fresh child process per "
        "row (it includes Python, torch and transformers).",
        "",
        "## Tokenisation (cold cache)",
        "",
    ]
    tok_rows = []
    for n, size, ours, peer in rows_tok:
        cells = [f"{n:,}", f"{size / 2**20:.0f}", f"{ours['store_mb']:.0f}",
                 f"{ours['seconds']:.1f}", f"{n / ours['seconds']:,.0f}",
                 f"{ours['peak_rss_mb']:.0f}"]  # fmt: skip
        if peer:
            cells += [f"{peer['seconds']:.1f}", f"{n / peer['seconds']:,.0f}",
                      f"{peer['peak_rss_mb']:.0f}",
                      f"{peer['seconds'] / ours['seconds']:.2f}x"]  # fmt: skip
        else:
            cells += ["–"] * 4
        tok_rows.append(cells)
    lines += [
        markdown_table(["lines", "text MiB", "token arrays MiB", "cselab s", "cselab lines/s",
                        "cselab peak RSS MiB", "datasets load+map s", "datasets lines/s",
                        "datasets peak RSS MiB", "speed ratio"], tok_rows, align="r" * 10),
        "",
        "speed ratio = datasets time / cselab time (above 1: cselab is faster).",
        "",
        f"## Training {args.steps} steps ({model_name}, batch 64, fp32, CPU, 2 threads, no eval)",
        "",
        markdown_table(
            ["lines", "token arrays MiB", "peak RSS MiB", "build s", "train s"],
            [[f"{n:,}", f"{res['store_mb']:.0f}", f"{res['peak_rss_mb']:.0f}",
              f"{res['build_seconds']:.1f}", f"{res['train_seconds']:.1f}"]
             for n, res in rows_train],
            align="rrrrr",
        ),
        "",
    ]  # fmt: skip
    text = "\n".join(lines)
    if rows_pairs:
        text = put_section(text, "\n".join(triplet_section))
    print(text)
    harness.write_page(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
