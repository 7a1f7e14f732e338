"""``cselab report ROOT``: the scores of a sweep over seeds, and paired comparisons to a baseline.

Reads every cell of a sweep (:mod:`cselab.insight.sweep`): the best model-selection score of
training (``results.json``: STS-B dev, or the run's own ``eval.dev`` file) and the headline scores
of its evaluation (``eval.json``). A configuration is its name *and* the settings its cells
trained with (each cell's ``config.yaml``, less the seed, paths and cadences): two cells of one
name with different settings (two sweeps in one folder), or two cells for the same
(configuration, seed), are refused naming both folders rather than pooled or dropped. A cell
whose best step is 0 (the untrained model won model selection) is flagged. Writes

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import load_yaml
from ..core.errors import DataFormatError, ReportError
from ..core.metrics import STSB, STSB_DEV
from ..evaluation.custom import DEV_SCORE_NAMES, METRICS, dev_score_name
from ..evaluation.report import markdown_table
from ..io.files import write_text_atomic
from ..io.readers import read_json
from ..io.runfolder import RunFolder
from ..training.rundir import RESUMABLE_KEYS, saved_settings
from .stats import MIN_SEEDS, PairedDifference, mean_std, paired_difference
from .sweep import SWEEP_FILE, cell_dirs

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DEV_COLUMN = "STS-B dev (best)"


def dev_column(name: str) -> str:
    """The report's column of a run's best model-selection score ``best_<name>`` of
    ``results.json`` (``name`` as :func:`~cselab.evaluation.custom.dev_score_name` gives it):
    ``STS-B dev (best)``, ``STS-B dev Pearson (best)``, ``dev file Spearman (best)``, ..."""
    if name == STSB_DEV:
        return DEV_COLUMN
    for dev, dataset in ((STSB, "STS-B dev"), ("file", "dev file")):
        for metric in METRICS:
            if name == dev_score_name(dev, metric):
                return f"{dataset} {metric.capitalize()} (best)"
    return f"{name} (best)"


@dataclass
class CellScores:
    """The scores of one (configuration, seed) cell, by task column.

    Attributes:
        config: the configuration's name in the sweep.
        seed: the training seed.
        scores: task column -> score.
        folder: the cell's folder (named in errors).
        best_step: the step of the selected model (``results.json``); ``0``: the untrained
            model won model selection, so the cell's scores are the base model's.
        settings: the cell's resolved config (its ``config.yaml``) as flat ``key -> value``,
            without the seed and the keys that never change the weights
            (:data:`~cselab.training.rundir.RESUMABLE_KEYS`: paths, cadences, device);
            ``None`` when the cell has no ``config.yaml``.
    """

    config: str
    seed: int
    scores: dict[str, float]
    folder: Path | None = None
    best_step: int | None = None
    settings: dict[str, Any] | None = None


def headline_scores(
    head: dict[str, dict[str, float | None]], path: Path | None = None
) -> dict[str, float]:
    """Flatten headline tables (``{"sts": {...}, "transfer": {...}}``) into task columns; the
    ``Avg`` of each group becomes ``STS avg`` / ``transfer avg``. A score that is not a finite
    number raises :class:`DataFormatError` naming ``path``."""
    scores = {}
    for group, row in head.items():
        for column, value in row.items():
            if value is not None:
                label = "STS" if group == "sts" else group
                scores[f"{label} avg" if column == "Avg" else column] = _score(
                    value, path, f"{group} {column}"
                )
    return scores


def _score(value: object, path: Path | None, key: str) -> float:
    """``value`` as a finite float, or a one-line error naming the file and the key."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise DataFormatError(
            path or Path("<scores>"), None, f"{key} is {value!r}, not a finite score"
        )
    return float(value)


def _cell_info(path: Path) -> tuple[str, int] | None:
    """The configuration name and seed of ``cell.json`` (``None`` without the file)."""
    info = read_json(path)
    if info is None:
        return None
    config, seed = info.get("config"), info.get("seed")
    if not isinstance(config, str) or not config:
        raise DataFormatError(path, None, "no 'config' (the configuration's name)")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise DataFormatError(path, None, f"no 'seed' (an integer): found {seed!r}")
    return config, seed


