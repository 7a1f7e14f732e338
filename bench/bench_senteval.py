"""Benchmark: ``cselab evaluate --tasks sts`` against SentEval's own run, whole processes (CPU).

The two commands a user runs to get the seven STS numbers of a model (STS12-16 "all", STS-B and
SICK-R test; Spearman x 100 of cosine similarities), each timed from process start to exit
(interpreter start, imports, model load, data, encoding, scoring), alternating ``--rounds``
rounds:

* **cselab**: ``python -m cselab evaluate MODEL --tasks sts --pooler avg --data-dir DATA
  --no-download -o results.json``;
* **SentEval**: SentEval's engine (``senteval.engine.SE``) from a checkout given with
  ``--senteval`` (SentEval is not on PyPI), run on the same files with the batcher of SimCSE's
  ``evaluation.py``: the Hugging Face model and tokenizer, each batch padded to its longest
  sentence, ``--pooler avg`` (the mean of the last layer over real tokens, the pooling of the
  packaged all-MiniLM-L6-v2). SimCSE's copy of SentEval (``princeton-nlp/SimCSE``, folder
  ``SentEval/``) is the one the papers report with: its STS-B and SICK-R are scored unsupervised
  (cosine), as cselab scores them; facebookresearch/SentEval's own ``STSBenchmark`` trains a
  regressor instead, so that checkout is refused.

SentEval reads ``TASK_PATH/downstream/STS/...``; the shared data folder *is* that ``downstream``
folder, so a scratch folder with a ``downstream`` link to it is given as the task path. Like
SimCSE's script, SentEval encodes every split of STS-B and SICK (train, dev and test, as its
``STSEval.run`` does) and does not deduplicate; cselab encodes each distinct test sentence
once. The table gives both sides' numbers and their largest difference.

    git clone https://github.com/princeton-nlp/SimCSE /tmp/SimCSE     # once
    python bench/bench_senteval.py --senteval /tmp/SimCSE/SentEval    # writes the results page
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness

DEFAULT_OUT = harness.RESULTS / "senteval_benchmark.md"
SIDES = ("cselab", "senteval")
STS_TASKS = ("STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness")
YEARS = STS_TASKS[:5]
TARGET = 5.0  # SentEval's wall time / cselab's (the evaluation target)


def senteval_worker(args: argparse.Namespace) -> None:
    """SentEval's engine with a SimCSE-style batcher; prints one JSON line of Spearman x 100."""
    import numpy as np
    import torch
    from transformers import AutoModel, AutoTokenizer

    sys.path.insert(0, str(args.senteval))
    import senteval

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModel.from_pretrained(args.model).eval()

    def batcher(params: Any, batch: list[list[str]]) -> np.ndarray:
        texts = [" ".join(words) for words in batch]
        inputs = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
        with torch.no_grad():
            hidden = model(**inputs).last_hidden_state
        mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        return ((hidden * mask).sum(1) / mask.sum(1)).numpy()

    with tempfile.TemporaryDirectory(prefix="senteval-task-path-") as tmp:
        (Path(tmp) / "downstream").symlink_to(Path(args.data_dir).resolve())
        params = {"task_path": tmp, "usepytorch": True, "kfold": 10, "batch_size": args.batch_size}
        scores = {}
        for task in STS_TASKS:
            result = senteval.engine.SE(params, batcher, lambda p, s: None).eval(task)
            value = (
                result["all"]["spearman"]["all"] if task in YEARS else result["test"]["spearman"][0]
            )
            scores[task] = 100.0 * float(value)
    harness.reply({"scores": scores})


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    """(wall seconds of ``cmd`` from start to exit, its stdout); exits naming it with its
    stderr on failure."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} failed:\n{proc.stderr[-3000:]}")
    return seconds, proc.stdout


def cselab_scores(path: Path) -> dict[str, float]:
    results = json.loads(path.read_text(encoding="utf-8"))["results"]
    return {
        t: 100.0 * (results[t]["all"]["spearman"] if t in YEARS else results[t]["spearman"])
        for t in STS_TASKS
    }


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--senteval", type=Path, default=None, help="a SentEval checkout (SimCSE's)")
    p.add_argument("--model", default=None, help="default: the packaged all-MiniLM-L6-v2")
    p.add_argument("--data-dir", type=Path, default=harness.SENTEVAL)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.model is None:
        args.model = str(harness.minilm_path())
    if args.senteval is None or not (args.senteval / "senteval" / "engine.py").is_file():
        raise SystemExit("--senteval: a SentEval checkout (the folder holding senteval/engine.py)")
    if "STSBenchmarkFinetune" not in (args.senteval / "senteval" / "sts.py").read_text():
        raise SystemExit(
            f"{args.senteval}: this SentEval trains a regressor for STS-B; use SimCSE's copy "
            "(princeton-nlp/SimCSE, folder SentEval/), which scores it by cosine"
        )
    if args.worker:
        senteval_worker(args)
        return None
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    load_before = os.getloadavg()[0]
    wall: dict[str, list[float]] = {side: [] for side in SIDES}
    scores: dict[str, dict[str, float]] = {}
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-senteval-") as tmp:
        out_json = Path(tmp) / "cselab.json"
        commands = {
            "cselab": [sys.executable, "-m", "cselab", "evaluate", args.model, "--tasks", "sts",
                       "--pooler", "avg", "--data-dir", str(args.data_dir), "--no-download",
                       "--batch-size", str(args.batch_size), "-o", str(out_json)],
            "senteval": [sys.executable, __file__, "--worker", "--senteval", str(args.senteval),
                         "--model", args.model, "--data-dir", str(args.data_dir),
                         "--batch-size", str(args.batch_size)],
        }  # fmt: skip
        for rnd, side in harness.alternation(SIDES, args.rounds, abba=True):
            seconds, stdout = timed(commands[side], env)
            wall[side].append(seconds)
            print(f"round {rnd + 1} {side}: {seconds:.1f} s", flush=True)
            if side == "cselab":
                scores["cselab"] = cselab_scores(out_json)
            else:
                line = [ln for ln in stdout.splitlines() if ln.startswith("{")][-1]
                scores["senteval"] = json.loads(line)["scores"]
    result = {
        "wall_s": wall,
        "scores": scores,
        "ratio": harness.median(wall["senteval"]) / harness.median(wall["cselab"]),
        "load": (load_before, os.getloadavg()[0]),
        "total_min": (time.perf_counter() - t_start) / 60,
    }
    page = render(args, argv, result)
    print(page)
    harness.write_page(args.out, page)
    print(f"wrote {args.out}")
    return result


def render(args: argparse.Namespace, argv: list[str] | None, result: dict[str, Any]) -> str:
    import torch

    from cselab.evaluation.report import markdown_table

    cpu = harness.cpu_description()
    wall, scores = result["wall_s"], result["scores"]
    labels = ["STS12", "STS13", "STS14", "STS15", "STS16", "STS-B", "SICK-R"]
    diff = max(abs(scores["cselab"][t] - scores["senteval"][t]) for t in STS_TASKS)
    met = "met" if result["ratio"] >= TARGET else "not met"
    return "\n".join(
        [
            "# STS evaluation: `cselab evaluate` vs SentEval's own run (whole processes, CPU)",
            "",
            f"- device: {cpu['model']}, {cpu['logical_cpus']} logical CPUs, torch threads "
            f"{torch.get_num_threads()}, SIMD {', '.join(cpu['simd'])}",
            "- versions: " + ", ".join(f"{k} {v}" for k, v in harness.versions().items()),
            f"- model: `{args.model}`, mean pooling; batch {args.batch_size}; SentEval: "
            f"`{args.senteval}`",
            f"- command: `{harness.command('bench_senteval.py', argv)}` ({args.rounds} round(s), "
            f"alternating; load average {result['load'][0]:.2f} before, {result['load'][1]:.2f} "
            f"after; whole run {result['total_min']:.1f} min)",
            "",
            markdown_table(
                ["side", "wall s (median)", "per round"],
                [
                    [
                        side,
                        f"{harness.median(wall[side]):.1f}",
                        ", ".join(f"{w:.1f}" for w in wall[side]),
                    ]
                    for side in SIDES
                ],
            ),  # fmt: skip
            "",
            f"**SentEval / cselab wall time: {result['ratio']:.2f}×** (target ≥ {TARGET}×: {met}).",
            "",
            markdown_table(
                ["", *labels],
                [[side, *(f"{scores[side][t]:.2f}" for t in STS_TASKS)] for side in SIDES]
                + [
                    [
                        "abs. difference",
                        *(
                            f"{abs(scores['cselab'][t] - scores['senteval'][t]):.4f}"
                            for t in STS_TASKS
                        ),
                    ]
                ],
            ),  # fmt: skip
            "",
            f"Largest difference {diff:.4f} (Spearman x 100).",
            "",
        ]
    )


if __name__ == "__main__":
    main()
