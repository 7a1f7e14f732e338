"""Benchmark: hard-negative mining, ``cselab mine`` vs ``sentence_transformers.util.mine_hard_negatives``.

Pairs: ``--n`` (default 100,000) pairs generated from the shared wiki lines (11,914): pair ``i``
takes line ``i mod 11914`` and its copy number ``c = i // 11914``; the anchor is the line
without its word ``c mod len`` (a dropped word) and the first half of the rest, the positive is
the line with its words rotated left by ``c`` (the line itself for ``c = 0``). Written once as
JSONL (columns ``anchor``, ``positive``). Both sides mine with the packaged all-MiniLM-L6-v2,
the same filters (``--num-negatives`` 3, ``--relative-margin`` 0.05: NV-Retriever's
TopK-PercPos 95%), ``top`` sampling, exact search (cselab ``exact``; sentence-transformers
``use_faiss=False``, or both FAISS flat with ``--faiss``), batch 128, each in a fresh process,
alternating sides for ``--rounds`` rounds. Measured per side: wall seconds from reading the
pairs to the written file (encoding included), the process's peak resident set, rows written;
and how many anchors got the same negatives on both sides.

``--memory N`` adds the streaming check: ``N`` pairs (distinct anchors, ``--memory-distinct``
distinct positives) mined with a stand-in encoder (a fixed random vector per text), the peak
resident set against a process that only holds the file's texts in two lists. ``--n 0``
runs the check alone.

    PYTHONPATH=src python bench/bench_mine.py --memory 1000000 --out docs/results/mine_benchmark.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import harness

SIDES = ("cselab", "sentence-transformers")


def write_pairs(path: Path, n: int) -> None:
    lines = harness.wiki_lines()
    with path.open("w", encoding="utf-8") as fh:
        for i in range(n):
            words = lines[i % len(lines)].split()
            c = i // len(lines)
            kept = [w for j, w in enumerate(words) if j != c % len(words)] or words
            anchor = " ".join(kept[: max(1, len(kept) // 2)])
            positive = " ".join(words[c % len(words) :] + words[: c % len(words)])
            fh.write(json.dumps({"anchor": anchor, "positive": positive}) + "\n")


def worker(side: str, pairs: Path, out: Path, args: argparse.Namespace) -> dict:
    model = harness.minilm_path()
    t0 = time.perf_counter()
    if side == "cselab":
        from cselab.search.mine import MineSettings, mine_hard_negatives
        from cselab.search.settings import IndexSettings

        settings = MineSettings(
            num_negatives=args.num_negatives, relative_margin=args.relative_margin,
            index=IndexSettings(chunk_size=4096, batch_size=128,
                                backend="flat" if args.faiss else "exact"),
        )  # fmt: skip
        report = mine_hard_negatives(model, pairs, out, settings)
        rows = report.written
    else:
        from datasets import load_dataset
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.util import mine_hard_negatives

        data = load_dataset("json", data_files=str(pairs), split="train")
        st_model = SentenceTransformer(model, device="cpu")
        mined = mine_hard_negatives(
            data, st_model, num_negatives=args.num_negatives,
            relative_margin=args.relative_margin, batch_size=128, use_faiss=args.faiss,
            verbose=False,
        )  # fmt: skip
        mined.to_json(str(out), lines=True, force_ascii=False)
        rows = len(mined)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "rows": rows, "peak_rss_mib": harness.peak_rss_mib()}


class HashEncoder:
    """A stand-in encoder for the memory check: a fixed random unit vector per text (BLAKE2b of
    the text seeds it), a few microseconds a text, so the check measures the miner's own memory
    (texts, digests, index, output), not a model's."""

    source = None

    def __init__(self, dim: int = 32) -> None:
        from types import SimpleNamespace

        self.dim, self.pooler = dim, SimpleNamespace(kind="avg")

    def encode(self, texts, batch_size: int = 128, normalize: bool = True, **_):
        import hashlib

        import numpy as np

        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            seed = int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest(), "big")
            out[i] = np.random.default_rng(seed).standard_normal(self.dim)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def write_memory_pairs(path: Path, n: int, distinct: int) -> None:
    """``n`` pairs with ``n`` distinct anchors (a wiki line and its number) and ``distinct``
    distinct positives (wiki lines, each repeated)."""
    lines = harness.wiki_lines()
    with path.open("w", encoding="utf-8") as fh:
        for i in range(n):
            anchor = f"{lines[i % len(lines)]} ({i})"
            positive = f"{lines[i % distinct % len(lines)]} [{i % distinct}]"
            fh.write(json.dumps({"anchor": anchor, "positive": positive}) + "\n")


