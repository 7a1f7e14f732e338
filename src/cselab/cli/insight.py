"""``cselab plot``, ``cselab sweep`` and ``cselab report`` (registered on the main CLI)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the three subcommands; each sets ``func(args) -> int``."""
    p = subparsers.add_parser(
        "plot",
        help="training curves and alignment-uniformity trajectories of runs",
        description="Plot loss terms, learning rate and STS-B dev score against steps, and the "
        "alignment-uniformity trajectory (SimCSE Fig. 2) of one or more training output folders.",
    )
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="folders holding metrics.csv")
    p.add_argument("-o", "--output", required=True, help="figure file (.png or .pdf)")
    p.add_argument(
        "--names",
        help="comma-separated legend names (default: the folder names, or what tells the runs "
        "apart: a sweep cell's configuration and seed, the config keys that differ)",
    )
    p.add_argument("--title", help="figure title")
    p.set_defaults(func=cmd_plot)

    p = subparsers.add_parser(
        "sweep",
        help="train and evaluate configurations x seeds",
        description="Run every (configuration, seed) cell of a sweep file; finished cells are "
        "skipped and interrupted ones resumed (see cselab.insight.sweep for the file's keys).",
    )
    p.add_argument("spec", help="sweep YAML file, or a sweep preset's name (e.g. focal-vs-simcse)")
    p.add_argument("--parallel", type=int, help="override the file's 'parallel'")
    p.add_argument("--dry-run", action="store_true", help="list the cells and their state only")
    p.set_defaults(func=cmd_sweep)

    p = subparsers.add_parser(
        "report",
        help="mean ± std over seeds and paired comparisons of a sweep",
        description="Tabulate a sweep's cells: mean ± std per configuration and task, and each "
        "configuration's same-seed difference to a baseline (95% CI by paired t and bootstrap; "
        "paired t-test and Wilcoxon p-values). Writes report.md, report.csv and report.png.",
    )
    p.add_argument("root", help="the sweep's output_root")
    p.add_argument("--baseline", help="configuration to compare against (default: the sweep's)")
    p.add_argument("--out-dir", help="where report.* go (default: ROOT)")
    p.set_defaults(func=cmd_report)


def cmd_plot(args: argparse.Namespace) -> int:
    from ..insight.plots import PlotError, plot_runs, read_run, run_labels

    names = [n.strip() for n in args.names.split(",")] if args.names else run_labels(args.runs)
    if len(names) != len(args.runs):
        raise PlotError(f"{len(names)} names for {len(args.runs)} runs")
    runs = [read_run(r, n) for r, n in zip(args.runs, names, strict=True)]
    plot_runs(runs, args.output, title=args.title)
    for run in runs:
        if not run.has_trajectory:
            print(f"note: {run.path} has no align/uniform columns; no trajectory drawn for it")
    print(f"wrote {args.output}")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from ..config.presets import find_sweep
    from ..insight.sweep import check_spec, load_sweep, run_sweep, sweep_progress

    spec = load_sweep(find_sweep(args.spec))
    if args.parallel is not None:
        spec.parallel = args.parallel
        check_spec(spec)
    cells = spec.cells()
    if args.dry_run:
        for cell in cells:
            state = "finished" if cell.finished(spec) else "to run"
            print(f"{cell.config} seed {cell.seed}: {cell.dir} ({state})")
        return 0
    outcome = run_sweep(spec, sweep_progress(len(cells)))
    print(
        f"{len(outcome['done'])} cell(s) run, {len(outcome['skipped'])} already finished; "
        f"report: cselab report {spec.output_root}"
    )
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from ..insight.report import build_report, collect, default_baseline, markdown, write_report

    baseline = args.baseline or default_baseline(args.root)
    report = build_report(collect(args.root), baseline)
    print(markdown(report))
    paths = write_report(report, args.out_dir or args.root)
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0
