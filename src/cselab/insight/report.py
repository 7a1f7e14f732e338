"""``cselab report ROOT``: the scores of a sweep over seeds, and paired comparisons to a baseline.

Reads every cell of a sweep (:mod:`cselab.insight.sweep`): the best STS-B dev score of training
(``results.json``) and the headline scores of its evaluation (``eval.json``). Writes

- the mean ± sample standard deviation over seeds of each configuration and task;
- for each configuration and task, its difference to the baseline trained with the *same seed*
  (:func:`cselab.insight.stats.paired_difference`): mean, 95% CI by paired t and by bootstrap, p-values
  of the paired t-test and the Wilcoxon signed-rank test, flagged when fewer than
  :data:`cselab.insight.stats.MIN_SEEDS` seeds are paired;

as markdown (printed and ``report.md``), long-format CSV (``report.csv``) and a figure of the
differences with their confidence intervals (``report.png``).
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import ReportError  # noqa: F401 - re-exported
from ..evaluation.report import markdown_table
from ..io.files import write_text_atomic
from ..io.runfolder import RunFolder
from .stats import MIN_SEEDS, PairedDifference, mean_std, paired_difference
from .sweep import SWEEP_FILE, cell_dirs, read_json

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DEV_COLUMN = "STS-B dev (best)"


@dataclass
class CellScores:
    """The scores of one (configuration, seed) cell, by task column."""

    config: str
    seed: int
    scores: dict[str, float]


def headline_scores(head: dict[str, dict[str, float | None]]) -> dict[str, float]:
    """Flatten headline tables (``{"sts": {...}, "transfer": {...}}``) into task columns; the
    ``Avg`` of each group becomes ``STS avg`` / ``transfer avg``."""
    scores = {}
    for group, row in head.items():
        for column, value in row.items():
            if value is not None:
                label = "STS" if group == "sts" else group
                scores[f"{label} avg" if column == "Avg" else column] = float(value)
    return scores


def cell_scores(cell_dir: Path) -> CellScores | None:
    """The scores of a finished cell (``None`` while it has neither results nor evaluation)."""
    from ..evaluation.report import headline

    cell = RunFolder(cell_dir)
    info = read_json(cell.cell)
    if info is None:
        return None
    scores: dict[str, float] = {}
    results = read_json(cell.results)
    if results and results.get("best_stsb_dev") is not None:
        scores[DEV_COLUMN] = float(results["best_stsb_dev"])
    evaluation = read_json(cell.evaluation)
    if evaluation:
        scores |= headline_scores(evaluation.get("headline") or headline(evaluation))
    if not scores:
        return None
    return CellScores(str(info["config"]), int(info["seed"]), scores)


def collect(root: str | os.PathLike[str]) -> list[CellScores]:
    """Every finished cell under ``root``."""
    cells = [c for c in (cell_scores(d) for d in cell_dirs(Path(root))) if c is not None]
    if not cells:
        raise ReportError(
            f"{root}: no finished sweep cell (no {RunFolder.CELL} with results) found"
        )
    return cells


def default_baseline(root: str | os.PathLike[str]) -> str | None:
    """The ``baseline`` of the sweep that wrote ``root`` (its ``sweep.json``), if any."""
    sweep = read_json(Path(root) / SWEEP_FILE)
    return sweep.get("baseline") if sweep else None


@dataclass
class Report:
    """Summaries and paired comparisons of a set of cells."""

    configs: list[str]
    tasks: list[str]
    #: (config, task) -> (values by seed)
    values: dict[tuple[str, str], dict[int, float]]
    baseline: str | None
    #: (config, task) -> paired difference to the baseline
    paired: dict[tuple[str, str], PairedDifference]


def build_report(
    cells: Sequence[CellScores],
    baseline: str | None = None,
    confidence: float = 0.95,
    n_resamples: int = 10_000,
) -> Report:
    """Group ``cells`` by configuration and task and compare each to ``baseline``, seed by seed."""
    configs: list[str] = []
    tasks: list[str] = []
    values: dict[tuple[str, str], dict[int, float]] = {}
    for cell in cells:
        if cell.config not in configs:
            configs.append(cell.config)
        for task, value in cell.scores.items():
            if task not in tasks:
                tasks.append(task)
            values.setdefault((cell.config, task), {})[cell.seed] = value
    if baseline is not None and baseline not in configs:
        raise ReportError(
            f"baseline {baseline!r} has no finished cell (found: {', '.join(configs)})"
        )
    paired: dict[tuple[str, str], PairedDifference] = {}
    if baseline is not None:
        for config in configs:
            if config == baseline:
                continue
            for task in tasks:
                mine = values.get((config, task), {})
                base = values.get((baseline, task), {})
                seeds = sorted(set(mine) & set(base))
                if seeds:
                    paired[(config, task)] = paired_difference(
                        [mine[s] for s in seeds],
                        [base[s] for s in seeds],
                        confidence=confidence,
                        n_resamples=n_resamples,
                    )
    return Report(configs, tasks, values, baseline, paired)


def _num(x: float, signed: bool = False) -> str:
    if math.isnan(x):
        return "–"
    return f"{x:+.2f}" if signed else f"{x:.2f}"


def _p(x: float) -> str:
    return "–" if math.isnan(x) else f"{x:.3f}"


def markdown(report: Report) -> str:
    """The two tables (summary, paired differences) as markdown."""
    rows = []
    for config in report.configs:
        n = max((len(report.values.get((config, t), {})) for t in report.tasks), default=0)
        cells = []
        for task in report.tasks:
            vals = list(report.values.get((config, task), {}).values())
            if not vals:
                cells.append("–")
                continue
            mean, std = mean_std(vals)
            cells.append(_num(mean) if math.isnan(std) else f"{mean:.2f} ± {std:.2f}")
        rows.append([config, n, *cells])
    lines = [
        "**Mean ± std over seeds** (sample std; n = seeds)",
        "",
        markdown_table(["config", "n", *report.tasks], rows),
    ]
    if report.baseline is None:
        lines += ["", "No baseline given: no paired comparison (use --baseline NAME)."]
        return "\n".join(lines) + "\n"
    level = next(iter(report.paired.values())).confidence if report.paired else 0.95
    pct = f"{100 * level:g}%"
    lines += [
        "",
        f"**Paired difference to {report.baseline} (same seed)**: mean Δ, {pct} CI by paired t "
        f"and by percentile bootstrap, two-sided p-values of the paired t-test and the Wilcoxon "
        f"signed-rank test. ⚠: fewer than {MIN_SEEDS} seeds, both tests are weak.",
        "",
    ]
    header = ["config", "task", "n", "Δ mean", f"{pct} CI (t)", f"{pct} CI (bootstrap)",
              "p (t-test)", "p (Wilcoxon)", ""]  # fmt: skip
    paired = [
        [config, task, d.n, _num(d.mean, True),
         f"[{_num(d.t_ci[0], True)}, {_num(d.t_ci[1], True)}]",
         f"[{_num(d.bootstrap_ci[0], True)}, {_num(d.bootstrap_ci[1], True)}]",
         _p(d.t_p), _p(d.wilcoxon_p), "⚠" if d.weak else ""]
        for (config, task), d in report.paired.items()
    ]  # fmt: skip
    lines.append(markdown_table(header, paired))
    return "\n".join(lines) + "\n"


CSV_FIELDS = (
    "kind", "config", "task", "n", "mean", "std", "baseline", "t_ci_low", "t_ci_high",
    "bootstrap_ci_low", "bootstrap_ci_high", "t_p", "wilcoxon_p", "weak", "values",
)  # fmt: skip


def to_csv(report: Report) -> str:
    """Long format: ``kind=summary`` rows (mean, std, the values by seed) and ``kind=paired``
    rows (the difference to the baseline)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, restval="")
    writer.writeheader()
    for config in report.configs:
        for task in report.tasks:
            by_seed = report.values.get((config, task))
            if not by_seed:
                continue
            mean, std = mean_std(list(by_seed.values()))
            values = ";".join(f"{s}:{v!r}" for s, v in sorted(by_seed.items()))
            row = {"kind": "summary", "config": config, "task": task, "n": len(by_seed)}
            writer.writerow(row | {"mean": mean, "std": std, "values": values})
    for (config, task), d in report.paired.items():
        row: dict[str, Any] = {"kind": "paired", "config": config, "task": task}
        row |= {k: v for k, v in d.to_dict().items() if k in CSV_FIELDS}
        writer.writerow(row | {"baseline": report.baseline})
    return buf.getvalue()