def _dev_score(path: Path) -> tuple[str, float, int | None] | None:
    """``(column, best score, best step)`` of ``results.json``, whatever dev set model
    selection used; ``None`` without the file or without a selection score."""
    results = read_json(path)
    if results is None:
        return None
    dev = results.get("dev")
    named = dev.get("name") if isinstance(dev, dict) else None
    names = [named] if isinstance(named, str) else list(DEV_SCORE_NAMES)
    name = next((n for n in names if results.get(f"best_{n}") is not None), None)
    if name is None:
        return None
    best = _score(results[f"best_{name}"], path, f"best_{name}")
    step = results.get("best_step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        raise DataFormatError(path, None, f"best_step is {step!r}, not a step")
    return dev_column(name), best, step


def _evaluation_scores(path: Path) -> dict[str, float]:
    """The headline scores of a cell's evaluation file (``{}`` without the file)."""
    from ..evaluation.report import headline

    evaluation = read_json(path)
    if evaluation is None:
        return {}
    head = evaluation.get("headline")
    if head is None:
        try:
            head = headline(evaluation)
        except (KeyError, TypeError, AttributeError, ValueError, OverflowError):
            head = None  # not the layout `cselab evaluate` writes: refused just below
    if not isinstance(head, dict) or not all(isinstance(r, dict) for r in head.values()):
        raise DataFormatError(path, None, "not a cselab evaluation results file")
    return headline_scores(head, path)


def cell_settings(cell_dir: Path) -> dict[str, Any] | None:
    """The resolved config the cell trained with (its ``config.yaml``), flat, without the seed
    and the keys that never change the weights; ``None`` without the file."""
    path = RunFolder(cell_dir).config
    if not path.is_file():
        return None
    flat = saved_settings(load_yaml(path))
    return {k: v for k, v in flat.items() if k not in RESUMABLE_KEYS and k != "train.seed"}


def cell_scores(cell_dir: Path) -> CellScores | None:
    """The scores of a finished cell (``None`` while it has neither results nor evaluation).

    A file that cannot be read (cut while being written, not JSON, a ``cell.json`` without a
    seed, a score that is NaN) raises :class:`DataFormatError` naming it."""
    cell = RunFolder(cell_dir)
    info = _cell_info(cell.cell)
    if info is None:
        return None
    scores: dict[str, float] = {}
    best_step = None
    if (dev := _dev_score(cell.results)) is not None:
        column, scores[column], best_step = dev
    scores |= _evaluation_scores(cell.evaluation)
    if not scores:
        return None
    return CellScores(*info, scores, cell_dir, best_step, cell_settings(cell_dir))


def collect(root: str | os.PathLike[str]) -> list[CellScores]:
    """Every finished cell under ``root``."""
    cells = [c for c in (cell_scores(d) for d in cell_dirs(Path(root))) if c is not None]
    if not cells:
        raise ReportError(
            f"{root}: no finished sweep cell (no {RunFolder.CELL} with results) found"
        )
    return cells


def check_cells(cells: Sequence[CellScores]) -> None:
    """Refuse what would be pooled or dropped without a word: two cells of one configuration
    name trained with different settings (two sweeps in one folder), and two cells for the same
    (configuration, seed); both name the two folders."""
    first: dict[str, CellScores] = {}
    seen: dict[tuple[str, int], CellScores] = {}
    for cell in cells:
        other = first.setdefault(cell.config, cell)
        if other is not cell and other.settings is not None and cell.settings is not None:
            keys = sorted(other.settings.keys() | cell.settings.keys())
            differ = [k for k in keys if _differs(other.settings.get(k), cell.settings.get(k))]
            if differ:
                k = differ[0]
                raise ReportError(
                    f"configuration {cell.config!r} names two different settings: "
                    f"{other.folder} and {cell.folder} differ in {k} "
                    f"({other.settings.get(k)!r} vs {cell.settings.get(k)!r}"
                    f"{f' and {len(differ) - 1} more key(s)' if len(differ) > 1 else ''}); "
                    "report each sweep's output_root on its own"
                )
        if (dup := seen.setdefault((cell.config, cell.seed), cell)) is not cell:
            raise ReportError(
                f"configuration {cell.config!r} seed {cell.seed} has two cells: {dup.folder} "
                f"and {cell.folder}; remove one, or report each sweep's output_root on its own"
            )


def default_baseline(root: str | os.PathLike[str]) -> str | None:
    """The ``baseline`` of the sweep that wrote ``root`` (its ``sweep.json``), if any."""
    path = Path(root) / SWEEP_FILE
    sweep = read_json(path)
    baseline = sweep.get("baseline") if sweep else None
    if baseline is not None and not isinstance(baseline, str):
        raise DataFormatError(path, None, f"'baseline' is {baseline!r}, not a configuration name")
    return baseline


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
    #: config -> the seeds whose best step is 0: the untrained model won model selection, so
    #: those cells' scores are the base model's
    untrained: dict[str, list[int]] = field(default_factory=dict)


def _differs(a: object, b: object) -> bool:
    """``a != b``, except that NaN equals NaN (a config may hold ``.nan``)."""
    both_nan = isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
    return a != b and not both_nan


def build_report(
    cells: Sequence[CellScores],
    baseline: str | None = None,
    confidence: float = 0.95,
    n_resamples: int = 10_000,
) -> Report:
    """Group ``cells`` by configuration and task and compare each to ``baseline``, seed by seed.

    Raises :class:`ReportError` for two cells of one configuration with different settings or
    the same seed (:func:`check_cells`), and for a score that is not a finite number."""
    check_cells(cells)
    configs: list[str] = []
    tasks: list[str] = []
    values: dict[tuple[str, str], dict[int, float]] = {}
    untrained: dict[str, list[int]] = {}
    for cell in cells:
        if cell.config not in configs:
            configs.append(cell.config)
        if cell.best_step == 0:
            untrained.setdefault(cell.config, []).append(cell.seed)
        for task, value in cell.scores.items():
            if not math.isfinite(value):
                where = f" ({cell.folder})" if cell.folder else ""
                raise ReportError(
                    f"configuration {cell.config!r} seed {cell.seed}{where}: {task} is "
                    f"{value!r}, not a finite score"
                )
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
    return Report(
        configs, tasks, values, baseline, paired, {c: sorted(s) for c, s in untrained.items()}
    )


def _num(x: float, signed: bool = False) -> str:
    if math.isnan(x):
        return "–"
    return f"{x:+.2f}" if signed else f"{x:.2f}"


def _p(x: float) -> str:
    return "–" if math.isnan(x) else f"{x:.3f}"


#: Marks a configuration with cells whose best step is 0 (the base model's scores).
UNTRAINED = "†"


def markdown(report: Report) -> str:
    """The two tables (summary, paired differences) as markdown."""
    rows = []
    for config in report.configs:
        counts = [len(report.values.get((config, t), {})) for t in report.tasks]
        n = max(counts, default=0)
        cells = []
        for task, count in zip(report.tasks, counts, strict=True):
            vals = list(report.values.get((config, task), {}).values())
            if not vals:
                cells.append("–")
                continue
            mean, std = mean_std(vals)
            cell = _num(mean) if math.isnan(std) else f"{mean:.2f} ± {std:.2f}"
            # a task scored on fewer seeds than the row's n (one cell evaluated on another file)
            cells.append(cell if count == n else f"{cell} (n={count})")
        fewest = min((c for c in counts if c), default=0)  # a task never scored shows "–"
        shown = n if fewest == n else f"{fewest}–{n}"
        name = f"{config} {UNTRAINED}" if config in report.untrained else config
        rows.append([name, shown, *cells])
    lines = [
        "**Mean ± std over seeds** (sample std; n = seeds)",
        "",
        markdown_table(["config", "n", *report.tasks], rows),
    ]
    if report.untrained:
        which = "; ".join(
            f"{config} seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
            for config, seeds in report.untrained.items()
        )
        lines += [
            "",
            f"{UNTRAINED} best step 0 ({which}): the untrained model won model selection, so "
            "these cells score the base model, not a trained one.",
        ]
    if report.baseline is None:
        lines += ["", "No baseline given: no paired comparison (use --baseline NAME)."]
        return "\n".join(lines) + "\n"
    unpaired = _unpaired(report)
    if not report.paired:  # no table to explain, only why it is empty
        lines += ["", f"**Paired difference to {report.baseline} (same seed)**: no pair to "
                  "compare.", "", *unpaired]  # fmt: skip
        return "\n".join(lines) + "\n"
    level = next(iter(report.paired.values())).confidence
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
    if unpaired:
        lines += ["", *unpaired]
    return "\n".join(lines) + "\n"


def _seeds(report: Report, config: str) -> list[int]:
    return sorted({s for (c, _), v in report.values.items() if c == config for s in v})


def _unpaired(report: Report) -> list[str]:
    """Why a configuration has no paired row: it shares no seed with the baseline (a paired
    difference compares the same seed's two cells)."""
    base = _seeds(report, report.baseline or "")
    lines = []
    for config in report.configs:
        if config == report.baseline or any(c == config for c, _ in report.paired):
            continue
        lines.append(
            f"{config}: no paired comparison: its seeds ({', '.join(map(str, _seeds(report, config)))}) "
            f"share none with {report.baseline}'s ({', '.join(map(str, base))}); run both "
            "configurations with the same seeds."
        )
    return lines


CSV_FIELDS = (
    "kind", "config", "task", "n", "mean", "std", "baseline", "t_ci_low", "t_ci_high",
    "bootstrap_ci_low", "bootstrap_ci_high", "t_p", "wilcoxon_p", "weak", "values",
    "untrained_seeds",
)  # fmt: skip


def to_csv(report: Report) -> str:
    """Long format: ``kind=summary`` rows (mean, std, the values by seed, the seeds whose best
    step is 0) and ``kind=paired`` rows (the difference to the baseline)."""
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
            untrained = ";".join(str(s) for s in report.untrained.get(config, []) if s in by_seed)
            writer.writerow(
                row | {"mean": mean, "std": std, "values": values, "untrained_seeds": untrained}
            )
    for (config, task), d in report.paired.items():
        row: dict[str, Any] = {"kind": "paired", "config": config, "task": task}
        row |= {k: v for k, v in d.to_dict().items() if k in CSV_FIELDS}
        writer.writerow(row | {"baseline": report.baseline})
    return buf.getvalue()


#: How far right of its configuration's tick the bootstrap interval is drawn (the t interval
#: is at the tick); each tick owns the x range tick ± 0.5, so the pair stays by its tick.
BOOTSTRAP_OFFSET = 0.12


def plot(report: Report, out: str | os.PathLike[str] | None = None) -> Figure:
    """One panel per task: each configuration's mean difference to the baseline with its t
    (thick, at the tick) and bootstrap (thin, just right of it) confidence intervals; or,
    without a baseline, the mean ± std of each configuration."""
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
            ax.set_xlim(-0.5, len(report.configs) - 0.5)
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
        ax.errorbar([x + BOOTSTRAP_OFFSET for x in xs], means, yerr=b_err, fmt="none",
                    capsize=2, elinewidth=0.8, label="bootstrap CI")  # fmt: skip
        ax.set_xticks(range(len(others)), others, rotation=30, fontsize=7)
        # fixed, not autoscaled: with one configuration autoscaling would span only the two
        # bars, putting the tick at one edge and the bootstrap bar at the other
        ax.set_xlim(-0.5, max(len(others), 1) - 0.5)
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
