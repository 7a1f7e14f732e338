"""``cselab evaluate`` and ``cselab compare`` (registered on the main CLI's subparsers)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from cselab.pooling import POOLERS

from .custom import read_sts_file
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
        default=None,
        help="sts | transfer | all | comma-separated names (STS12..STS16, STSBenchmark, "
        "SICKRelatedness, MR, CR, SUBJ, MPQA, SST2, TREC, MRPC, AlignUniform); default: sts, "
        "or none when --sts-file is given",
    )
    ev.add_argument(
        "--sts-file",
        action="append",
        default=[],
        metavar="PATH",
        help="your own sentence pairs with a gold score (.tsv/.csv with a header, .jsonl, or a "
        "datasets save_to_disk folder), scored like STS-B; repeatable",
    )
    ev.add_argument(
        "--sts-columns",
        default="sentence1,sentence2,score",
        help="the two sentence columns and the score column of --sts-file "
        "(default: sentence1,sentence2,score)",
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


def run_evaluate(args: argparse.Namespace) -> int:
    from . import api, report

    try:
        spec = args.tasks if args.tasks is not None or args.sts_file else "sts"
        tasks = api.parse_tasks(spec, args.mode) if spec is not None else None
        columns = [c.strip() for c in args.sts_columns.split(",")]
        # check (or fetch) the data before spending time on loading the model
        files = [read_sts_file(f, columns) for f in args.sts_file]
        if tasks:
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
            sts_files=files,
        )
    except (DataFormatError, MissingDataError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
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
