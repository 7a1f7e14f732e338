"""Figures of training runs and evaluation results (matplotlib, Agg backend; PNG or PDF).

- :func:`plot_runs`: the loss terms, learning rate and dev score of one or more runs
  against steps, and each run's alignment–uniformity trajectory in the style of SimCSE's Figure 2
  (Gao et al. 2021, §5: uniformity on x, alignment on y, one marker per evaluation step, arrows
  in time order; Wang & Isola 2020 define both, lower is better).
- :func:`plot_task_scores`: a grouped bar chart of per-task scores of several evaluation results
  (``cselab compare --plot``), your own STS files included.

Every function returns the :class:`~matplotlib.figure.Figure` it drew, and writes it when given
a path whose extension is ``.png`` or ``.pdf``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import load_yaml
from ..core.errors import PlotError, UserError  # noqa: F401 - PlotError re-exported
from ..core.metrics import STSB_DEV
from ..evaluation.custom import DEV_SCORE_NAMES, EVAL_COLUMNS
from ..io.files import atomic_path
from ..io.runfolder import RunFolder
from ..training.metrics import read_metrics
from ..training.rundir import saved_settings

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: metrics.csv columns that are not loss terms
NON_TERM_COLUMNS = ("step", "epoch", "lr", "loss", "sentences_per_s", *EVAL_COLUMNS)
FORMATS = (".png", ".pdf")


@dataclass
class RunLog:
    """The columns of one run's ``metrics.csv`` as ``name -> (steps, values)`` (blanks dropped)."""

    name: str
    path: Path
    series: dict[str, tuple[list[int], list[float]]] = field(default_factory=dict)

    @property
    def terms(self) -> list[str]:
        """The objective's loss-term columns (e.g. ``infonce``, ``dcl``), in file order."""
        return [c for c in self.series if c not in NON_TERM_COLUMNS]

    @property
    def dev_score(self) -> str | None:
        """The model-selection score's column (``stsb_dev``, ``dev_pearson``, ...), if logged."""
        return next((name for name in DEV_SCORE_NAMES if name in self.series), None)

    @property
    def has_trajectory(self) -> bool:
        return bool(self.trajectory()[0])

    def trajectory(self) -> tuple[list[float], list[float], list[int]]:
        """``(uniform, align, steps)`` at the steps where both were logged."""
        if "align" not in self.series or "uniform" not in self.series:
            return [], [], []
        align = dict(zip(*self.series["align"], strict=True))
        uniform = dict(zip(*self.series["uniform"], strict=True))
        steps = sorted(set(align) & set(uniform))
        return [uniform[s] for s in steps], [align[s] for s in steps], steps


def read_run(run_dir: str | os.PathLike[str], name: str | None = None) -> RunLog:
    """Read ``run_dir/metrics.csv`` (or that file itself) with the file's one reader,
    :func:`cselab.training.metrics.read_metrics`: a malformed file raises its
    :class:`~cselab.core.errors.DataFormatError` naming the file and line."""
    folder = Path(run_dir)
    path = RunFolder(folder).metrics if folder.is_dir() else folder
    if not path.is_file():
        raise PlotError(
            f"{folder}: no {RunFolder.METRICS} (is it a cselab training output folder?)"
        )
    run = RunLog(name or (folder.name if folder.is_dir() else folder.parent.name), path)
    for row in read_metrics(path).rows:
        step = int(row["step"])
        for key, value in row.items():
            if key != "step":
                steps, values = run.series.setdefault(key, ([], []))
                steps.append(step)
                values.append(float(value))
    return run


#: Config keys that differ between any two runs without telling them apart as methods.
_NOT_A_DIFFERENCE = ("train.output_dir", "data.cache_dir", "train.resume", "train.overwrite")


