"""A resume of a run that already finished (a retry loop, a scheduler rerunning a job that had
ended): nothing to do, said in one line, the first run's files and results kept byte for byte;
a run stopped after its last checkpoint but before ``results.json`` still writes its end."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest

from cselab.app.train import build_trainer
from cselab.cli import main
from cselab.io.runfolder import RunFolder
from test_hostile_inputs import train_args
from test_trainer import tiny_config

FINISHED = "run already finished at step"


def folder_state(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``folder`` with its bytes and modification time (ns); the lock file is
    the running process's, not part of the run."""
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != RunFolder.LOCK
    }


def finished_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if FINISHED in r.getMessage()]


def test_resuming_a_finished_run_keeps_every_file_and_returns_its_results(
    tiny_bert: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, one_thread: None
) -> None:
    extra = ("--train.max_steps=3", "--train.save_steps=2", "--train.log_steps=1")
    first = build_trainer(tiny_config(tiny_bert, tmp_path, *extra)).train()
    out = RunFolder(tmp_path / "out")
    before = folder_state(out.path)
    assert {RunFolder.RESULTS, RunFolder.CONFIG, RunFolder.PLAN, "last/README.md"} <= set(before)
    saved = json.loads(out.results.read_text(encoding="utf-8"))
    assert saved["steps"] == 3 and saved["train_time_s"] == first["train_time_s"]
    caplog.set_level(logging.INFO, logger="cselab")
    again = build_trainer(tiny_config(tiny_bert, tmp_path, *extra, "--train.resume=true"))
    assert again.train() == saved  # the first run's results, its times included
    assert folder_state(out.path) == before  # not one byte rewritten, not one file added
    assert finished_lines(caplog) == [f"{out.path}: {FINISHED} 3; nothing to do"]


def test_a_retried_command_on_a_finished_run_succeeds_and_writes_nothing(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture, one_thread: None
) -> None:
    """``cselab train ... --train.resume=true`` again (a bookkeeping change allowed, as a
    resume allows it): exit 0, the same summary printed, the folder untouched."""
    argv = [*train_args(tiny_bert, tmp_path), "--train.resume=true"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    out = tmp_path / "out"
    before = folder_state(out)
    for more in ([], ["--train.log_steps=2"]):
        assert main([*argv, *more]) == 0
        assert capsys.readouterr().out == first
        assert folder_state(out) == before


def test_a_finished_run_s_resume_does_not_load_the_model(
    tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_thread: None
) -> None:
    """``cselab train ... --train.resume=true`` on a finished run answers from the folder
    before the model is loaded (minutes and gigabytes for a decoder LLM): the same exit, the
    same printed summary, nothing written; a run stopped before ``results.json`` still loads
    it and writes its end."""
    from cselab.model.sentence_encoder import SentenceEncoder

    argv = [*train_args(tiny_bert, tmp_path), "--train.resume=true"]
    assert main(argv) == 0
    out = RunFolder(tmp_path / "out")
    before = folder_state(out.path)

    def no_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(SentenceEncoder, "from_config", no_load)
    assert main(argv) == 0
    assert folder_state(out.path) == before
    out.results.unlink()  # stopped between its last checkpoint and its end
    with pytest.raises(AssertionError, match="the model was loaded"):
        main(argv)


def test_a_run_stopped_before_its_results_writes_them_on_resume(
    tiny_bert: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, one_thread: None
) -> None:
    """The checkpoint at the last step without ``results.json`` (stopped between the two) is
    not a finished run: the resume writes the end of the run."""
    build_trainer(tiny_config(tiny_bert, tmp_path, "--train.max_steps=2")).train()
    out = RunFolder(tmp_path / "out")
    out.results.unlink()
    caplog.set_level(logging.INFO, logger="cselab")
    resumed = build_trainer(tiny_config(tiny_bert, tmp_path, "--train.max_steps=2", "--train.resume=true"))  # fmt: skip
    results = resumed.train()
    assert results["steps"] == 2 and json.loads(out.results.read_text(encoding="utf-8")) == results
    assert finished_lines(caplog) == []


def test_the_times_of_a_resumed_run_cover_the_whole_run(tiny_bert: Path, tmp_path: Path) -> None:
    """Stopped at its step-6 checkpoint and resumed to step 12: each checkpoint carries the
    run's running totals, so the end counts the sentences of all 12 steps once and the training
    time of both parts."""
    from cselab.training import checkpoint as ckpt

    extra = ("--train.save_steps=6", "--train.log_steps=1")
    stopped = build_trainer(tiny_config(tiny_bert, tmp_path, *extra))
    stopped.loop = dataclasses.replace(stopped.loop, total_steps=6)  # as a killed run would
    stopped.train()
    out = RunFolder(tmp_path / "out")
    first = ckpt.read_metadata(out.checkpoint_file)["extra"]["times"]
    assert first["sentences"] == 6 * 8
    results = build_trainer(tiny_config(tiny_bert, tmp_path, *extra, "--train.resume=true")).train()
    assert results["steps"] == 12 and results["train_time_s"] >= round(first["train_s"], 2)
    rate, seconds = results["sentences_per_s"], results["train_time_s"]  # each rounded: 0.005
    assert abs(rate * seconds - 12 * 8) <= 0.005 * (rate + seconds) + 1e-4
    whole = ckpt.read_metadata(out.checkpoint_file)["extra"]["times"]
    assert whole["sentences"] == 12 * 8 and whole["train_s"] >= first["train_s"]


def test_a_run_killed_while_it_merges_is_finished_by_its_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_thread: None
) -> None:
    """``results.json`` is written last, after the cards and the LoRA merge: a run killed while
    it merges into ``merged/`` (minutes for a large model) has no ``results.json``, so its
    resume writes the end again (the merge included) instead of finding it finished."""
    import cselab.training.finish as finish
    from backbone_models import make_tiny_decoder
    from test_lora import lora_config

    tiny_llama = make_tiny_decoder(tmp_path / "llama")

    args = ("--train.save_merged=true", "--train.save_steps=2")
    real = finish.merge_folder

    def killed(*a: object, **k: object) -> None:
        raise KeyboardInterrupt  # the job's time limit, mid-merge

    monkeypatch.setattr(finish, "merge_folder", killed)
    with pytest.raises(KeyboardInterrupt):
        build_trainer(lora_config(tiny_llama, tmp_path, *args)).train()
    out = RunFolder(tmp_path / "out")
    assert not out.results.exists() and not out.merged.exists()
    monkeypatch.setattr(finish, "merge_folder", real)
    results = build_trainer(lora_config(tiny_llama, tmp_path, *args, "--train.resume=true")).train()
    assert out.results.is_file() and (out.merged / "config.json").is_file()
    assert json.loads(out.results.read_text())["steps"] == results["steps"]


