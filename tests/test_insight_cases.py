"""The cases of issue 20 for ``cselab sweep``, ``cselab report`` and the plots, on a real sweep
cell (a tiny BERT that selects on its own dev file and is evaluated on it) and on copies of it:

- report: any dev-score column; cells grouped by the settings they trained with (two sweeps
  with the same configuration names are refused, naming both folders, as are two cells for one
  seed); unreadable cell files are one line; a cell whose best step is 0 is flagged;
- sweep: an own STS file in ``evaluate:``; a live cell (``cselab train`` holding the run folder,
  or another sweep) is left alone; a sweep killed with SIGKILL takes its running cell with it;
- plots: no empty trajectory quarter, a note that covers no points, a log loss axis, the
  bootstrap bar by its tick, ``compare --plot`` of ``--sts-file`` results from 0.

Property tests: any bytes (or any JSON) as a cell's files give scores or one line.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest import GREEK, write_corpus
from cselab.cli import build_parser, main
from cselab.core.errors import DataFormatError, ReportError, SweepError, UserError
from cselab.insight import sweep as sweep_module
from cselab.insight.plots import plot_runs, plot_task_scores, read_run
from cselab.insight.report import (
    CellScores,
    build_report,
    cell_scores,
    collect,
    default_baseline,
    markdown,
    plot,
    to_csv,
)
from cselab.insight.sweep import cell_commands, load_sweep, run_sweep
from cselab.io import readers
from cselab.io.runfolder import RunFolder
from cselab.training.metrics import MetricsLog

SRC = Path(__file__).resolve().parents[1] / "src"


def write_sts_file(folder: Path) -> Path:
    """Twelve scored pairs of Greek-letter sentences (own dev set and evaluation file)."""
    rows = ["sentence1\tsentence2\tscore"]
    for i in range(12):
        a = " ".join(GREEK[(i + j) % len(GREEK)] for j in range(4))
        b = " ".join(GREEK[(i + j + i % 3) % len(GREEK)] for j in range(4))
        rows.append(f"{a}\t{b}\t{(i * 7) % 5 + 0.5}")
    path = folder / "own_dev.tsv"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def sweep_file(folder: Path, tiny_bert: Path, **extra) -> Path:
    """One configuration, one seed, trained in this process on a corpus whose name says SICK
    (so that the model folder carries the SICK-R note), selecting on its own dev file."""
    folder.mkdir(parents=True, exist_ok=True)
    corpus = write_corpus(folder, n=48).rename(folder / "sick_sentences.txt")
    dev = write_sts_file(folder)
    spec = {
        "base": {
            "model": {"name_or_path": str(tiny_bert), "max_seq_len": 16},
            "data": {"train_file": str(corpus), "cache_dir": str(folder / "cache")},
            "train": {
                "batch_size": 8,
                "max_steps": 4,
                "lr": 1e-3,
                "eval_steps": 2,
                "log_steps": 2,
                "device": "cpu",
                "report_to": [],
            },
            "eval": {"dev": str(dev)},
        },  # fmt: skip
        "configs": {"simcse": []},
        "seeds": [1],
        "output_root": str(folder / "runs"),
        "launcher": "inprocess",
        "evaluate": {"sts_files": [str(dev)]},
        **extra,
    }
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def own_dev_sweep(tiny_bert: Path, tmp_path_factory, one_thread) -> Path:
    folder = tmp_path_factory.mktemp("own-dev-sweep")
    assert main(["-q", "sweep", str(sweep_file(folder, tiny_bert))]) == 0
    return folder


def cell_of(sweep_folder: Path) -> Path:
    return sweep_folder / "runs" / "simcse" / "seed1"


def copy_cell(cell: Path, to: Path, seed: int | None = None) -> Path:
    """A copy of a real cell (results, evaluation, config, cell.json) without its models."""
    shutil.copytree(cell, to, ignore=shutil.ignore_patterns("best", "last", "checkpoint"))
    if seed is not None:
        info = json.loads((to / "cell.json").read_text())
        (to / "cell.json").write_text(json.dumps({**info, "seed": seed}))
    return to


def edit_json(path: Path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


# ------------------------------------------------------------------------------------ report


def test_an_own_dev_file_sweep_is_evaluated_on_it_and_reported(own_dev_sweep: Path, capsys) -> None:
    cell = cell_of(own_dev_sweep)
    results = json.loads((cell / "results.json").read_text())
    assert results["dev"]["name"] == "dev_spearman" and "best_stsb_dev" not in results
    evaluation = json.loads((cell / "eval.json").read_text())
    assert list(evaluation["results"]) == ["own_dev.tsv"]  # only the own file: no SentEval
    assert "notes" not in evaluation  # the model trained on "SICK", but SICK-R was not evaluated
    (scores,) = collect(own_dev_sweep / "runs")
    assert scores.scores == {
        "dev file Spearman (best)": results["best_dev_spearman"],
        "own_dev.tsv": evaluation["headline"]["sts_files"]["own_dev.tsv"],
    }
    assert main(["report", str(own_dev_sweep / "runs")]) == 0
    out = capsys.readouterr().out
    assert "| config | n | dev file Spearman (best) | own_dev.tsv |" in out


def test_cselab_evaluate_notes_sick_r_only_when_it_evaluated_it(
    own_dev_sweep: Path, tmp_path: Path, capsys
) -> None:
    best = cell_of(own_dev_sweep) / "best"
    out = tmp_path / "eval.json"
    argv = ["evaluate", str(best), "--sts-file", str(own_dev_sweep / "own_dev.tsv"), "-o", str(out)]
    assert main(argv) == 0
    assert "SICK-R" not in capsys.readouterr().out
    assert "notes" not in json.loads(out.read_text())


def test_subprocess_cells_pass_the_sts_files_to_cselab_evaluate(
    tiny_bert: Path, tmp_path: Path
) -> None:
    spec = load_sweep(
        sweep_file(
            tmp_path, tiny_bert, launcher="subprocess",
            evaluate={"sts_files": [str(tmp_path / "own_dev.tsv")], "mode": "fasttest",
                      "sts_columns": ["sentence1", "sentence2", "score"]},
        )
    )  # fmt: skip
    cell = spec.cells()[0]
    _, evaluate = cell_commands(spec, cell, cell.dir / "sweep_config.yaml")
    args = build_parser().parse_args(evaluate[3:])
    assert args.command == "evaluate" and args.tasks is None and args.mode == "fasttest"
    assert args.sts_file == [str(tmp_path / "own_dev.tsv")]
    assert args.sts_columns == "sentence1,sentence2,score"
    # a missing or malformed file is refused when the sweep file is read, before any training
    bad = sweep_file(tmp_path / "bad", tiny_bert, evaluate={"sts_files": ["nope.tsv"]})
    with pytest.raises(UserError, match=r"sweep.yaml: evaluate.sts_files: nope.tsv"):
        load_sweep(bad)


def test_two_sweeps_with_the_same_names_but_other_settings_are_refused(
    own_dev_sweep: Path, tmp_path: Path, capsys
) -> None:
    cell = cell_of(own_dev_sweep)
    a = copy_cell(cell, tmp_path / "a" / "simcse" / "seed1")
    b = copy_cell(cell, tmp_path / "b" / "simcse" / "seed1")
    config = yaml.safe_load((b / "config.yaml").read_text())
    config["train"]["lr"] = 3e-5
    (b / "config.yaml").write_text(yaml.safe_dump(config))
    assert main(["report", str(tmp_path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert str(a) in line and str(b) in line and "train.lr (0.001 vs 3e-05)" in line


def test_two_cells_for_one_seed_are_refused_and_paths_are_no_setting(
    own_dev_sweep: Path, tmp_path: Path, capsys
) -> None:
    """Same settings, other folders (output_dir and cache differ): one experiment twice."""
    cell = cell_of(own_dev_sweep)
    a = copy_cell(cell, tmp_path / "a" / "simcse" / "seed1")
    b = copy_cell(cell, tmp_path / "b" / "simcse" / "seed1")
    config = yaml.safe_load((b / "config.yaml").read_text())
    config["train"]["output_dir"] = str(b)
    config["data"]["cache_dir"] = str(tmp_path / "elsewhere")
    (b / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ReportError, match="seed 1 has two cells"):
        build_report(collect(tmp_path))
    assert main(["report", str(tmp_path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"'simcse' seed 1 has two cells: {a} and {b}" in line


def test_a_cell_whose_best_step_is_0_is_flagged(own_dev_sweep: Path, tmp_path: Path) -> None:
    cell = cell_of(own_dev_sweep)
    copy_cell(cell, tmp_path / "simcse" / "seed1")
    untrained = copy_cell(cell, tmp_path / "simcse" / "seed2", seed=2)
    edit_json(untrained / "results.json", best_step=0)
    report = build_report(collect(tmp_path))
    assert report.untrained == {"simcse": [2]}
    text = markdown(report)
    assert "| simcse † | 2 |" in text
    assert "† best step 0 (simcse seed 2): the untrained model won model selection" in text
    rows = list(csv.DictReader(to_csv(report).splitlines()))
    assert {r["untrained_seeds"] for r in rows if r["kind"] == "summary"} == {"2"}


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])


@pytest.mark.parametrize(
    ("file", "damage", "message"),
    [
        ("results.json", _truncate, r"results.json:\d+: not valid JSON"),
        ("cell.json", lambda p: edit_json(p, seed=None), "cell.json: no 'seed' (an integer)"),
        ("cell.json", lambda p: p.write_text('{"config": "simcse"}'), "cell.json: no 'seed'"),
        (
            "results.json",
            lambda p: p.write_text(p.read_text().replace('"best_dev_spearman": ', '"best_dev_spearman": NaN, "x": ')),
            "results.json: best_dev_spearman is nan, not a finite score",
        ),
        ("eval.json", lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n"), "eval.json:1: invalid UTF-8"),
        ("eval.json", lambda p: p.write_text("[1, 2]"), "eval.json: expected a JSON object"),
        ("eval.json", lambda p: p.write_text('{"results": {"MR": {"acc": "x"}}}'),
         "eval.json: not a cselab evaluation results file"),
    ],
)  # fmt: skip
def test_unreadable_cell_files_are_one_line(
    own_dev_sweep: Path, tmp_path: Path, capsys, file: str, damage, message: str
) -> None:
    cell = copy_cell(cell_of(own_dev_sweep), tmp_path / "simcse" / "seed1")
    damage(cell / file)
    assert main(["report", str(tmp_path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("cselab report: error: ") and str(cell / file) in line
    assert message in line or re.search(message, line), line


def test_report_png_draws_the_bootstrap_bar_by_its_tick_with_one_config() -> None:
    cells = [CellScores("base", s, {"X": 70.0 + s}) for s in (1, 2, 3)]
    cells += [CellScores("new", s, {"X": 70.0 + 2 * s}) for s in (1, 2, 3)]
    (ax,) = plot(build_report(cells, "base", n_resamples=500)).axes
    assert ax.get_xlim() == (-0.5, 0.5)  # the tick's own slot, not just the two bars
    t_bar, boot_bar = (c.lines[2][0].get_segments()[0] for c in ax.containers)
    assert t_bar[0][0] == 0 and 0 < boot_bar[0][0] <= 0.15


# ------------------------------------------------------------------------------------- plots


def write_metrics(folder: Path, rows: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    log = MetricsLog(folder)
    for row in rows:
        log.write(row)
    return folder


def test_a_runs_note_covers_no_other_runs_points(tmp_path: Path) -> None:
    """Run a's trajectory has points in every corner of its panel (the old note sat in the top
    left, over them); run b logged no align/uniform. The note lies outside the data area."""
    corners = [(0.9, -1.0), (0.9, -3.0), (0.2, -3.0), (0.2, -1.0)]  # (align, uniform)
    a = write_metrics(tmp_path / "a", [
        {"step": 2 * i, "loss": 1.0 / (i + 1), "stsb_dev": 60.0 + i, "align": al, "uniform": un}
        for i, (al, un) in enumerate(corners)
    ])  # fmt: skip
    b = write_metrics(tmp_path / "b", [{"step": 2 * i, "loss": 0.5, "dev_spearman": 50.0 + i}
                                       for i in range(4)])  # fmt: skip
    fig = plot_runs([read_run(a), read_run(b)])
    ax_traj = fig.axes[3]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (note,) = [t for t in ax_traj.texts if "no align/uniform" in t.get_text()]
    assert note.get_text().endswith(": b")
    box = note.get_window_extent(renderer)
    assert not box.overlaps(ax_traj.get_window_extent(renderer))
    (markers,) = ax_traj.lines
    points = ax_traj.transData.transform(list(zip(*markers.get_data(), strict=True)))
    assert len(points) == 4 and not any(box.contains(x, y) for x, y in points)


def test_the_loss_axis_is_logarithmic_when_the_loss_spans_decades(tmp_path: Path) -> None:
    def loss_scale(losses: list[float], **term: list[float]) -> str:
        rows = [{"step": i + 1, "loss": v, **{k: t[i] for k, t in term.items()}}
                for i, v in enumerate(losses)]  # fmt: skip
        folder = write_metrics(tmp_path / f"run{len(list(tmp_path.iterdir()))}", rows)
        return plot_runs([read_run(folder)]).axes[0].get_yscale()

    assert loss_scale([12.0, 1.0, 0.1, 0.05]) == "log"  # 240x: more than two decades
    assert loss_scale([2.0, 1.0, 0.5, 0.03]) == "linear"  # 67x
    # a term that goes below 0 cannot be drawn on a log axis
    assert (
        loss_scale([12.0, 1.0, 0.1, 0.05], a=[6.0, 1.0, 0.1, 0.05], b=[6.0, 0.0, 0.0, -0.1])
        == "linear"
    )


def test_compare_plot_takes_sts_file_results_and_starts_bars_at_0(
    own_dev_sweep: Path, tmp_path: Path
) -> None:
    first = cell_of(own_dev_sweep) / "eval.json"
    second = tmp_path / "second.json"
    edit_json(Path(shutil.copy(first, second)), model="other")
    png = tmp_path / "bars.png"
    assert main(["compare", str(first), str(second), "--plot", str(png)]) == 0
    assert png.stat().st_size > 5000
    outs = [json.loads(p.read_text()) for p in (first, second)]
    (ax,) = plot_task_scores(outs, ["a", "b"]).axes
    assert ax.get_title() == "Your STS files"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["own_dev.tsv"]
    # STS scores in the 70s: the bars still start at 0, so that their lengths compare them
    sts = [
        {"results": {}, "headline": {"sts": {"STS-B": v, "SICK-R": v - 3}}} for v in (75.0, 79.0)
    ]
    (ax,) = plot_task_scores(sts, ["a", "b"]).axes
    assert ax.get_ylim()[0] == 0


# ------------------------------------------------------------------------------------- sweep

#: A cell process that writes its pid and then runs for a while, in place of `cselab train`.
SLOW_CELL = (
    "import os, sys, time\n"
    "open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid()))\n"
    "os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n"
    "time.sleep(120)\n"
)
#: A sweep whose cells run :data:`SLOW_CELL`.
SLOW_SWEEP = (
    "import sys\n"
    "from cselab.insight import sweep\n"
    "cell = [sys.executable, '-c', sys.argv[3], sys.argv[2]]\n"
    "sweep.cell_commands = lambda spec, c, config_file: [cell]\n"
    "sweep.run_sweep(sweep.load_sweep(sys.argv[1]))\n"
)


def bare_sweep(folder: Path) -> Path:
    """A sweep of one cell, its processes launched as subprocesses, no evaluation."""
    spec = {"base": {"train": {"max_steps": 1}}, "configs": {"simcse": []}, "seeds": [1],
            "output_root": str(folder / "runs"), "launcher": "subprocess", "evaluate": None}  # fmt: skip
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def start_slow_sweep(spec: Path, pidfile: Path) -> tuple[subprocess.Popen, int]:
    """Start the sweep in its own process; returns it and its running cell's pid."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_SWEEP, str(spec), str(pidfile), SLOW_CELL], env=env
    )
    deadline = time.monotonic() + 120  # imports torch on a loaded machine
    while not pidfile.is_file():
        assert proc.poll() is None and time.monotonic() < deadline, (
            "the sweep did not start its cell"
        )
        time.sleep(0.2)
    return proc, int(pidfile.read_text())


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie waiting to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def stop(proc: subprocess.Popen, pid: int) -> None:
    proc.kill()
    proc.wait()
    if running(pid):
        os.kill(pid, signal.SIGKILL)


