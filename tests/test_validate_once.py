"""A run config is validated once where it enters (issue 28, point 5): ``cselab train`` reads and
checks the YAML, and the run does not check (nor read the disk for) the same values again;
a config changed after its check, or built in Python, is checked when the run starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from cselab.app import train as run
from cselab.config import Config, load_config
from cselab.objectives.config import ObjectiveConfig


class Started(Exception):
    """Raised where the run builds its objective from the resolved plan: everything before it
    (the config's check, the folder's, ``resolve``) is the entry."""


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, int]:
    seen = {"config": 0, "objective": 0}
    config_validate, objective_validate = Config.validate, ObjectiveConfig.validate

    def config_counted(self: Config) -> Config:
        seen["config"] += 1
        return config_validate(self)

    def objective_counted(self: ObjectiveConfig, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        seen["objective"] += 1
        objective_validate(self, *args, **kwargs)

    def started(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise Started

    monkeypatch.setattr(Config, "validate", config_counted)
    monkeypatch.setattr(ObjectiveConfig, "validate", objective_counted)
    corpus = tmp_path / "corpus.txt"  # the default wiki1m, without a download
    corpus.write_text("a sentence\nanother one\n", encoding="utf-8")
    monkeypatch.setattr(run, "resolve_train_file", lambda *args, **kwargs: str(corpus))
    monkeypatch.setattr(run, "build_objective", started)
    return seen


def test_a_loaded_config_is_checked_once(counts: dict[str, int], tmp_path: Path) -> None:
    config = load_config(None, [f"train.output_dir={tmp_path / 'out'}"])
    with pytest.raises(Started):
        run.train(config)
    assert counts == {"config": 1, "objective": 1}


def test_a_changed_or_python_built_config_is_checked(
    counts: dict[str, int], tmp_path: Path
) -> None:
    config = load_config(None, [f"train.output_dir={tmp_path / 'out'}"])
    config.objective.temperature = -1.0  # changed after its check: refused at the start
    with pytest.raises(Exception, match=r"objective\.temperature must be > 0"):
        run.train(config)
    built = Config()
    built.train.output_dir = str(tmp_path / "built")
    with pytest.raises(Started):
        run.train(built)
    assert counts["config"] == 3
