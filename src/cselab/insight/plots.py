"""Figures of training runs and evaluation results (matplotlib, Agg backend; PNG or PDF).

- :func:`plot_runs`: the loss terms, learning rate and dev score of one or more runs
  against steps, and each run's alignment–uniformity trajectory in the style of SimCSE's Figure 2
  (Gao et al. 2021, §5: uniformity on x, alignment on y, one marker per evaluation step, arrows
  in time order; Wang & Isola 2020 define both, lower is better).
- :func:`plot_task_scores`: a grouped bar chart of per-task scores of several evaluation results
  (``cselab compare --plot``).

Every function returns the :class:`~matplotlib.figure.Figure` it drew, and writes it when given
a path whose extension is ``.png`` or ``.pdf``.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.errors import PlotError  # noqa: F401 - re-exported
from ..evaluation.custom import DEV_SCORE_NAMES, EVAL_COLUMNS
from ..io.files import atomic_path
from ..io.runfolder import RunFolder

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
    """Read ``run_dir/metrics.csv`` (as written by the trainer)."""
    folder = Path(run_dir)
    path = RunFolder(folder).metrics if folder.is_dir() else folder
    if not path.is_file():
        raise PlotError(
            f"{folder}: no {RunFolder.METRICS} (is it a cselab training output folder?)"
        )
    run = RunLog(name or (folder.name if folder.is_dir() else folder.parent.name), path)
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        if not reader.fieldnames or "step" not in reader.fieldnames:
            raise PlotError(f"{path}: no 'step' column")
        for line, row in enumerate(reader, start=2):
            try:
                step = int(row["step"])
            except (TypeError, ValueError):
                raise PlotError(
                    f"{path}, line {line}: step {row['step']!r} is not an integer"
                ) from None
            for key, text in row.items():
                if key == "step" or key is None or text in (None, ""):
                    continue
                try:
                    value = float(text)
                except ValueError:
                    raise PlotError(
                        f"{path}, line {line}: column {key!r} has non-number {text!r}"
                    ) from None
                steps, values = run.series.setdefault(key, ([], []))
                steps.append(step)
                values.append(value)
    return run


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

    Panels: loss (the total solid; each term dashed when the objective has more than one), the
    learning rate, the dev score (STS-B dev, or the run's own ``eval.dev``), and the trajectory.
    Runs whose ``metrics.csv`` has no ``align``/``uniform`` columns are named in a note instead of
    drawn in the last panel; when no run has them the panel holds only that note.
    """
    logs = [r if isinstance(r, RunLog) else read_run(r) for r in runs]
    if not logs:
        raise PlotError("no run to plot")
    plt = _pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    ax_loss, ax_lr, ax_dev, ax_traj = axes.ravel()
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, run in enumerate(logs):
        c = colours[i % len(colours)]
        if "loss" in run.series:
            ax_loss.plot(*run.series["loss"], color=c, label=run.name)
        if len(run.terms) > 1:
            styles = ["--", ":", "-."]
            for j, term in enumerate(run.terms):
                ax_loss.plot(
                    *run.series[term], color=c, linestyle=styles[j % 3], linewidth=1,
                    label=f"{run.name}: {term}",
                )  # fmt: skip
        if "lr" in run.series:
            ax_lr.plot(*run.series["lr"], color=c, label=run.name)
        if run.dev_score is not None:
            label = run.name if run.dev_score == "stsb_dev" else f"{run.name} ({run.dev_score})"
            ax_dev.plot(*run.series[run.dev_score], color=c, marker="o", label=label)
        uniform, align, _ = run.trajectory()
        if uniform:
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
    scores = {r.dev_score for r in logs} - {None}
    dev_label = "STS-B dev Spearman x 100" if scores <= {"stsb_dev"} else "dev score x 100"
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
    ax_traj.set_title("Alignment vs uniformity (lower is better)")
    ax_traj.set_xlabel(r"$\ell_{uniform}$")
    ax_traj.set_ylabel(r"$\ell_{align}$")
    missing = [r.name for r in logs if not r.has_trajectory]
    if missing:
        _note(
            ax_traj,
            "no align/uniform columns in metrics.csv:\n" + "\n".join(missing),
            corner=bool(ax_traj.lines),
        )
    if ax_traj.lines:
        ax_traj.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    _save(fig, out)
    return fig


def _note(ax, text: str, corner: bool = False) -> None:  # noqa: ANN001 - a matplotlib Axes
    if corner:
        # top left: trajectories run from the top right (start) towards the bottom left
        ax.text(0.02, 0.98, text, transform=ax.transAxes, fontsize=7, va="top", color="0.3")
    else:
        ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="0.3")
        ax.set_xticks([])
        ax.set_yticks([])


def plot_task_scores(
    outs: Sequence[dict],
    names: Sequence[str],
    out: str | os.PathLike[str] | None = None,
) -> Figure:
    """Grouped bars of the headline scores (:func:`cselab.evaluation.report.headline`) of
    ``outs``: one panel per group present (STS, transfer), one bar per result and task."""
    from ..evaluation.report import headline

    heads = [o.get("headline") or headline(o) for o in outs]
    groups = [g for g in ("sts", "transfer") if any(h.get(g) for h in heads)]
    if not groups:
        raise PlotError("no STS or transfer scores to plot")
    plt = _pyplot()
    fig, axes = plt.subplots(len(groups), 1, figsize=(11, 4 * len(groups)), squeeze=False)
    for ax, group in zip(axes[:, 0], groups, strict=True):
        columns: list[str] = []
        for h in heads:
            columns += [c for c in h.get(group) or {} if c not in columns]
        width = 0.8 / len(outs)
        for i, (h, name) in enumerate(zip(heads, names, strict=True)):
            row = h.get(group) or {}
            values = [row.get(c) for c in columns]
            xs = [k + (i - (len(outs) - 1) / 2) * width for k in range(len(columns))]
            ax.bar(xs, [math.nan if v is None else v for v in values], width, label=name)
        ax.set_xticks(range(len(columns)), columns)
        ax.set_ylabel("Spearman x 100" if group == "sts" else "accuracy %")
        ax.set_title("STS" if group == "sts" else "Transfer")
        finite = [v for h in heads for v in (h.get(group) or {}).values() if v is not None]
        if finite:  # bars start near the smallest score, so that differences are visible
            ax.set_ylim(max(0.0, min(finite) - 5), max(finite) + 2)
        ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, out)
    return fig
