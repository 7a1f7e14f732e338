"""``cselab sweep`` / ``cselab report``: a real 2-configuration x 3-seed sweep of a tiny BERT,
skipping finished cells, resuming an interrupted one, the report's tables, and the sweep
file's errors (one line naming the file and key)."""

from __future__ import annotations

import csv
import json
import logging
import statistics
import sys
from pathlib import Path

import pytest
import yaml

from conftest import needs_senteval, write_corpus
from cselab.cli import main
from cselab.config import ConfigError
from cselab.insight.report import DEV_COLUMN, build_report, collect, markdown
from cselab.insight.stats import paired_difference
from cselab.insight.sweep import cell_commands, grid_configs, load_sweep
from cselab.io.runfolder import RunFolder

SEEDS = [1, 2, 3]


def write_sweep(folder: Path, tiny_bert: Path, senteval: Path | None, **extra) -> Path:
    spec = {
        "base": {
            "model": {"name_or_path": str(tiny_bert), "max_seq_len": 16},
            "data": {
                "train_file": str(write_corpus(folder, n=48)),
                "cache_dir": str(folder / "cache"),
            },
            "train": {
                "batch_size": 8,
                "max_steps": 4,
                "lr": 1e-3,
                "eval_steps": 2,
                "log_steps": 2,
                "device": "cpu",
                "report_to": [],
            },  # fmt: skip
            "eval": {"data_dir": str(senteval) if senteval else None, "batch_size": 64},
        },
        "configs": {"simcse": [], "dcl": ["objective.dcl.enabled=true"]},
        "seeds": SEEDS,
        "output_root": str(folder / "runs"),
        "baseline": "simcse",
        "launcher": "inprocess",
        "evaluate": {
            "tasks": "STSBenchmark,SICKRelatedness",
            "mode": "dev",
            "data_dir": str(senteval) if senteval else None,
            "batch_size": 64,
        },
        **extra,
    }
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def sweep_root(tiny_bert: Path, senteval_dir: Path, tmp_path_factory, one_thread) -> Path:
    """The 2 x 3 sweep, run once through the CLI for the module."""
    folder = tmp_path_factory.mktemp("sweep")
    spec = write_sweep(folder, tiny_bert, senteval_dir)
    assert main(["-q", "sweep", str(spec)]) == 0
    return folder


@needs_senteval
def test_sweep_runs_every_cell_and_evaluates(sweep_root: Path) -> None:
    runs = sweep_root / "runs"
    for config in ("simcse", "dcl"):
        for seed in SEEDS:
            cell = runs / config / f"seed{seed}"
            results = json.loads((cell / RunFolder.RESULTS).read_text())
            assert results["steps"] == 4
            saved = yaml.safe_load((cell / "best" / "cselab_config.yaml").read_text())
            assert saved["train"]["seed"] == seed
            assert saved["objective"]["dcl"]["enabled"] == (config == "dcl")
            out = json.loads((cell / RunFolder.EVALUATION).read_text())
            assert set(out["results"]) == {"STSBenchmark", "SICKRelatedness"}
            assert out["mode"] == "dev" and out["results"]["STSBenchmark"]["n"] == 1500
    # the same seed gives the same dev score at step 0 (nothing trained yet), whatever the
    # objective; different seeds only differ in the MLP head, so step 0 may differ
    for seed in SEEDS:
        first = [
            next(csv.DictReader((runs / c / f"seed{seed}" / "metrics.csv").open()))["stsb_dev"]
            for c in ("simcse", "dcl")
        ]
        assert first[0] == first[1]


@needs_senteval
def test_report_matches_the_cells(sweep_root: Path, capsys) -> None:
    runs = sweep_root / "runs"
    cells = collect(runs)
    assert sorted((c.config, c.seed) for c in cells) == sorted(
        (c, s) for c in ("simcse", "dcl") for s in SEEDS
    )
    report = build_report(cells, "simcse", n_resamples=2000)
    assert report.tasks[:3] == [DEV_COLUMN, "STS-B", "SICK-R"]

    def score(config: str, seed: int, task: str) -> float:
        out = json.loads((runs / config / f"seed{seed}" / RunFolder.EVALUATION).read_text())
        return round(100 * out["results"][task]["spearman"], 2)  # the headline value

    dcl = [score("dcl", s, "STSBenchmark") for s in SEEDS]
    base = [score("simcse", s, "STSBenchmark") for s in SEEDS]
    d = report.paired[("dcl", "STS-B")]
    assert d.n == 3 and d.weak
    assert d.mean == pytest.approx(
        statistics.fmean(a - b for a, b in zip(dcl, base, strict=True)), rel=1e-12
    )
    # the CLI writes the three files and takes the baseline from the sweep's sweep.json
    assert main(["-q", "report", str(runs)]) == 0
    text = (runs / "report.md").read_text()
    assert text == markdown(build_report(cells, "simcse"))
    mean, std = statistics.fmean(dcl), statistics.stdev(dcl)
    assert f"{mean:.2f} ± {std:.2f}" in text
    rows = list(csv.DictReader((runs / "report.csv").open()))
    assert len([r for r in rows if r["kind"] == "summary"]) == 2 * len(report.tasks)
    assert len([r for r in rows if r["kind"] == "paired"]) == len(report.tasks)
    assert (runs / "report.png").stat().st_size > 10_000
    assert "Paired difference to simcse" in capsys.readouterr().out