def memory_worker(folder: Path, args: argparse.Namespace) -> dict:
    from cselab.search.mine import MineSettings, mine_hard_negatives

    pairs = folder / "pairs.jsonl"
    t0 = time.perf_counter()
    # no margin: random vectors would fail it for most anchors, and the output is part of the check
    report = mine_hard_negatives(HashEncoder(), pairs, folder / "out.jsonl",
                                 MineSettings(num_negatives=args.num_negatives))  # fmt: skip
    return {"seconds": time.perf_counter() - t0, "rows": report.written,
            "corpus": report.corpus, "anchors": report.anchors,
            "peak_rss_mib": harness.peak_rss_mib(),
            "pairs_mib": pairs.stat().st_size / 2**20,
            "out_mib": (folder / "out.jsonl").stat().st_size / 2**20}  # fmt: skip


def memory_check(args: argparse.Namespace, work: Path) -> str:
    """The streaming check: ``--memory N`` pairs mined with :class:`HashEncoder`; the peak
    resident set against the file's size, and against Python holding the file's texts once."""
    write_memory_pairs(work / "pairs.jsonl", args.memory, args.memory_distinct)
    base = harness.run_worker(__file__, ["--worker-baseline", str(work)], what="baseline")
    result = harness.run_worker(
        __file__, [f"--num-negatives={args.num_negatives}",
                   f"--relative-margin={args.relative_margin}", "--worker-memory", str(work)],
        what="memory",
    )  # fmt: skip
    print("memory", result, "baseline", base, flush=True)
    return f"""
## Streaming: {args.memory:,} pairs

Command: `{harness.command("bench_mine.py", prefix="PYTHONPATH=src python")}`
(1-minute load average {os.getloadavg()[0]:.1f} at the end).

The file: {result["anchors"]:,} distinct anchors, {result["corpus"]:,} distinct
positives (a pairs file of {result["pairs_mib"]:.0f} MiB), mined with a stand-in encoder (a fixed
random 32-d vector per text, so the model's memory is not in the figure; {args.num_negatives}
negatives, no margin) into
{result["rows"]:,} rows ({result["out_mib"]:.0f} MiB) in {result["seconds"]:.0f} s (under load).

| process | peak RSS MiB |
|---|---|
| importing cselab and torch, nothing mined | {base["peak_rss_mib"]:.0f} |
| the same, then the file's anchor and positive texts read into two Python lists | {base["lists_peak_rss_mib"]:.0f} |
| `mine_hard_negatives` over the file | {result["peak_rss_mib"]:.0f} |
"""


