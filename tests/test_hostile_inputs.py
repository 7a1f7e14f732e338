"""Hostile inputs a user meets, run through the real commands: a resume with nothing to resume,
an output folder that holds the user's files, damaged adapter folders, a cache under a file, a
missing dev set. Each is one line (``cselab CMD: error: ...``, exit 2) and loses nothing."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from conftest import write_corpus
from cselab.cli import main
from cselab.io.runfolder import RunFolder


def one_line(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


def tree_digest(folder: Path) -> dict[str, str]:
    """Each file under ``folder`` and the SHA-256 of its bytes."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def train_args(tiny_bert: Path, tmp_path: Path, *extra: str) -> list[str]:
    data = tmp_path / "data"
    return [
        "-q", "train", f"--model.name_or_path={tiny_bert}", "--model.max_seq_len=16",
        f"--data.train_file={write_corpus(data, 32)}", f"--data.cache_dir={data / 'cache'}",
        f"--train.output_dir={tmp_path / 'out'}", "--train.batch_size=8", "--train.max_steps=2",
        "--train.eval_steps=0", "--train.report_to=[]", "--train.device=cpu", *extra,
    ]  # fmt: skip


def test_resume_without_a_checkpoint_never_starts_over(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A finished run whose checkpoint is gone: ``--train.resume=true`` (even with another lr)
    is one line, and best/, last/ and metrics.csv are left as they were."""
    import shutil

    argv = train_args(tiny_bert, tmp_path)
    assert main(argv) == 0
    run = RunFolder(tmp_path / "out")
    shutil.rmtree(run.checkpoint_file.parent)
    before = tree_digest(run.path)
    capsys.readouterr()
    assert main([*argv, "--train.resume=true", "--train.lr=1e-3"]) == 2
    message = one_line(capsys)
    assert message.startswith(f"cselab train: error: train.resume: {run.path} holds a run (")
    assert "but no checkpoint" in message and "--train.overwrite=true" in message
    assert tree_digest(run.path) == before


def test_resume_in_an_empty_folder_starts_the_run(tiny_bert: Path, tmp_path: Path) -> None:
    """Nothing to continue and nothing to lose: a resume starts the run."""
    assert main([*train_args(tiny_bert, tmp_path), "--train.resume=true"]) == 0
    assert RunFolder(tmp_path / "out").results.is_file()
