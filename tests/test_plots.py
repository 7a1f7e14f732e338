"""``cselab plot``: real figures from a real tiny-model run and from the kept MiniLM runs,
checked as images (size, not blank) and as matplotlib objects (one series per run and term)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from conftest import REPO, write_corpus
from cselab.app.train import build_trainer
from cselab.cli import main
from cselab.config import load_config
from cselab.core.errors import DataFormatError
from cselab.insight.plots import plot_runs, read_run
from test_sweep import assert_png

KEPT = REPO / "docs" / "results" / "objectives_runs"


@pytest.fixture(scope="module")
def tiny_run(tiny_bert: Path, tmp_path_factory, one_thread) -> Path:
    """8 steps of DCL (two loss terms) with a dev score every 4 steps: a deterministic stand-in
    evaluator (the mean of a fixed sentence's vector) keeps the test free of data files."""
    folder = tmp_path_factory.mktemp("plotrun")
    config = load_config(
        None,
        [
            f"--model.name_or_path={tiny_bert}",
            f"--data.train_file={write_corpus(folder, n=64)}",
            f"--data.cache_dir={folder / 'cache'}",
            f"--train.output_dir={folder / 'out'}",
            "--train.batch_size=8", "--train.max_steps=8", "--train.lr=1e-3",
            "--train.eval_steps=4", "--train.log_steps=2", "--train.report_to=[]",
            "--train.warmup_steps=2", "--objective.dcl.enabled=true",
        ],
    )  # fmt: skip
    trainer = build_trainer(config)
    trainer.selection.evaluator = lambda enc: 50 + float(enc.encode(["alpha beta"])[0].mean())
    trainer.train()
    return folder / "out"


def test_real_run_curves(tiny_run: Path, tmp_path: Path, capsys) -> None:
    run = read_run(tiny_run)
    assert run.terms == ["infonce", "dcl"]
    assert run.series["stsb_dev"][0] == [0, 4, 8]
    assert not run.has_trajectory
    png = tmp_path / "run.png"
    assert main(["plot", str(tiny_run), "-o", str(png)]) == 0
    assert "has no align/uniform columns" in capsys.readouterr().out
    assert_png(png, (1000, 800))
    fig = plot_runs([run])
    # no run logged align/uniform: no empty trajectory quarter, the loss spans the top row
    ax_loss, ax_lr, ax_dev = fig.axes
    assert ax_loss.get_position().width > 1.5 * ax_lr.get_position().width
    assert len(ax_loss.lines) == 3  # total + 2 terms
    assert list(ax_loss.lines[0].get_xdata()) == [2, 4, 6, 8]
    assert list(ax_loss.lines[0].get_ydata()) == run.series["loss"][1]
    assert list(ax_lr.lines[0].get_ydata()) == run.series["lr"][1]
    assert len(ax_dev.lines) == 1 and len(ax_dev.lines[0].get_xdata()) == 3


def test_an_own_dev_score_is_the_dev_curve_not_a_loss_term(tiny_run: Path, tmp_path: Path) -> None:
    """A run that selected on its own dev file by Pearson logs ``dev_pearson``: it is drawn as
    the dev score, and is not a loss term."""
    own = tmp_path / "own"
    own.mkdir()
    text = (tiny_run / "metrics.csv").read_text()
    (own / "metrics.csv").write_text(text.replace("stsb_dev", "dev_pearson", 1))
    run = read_run(own)
    assert run.terms == ["infonce", "dcl"] and run.dev_score == "dev_pearson"
    ax_loss, _, ax_dev = plot_runs([run]).axes
    assert len(ax_loss.lines) == 3  # total + 2 terms
    assert list(ax_dev.lines[0].get_xdata()) == [0, 4, 8]
    assert ax_dev.get_ylabel() == "dev Pearson x 100"


def test_trajectory_has_one_marker_per_eval_and_arrows_in_time_order(
    tiny_run: Path, tmp_path: Path
) -> None:
    """The real run plus alignment/uniformity columns as the evaluator will log them (issue 14
    part 1); a second run without them is named in the note."""
    with_au = tmp_path / "with_au"
    with_au.mkdir()
    rows = list(csv.DictReader((tiny_run / "metrics.csv").open()))
    points = {0: (0.80, -1.2), 4: (0.55, -1.9), 8: (0.40, -2.6)}  # (align, uniform) by step
    for row in rows:
        step = int(row["step"])
        row["align"], row["uniform"] = points[step] if row["stsb_dev"] else ("", "")
    with (with_au / "metrics.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    pdf = tmp_path / "traj.pdf"
    assert main(["plot", str(with_au), str(tiny_run), "--names", "a,b", "-o", str(pdf)]) == 0
    assert pdf.read_bytes().startswith(b"%PDF")
    fig = plot_runs([read_run(with_au, "a"), read_run(tiny_run, "b")], tmp_path / "traj.png")
    ax_traj = fig.axes[3]
    (markers,) = ax_traj.lines
    assert list(markers.get_xdata()) == [-1.2, -1.9, -2.6]  # uniformity on x
    assert list(markers.get_ydata()) == [0.80, 0.55, 0.40]  # alignment on y
    arrows = [t for t in ax_traj.texts if getattr(t, "arrow_patch", None) is not None]
    assert [(a.xyann, a.xy) for a in arrows] == [
        ((-1.2, 0.80), (-1.9, 0.55)),
        ((-1.9, 0.55), (-2.6, 0.40)),
    ]
    assert [t.get_text() for t in ax_traj.get_legend().get_texts()] == ["a"]
    assert any("no align/uniform" in t.get_text() and "b" in t.get_text() for t in ax_traj.texts)
    # colours: run a and run b differ, and a keeps its colour in every panel
    a_colour = fig.axes[0].lines[0].get_color()
    assert markers.get_color() == a_colour != fig.axes[1].lines[1].get_color()
    assert_png(tmp_path / "traj.png", (1000, 800))


def test_kept_minilm_runs(tmp_path: Path) -> None:
    """The committed metrics.csv of real MiniLM runs (11 objectives' seed 1) in one figure."""
    runs = sorted(KEPT.glob("*-seed1"))
    assert len(runs) == 11
    out = tmp_path / "minilm.png"
    fig = plot_runs(runs, out)
    # the runs made since alignment/uniformity are logged at each evaluation (ESimCSE's) add
    # the trajectory panel, with one line each
    ax_loss, ax_lr, ax_dev, ax_traj = fig.axes
    with_alignment = [r for r in runs if read_run(r).has_trajectory]
    assert [r.name for r in with_alignment] == [
        "esimcse-seed1",
        "esimcse_focal-seed1",
        "promptbert-seed1",
    ]
    assert len(ax_traj.lines) >= len(with_alignment)
    assert len(ax_lr.lines) == len(ax_dev.lines) == 11
    # single-term objectives draw only their total; the others add a line per term
    terms = [len(read_run(r).terms) for r in runs]
    assert len(ax_loss.lines) == 11 + sum(t for t in terms if t > 1)
    assert [ln.get_xdata()[-1] for ln in ax_dev.lines] == [186] * 11
    assert_png(out, (1000, 800))


def test_bad_inputs_are_one_line(tmp_path: Path, capsys) -> None:
    assert main(["plot", str(tmp_path), "-o", str(tmp_path / "x.png")]) == 2
    assert "no metrics.csv" in capsys.readouterr().err
    (tmp_path / "metrics.csv").write_text("step,loss\n2,0.5\n4,oops\n")
    # the one reader of metrics.csv (training.metrics.read_metrics) names file and line
    with pytest.raises(
        DataFormatError, match=r"metrics.csv:3: column 'loss' has non-number 'oops'"
    ):
        read_run(tmp_path)
    (tmp_path / "metrics.csv").write_text("step,loss\n2,0.5\n4,0.25\n")
    assert main(["plot", str(tmp_path), "-o", str(tmp_path / "x.svg")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("cselab plot: error: ") and "x.svg: unsupported figure format" in line
    assert math.isclose(read_run(tmp_path).series["loss"][1][1], 0.25)


def test_a_run_with_one_logged_step_draws_its_point(tiny_bert: Path, tmp_path: Path) -> None:
    """The loss and lr panels of a one-step run were empty: a line through one point draws
    nothing (issue 31). A lone point gets a marker."""
    out = tmp_path / "out"
    argv = ["-q", "train", f"--model.name_or_path={tiny_bert}",
            f"--data.train_file={write_corpus(tmp_path, n=16)}",
            f"--data.cache_dir={tmp_path / 'cache'}", f"--train.output_dir={out}",
            "--train.batch_size=8", "--train.max_steps=1", "--train.eval_steps=0",
            "--train.log_steps=1", "--train.report_to=[]", "--train.device=cpu"]  # fmt: skip
    assert main(argv) == 0
    png = tmp_path / "run.png"
    assert main(["plot", str(out), "-o", str(png)]) == 0
    assert_png(png, (1000, 800))
    ax_loss, ax_lr, _ = plot_runs([read_run(out)]).axes
    for ax in (ax_loss, ax_lr):
        (line,) = ax.lines
        assert len(line.get_xdata()) == 1 and line.get_marker() == "o"