@needs_senteval
def test_finished_cells_are_skipped_and_an_interrupted_one_resumes(
    sweep_root: Path, capsys, caplog
) -> None:
    spec_file = sweep_root / "sweep.yaml"
    runs = sweep_root / "runs"
    before = {p: p.stat().st_mtime_ns for p in runs.rglob(RunFolder.RESULTS)}
    assert main(["-q", "sweep", str(spec_file)]) == 0
    assert "0 cell(s) run, 6 already finished" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in runs.rglob(RunFolder.RESULTS)} == before
    # an interrupted cell: the checkpoint is there, results and evaluation are not
    cell = runs / "dcl" / "seed2"
    metrics = (cell / "metrics.csv").read_text()
    (cell / RunFolder.RESULTS).unlink()
    (cell / RunFolder.EVALUATION).unlink()
    with caplog.at_level(logging.INFO, logger="cselab"):
        assert main(["-q", "sweep", str(spec_file)]) == 0
    assert "1 cell(s) run, 5 already finished" in capsys.readouterr().out
    assert any("resumed from" in r.getMessage() for r in caplog.records)
    assert (cell / "metrics.csv").read_text() == metrics  # nothing re-trained
    assert json.loads((cell / RunFolder.RESULTS).read_text())["steps"] == 4
    assert (cell / RunFolder.EVALUATION).is_file()


@needs_senteval
def test_compare_plot_draws_one_bar_per_result_and_task(sweep_root: Path, tmp_path: Path) -> None:
    from cselab.insight.plots import plot_task_scores

    files = [
        str(sweep_root / "runs" / c / "seed1" / RunFolder.EVALUATION) for c in ("simcse", "dcl")
    ]
    png = tmp_path / "bars.png"
    assert main(["compare", *files, "--names", "simcse,dcl", "--plot", str(png)]) == 0
    outs = [json.loads(Path(f).read_text()) for f in files]
    fig = plot_task_scores(outs, ["simcse", "dcl"])
    (ax,) = fig.axes
    # dev mode: STS-B and SICK-R and their average, one bar per result
    assert [t.get_text() for t in ax.get_xticklabels()] == ["STS-B", "SICK-R", "Avg"]
    assert len(ax.patches) == 2 * 3
    heights = [p.get_height() for p in ax.containers[1]]
    assert heights[0] == pytest.approx(outs[1]["headline"]["sts"]["STS-B"])
    assert_png(png)


def assert_png(path: Path, min_size: tuple[int, int] = (400, 300)) -> None:
    """A real PNG of at least ``min_size`` pixels that is not one flat colour."""
    import numpy as np
    from matplotlib.image import imread

    image = imread(path)
    assert image.shape[1] >= min_size[0] and image.shape[0] >= min_size[1]
    rgb = image[..., :3]
    non_white = (rgb < 0.95).any(axis=-1).mean()
    assert 0.01 < non_white < 0.9, non_white
    assert np.unique(rgb.reshape(-1, 3), axis=0).shape[0] > 20  # lines, text and colours


# ---------------------------------------------------------------------------- no training


def test_grid_names_every_combination() -> None:
    configs = grid_configs({"objective.dcl.enabled": [False, True], "train.lr": [1e-5, 3e-5]})
    assert list(configs) == [
        "objective.dcl.enabled=false,train.lr=1.0e-05",
        "objective.dcl.enabled=false,train.lr=3.0e-05",
        "objective.dcl.enabled=true,train.lr=1.0e-05",
        "objective.dcl.enabled=true,train.lr=3.0e-05",
    ]
    assert configs["objective.dcl.enabled=true,train.lr=1.0e-05"] == [
        "objective.dcl.enabled=true",
        "train.lr=1.0e-05",
    ]


