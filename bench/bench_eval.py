"""Benchmark: the full STS suite (STS12-16, STS-B test, SICK-R test) with cselab vs SentEval's way.

Both paths use the same encoder object (``cselab.load`` of the packaged all-MiniLM-L6-v2):

* **cselab** ``evaluate(encoder, tasks="sts")``: every distinct sentence of the 7 tasks encoded
  once, longest first, in batches of ``--batch-size``;
* **SentEval-style** (a transcription of SentEval/SimCSE ``sts.py``'s procedure): per file,
  scored pairs sorted by (len(s1), len(s2), score), then for each batch of ``--batch-size``
  pairs the first and the second sentences encoded separately; no deduplication.

The two must give the same Spearman (checked here to 0.01 on the x100 scale). Results are
printed and written to ``docs/results/eval_benchmark.md`` (``--out``). Timings on a shared
machine are noisy: ``--repeats`` alternates the two paths and reports each one's best run.

    python bench/bench_eval.py --threads 2 --repeats 1
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import harness
import numpy as np
from scipy import stats

STS_TASKS = ("STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness")


def senteval_style(
    encoder, data_dir: Path, batch_size: int, calls: list[list[str]] | None = None
) -> tuple[dict[str, float], int]:
    """SentEval's per-file procedure; returns ({task: Spearman x 100}, sentences encoded).

    ``calls`` (if given) receives the sentence list of every encoder call, for the padding count.
    """
    from cselab.evaluation import datasets as ds

    def pairs_of(task: str) -> list[list[tuple[list[str], list[str], float]]]:
        files = []
        if task in ds.STS_YEARS:
            folder = data_dir / "STS" / f"{task}-en-test"
            for subset in ds.STS_YEARS[task]:
                lines = (folder / f"STS.input.{subset}.txt").read_text("utf-8").splitlines()
                golds = (folder / f"STS.gs.{subset}.txt").read_text("utf-8").splitlines()
                files.append(
                    [
                        (*(side.split() for side in line.split("\t")), float(g))
                        for line, g in zip(lines, golds, strict=True)
                        if g != ""
                    ]
                )
        else:
            path, cols, skip = {
                "STSBenchmark": (data_dir / "STS" / "STSBenchmark" / "sts-test.csv", (5, 6, 4), 0),
                "SICKRelatedness": (data_dir / "SICK" / "SICK_test_annotated.txt", (1, 2, 3), 1),
            }[task]
            with path.open(encoding="utf-8") as f:
                rows = [line.strip().split("\t") for line in f][skip:]
            files.append(
                [(r[cols[0]].split(), r[cols[1]].split(), float(r[cols[2]])) for r in rows]
            )
        return files

    scores: dict[str, float] = {}
    encoded = 0
    for task in STS_TASKS:
        sys_all: list[float] = []
        gold_all: list[float] = []
        for rows in pairs_of(task):
            rows.sort(key=lambda z: (len(z[0]), len(z[1]), z[2]))
            for i in range(0, len(rows), batch_size):
                chunk = rows[i : i + batch_size]
                side1 = [" ".join(r[0]) for r in chunk]
                side2 = [" ".join(r[1]) for r in chunk]
                if calls is not None:
                    calls += [side1, side2]
                e1 = encoder.encode(side1, batch_size=batch_size)
                e2 = encoder.encode(side2, batch_size=batch_size)
                encoded += 2 * len(chunk)
                for u, v in zip(e1, e2, strict=True):
                    sys_all.append(float(np.dot(u, v) / (np.linalg.norm(u) * np.linalg.norm(v))))
                gold_all.extend(r[2] for r in chunk)
        scores[task] = 100 * stats.spearmanr(sys_all, gold_all)[0]
    return scores, encoded


def cselab_way(encoder, data_dir: Path, batch_size: int) -> tuple[dict[str, float], dict]:
    from cselab.evaluation import evaluate

    out = evaluate(encoder, tasks=",".join(STS_TASKS), data_dir=data_dir, batch_size=batch_size)
    res = out["results"]
    scores = {
        t: 100 * (res[t]["all"]["spearman"] if t.startswith("STS1") else res[t]["spearman"])
        for t in STS_TASKS
    }
    return scores, out


def padded_tokens(tokenizer, calls: list[list[str]], batch_size: int) -> int:
    """Token positions the model computes: per batch, batch size x longest sentence.

    Batches are formed as ``SentenceEncoder.encode`` forms them (each call's sentences sorted
    by character length, longest first, cut into ``batch_size`` chunks).
    """
    total = 0
    for sentences in calls:
        order = sorted(range(len(sentences)), key=lambda i: -len(sentences[i]))
        lengths = [len(ids) for ids in tokenizer([sentences[i] for i in order])["input_ids"]]
        for start in range(0, len(lengths), batch_size):
            chunk = lengths[start : start + batch_size]
            total += len(chunk) * max(chunk)
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=str(harness.SENTEVAL))
    parser.add_argument("--pooler", default="avg")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument(
        "--repeats", type=int, default=1, help="rounds; round i runs cselab first if i is even"
    )
    parser.add_argument("--out", default=str(harness.RESULTS / "eval_benchmark.md"))
    args = parser.parse_args()

    import torch

    import cselab
    from cselab.evaluation import datasets as ds
    from cselab.evaluation.report import markdown_table

    if args.threads:
        torch.set_num_threads(args.threads)
    data_dir = Path(args.data_dir)
    encoder = cselab.load(harness.minilm_path(), pooler=args.pooler)
    encoder.encode(["warm up the model ."] * 8)
    load_before = harness.load1()

    wall: dict[str, list[float]] = {"cselab": [], "senteval": []}
    cpu: dict[str, list[float]] = {"cselab": [], "senteval": []}
    calls: list[list[str]] = []
    # ABBA order over rounds, so a drift in the machine's load hits both paths alike
    for _, path in harness.alternation(("cselab", "senteval"), args.repeats, abba=True):
        ds.clear_cache()  # parse the files again each time, as a fresh process would
        t0, c0 = time.perf_counter(), time.process_time()
        if path == "cselab":
            ours, out = cselab_way(encoder, data_dir, args.batch_size)
        else:
            calls.clear()
            ref, ref_encoded = senteval_style(encoder, data_dir, args.batch_size, calls)
        wall[path].append(time.perf_counter() - t0)
        cpu[path].append(time.process_time() - c0)
    load_after = harness.load1()

    # the distinct sentences as evaluate() sends them: one call, longest first
    from cselab.evaluation.sts import sentences_of

    distinct_call = [list(dict.fromkeys(sentences_of(STS_TASKS, "test", data_dir)))]
    tok_ours = padded_tokens(encoder.tokenizer, distinct_call, args.batch_size)
    tok_ref = padded_tokens(encoder.tokenizer, calls, args.batch_size)

    diffs = {t: abs(ours[t] - ref[t]) for t in STS_TASKS}
    occurrences = out["encoding"]["requested"]
    distinct = out["encoding"]["distinct"]
    best = {k: min(v) for k, v in wall.items()}
    mean = {k: sum(v) / len(v) for k, v in wall.items()}
    cpu_best = {k: min(v) for k, v in cpu.items()}
    speedup = best["senteval"] / best["cselab"]
    names = [t.replace("Benchmark", "-B").replace("SICKRelatedness", "SICK-R") for t in STS_TASKS]

    def runs(v: list[float]) -> str:
        return ", ".join(f"{x:.1f}" for x in v)

    timing = markdown_table(
        ["path", "wall time (s), best", "wall time per round (s)", "CPU time (s), best",
         "sentences encoded", "padded token positions", "pair sentences scored / s", "encoded / s"],
        [["cselab `evaluate(tasks='sts')`", f"{best['cselab']:.1f}", runs(wall["cselab"]),
          f"{cpu_best['cselab']:.1f}", f"{distinct:,} (distinct)", f"{tok_ours:,}",
          f"{occurrences / best['cselab']:.1f}", f"{distinct / best['cselab']:.1f}"],
         ["SentEval-style: per file, per side, no dedup", f"{best['senteval']:.1f}",
          runs(wall["senteval"]), f"{cpu_best['senteval']:.1f}", f"{ref_encoded:,}", f"{tok_ref:,}",
          f"{ref_encoded / best['senteval']:.1f}", f"{ref_encoded / best['senteval']:.1f}"]],
    )  # fmt: skip
    scores = markdown_table(
        ["", *names],
        [["cselab", *(f"{ours[t]:.2f}" for t in STS_TASKS)],
         ["SentEval-style", *(f"{ref[t]:.2f}" for t in STS_TASKS)],
         ["abs. difference", *(f"{diffs[t]:.4f}" for t in STS_TASKS)]],
    )  # fmt: skip
    lines = [
        "# Evaluation benchmark: full STS suite, cselab vs SentEval-style",
        "",
        f"Command (repository root): `{harness.command('bench_eval.py')}`",
        "",
        f"Model: packaged all-MiniLM-L6-v2 via `cselab.load(..., pooler={args.pooler!r})`, batch "
        f"size {args.batch_size} for both paths; torch {torch.__version__}, "
        f"{torch.get_num_threads()} intra-op thread(s); {os.cpu_count()} CPUs "
        f"({platform.machine()}), shared with other jobs: load average {load_before:.1f} "
        f"before, {load_after:.1f} after. {args.repeats} round(s), alternating order.",
        "",
        timing,
        "",
        f"**Speed-up (best wall time): {speedup:.2f}x**; mean wall time "
        f"{mean['senteval'] / mean['cselab']:.2f}x; CPU time "
        f"{cpu_best['senteval'] / cpu_best['cselab']:.2f}x; token positions computed "
        f"{tok_ref / tok_ours:.2f}x fewer (target >= 1.5x). Both paths score the same "
        f"{occurrences:,} sentence occurrences ({occurrences // 2:,} pairs).",
        "",
        "Spearman x 100 (STS12-16: 'all'; STS-B, SICK-R: test), same encoder object:",
        "",
        scores,
        "",
        f"Largest difference {max(diffs.values()):.4f} (required < 0.01): different batches pad "
        "differently, which moves the vectors by float noise, and SentEval's float32 cosine "
        "breaks the ties of identical sentence pairs by rounding noise.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    harness.write_page(args.out, text)
    return 0 if max(diffs.values()) < 0.01 else 1


if __name__ == "__main__":
    raise SystemExit(main())
