"""``cselab evaluate`` and ``cselab compare`` (registered on the main CLI's subparsers)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from cselab.pooling import POOLERS

from .datasets import DataFormatError, MissingDataError
from .download import ensure_data

MODES = ("test", "dev", "fasttest")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``evaluate`` and ``compare``; each sets ``func(args) -> int`` (the exit code)."""
    ev = subparsers.add_parser(
        "evaluate",
        help="SentEval STS and transfer tasks (SimCSE's numbers)",
        description=(
            "Evaluate a sentence encoder on STS12-16, STS-B, SICK-R and the SentEval transfer "
            "tasks, as SentEval + SimCSE's evaluation.py do. Prints markdown tables; --output "
            "writes every number as JSON."
        ),
    )
    ev.add_argument("model", help="cselab output folder, sentence-transformers folder, or HF model")
    ev.add_argument(
        "--tasks",
        default="sts",
        help="sts | transfer | all | comma-separated names (STS12..STS16, STSBenchmark, "
        "SICKRelatedness, MR, CR, SUBJ, MPQA, SST2, TREC, MRPC, AlignUniform); default: sts",
    )
    ev.add_argument("--mode", choices=MODES, default="test", help="default: test")
    ev.add_argument(
        "--pooler",
        choices=POOLERS,
        default=None,
        help="override the saved pooler (plain HF models default to cls_before_pooler)",
    )
    ev.add_argument("--batch-size", type=int, default=128, help="encoding batch size (128)")
    ev.add_argument("--output", "-o", help="write the full results as JSON")
    ev.add_argument("--csv", help="write every number as long-format CSV")
    ev.add_argument(
        "--data-dir", help="SentEval data/downstream folder (else $CSELAB_DATA or cache)"
    )
    ev.add_argument("--no-download", action="store_true", help="never download missing data")
    ev.set_defaults(func=run_evaluate)

    cmp_ = subparsers.add_parser(
        "compare",
        help="one table from several `cselab evaluate --output` files",
        description="Print the headline tables with one row per results file.",
    )
    cmp_.add_argument("results", nargs="+", help="JSON files written by `cselab evaluate -o`")
    cmp_.add_argument("--names", help="comma-separated row names (default: the model names)")
    cmp_.add_argument("--csv", help="write all runs' numbers as one long-format CSV")
    cmp_.set_defaults(func=run_compare)


def check_output_path(path: str, option: str) -> None:
    """Raise ``ValueError`` naming ``option`` if ``path`` cannot be written, so that a bad
    ``-o`` is reported before the evaluation runs, not after."""
    p = Path(path)
    folder = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        reason = "is a folder"
    elif not folder.is_dir():
        reason = f"folder {folder} does not exist"
    elif not os.access(folder, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        reason = "permission denied"
    else:
        return
    raise ValueError(f"{option} {path}: cannot write there ({reason})")


def run_evaluate(args: argparse.Namespace) -> int:
    from . import api, report

    try:
        for option, path in (("--output", args.output), ("--csv", args.csv)):
            if path:
                check_output_path(path, option)
        tasks = api.parse_tasks(args.tasks, args.mode)
        # check (or fetch) the data before spending time on loading the model
        ensure_data(tasks, args.data_dir, download_missing=not args.no_download)
        from cselab import load  # lazy: model loading pulls in transformers

        encoder = load(args.model, pooler=args.pooler)
        out = api.evaluate(
            encoder,
            tasks=tasks,
            mode=args.mode,
            data_dir=args.data_dir,
            batch_size=args.batch_size,
            download=not args.no_download,
            model_name=args.model,
        )
    except (DataFormatError, MissingDataError, ValueError, OSError) as exc:
        print(f"cselab evaluate: error: {exc}", file=sys.stderr)
        return 2
    if args.pooler:
        out["pooler"] = args.pooler
    print(report.markdown(out))
    if args.output:
        report.save_json(out, args.output)
        print(f"\nresults: {args.output}")
    if args.csv:
        report.to_csv(out, args.csv)
    return 0


def run_compare(args: argparse.Namespace) -> int:
    from . import report

    try:
        outs = [report.load_json(p) for p in args.results]
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    names = [n.strip() for n in args.names.split(",")] if args.names else None
    if names is not None and len(names) != len(outs):
        print(f"error: {len(names)} names for {len(outs)} results files", file=sys.stderr)
        return 2
    if names is None:
        names = [
            report._model_name(o, Path(p).stem) for o, p in zip(outs, args.results, strict=True)
        ]
    print(report.compare(outs, names))
    if args.csv:
        report.to_csv(outs, args.csv)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry (``python -m cselab.evaluation.cli evaluate ...``)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(prog="cselab")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