def test_a_grid_names_its_cells_as_its_values_are_written(tmp_path: Path) -> None:
    """``1e-5`` (text to YAML 1.1, a number now) keeps the cell name it had (``train.lr=1e-5``):
    a sweep run again finds its finished cells; a number YAML 1.1 read already keeps its
    name too (``3.0e-05``), and every override reads the number it names."""
    from cselab.config import load_config

    spec_file = tmp_path / "sweep.yaml"
    spec_file.write_text(
        "base: demo-minilm\ngrid:\n  train.lr: [1e-5, 3.0e-5, 0.001]\nseeds: [1]\n"
        f"output_root: {tmp_path / 'out'}\n", encoding="utf-8",
    )  # fmt: skip
    configs = load_sweep(spec_file).configs
    assert list(configs) == ["train.lr=1e-5", "train.lr=3.0e-05", "train.lr=0.001"]
    lrs = [load_config(None, ["--" + o for o in c]).train.lr for c in configs.values()]
    assert lrs == [1e-5, 3e-5, 0.001]


def test_grid_sweep_file_builds_its_cells(tiny_bert: Path, tmp_path: Path) -> None:
    spec_file = write_sweep(tmp_path, tiny_bert, None)
    data = yaml.safe_load(spec_file.read_text())
    del data["configs"], data["baseline"]
    data["grid"] = {"objective.temperature": [0.05, 0.1]}
    spec_file.write_text(yaml.safe_dump(data))
    spec = load_sweep(spec_file)
    cells = spec.cells()
    assert len(cells) == 2 * 3
    config = cells[1].build_config(spec)
    assert config.objective.temperature == 0.1 and config.train.seed == 1
    assert config.train.resume and config.train.output_dir == str(cells[1].dir)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"seed": [1]}, "unknown key 'seed'"),
        ({"seeds": [1, 1]}, "'seeds' lists a seed twice"),
        ({"baseline": "nope"}, "'baseline' 'nope' is none of the configurations"),
        ({"launcher": "slurm"}, "'launcher' must be one of"),
        ({"parallel": 2}, "launcher 'inprocess' runs one cell at a time"),
        ({"configs": {"bad": ["train.lr=-1"]}, "baseline": None}, "train.lr must be > 0"),
        ({"evaluate": {"tasks": "STS12", "mode": "dev"}}, "evaluate.tasks: STS12 has no dev"),
        ({"evaluate": {"model": "middle"}}, "evaluate.model must be best or last"),
        # refused as `cselab evaluate --batch-size` refuses it, before any cell trains
        ({"evaluate": {"batch_size": 0}}, "evaluate.batch_size must be at least 1"),
        ({"grid": {"train.lr": [1e-5]}}, "give exactly one of 'grid'"),
    ],
)
def test_sweep_file_errors_name_file_and_key(
    tiny_bert: Path, tmp_path: Path, capsys, change: dict, message: str
) -> None:
    spec_file = write_sweep(tmp_path, tiny_bert, None, **change)
    with pytest.raises(ConfigError, match="sweep.yaml: ") as err:
        load_sweep(spec_file)
    assert message in str(err.value)
    assert main(["sweep", str(spec_file)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("cselab sweep: error: ") and message in line


def test_torchrun_cell_command(tiny_bert: Path, tmp_path: Path) -> None:
    spec = load_sweep(write_sweep(tmp_path, tiny_bert, None, launcher="torchrun"))
    spec.nproc_per_node = 2
    cell = spec.cells()[0]
    train, evaluate = cell_commands(spec, cell, cell.dir / "sweep_config.yaml")
    assert train[:5] == [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
    ]
    assert train[5:] == ["-m", "cselab", "-q", "train", str(cell.dir / "sweep_config.yaml")]
    assert evaluate[4:6] == ["evaluate", str(cell.dir / "best")]
    assert "--no-download" in evaluate


@pytest.mark.slow  # two fresh Python processes importing torch: ~30 s on 2 shared cores
def test_subprocess_cells_run_in_parallel(tiny_bert: Path, tmp_path: Path) -> None:
    """Two cells as two processes at once (no evaluation, so no data needed)."""
    spec_file = write_sweep(
        tmp_path, tiny_bert, None, launcher="subprocess", parallel=2, threads_per_cell=1,
        configs={"simcse": []}, seeds=[1, 2], evaluate=None,
    )  # fmt: skip
    data = yaml.safe_load(spec_file.read_text())
    data["base"]["train"]["eval_steps"] = 0
    spec_file.write_text(yaml.safe_dump(data))
    assert main(["-q", "sweep", str(spec_file)]) == 0
    for seed in (1, 2):
        cell = tmp_path / "runs" / "simcse" / f"seed{seed}"
        assert json.loads((cell / RunFolder.RESULTS).read_text())["steps"] == 4
        assert "$ " in (cell / "sweep.log").read_text()


def test_report_by_hand(tmp_path: Path) -> None:
    """Three seeds written by hand: the summary and the paired numbers as computed by hand."""
    from cselab.insight.report import CellScores

    cells = [
        CellScores("base", 1, {"X": 70.0}),
        CellScores("base", 2, {"X": 71.0}),
        CellScores("base", 3, {"X": 72.0}),
        CellScores("new", 1, {"X": 71.0}),
        CellScores("new", 2, {"X": 73.0}),
        CellScores("new", 3, {"X": 75.0}),
        CellScores("new", 4, {"X": 99.0}),  # no baseline with seed 4: not paired
    ]
    report = build_report(cells, "base")
    d = report.paired[("new", "X")]
    # differences 1, 2, 3: mean 2, sd 1, t = 2 / (1 / sqrt 3); with 2 d.o.f. the t CDF is
    # 1/2 + t / (2 sqrt(2 + t^2)), so p = 1 - t / sqrt(2 + t^2) and t_0.975 = sqrt(2 u^2 / (1 - u^2))
    # with u = 0.95
    t = 2 * 3**0.5
    assert d.n == 3 and d.mean == pytest.approx(2.0) and d.std == pytest.approx(1.0)
    assert d.t_p == pytest.approx(1 - t / (2 + t * t) ** 0.5, rel=1e-9)
    q = (2 * 0.95**2 / (1 - 0.95**2)) ** 0.5
    assert d.t_ci == pytest.approx((2 - q / 3**0.5, 2 + q / 3**0.5), rel=1e-9)
    text = markdown(report)
    assert "| new | 4 | 79.50 ± 13.10 |" in text  # 71, 73, 75, 99
    assert "| new | X | 3 | +2.00 | [-0.48, +4.48] | [+1.00, +3.00] | 0.074 | 0.250 | ⚠ |" in text
    assert d == paired_difference([71.0, 73.0, 75.0], [70.0, 71.0, 72.0])


def test_example_sweep_file_loads() -> None:
    from conftest import REPO

    spec = load_sweep(REPO / "src/cselab/presets" / "sweeps" / "focal-vs-simcse.yaml")
    assert [c.config for c in spec.cells()[:2]] == ["simcse", "focal"] and len(spec.seeds) == 5


def test_a_sweep_evaluates_retrieval_the_same_in_process_and_as_a_command(
    tiny_bert: Path, tmp_path: Path
) -> None:
    """One request, two routes: the in-process cell's task list and the subprocess cell's
    ``cselab evaluate`` options give the same retrieval numbers (issue 28, point 1)."""
    from cselab.insight.sweep import _evaluate_inprocess
    from cselab.model.encoder import SentenceEncoder
    from test_retrieval import write_beir

    beir = write_beir(tmp_path / "beir", split="test")
    evaluate = {"retrieval": str(beir), "k": 5, "batch_size": 16}
    spec = load_sweep(write_sweep(tmp_path, tiny_bert, None, evaluate=evaluate))
    assert spec.evaluate is not None and spec.evaluate.task_spec is None
    cell = spec.cells()[0]
    SentenceEncoder.from_pretrained(str(tiny_bert)).save(cell.folder.model(spec.evaluate.model))
    (command,) = cell_commands(spec, cell, cell.dir / "sweep_config.yaml")[-1:]
    assert command[command.index("--retrieval") + 1] == str(beir)
    assert command[command.index("--k") + 1] == "5"
    _evaluate_inprocess(spec, cell)
    inprocess = json.loads(cell.folder.evaluation.read_text())["results"]["retrieval:beir"]
    assert main(command[4:]) == 0  # the subprocess cell's command, run here
    as_command = json.loads(cell.folder.evaluation.read_text())["results"]["retrieval:beir"]
    assert inprocess["metrics"] == as_command["metrics"] and inprocess["k"] == 5
    bad = {"retrieval": str(tmp_path / "nothing")}
    with pytest.raises(ConfigError, match="evaluate.retrieval"):
        load_sweep(write_sweep(tmp_path / "bad", tiny_bert, None, evaluate=bad))
