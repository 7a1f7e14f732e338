"""``cselab evaluate`` on the newcomer's path: a wrong model path is reported first (before any
SentEval data is looked for or fetched), progress is one line per task with the time left
(silent with -q), and ``--split`` picks the split of an MTEB task."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import needs_senteval
from cselab.cli import main
from cselab.evaluation import api
from cselab.model.encoder import SentenceEncoder, load

PAIRS = [
    ("a man plays a guitar", "a man is playing a guitar", 4.8),
    ("a woman slices an onion", "a person cuts a vegetable", 3.6),
    ("the cat sleeps", "a stock market report", 0.2),
    ("kids play football", "children are playing soccer", 4.5),
    ("a dog runs in the park", "the weather is cold", 0.4),
]


def error_line(capsys: pytest.CaptureFixture) -> str:
    (line,) = capsys.readouterr().err.splitlines()
    return line


@pytest.fixture(scope="module")
def model_folder(tiny_bert: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("eval-cli") / "tiny-avg"
    SentenceEncoder.from_pretrained(str(tiny_bert), pooler="avg").save(folder)
    return folder


def sts_file(path: Path) -> Path:
    path.write_text(
        "sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in PAIRS),
        encoding="utf-8",
    )
    return path


# ---------------------------------------------------------------------------- the model first
@pytest.mark.parametrize("download", [[], ["--no-download"]])
def test_missing_model_folder_is_reported_before_the_data(
    tmp_path: Path, capsys: pytest.CaptureFixture, download: list[str]
) -> None:
    """No data folder and no model: the model is named at once (no SentEval download first)."""
    model = tmp_path / "outputs" / "mine" / "best"
    argv = ["evaluate", str(model), "--data-dir", str(tmp_path / "no-data"), *download]
    assert main(argv) == 2
    assert error_line(capsys) == f"cselab evaluate: error: {model}: model folder not found"
    assert not (tmp_path / "no-data").exists()


@pytest.mark.parametrize("model", ["outputs/mine/best", "./best", "best/"])
def test_relative_paths_that_cannot_be_hub_names(
    model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["evaluate", model, "--tasks", "STS12", "--no-download"]) == 2
    assert error_line(capsys) == f"cselab evaluate: error: {model}: model folder not found"


def test_model_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\0" * 8)
    assert main(["evaluate", str(weights), "--mteb", "STS12"]) == 2
    assert error_line(capsys) == (
        f"cselab evaluate: error: {weights}: is a file; a model is a folder or a Hugging Face "
        "Hub name"
    )


# ------------------------------------------------------------------------------------ progress
def test_progress_line_per_task_with_time_left(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The time left is the time so far scaled by the weight of the tasks still to run."""
    clock = iter([0.0, 0.0, 10.0, 10.0, 40.0])
    monkeypatch.setattr(api.time, "perf_counter", lambda: next(clock))
    caplog.set_level(logging.INFO, logger="cselab.evaluation.api")
    progress = api.TaskProgress([("STS12", 1.0), ("MR", 3.0)])
    for _ in range(2):
        progress.start()
        progress.end()
    assert [r.getMessage() for r in caplog.records] == [
        "evaluate [1/2] STS12 ...",
        "evaluate [1/2] STS12 done in 10s (10s elapsed, about 30s left)",
        "evaluate [2/2] MR ...",
        "evaluate [2/2] MR done in 30s (40s elapsed)",
    ]
    assert [api._duration(s) for s in (0.4, 59.6, 61, 3599, 3725)] == [
        "0s", "1m00s", "1m01s", "59m59s", "1h02m"
    ]  # fmt: skip


def test_evaluate_prints_progress_unless_quiet(model_folder: Path, tmp_path: Path) -> None:
    files = [sts_file(tmp_path / "a.tsv"), sts_file(tmp_path / "b.tsv")]
    argv = [sys.executable, "-m", "cselab", "evaluate", str(model_folder)]
    for f in files:
        argv += ["--sts-file", str(f)]
    loud = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert loud.returncode == 0, loud.stderr[-2000:]
    lines = [line.split(" INFO ", 1)[-1] for line in loud.stderr.splitlines()]
    starts = [line for line in lines if line.startswith("evaluate [") and line.endswith("...")]
    ends = [line for line in lines if line.startswith("evaluate [") and " done in " in line]
    assert starts == [f"evaluate [1/2] {files[0]} ...", f"evaluate [2/2] {files[1]} ..."]
    assert ends[0].startswith(f"evaluate [1/2] {files[0]} done in ") and "left)" in ends[0]
    assert ends[1].startswith(f"evaluate [2/2] {files[1]} done in ") and "left" not in ends[1]
    quiet = subprocess.run(
        [argv[0], "-m", "cselab", "-q", *argv[3:]], capture_output=True, text=True, timeout=600
    )
    assert quiet.returncode == 0 and "evaluate [" not in quiet.stderr
    assert quiet.stdout == loud.stdout  # the same tables


# -------------------------------------------------------------------------------------- --split
def test_split_needs_mteb(model_folder: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["evaluate", str(model_folder), "--split", "test"]) == 2
    assert error_line(capsys) == (
        "cselab evaluate: error: --split goes with --mteb or --retrieval; the SentEval tasks "
        "choose their split with --mode (test, dev, fasttest)"
    )


@pytest.mark.parametrize(
    ("task", "split", "splits"),
    [("STS12", "dev", "test"), ("SentEvalSTSBenchmark", "train", "dev, test")],
)
def test_split_the_task_does_not_evaluate(
    model_folder: Path, capsys: pytest.CaptureFixture, task: str, split: str, splits: str
) -> None:
    pytest.importorskip("mteb")
    assert main(["evaluate", str(model_folder), "--mteb", task, "--split", split]) == 2
    assert error_line(capsys) == (
        f"cselab evaluate: error: MTEB task {task} has no split {split!r} to evaluate (its "
        f"splits: {splits})"
    )


@needs_senteval
def test_split_test_of_senteval_stsb(
    model_folder: Path, senteval_dir: Path, capsys: pytest.CaptureFixture, one_thread
) -> None:
    """``--mteb SentEvalSTSBenchmark --split test`` scores the STS-B test set: the Spearman
    ``cselab evaluate --tasks STSBenchmark`` gives (test mode), not the dev one."""
    pytest.importorskip("mteb")
    argv = ["-q", "evaluate", str(model_folder), "--mteb", "SentEvalSTSBenchmark",
            "--data-dir", str(senteval_dir), "--split", "test"]  # fmt: skip
    assert main(argv) == 0
    row = [line for line in capsys.readouterr().out.splitlines() if "SentEvalSTSBenchmark" in line]
    assert len(row) == 1 and row[0].startswith("| SentEvalSTSBenchmark | test | default | ")
    score = float(row[0].split("|")[4])
    encoder = load(str(model_folder))
    test = api.evaluate(encoder, "STSBenchmark", "test", senteval_dir, download=False)
    dev = api.evaluate(encoder, "STSBenchmark", "dev", senteval_dir, download=False)
    assert score == pytest.approx(100 * test["results"]["STSBenchmark"]["spearman"], abs=0.006)
    assert abs(score - 100 * dev["results"]["STSBenchmark"]["spearman"]) > 0.1
