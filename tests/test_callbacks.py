"""Callbacks and the ``train.report_to`` loggers: hooks called with the logged numbers, real
TensorBoard / W&B (offline) / MLflow (local file store) files read back, and a failing logger
warned about once, by name."""

from __future__ import annotations

import csv
import json
import logging
import sys
import time
from pathlib import Path

import pytest

from conftest import write_corpus
from cselab.app.train import build_trainer
from cselab.config import ConfigError, load_config
from cselab.training.callbacks import Callback, Logger, split_row


def tiny_config(tiny_bert: Path, folder: Path, *extra: str):
    return load_config(
        None,
        [
            f"--model.name_or_path={tiny_bert}",
            f"--data.train_file={write_corpus(folder, n=48)}",
            f"--data.cache_dir={folder / 'cache'}",
            f"--train.output_dir={folder / 'out'}",
            "--train.batch_size=8", "--train.max_steps=6", "--train.lr=1e-3",
            "--train.eval_steps=3", "--train.log_steps=2", "--train.report_to=[]",
            "--train.save_steps=3",  # checkpoints no longer follow evaluations by default
            *extra,
        ],
    )  # fmt: skip


def run(config, callbacks=()):  # noqa: ANN001, ANN201
    trainer = build_trainer(config, callbacks)
    # a deterministic stand-in for STS-B dev (no data files needed): it changes with training
    trainer.selection.evaluator = lambda enc: 50 + 10 * float(enc.encode(["alpha beta"])[0].mean())
    return trainer.train()


def metrics_rows(out: Path) -> list[dict[str, str]]:
    return list(csv.DictReader((out / "metrics.csv").open()))


class Recorder(Callback):
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def on_step(self, step, metrics):  # noqa: ANN001
        self.calls.append(("step", step, dict(metrics)))

    def on_evaluate(self, step, metrics):  # noqa: ANN001
        self.calls.append(("evaluate", step, dict(metrics)))

    def on_save(self, step, path):  # noqa: ANN001
        self.calls.append(("save", step, path))

    def on_end(self, results):  # noqa: ANN001
        self.calls.append(("end", results))


def test_hooks_get_what_metrics_csv_gets(tiny_bert: Path, tmp_path: Path, one_thread) -> None:
    rec = Recorder()
    results = run(tiny_config(tiny_bert, tmp_path), [rec])
    out = tmp_path / "out"
    kinds = [(c[0], c[1]) if c[0] != "end" else ("end",) for c in rec.calls]
    assert kinds == [
        ("evaluate", 0),
        ("step", 2),
        ("step", 3), ("evaluate", 3), ("save", 3),
        ("step", 4),
        ("step", 6), ("evaluate", 6), ("save", 6),
        ("end",),
    ]  # fmt: skip
    rows = {int(r["step"]): r for r in metrics_rows(out)}
    for kind, step, *rest in rec.calls[:-1]:
        if kind == "step":
            logged = rest[0]
            assert set(logged) == {"epoch", "lr", "loss", "infonce", "sentences_per_s"}
            assert logged["loss"] == float(rows[step]["loss"])
            assert logged["lr"] == float(rows[step]["lr"])
        elif kind == "evaluate":
            assert rest[0] == {"stsb_dev": float(rows[step]["stsb_dev"])}
        else:
            assert rest[0] == out / "checkpoint"
    assert rec.calls[-1][1] == results == json.loads((out / "results.json").read_text())


def test_every_dev_score_is_an_evaluation_metric(tmp_path: Path) -> None:
    """Whatever ``eval.dev`` and ``eval.dev_metric`` name the model-selection score, it reaches
    ``on_evaluate`` (with alignment and uniformity), never ``on_step``."""
    from cselab.evaluation.custom import dev_evaluator
    from test_eval_custom import PAIRS, write

    dev = write(tmp_path / "dev.tsv", PAIRS, ("sentence1", "sentence2", "score"))
    names = [dev_evaluator(d, m).name for d in ("stsb", str(dev)) for m in ("spearman", "pearson")]
    assert len(set(names)) == 4
    for name in names:
        row = {"step": 4, "epoch": 0.5, "lr": 1e-3, "loss": 1.25, name: 61.0, "align": 0.4,
               "uniform": -2.1}  # fmt: skip
        trained, evaluated = split_row(row)
        assert evaluated == {name: 61.0, "align": 0.4, "uniform": -2.1}
        assert trained == {"epoch": 0.5, "lr": 1e-3, "loss": 1.25}