def run_labels(run_dirs: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Legend names of runs: their folder names when those differ; else, for sweep cells
    (``cell.json``), ``<configuration> seed<N>``; else the config keys that differ between the
    runs (``config.yaml``, ``key=value, ...``); else the shortest path ends that differ."""

    from ..io.readers import read_json

    folders = [Path(d) if Path(d).is_dir() else Path(d).parent for d in run_dirs]
    names = [f.name for f in folders]
    if len(set(names)) == len(names):
        return names
    cells = []
    for f in folders:
        try:
            info = read_json(RunFolder(f).cell)  # None (no file): TypeError below
            cells.append(f"{info['config']} seed{info['seed']}")
        except (OSError, ValueError, KeyError, TypeError):
            break
    else:
        if len(set(cells)) == len(cells):
            return cells
    try:
        flat = [saved_settings(load_yaml(RunFolder(f).config)) for f in folders]
    except (UserError, AttributeError, TypeError):
        flat = []
    if flat:
        keys = sorted({k for c in flat for k in c} - set(_NOT_A_DIFFERENCE))
        differ = [k for k in keys if len({repr(c.get(k)) for c in flat}) > 1]
        labels = [", ".join(f"{k}={c.get(k)}" for k in differ) for c in flat]
        if differ and len(set(labels)) == len(labels):
            return labels
    for depth in range(2, max(len(f.parts) for f in folders) + 1):
        ends = ["/".join(f.parts[-depth:]) for f in folders]
        if len(set(ends)) == len(ends):
            return ends
    return [str(f) for f in folders]


def _pyplot():  # noqa: ANN202 - the module, imported lazily on the non-interactive backend
    try:
        import matplotlib
    except ImportError:
        raise PlotError("plotting needs matplotlib: pip install 'cselab[plot]'") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Figure, out: str | os.PathLike[str] | None) -> None:
    if out is None:
        return
    path = Path(out)
    if path.suffix.lower() not in FORMATS:
        raise PlotError(f"{path}: unsupported figure format (use {' or '.join(FORMATS)})")
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path, "plot") as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")


def plot_runs(
    runs: Sequence[RunLog | str | os.PathLike[str]],
    out: str | os.PathLike[str] | None = None,
    title: str | None = None,
) -> Figure:
    """Training curves and alignment–uniformity trajectories of ``runs`` (one colour per run).

    Panels: loss (the total solid; each term dashed when the objective has more than one; on a
    log scale when the positive losses span more than :data:`LOG_DECADES` decades), the learning
    rate, the dev score (STS-B dev, or the run's own ``eval.dev``), and the trajectory. The
    trajectory panel is drawn only when some run logged ``align``/``uniform`` (a run that
    selected on its own dev file logs neither): the loss then spans the top row. Runs without
    them are named in a note under the panel, where it cannot cover another run's points.
    """
    logs = [r if isinstance(r, RunLog) else read_run(r) for r in runs]
    if not logs:
        raise PlotError("no run to plot")
    plt = _pyplot()
    fig = plt.figure(figsize=(12, 9))
    grid = fig.add_gridspec(2, 2)
    with_trajectory = any(r.has_trajectory for r in logs)
    ax_loss = fig.add_subplot(grid[0, 0] if with_trajectory else grid[0, :])
    ax_lr = fig.add_subplot(grid[0, 1] if with_trajectory else grid[1, 0])
    ax_dev = fig.add_subplot(grid[1, 0] if with_trajectory else grid[1, 1])
    ax_traj = fig.add_subplot(grid[1, 1]) if with_trajectory else None
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    losses: list[float] = []
    lr_drawn: list[tuple[str, tuple[list[int], list[float]]]] = []
    scores = list(dict.fromkeys(r.dev_score for r in logs if r.dev_score is not None))
    mixed_scores = len(scores) > 1
    for i, run in enumerate(logs):
        c = colours[i % len(colours)]
        if "loss" in run.series:
            ax_loss.plot(*run.series["loss"], color=c, label=run.name, **_lone(run, "loss"))
            losses += run.series["loss"][1]
        if len(run.terms) > 1:
            styles = ["--", ":", "-."]
            for j, term in enumerate(run.terms):
                ax_loss.plot(
                    *run.series[term], color=c, linestyle=styles[j % 3], linewidth=1,
                    label=f"{run.name}: {term}", **_lone(run, term),
                )  # fmt: skip
                losses += run.series[term][1]
        if "lr" in run.series:
            # a schedule equal to an earlier run's would hide under it: drawn dashed on top,
            # with markers, and named as the same in the legend
            same = next((name for name, lr in lr_drawn if lr == run.series["lr"]), None)
            ax_lr.plot(
                *run.series["lr"], color=c,
                label=run.name if same is None else f"{run.name} (same as {same})",
                linestyle="-" if same is None else (0, (4, 2 + len(lr_drawn))),
                marker=_lone(run, "lr").get("marker", None if same is None else "x"),
                markevery=0.1, linewidth=1.5,
            )  # fmt: skip
            lr_drawn.append((run.name, run.series["lr"]))
        if run.dev_score is not None:
            label = run.name if not mixed_scores else f"{run.name} ({score_words(run.dev_score)})"
            ax_dev.plot(*run.series[run.dev_score], color=c, marker="o", label=label)
        uniform, align, _ = run.trajectory()
        if uniform and ax_traj is not None:
            ax_traj.plot(uniform, align, color=c, marker="o", linestyle="none", label=run.name)
            for k in range(1, len(uniform)):
                ax_traj.annotate(
                    "",
                    xy=(uniform[k], align[k]),
                    xytext=(uniform[k - 1], align[k - 1]),
                    arrowprops={"arrowstyle": "->", "color": c, "lw": 1.2},
                )
            ax_traj.annotate(  # where the run started
                "start", (uniform[0], align[0]), textcoords="offset points", xytext=(4, 4),
                fontsize=7, color=c,
            )  # fmt: skip
    if spans_decades(losses):
        ax_loss.set_yscale("log")
    # one metric: the axis names it; several: each, and every run's legend entry says its own
    dev_label = ", ".join(score_words(n) for n in scores) + " x 100" if scores else "dev score"
    for ax, ylabel, what in (
        (ax_loss, "loss", "Training loss"),
        (ax_lr, "learning rate", "Learning rate"),
        (ax_dev, dev_label, "Dev score"),
    ):
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.set_title(what)
        if ax.lines:
            ax.legend(fontsize=7)
        else:
            _note(ax, f"no '{ylabel}' logged")
    if ax_traj is not None:
        ax_traj.set_title("Alignment vs uniformity (lower is better)")
        ax_traj.set_xlabel(r"$\ell_{uniform}$")
        ax_traj.set_ylabel(r"$\ell_{align}$")
        ax_traj.legend(fontsize=7)
        missing = [r.name for r in logs if not r.has_trajectory]
        if missing:  # under the x-axis label: outside the data area, over nobody's points
            ax_traj.annotate(
                "no align/uniform columns in metrics.csv: " + ", ".join(missing),
                xy=(0.5, 0), xycoords=ax_traj.xaxis.label, xytext=(0, -4),
                textcoords="offset points", ha="center", va="top", fontsize=7, color="0.3",
            )  # fmt: skip
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    _save(fig, out)
    return fig


def score_words(column: str) -> str:
    """A dev-score column of ``metrics.csv`` in words: ``stsb_dev`` -> ``STS-B dev Spearman``,
    ``dev_ndcg@10`` -> ``dev nDCG@10``, ``dev_pearson`` -> ``dev Pearson``."""
    from ..core.metrics import RETRIEVAL_NAMES, retrieval_metric

    stsb = column.startswith(STSB_DEV)
    metric = column.removeprefix(STSB_DEV).removeprefix("dev").lstrip("_") or "spearman"
    measure = retrieval_metric(metric)
    if measure is not None:
        words = f"{RETRIEVAL_NAMES.get(measure[0], measure[0])}@{measure[1]}"
    else:
        words = metric.capitalize()
    return f"{'STS-B dev' if stsb else 'dev'} {words}"


def _lone(run: RunLog, column: str) -> dict[str, str]:
    """A marker for a series of one point (a run with one logged step): a line through one
    point draws nothing, and the panel would look empty."""
    return {"marker": "o"} if len(run.series[column][0]) == 1 else {}


#: The loss panel turns logarithmic when its positive values span more decades than this.
LOG_DECADES = 2


def spans_decades(values: Sequence[float], decades: float = LOG_DECADES) -> bool:
    """Whether ``values`` (finite ones) are all positive and their largest is more than
    ``10 ** decades`` times their smallest: a linear axis would flatten all but the first steps.
    Values at or below 0 keep the axis linear (a log axis cannot show them)."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite or min(finite) <= 0:
        return False
    return max(finite) / min(finite) > 10**decades


def _note(ax, text: str) -> None:  # noqa: ANN001 - a matplotlib Axes
    """``text`` in the middle of an empty panel."""
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="0.3")
    ax.set_xticks([])
    ax.set_yticks([])


def plot_task_scores(
    outs: Sequence[dict],
    names: Sequence[str],
    out: str | os.PathLike[str] | None = None,
) -> Figure:
    """Grouped bars of the headline scores (:func:`cselab.evaluation.report.headline`) of
    ``outs``: one panel per headline table present (each task kind's ``panel``, in the order of
    the registry: STS, your own ``--sts-file`` files, transfer, ...), one bar per result and
    task that some result has (a task none of them ran gets no empty slot, which would read as
    a zero). Bars start at 0, so that their lengths compare the scores."""
    from ..evaluation.registry import TASK_KINDS
    from ..evaluation.report import headline

    heads = [o.get("headline") or headline(o) for o in outs]
    groups = [
        (k.headline, *k.panel) for k in TASK_KINDS.values()
        if k.headline and k.panel
        and any(v is not None for h in heads for v in (h.get(k.headline) or {}).values())
    ]  # fmt: skip
    if not groups:
        raise PlotError("no STS, STS-file or transfer scores to plot")
    plt = _pyplot()
    fig, axes = plt.subplots(len(groups), 1, figsize=(11, 4 * len(groups)), squeeze=False)
    for ax, (group, title, ylabel) in zip(axes[:, 0], groups, strict=True):
        columns: list[str] = []
        for h in heads:  # a task no result has (not run, or an Avg over missing tasks): no slot
            columns += [
                c for c, v in (h.get(group) or {}).items() if v is not None and c not in columns
            ]
        width = 0.8 / len(outs)
        for i, (h, name) in enumerate(zip(heads, names, strict=True)):
            row = h.get(group) or {}
            values = [row.get(c) for c in columns]
            xs = [k + (i - (len(outs) - 1) / 2) * width for k in range(len(columns))]
            ax.bar(xs, [math.nan if v is None else v for v in values], width, label=name)
        ax.set_xticks(range(len(columns)), columns)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.axhline(0, color="0.6", linewidth=0.8)
        ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, out)
    return fig
