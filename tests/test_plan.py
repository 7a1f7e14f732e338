"""The run plan (issue 28, points 4 and 5): what a run resolved once at its entry (data kind, dev
set, device, precision, pooler, width, Matryoshka's prefixes, the objective) is saved in the
run folder, the trainer runs on it, and a card written later from the saved folder reads the data
kind from it instead of deriving it again from the config with a rule of its own."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from backbone_models import make_tiny_decoder, tiny_run_argv
from cselab.app.train import build_trainer
from cselab.config import Config, load_config
from cselab.config.devset import resolve_dev_set
from cselab.config.plan import RunPlan
from cselab.core.datakind import DataKind
from cselab.core.errors import ConfigError
from cselab.core.schema import from_dict
from cselab.io.runfolder import RunFolder
from cselab.objectives.config import ObjectiveConfig
from cselab.publish.card import CARD_FILE, write_model_card

ROWS = 16


def pairs_file(path: Path) -> Path:
    """Pairs with one hard negative in the default ``negative`` column, which the config does
    not name: only opening the file tells that there is one."""
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["anchor", "positive", "negative"])
        for i in range(ROWS):
            writer.writerow([f"a man plays {i}", f"someone plays {i}", f"a cat sleeps {i}"])
    return path


def test_a_run_saves_its_plan_and_runs_on_it(
    tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_thread
) -> None:
    checks: list[object] = []
    validate = ObjectiveConfig.validate

    def counted(self: ObjectiveConfig, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        checks.append(args)
        validate(self, *args, **kwargs)

    monkeypatch.setattr(ObjectiveConfig, "validate", counted)
    data = pairs_file(tmp_path / "pairs.csv")
    out = tmp_path / "out"
    config = load_config(
        None,
        [
            f"--model.name_or_path={tiny_bert}",  # model.pooler: null, BERT's default (cls)
            f"--data.train_file={data}",
            f"--data.cache_dir={tmp_path / 'cache'}",
            f"--train.output_dir={out}",
            "--train.batch_size=8",
            "--train.max_steps=2",
            "--train.eval_steps=0",
            "--train.device=cpu",
            "--train.precision=auto",
            "--objective.matryoshka.dims=[16, 8]",
        ],
    )
    trainer = build_trainer(config)
    assert RunPlan.load(out) is None  # written with config.yaml, when the loop starts
    results = trainer.train()
    plan = RunPlan.load(out)
    assert plan is not None and plan == trainer.plan
    saved = json.loads(RunFolder(out).plan.read_text(encoding="utf-8"))
    assert saved["kind"] == {"pairs": True, "negatives": 1}
    assert plan.kind == DataKind(pairs=True, negatives=1) == trainer.kind
    assert (plan.device, plan.precision, plan.world_size) == ("cpu", "fp32", 1)
    assert plan.pooler == "cls" == config.model.pooler
    hidden = json.loads((tiny_bert / "config.json").read_text(encoding="utf-8"))["hidden_size"]
    assert plan.width == hidden
    assert plan.matryoshka_dims == (16, 8) == trainer.matryoshka_dims
    assert plan.dev == resolve_dev_set("stsb")
    assert plan.train_file == str(data)
    assert plan.objective == config.objective
    assert RunPlan.from_dict(plan.to_dict()) == plan
    assert results["precision"] == plan.precision
    # the objective section is checked where the config enters and once with the data's kind
    # when it is built; the cards of best/ and last/ ask the run's built objective
    assert len(checks) == 2

    # A card written later from the saved folder (as `cselab evaluate --update-card` does)
    # takes the kind from the plan, even once the training file is gone: one hard negative.
    best = RunFolder(out).best
    (best / CARD_FILE).unlink()
    raw = yaml.safe_load((best / RunFolder.MODEL_CONFIG).read_text(encoding="utf-8"))
    saved_config = from_dict(Config, raw).validate()
    data.unlink()

    def derived_again(*args: object, **kwargs: object) -> None:
        raise AssertionError("the card derived a fact of the plan again")

    import cselab.publish.card as card_module
    import cselab.publish.hub_metadata as metadata_module

    monkeypatch.setattr(metadata_module, "resolve_dev_set", derived_again)
    monkeypatch.setattr(card_module, "TrainingSource", derived_again)
    monkeypatch.setattr(card_module, "is_pairs_source", derived_again)
    text = write_model_card(best, saved_config).read_text(encoding="utf-8")
    assert "every hard negative of the batch (1 per pair)" in text
    assert "| pairs |" in text


def test_a_resume_keeps_the_pooler_the_run_trained(tmp_path: Path, one_thread) -> None:
    """A decoder trained with ``model.pooler=last`` (its default is ``avg``) and resumed with
    the pooler left out resumes with ``last``: the checkpoint's value, not today's default,
    in the model, ``config.yaml``, ``plan.json`` and ``last/``; an explicit other pooler is
    still refused, naming the key."""
    llama = make_tiny_decoder(tmp_path / "llama")
    argv = tiny_run_argv(
        llama, tmp_path, "--model.dropout=0.1", "--train.device=cpu", "--train.max_steps=2",
        rows=32,
    )  # fmt: skip
    build_trainer(load_config(None, [*argv, "--model.pooler=last"])).train()
    out = RunFolder(tmp_path / "out")
    trainer = build_trainer(load_config(None, [*argv, "--train.resume=true"]))
    assert trainer.encoder.pooler.kind == "last"
    trainer.train()
    assert RunPlan.load(out.path).pooler == "last"
    assert yaml.safe_load(out.config.read_text(encoding="utf-8"))["model"]["pooler"] == "last"
    saved = json.loads((out.last / "cselab.json").read_text(encoding="utf-8"))
    assert saved["pooler"] == "last"
    with pytest.raises(ConfigError, match=r"model\.pooler: 'last' -> 'avg'"):
        build_trainer(load_config(None, [*argv, "--model.pooler=avg", "--train.resume=true"]))