def test_user_callback_errors_propagate(tiny_bert: Path, tmp_path: Path, one_thread) -> None:
    class Stop(Callback):
        def on_evaluate(self, step, metrics):  # noqa: ANN001
            if step == 3:
                raise KeyboardInterrupt  # e.g. the user stopping a run from a callback

    with pytest.raises(KeyboardInterrupt):
        run(tiny_config(tiny_bert, tmp_path), [Stop()])


def test_failing_logger_warns_once_by_name(
    tiny_bert: Path, tmp_path: Path, caplog, monkeypatch, one_thread
) -> None:
    class Broken(Logger):
        name = "broken-board"

        def log_scalars(self, step, values):  # noqa: ANN001
            raise OSError("disk full")

    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` fails
    config = tiny_config(tiny_bert, tmp_path, "--train.report_to=[wandb]")
    rec = Recorder()
    with caplog.at_level(logging.WARNING, logger="cselab"):
        results = run(config, [Broken(tmp_path, {}), rec])
    assert results["steps"] == 6  # training went on
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith(
        "logger 'wandb' failed in on_evaluate (ImportError: wandb is not installed "
        "(pip install 'cselab[wandb]'))"
    )
    assert "logger 'broken-board' failed in on_evaluate (OSError: disk full)" in warnings[1]
    assert len(rec.calls) == 10  # the callback after the broken ones got every call


def test_unknown_logger_is_a_config_error() -> None:
    with pytest.raises(
        ConfigError,
        match=r"train.report_to\[1\]: must be one of \['tensorboard', 'wandb', 'mlflow'\], got 'comet'",
    ):
        load_config(None, ["--train.report_to=[tensorboard,comet]"])


def test_tensorboard_scalars(tiny_bert: Path, tmp_path: Path, one_thread) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run(tiny_config(tiny_bert, tmp_path, "--train.report_to=[tensorboard]"))
    out = tmp_path / "out"
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    rows = metrics_rows(out)
    logged = [r for r in rows if r["loss"]]
    loss = events.Scalars("loss")
    assert [e.step for e in loss] == [int(r["step"]) for r in logged]
    # TensorBoard stores float32: equal to float32 rounding (half an ulp, relative 2**-24)
    assert [e.value for e in loss] == pytest.approx([float(r["loss"]) for r in logged], rel=2**-23)
    dev = [(e.step, e.value) for e in events.Scalars("stsb_dev")]
    assert [s for s, _ in dev] == [0, 3, 6]


def test_mlflow_local_file_store(tiny_bert: Path, tmp_path: Path, monkeypatch, one_thread) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run(tiny_config(tiny_bert, tmp_path, "--train.report_to=[mlflow]", "--train.seed=7"))
    out = tmp_path / "out"
    client = MlflowClient(tracking_uri=(out / "mlruns").resolve().as_uri())
    experiment = client.get_experiment_by_name("cselab")
    (run_info,) = client.search_runs([experiment.experiment_id])
    assert run_info.data.params["train.seed"] == "7"
    assert run_info.info.status == "FINISHED"
    history = client.get_metric_history(run_info.info.run_id, "loss")
    rows = metrics_rows(out)
    expected = [(int(r["step"]), float(r["loss"])) for r in rows if r["loss"]]
    assert sorted((m.step, m.value) for m in history) == expected  # float64 both ways
    dev = client.get_metric_history(run_info.info.run_id, "stsb_dev")
    assert sorted(m.step for m in dev) == [0, 3, 6]


def test_wandb_offline(tiny_bert: Path, tmp_path: Path, monkeypatch, one_thread) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run(tiny_config(tiny_bert, tmp_path, "--train.report_to=[wandb]"))
    out = tmp_path / "out"
    (record,) = (out / "wandb").glob("offline-run-*/run-*.wandb")
    # wandb >= 0.19 reads its offline record file only in its Go core; the history values are
    # stored as JSON text in it, so each logged number must appear there verbatim. The core
    # writes the file after run.finish() returns: wait for it (a bounded poll, not a timing claim).
    logged = [(k, r[k]) for r in metrics_rows(out) for k in ("loss", "infonce", "stsb_dev") if r[k]]
    deadline = time.monotonic() + 60
    while repr(float(logged[-1][1])).encode() not in record.read_bytes():
        assert time.monotonic() < deadline, "wandb never wrote the run's history"
        time.sleep(0.2)
    data = record.read_bytes()
    assert len(logged) == 4 + 4 + 3
    for key, value in logged:
        assert key.encode() in data and repr(float(value)).encode() in data, (key, value)
    assert b"report_to" in data  # the run's config


def test_every_report_to_name_has_a_logger() -> None:
    """The config's list of logger names and the loggers are the same set."""
    import typing

    from cselab.config import ReportTo
    from cselab.training.callbacks import LOGGERS

    assert set(typing.get_args(ReportTo)) == set(LOGGERS)
