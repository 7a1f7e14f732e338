"""Evaluation tasks and the dev set (issue 28, points 1 and 2): ``evaluate(encoder, tasks)`` runs
what ``cselab evaluate`` runs, the task registry holds every kind, and ``eval.dev`` is resolved
once into a frozen ``DevSet`` that model selection carries."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from cselab.cli import main
from cselab.config.devset import DevSet, resolve_dev_set
from cselab.evaluation import api
from cselab.evaluation.custom import DevEvaluator, dev_evaluator
from cselab.evaluation.names import STS_FILE_KIND
from cselab.evaluation.registry import TASK_KINDS, senteval_tasks
from cselab.evaluation.tasks import (
    AlignUniformTask,
    EvalTask,
    RetrievalTask,
    STSFileTask,
    STSTask,
    TransferTask,
)
from cselab.model.encoder import load
from cselab.training.selection import ModelSelection
from test_retrieval import write_beir

PAIRS = [
    ("a man plays a guitar", "a man is playing a guitar", 4.8),
    ("a woman slices an onion", "a person cuts a vegetable", 3.6),
    ("the cat sleeps", "a stock market report", 0.2),
    ("kids play football", "children are playing soccer", 4.5),
    ("a dog runs in the park", "the weather is cold", 0.4),
]


def sts_file(path: Path) -> Path:
    rows = "".join(f"{a}\t{b}\t{s}\n" for a, b, s in PAIRS)
    path.write_text("sentence1\tsentence2\tscore\n" + rows, encoding="utf-8")
    return path


def without_times(out: dict) -> dict:
    """``out`` without what differs between two runs of the same evaluation: times, the date."""
    out = json.loads(json.dumps(out))
    out.pop("date", None)
    out.pop("timing", None)
    for result in out["results"].values():
        result.pop("timing", None)
    return out


def test_every_task_kind_is_registered_and_has_the_interface() -> None:
    assert set(TASK_KINDS) == {
        "sts",
        "align-uniform",
        STS_FILE_KIND,
        "transfer",
        "clustering",
        "retrieval",
        "mteb",
    }
    for kind, cls in TASK_KINDS.items():
        assert cls.kind == kind
        assert dataclasses.is_dataclass(cls)
    tasks = senteval_tasks(["STS12", "STSBenchmark", "MR", "AlignUniform"])
    assert [type(t) for t in tasks] == [STSTask, AlignUniformTask, TransferTask]
    assert tasks[0].senteval_names == ("STS12", "STSBenchmark")
    assert all(isinstance(t, EvalTask) for t in tasks)


def test_evaluate_with_a_task_list_is_what_the_cli_writes(tiny_bert: Path, tmp_path: Path) -> None:
    """An STS file and a BEIR folder at two Matryoshka dimensions: the library call with the
    task list gives the numbers ``cselab evaluate -o`` saves."""
    pairs = sts_file(tmp_path / "pairs.tsv")
    folder = write_beir(tmp_path / "b", split="test")
    saved = tmp_path / "res.json"
    argv = ["evaluate", str(tiny_bert), "--sts-file", str(pairs), "--retrieval", str(folder),
            "--k", "5", "--dims", "8,16", "-o", str(saved)]  # fmt: skip
    assert main(argv) == 0
    encoder = load(str(tiny_bert))
    from cselab.io.readers import read_beir

    out = api.evaluate(
        encoder,
        tasks=[RetrievalTask(read_beir(folder, "test"), "test", 5, (8, 16))],
        sts_files=[pairs],
        model_name=str(tiny_bert),
        dims=[8, 16],
    )
    cli = without_times(json.loads(saved.read_text()))
    lib = without_times(out)
    assert set(cli["results"]) == {"pairs.tsv", "retrieval:b"}
    assert lib["results"] == cli["results"]  # same process, same model: the same numbers
    assert lib["dims"] == cli["dims"] and lib["headline"] == cli["headline"]
    assert cli["results"]["pairs.tsv"]["kind"] == STS_FILE_KIND
    assert set(cli["results"]["retrieval:b"]["dims"]) == {"8", "16"}


def test_two_files_with_one_name_keep_both(tiny_bert: Path, tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    first, second = sts_file(tmp_path / "pairs.tsv"), sts_file(tmp_path / "x" / "pairs.tsv")
    out = api.evaluate(load(str(tiny_bert)), tasks=None, sts_files=[first, second])
    assert list(out["results"]) == ["pairs.tsv", f"pairs.tsv ({second})"]
    assert [type(t) for t in senteval_tasks([], [])] == []
    assert STSFileTask.headline == "sts_files"


def test_the_dev_set_is_resolved_once_into_a_frozen_value(tmp_path: Path) -> None:
    assert resolve_dev_set("none") is None
    stsb = resolve_dev_set("stsb")
    assert stsb == DevSet("stsb", "stsb", "dev", "spearman", "stsb_dev", "stsb")
    with pytest.raises(dataclasses.FrozenInstanceError):
        stsb.metric = "pearson"  # type: ignore[misc]
    pairs = sts_file(tmp_path / "dev.tsv")
    file = resolve_dev_set(str(pairs), "pearson", ["sentence1", "sentence2", "score"])
    assert (file.kind, file.metric, file.score_name, file.label) == (
        STS_FILE_KIND, "pearson", "dev_pearson", str(pairs)
    )  # fmt: skip
    beir = resolve_dev_set(str(write_beir(tmp_path / "beir", split="test")))
    assert (beir.kind, beir.split, beir.metric, beir.score_name) == (
        "retrieval", "test", "ndcg@10", "dev_ndcg@10"
    )  # fmt: skip
    assert beir.label == f"{tmp_path / 'beir'} (test)"


def test_model_selection_carries_the_dev_set(tmp_path: Path) -> None:
    pairs = sts_file(tmp_path / "dev.tsv")
    evaluator = dev_evaluator(str(pairs), "spearman")
    assert isinstance(evaluator, DevEvaluator)
    assert (evaluator.name, evaluator.source) == ("dev_spearman", str(pairs))
    selection = ModelSelection(evaluator, lambda: tmp_path)
    assert (selection.name, selection.source) == ("dev_spearman", str(pairs))
    plain = ModelSelection(lambda encoder: 1.0, lambda: tmp_path)  # a user's own function
    assert isinstance(plain.evaluator, DevEvaluator)
    assert (plain.name, plain.source) == ("stsb_dev", None)
    assert ModelSelection(None, lambda: tmp_path).name == "stsb_dev"