def plot(report: Report, out: str | os.PathLike[str] | None = None) -> Figure:
    """One panel per task: each configuration's mean difference to the baseline with its t
    (thick) and bootstrap (thin, offset) confidence intervals; or, without a baseline, the
    mean ± std of each configuration."""
    from .plots import _pyplot, _save

    plt = _pyplot()
    tasks = report.tasks
    ncols = min(3, len(tasks))
    nrows = math.ceil(len(tasks) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.4 * nrows), squeeze=False)
    others = [c for c in report.configs if c != report.baseline]
    for ax, task in zip(axes.ravel(), tasks, strict=False):
        ax.set_title(task, fontsize=9)
        if report.baseline is None:
            stats_ = [mean_std(list(report.values.get((c, task), {}).values()) or [math.nan])
                      for c in report.configs]  # fmt: skip
            ax.errorbar(
                range(len(report.configs)), [m for m, _ in stats_],
                yerr=[0 if math.isnan(s) else s for _, s in stats_], fmt="o", capsize=3,
            )  # fmt: skip
            ax.set_xticks(range(len(report.configs)), report.configs, rotation=30, fontsize=7)
            continue
        xs, means, t_err, b_err = [], [], [[], []], [[], []]
        for i, config in enumerate(others):
            d = report.paired.get((config, task))
            if d is None:
                continue
            xs.append(i)
            means.append(d.mean)
            for err, (lo, hi) in ((t_err, d.t_ci), (b_err, d.bootstrap_ci)):
                err[0].append(0 if math.isnan(lo) else d.mean - lo)
                err[1].append(0 if math.isnan(hi) else hi - d.mean)
        ax.axhline(0, color="0.6", linewidth=0.8)
        ax.errorbar(xs, means, yerr=t_err, fmt="o", capsize=4, label="t CI")
        ax.errorbar([x + 0.15 for x in xs], means, yerr=b_err, fmt="none", capsize=2,
                    elinewidth=0.8, label="bootstrap CI")  # fmt: skip
        ax.set_xticks(range(len(others)), others, rotation=30, fontsize=7)
        ax.set_ylabel(f"Δ vs {report.baseline}", fontsize=8)
    for ax in axes.ravel()[len(tasks) :]:
        ax.set_visible(False)
    if report.baseline is not None:
        axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    _save(fig, out)
    return fig


def write_report(
    report: Report, out_dir: str | os.PathLike[str], stem: str = "report"
) -> dict[str, Path]:
    """Write ``<stem>.md``, ``<stem>.csv`` and ``<stem>.png`` into ``out_dir``."""
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {ext: folder / f"{stem}.{ext}" for ext in ("md", "csv", "png")}
    write_text_atomic(paths["md"], markdown(report), "report")
    write_text_atomic(paths["csv"], to_csv(report), "report")
    plot(report, paths["png"])
    return paths
