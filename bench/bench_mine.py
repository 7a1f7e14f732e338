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

    python bench/bench_mine.py --out docs/results/mine_benchmark.md
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
        from cselab.search.mine import mine_hard_negatives

        report = mine_hard_negatives(
            model, pairs, out, num_negatives=args.num_negatives,
            relative_margin=args.relative_margin, batch_size=128,
            backend="flat" if args.faiss else "exact",
        )  # fmt: skip
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


def negatives_by_anchor(path: Path) -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = {}
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            out.setdefault((row["anchor"], row["positive"]), []).append(row["negative"])
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000, help="pairs")
    ap.add_argument("--num-negatives", type=int, default=3)
    ap.add_argument("--relative-margin", type=float, default=0.05)
    ap.add_argument("--faiss", action="store_true", help="both sides search with FAISS flat")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--work-dir", default=None, help="where pairs and outputs go")
    ap.add_argument("--out", default=None, help="markdown results file")
    ap.add_argument("--worker", nargs=2, metavar=("SIDE", "DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        side, folder = args.worker
        harness.reply(
            worker(side, Path(folder) / "pairs.jsonl", Path(folder) / f"{side}.jsonl", args)
        )
        return

    import tempfile

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="cselab-bench-mine-"))
    work.mkdir(parents=True, exist_ok=True)
    write_pairs(work / "pairs.jsonl", args.n)
    cpu = harness.cpu_model()
    print(f"CPU: {cpu}; {os.cpu_count()} CPUs; load average {os.getloadavg()}", flush=True)
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
    both = len(set(ours) | set(theirs))
    med = {s: harness.median(r["seconds"] for r in results[s]) for s in SIDES}
    rows = [
        f"| {s} | {med[s]:.1f} | {args.n / med[s]:.0f} | "
        f"{max(r['peak_rss_mib'] for r in results[s]):.0f} | {results[s][-1]['rows']} |"
        for s in SIDES
    ]
    page = f"""# Hard-negative mining: `cselab mine` vs sentence-transformers

**Taken under load** (a shared machine: other engineers' jobs ran at the same time; 1-minute
load average {min(loads):.1f} to {max(loads):.1f} on {os.cpu_count()} CPUs). The ratio is a
rough guide only; the lead may rerun it on a quiet machine.

- CPU: {cpu}
- command: `{harness.command("bench_mine.py", prefix="PYTHONPATH=src python")}`
- pairs: {args.n} generated from the shared wiki lines (see the script's docstring), model:
  the packaged all-MiniLM-L6-v2, filters: {args.num_negatives} negatives, relative margin
  {args.relative_margin}, top sampling, {"FAISS flat" if args.faiss else "exact"} search,
  batch 128, {args.rounds} round(s), each side in a fresh process
- versions: {json.dumps(harness.versions(("torch", "sentence_transformers", "faiss", "numpy")))}

| side | seconds (median) | pairs/s | peak RSS MiB | rows written |
|---|---|---|---|---|
{chr(10).join(rows)}

Same negatives: {same} of {both} (anchor, positive) pairs ({100 * same / max(both, 1):.2f}%)
got the same negatives in the same order on both sides. The rest differ by float rounding of
two encoders (cselab's and sentence-transformers' forward passes agree to about 1e-6 in
cosine): a candidate at the edge of the margin or tied in rank can fall either way.
"""
    print(page)
    if args.out:
        harness.write_page(args.out, page)


if __name__ == "__main__":
    sys.exit(main())
