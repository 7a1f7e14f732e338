"""The kind of the training data is decided once, where the data is opened, and that one value is
what the objective, the task's views, the trainer and the model card receive; what a run records
is what it ran (the resolved precision); the run's assembly refuses a batch the ranks cannot split.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from cselab.app import train as run_module
from cselab.config import ConfigError, DataConfig, load_config
from cselab.core.datakind import DataKind
from cselab.data import shard_bounds
from cselab.data.source import TrainingSource
from cselab.publish.callbacks import ModelCardCallback
from cselab.publish.card import CARD_FILE
from cselab.training import task as task_module
from cselab.training.distributed import DistInfo
from test_trainer import tiny_config

ROWS = 16


def triplets(path: Path) -> Path:
    """``ROWS`` rows with two hard-negative columns."""
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["anchor", "positive", "neg_a", "neg_b"])
        for i in range(ROWS):
            writer.writerow([f"a man plays {i}", f"someone plays {i}", f"no one {i}", f"a cat {i}"])
    return path


def pairs_config(tiny_bert: Path, tmp_path: Path, *extra: str):
    return load_config(
        None,
        [
            f"--model.name_or_path={tiny_bert}",
            "--model.pooler=avg",
            f"--data.train_file={triplets(tmp_path / 'triplets.csv')}",
            "--data.columns.negative=[neg_a, neg_b]",
            f"--data.cache_dir={tmp_path / 'cache'}",
            f"--train.output_dir={tmp_path / 'out'}",
            "--train.batch_size=8",
            "--train.max_steps=2",
            "--train.eval_steps=0",
            "--objective.hard_negative_weight=0.5",
            *extra,
        ],
    )


def test_the_config_has_no_property_that_reads_the_disk() -> None:
    assert not hasattr(DataConfig(), "pairs")
    assert not isinstance(getattr(DataConfig, "pairs", None), property)


def test_the_source_decides_the_kind_from_the_file(tmp_path: Path) -> None:
    path = triplets(tmp_path / "t.csv")
    data = DataConfig(train_file=str(path))
    data.columns.negative = ["neg_a", "neg_b"]
    assert TrainingSource(path, data).kind == DataKind(pairs=True, negatives=2)
    data.columns.negative = []
    assert TrainingSource(path, data).kind == DataKind(pairs=True, negatives=0)
    text = tmp_path / "corpus.txt"
    text.write_text("one sentence\nanother one\n", encoding="utf-8")
    assert TrainingSource(text, DataConfig(train_file=str(text))).kind == DataKind()
    with pytest.raises(ValueError, match="hard negatives need pairs"):
        DataKind(pairs=False, negatives=1)


def test_one_kind_reaches_the_objective_views_trainer_and_card(
    tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_thread
) -> None:
    """The kind is decided by one call of the rule, and the value the source made is the one
    the objective is built for, the trainer and its task hold, every step's views are computed
    for and every model card is written from."""
    config = pairs_config(tiny_bert, tmp_path)
    rule_calls: list[object] = []
    sources: list[TrainingSource] = []
    view_kinds: list[DataKind] = []
    built_for: list[DataKind | None] = []
    card_kinds: list[DataKind] = []

    import cselab.data.source as source_module
    import cselab.publish.card as card_module

    rule = source_module.is_pairs_source

    def counted(*args: object) -> bool:
        rule_calls.append(args)
        return rule(*args)

    monkeypatch.setattr(source_module, "is_pairs_source", counted)
    monkeypatch.setattr(card_module, "is_pairs_source", counted)

    real_init = TrainingSource.__init__

    def init(self: TrainingSource, *args: object) -> None:
        real_init(self, *args)
        sources.append(self)

    monkeypatch.setattr(TrainingSource, "__init__", init)
    real_build = run_module.build_objective
    monkeypatch.setattr(
        run_module, "build_objective", lambda cfg, data=None: built_for.append(data) or real_build(cfg, data)
    )  # fmt: skip
    real_views = task_module.compute_views

    def views(encoder, inputs, names, kind, momentum=None):  # noqa: ANN001, ANN202
        view_kinds.append(kind)
        return real_views(encoder, inputs, names, kind, momentum)

    monkeypatch.setattr(task_module, "compute_views", views)
    real_card = ModelCardCallback.on_model_save
    monkeypatch.setattr(
        ModelCardCallback, "on_model_save",
        lambda self, model: card_kinds.append(self.data.kind) or real_card(self, model),
    )  # fmt: skip

    trainer = run_module.build_trainer(config)
    trainer.train()

    (source,) = sources
    kind = source.kind
    assert kind == DataKind(pairs=True, negatives=2)
    assert len(rule_calls) == 1  # decided once, where the data is opened
    assert built_for == [kind] and built_for[0] is kind
    assert trainer.plan.kind is kind and trainer.task.kind is kind
    assert view_kinds and all(k is kind for k in view_kinds)
    assert len(card_kinds) >= 2 and all(k is kind for k in card_kinds)  # last, best, then final
    text = (tmp_path / "out" / "best" / CARD_FILE).read_text(encoding="utf-8")
    assert f"| pairs | {ROWS} |" in text
    assert "every hard negative of the batch (2 per pair)" in text


def test_results_record_the_precision_that_ran(tiny_bert: Path, tmp_path: Path, one_thread) -> None:
    """``train.precision: auto`` on the CPU trains in fp32: results.json and the card say so."""
    config = tiny_config(tiny_bert, tmp_path, "--train.precision=auto", "--train.device=cpu",
                         "--train.max_steps=2")  # fmt: skip
    results = run_module.build_trainer(config).train()
    saved = json.loads((tmp_path / "out" / "results.json").read_text(encoding="utf-8"))
    assert results["precision"] == saved["precision"] == "fp32"
    hardware = (tmp_path / "out" / "last" / CARD_FILE).read_text(encoding="utf-8")
    hardware = hardware.split("## Hardware and time")[1].split("##")[0]
    assert "| precision | fp32 |" in hardware and "auto" not in hardware


def test_the_batch_must_split_over_the_ranks(
    tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The data layer names no config key (a plain ValueError); the run's assembly refuses the
    config first, naming ``train.batch_size``."""
    with pytest.raises(ValueError, match="cannot be split equally over 3 ranks") as err:
        shard_bounds(8, 0, 3)
    assert not isinstance(err.value, ConfigError)
    monkeypatch.setattr(run_module, "dist_from_env", lambda: DistInfo(0, 3, 0))
    with pytest.raises(ConfigError, match=r"train\.batch_size=8 must be divisible by the 3 ranks"):
        run_module.build_trainer(tiny_config(tiny_bert, tmp_path))