needs_linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


@needs_linux
def test_a_sweep_killed_with_sigkill_takes_its_running_cell_with_it(tmp_path: Path) -> None:
    proc, child = start_slow_sweep(bare_sweep(tmp_path), tmp_path / "cell.pid")
    try:
        assert running(child)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 20
        while running(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not running(child), "the cell outlived its sweep"
    finally:
        stop(proc, child)


@needs_linux
def test_two_sweeps_at_once_the_second_leaves_the_live_cell_alone(
    tmp_path: Path, monkeypatch
) -> None:
    spec_file = bare_sweep(tmp_path)
    proc, child = start_slow_sweep(spec_file, tmp_path / "cell.pid")
    try:
        cell = tmp_path / "runs" / "simcse" / "seed1"
        before = {p.name: p.read_bytes() for p in cell.iterdir() if p.is_file()}
        assert {"cell.json", "sweep.log", "sweep_config.yaml"} <= before.keys()
        started = []
        monkeypatch.setattr(sweep_module, "cell_commands", lambda *a: started.append(a) or [])
        with pytest.raises(SweepError, match=r"1 cell\(s\) left alone, in use by another cselab"):
            run_sweep(load_sweep(spec_file))
        assert not started
        assert {p.name: p.read_bytes() for p in cell.iterdir() if p.is_file()} == before
    finally:
        stop(proc, child)


def test_a_sweep_leaves_a_cell_alone_while_cselab_train_holds_its_folder(
    tiny_bert: Path, tmp_path: Path, capsys
) -> None:
    """`cselab train` holds its run folder's lock for the life of the run (simulated here by a
    second process holding ``RunFolder(cell).lock()``): a sweep writes nothing into that cell."""
    spec_file = sweep_file(tmp_path, tiny_bert, evaluate=None)
    cell = tmp_path / "runs" / "simcse" / "seed1"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom cselab.io.runfolder import RunFolder\n"
         "with RunFolder(sys.argv[1]).lock():\n    print('locked', flush=True)\n"
         "    time.sleep(120)\n", str(cell)],
        stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(SRC)},
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert main(["-q", "sweep", str(spec_file)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "left alone, in use by another cselab process" in err[0]
        assert {p.name for p in cell.iterdir()} == {RunFolder.LOCK, RunFolder.SWEEP_LOCK}
    finally:
        holder.kill()
        holder.wait()


# -------------------------------------------------------------------------------- properties

PROPERTY = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
keys = st.sampled_from(["config", "seed", "best_step", "best_stsb_dev", "best_dev_spearman",
                        "dev", "name", "results", "headline", "sts", "sts_files", "STS-B",
                        "STSBenchmark", "spearman", "MR", "acc", "Avg", "kind", "baseline"])  # fmt: skip
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.sampled_from(["simcse", "dev_spearman", "sts-file"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=12,
)
file_bytes = st.one_of(
    st.binary(max_size=120),
    st.dictionaries(keys, json_values, max_size=5).map(lambda d: json.dumps(d).encode()),
    st.none(),  # no such file
)


@PROPERTY
@given(cell_json=file_bytes, results=file_bytes, evaluation=file_bytes, sweep_json=file_bytes,
       config_yaml=st.one_of(st.none(), st.binary(max_size=80), st.text(max_size=80).map(str.encode)))  # fmt: skip
@example(cell_json=b'{"config": "simcse", "seed": 1}', results=b'{"best_step": 0}',
         evaluation=b'{"results": {"MR": {"acc": "x"}}}', sweep_json=b'{"baseline": [1]}',
         config_yaml=b"train: {seed: .nan}")  # fmt: skip
@example(cell_json=b'{"config": "simcse", "seed": 1}', results=b'{"best_stsb_dev": NaN}',
         evaluation=b'{"results": {"STSBenchmark": {"spearman": 1e308}}}', sweep_json=None,
         config_yaml=b"[1]")  # fmt: skip
def test_any_cell_files_give_scores_or_one_line(
    tmp_path: Path, cell_json, results, evaluation, sweep_json, config_yaml
) -> None:
    root = tmp_path / "root"
    shutil.rmtree(root, ignore_errors=True)
    cell = root / "simcse" / "seed1"
    cell.mkdir(parents=True)
    for name, data in (("cell.json", cell_json), ("results.json", results),
                       ("eval.json", evaluation), ("config.yaml", config_yaml)):  # fmt: skip
        if data is not None:
            (cell / name).write_bytes(data)
    if sweep_json is not None:
        (root / "sweep.json").write_bytes(sweep_json)
    try:
        scores = cell_scores(cell)
        baseline = default_baseline(root)
        if scores is not None:
            report = build_report([scores], baseline if baseline == scores.config else None)
            markdown(report)
            to_csv(report)
    except UserError as err:
        assert "\n" not in str(err)
        return
    assert scores is None or all(math.isfinite(v) for v in scores.scores.values())


@given(data=st.binary(max_size=60))
@settings(max_examples=100, deadline=None)
def test_bytes_as_a_sweep_file_json_are_none_a_dict_or_one_line(
    data: bytes, tmp_path_factory
) -> None:
    path = tmp_path_factory.mktemp("json") / "x.json"
    path.write_bytes(data)
    try:
        assert isinstance(readers.read_json(path), dict)
    except DataFormatError as err:
        assert str(path) in str(err) and "\n" not in str(err)


def test_configs_without_a_shared_seed_say_why_there_is_no_paired_row(
    own_dev_sweep: Path, tmp_path: Path, capsys
) -> None:
    """The paired table was printed empty, without a word (issue 31)."""
    cell = cell_of(own_dev_sweep)
    copy_cell(cell, tmp_path / "simcse" / "seed1")
    other = copy_cell(cell, tmp_path / "other" / "seed2", seed=2)
    edit_json(other / "cell.json", config="other")
    assert main(["report", str(tmp_path), "--baseline", "simcse"]) == 0
    out = capsys.readouterr().out
    assert "| config | task |" not in out  # no empty table
    assert (
        "**Paired difference to simcse (same seed)**: no pair to compare.\n\nother: no paired "
        "comparison: its seeds (2) share none with simcse's (1); run both configurations with "
        "the same seeds."
    ) in out


def test_a_task_scored_on_fewer_seeds_shows_its_own_count(
    own_dev_sweep: Path, tmp_path: Path, capsys
) -> None:
    """A row said n=2 beside a value from one seed (one cell evaluated on another file)."""
    cell = cell_of(own_dev_sweep)
    copy_cell(cell, tmp_path / "simcse" / "seed1")
    second = copy_cell(cell, tmp_path / "simcse" / "seed2", seed=2)
    (second / "eval.json").unlink()  # seed 2 has its dev score only
    assert main(["report", str(tmp_path)]) == 0
    value = json.loads((cell / "eval.json").read_text())["headline"]["sts_files"]["own_dev.tsv"]
    row = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("| simcse"))
    assert row.startswith("| simcse | 1–2 | ") and row.endswith(f" | {value:.2f} (n=1) |")