def test_a_finished_run_names_the_end_it_does_not_redo_and_its_unreadable_results(
    tiny_bert: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, one_thread: None
) -> None:
    """Resumed with ``train.push_to_hub`` now set, a finished run uploads nothing and says which
    command does; with its ``results.json`` cut, the resume stops in one line saying how to
    write the end again (one process here; the error is broadcast to every rank)."""
    from cselab.core.errors import UserError

    extra = ("--train.max_steps=3", "--train.save_steps=3")
    build_trainer(tiny_config(tiny_bert, tmp_path, *extra)).train()
    out = tmp_path / "out"
    again = (*extra, "--train.resume=true", "--train.push_to_hub=someone/model")
    with caplog.at_level(logging.INFO, logger="cselab"):
        build_trainer(tiny_config(tiny_bert, tmp_path, *again)).train()
    said = [
        r.getMessage() for r in caplog.records if "does not run its end again" in r.getMessage()
    ]
    assert said == [
        f"a finished run does not run its end again; for that: cselab push {out / 'best'} "
        "someone/model"
    ]
    RunFolder(out).results.write_text('{"steps": 3, "best', encoding="utf-8")
    with pytest.raises(UserError, match="remove it and resume again to write the run's end"):
        build_trainer(tiny_config(tiny_bert, tmp_path, *extra, "--train.resume=true")).train()


def test_a_checkpoint_carries_every_running_total() -> None:
    """What a checkpoint records of the run's totals is what a resume reads back (the wall
    time as ``elapsed``, the others under ``times``); a checkpoint written before the totals
    were kept resumes with its wall time and the rest from zero. A checkpoint's own host copy
    is counted from the next one on (it is timed once written)."""
    from cselab.training.runstate import RunTotals

    totals = RunTotals(wall_s=1.5, train_s=2.25, sentences=96, eval_s=0.5, checkpoint_s=0.125)
    record = totals.record(7.0)
    assert RunTotals.from_record(record) == dataclasses.replace(totals, wall_s=7.0)
    assert RunTotals.from_record({"elapsed": 3.0}) == RunTotals(wall_s=3.0)