def baseline_worker(folder: Path) -> dict:
    import cselab.search.mine  # noqa: F401  (the same imports as the miner)

    start = harness.peak_rss_mib()
    anchors, positives = [], []
    with (folder / "pairs.jsonl").open(encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            anchors.append(row["anchor"])
            positives.append(row["positive"])
    return {"peak_rss_mib": start, "lists_peak_rss_mib": harness.peak_rss_mib()}


def negatives_by_anchor(path: Path) -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = {}
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            out.setdefault((row["anchor"], row["positive"]), []).append(row["negative"])
    return out


def compare(args: argparse.Namespace, work: Path) -> str:
    """Both sides on ``--n`` pairs: the speed table and how many negatives agree."""
    write_pairs(work / "pairs.jsonl", args.n)
    base = [f"--n={args.n}", f"--num-negatives={args.num_negatives}",
            f"--relative-margin={args.relative_margin}", *(["--faiss"] if args.faiss else [])]  # fmt: skip
    results: dict[str, list[dict]] = {s: [] for s in SIDES}
    loads = []
    for _, side in harness.alternation(SIDES, args.rounds, abba=True):
        result = harness.run_worker(__file__, [*base, "--worker", side, str(work)], what=side)
        loads.append(os.getloadavg()[0])
        results[side].append(result)
        print(side, result, f"load {loads[-1]:.1f}", flush=True)
    ours, theirs = (negatives_by_anchor(work / f"{s}.jsonl") for s in SIDES)
    same = sum(ours.get(key) == negs for key, negs in theirs.items())
    same_set = sum(sorted(ours.get(key) or []) == sorted(negs) for key, negs in theirs.items())
    both = len(set(ours) | set(theirs))
    med = {s: harness.median(r["seconds"] for r in results[s]) for s in SIDES}
    rows = [
        f"| {s} | {med[s]:.1f} | {args.n / med[s]:.0f} | "
        f"{max(r['peak_rss_mib'] for r in results[s]):.0f} | {results[s][-1]['rows']} |"
        for s in SIDES
    ]
    return f"""
## Speed: {args.n:,} pairs

- load average after the runs: {", ".join(f"{x:.1f}" for x in loads)}
- pairs: {args.n} generated from the shared wiki lines (see the script's docstring), model:
  the packaged all-MiniLM-L6-v2, filters: {args.num_negatives} negatives, relative margin
  {args.relative_margin}, top sampling, {"FAISS flat" if args.faiss else "exact"} search,
  batch 128, {args.rounds} round(s), each side in a fresh process

| side | seconds (median) | pairs/s | peak RSS MiB | rows written |
|---|---|---|---|---|
{chr(10).join(rows)}

Same negatives: {same} of {both} (anchor, positive) pairs ({100 * same / max(both, 1):.2f}%)
got the same negatives in the same order on both sides, {same_set} the same set of negatives.
Where the order differs, two candidates have the same cosine (texts the model cannot tell
apart: checked on a 2,000-pair run, equal to 7 digits): cselab puts the lower corpus row first,
`torch.topk` its own way. Where a set differs, a candidate sits at a margin's edge or a tie at
the window's end, and the two encoders' float rounding (about 1e-6) decides.
"""


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000, help="pairs")
    ap.add_argument("--num-negatives", type=int, default=3)
    ap.add_argument("--relative-margin", type=float, default=0.05)
    ap.add_argument("--faiss", action="store_true", help="both sides search with FAISS flat")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--work-dir", default=None, help="where pairs and outputs go")
    ap.add_argument("--out", default=None, help="markdown results file")
    ap.add_argument("--memory", type=int, default=0,
                    help="also mine this many pairs with a stand-in encoder: peak memory")  # fmt: skip
    ap.add_argument("--memory-distinct", type=int, default=100_000,
                    help="distinct positives among the --memory pairs")  # fmt: skip
    ap.add_argument("--worker", nargs=2, metavar=("SIDE", "DIR"), help=argparse.SUPPRESS)
    ap.add_argument("--worker-memory", help=argparse.SUPPRESS)
    ap.add_argument("--worker-baseline", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker_memory:
        harness.reply(memory_worker(Path(args.worker_memory), args))
        return
    if args.worker_baseline:
        harness.reply(baseline_worker(Path(args.worker_baseline)))
        return
    if args.worker:
        side, folder = args.worker
        harness.reply(
            worker(side, Path(folder) / "pairs.jsonl", Path(folder) / f"{side}.jsonl", args)
        )
        return

    import tempfile

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="cselab-bench-mine-"))
    (work / "memory").mkdir(parents=True, exist_ok=True)
    cpu = harness.cpu_model()
    print(f"CPU: {cpu}; {os.cpu_count()} CPUs; load average {os.getloadavg()}", flush=True)
    page = f"""# Hard-negative mining: `cselab mine` vs sentence-transformers

**Taken under load** (a shared machine: other engineers' jobs ran at the same time; the
1-minute load average after each run is given, on {os.cpu_count()} CPUs). The figures are a
rough guide only; the lead may rerun the command on a quiet machine.

- CPU: {cpu}
- command: `{harness.command("bench_mine.py", prefix="PYTHONPATH=src python")}`
- versions: {json.dumps(harness.versions(("torch", "sentence_transformers", "faiss", "numpy")))}
"""
    if args.n:
        page += compare(args, work)
    if args.memory:
        page += memory_check(args, work / "memory")
    print(page)
    if args.out:
        harness.write_page(args.out, page)


if __name__ == "__main__":
    sys.exit(main())
