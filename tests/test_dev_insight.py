"""Alignment and uniformity at every evaluation during training (SimCSE Fig. 2): one encoding of
STS-B dev gives the model-selection score and both numbers, logged to metrics.csv, the callbacks
and results.json."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from conftest import SENTEVAL, needs_senteval, write_corpus
from cselab.app.train import build_trainer
from cselab.config import load_config
from cselab.evaluation import alignment as au
from cselab.evaluation.custom import dev_evaluator
from cselab.evaluation.embed import EmbeddingCache
from cselab.evaluation.sts import stsb_dev_measures, stsb_dev_spearman
from cselab.training.callbacks import Callback
from fakes import HashingEncoder

pytestmark = needs_senteval


def test_one_encoding_gives_the_score_and_the_definitions_of_alignment_and_uniformity() -> None:
    enc = HashingEncoder(dim=48)
    got = stsb_dev_measures(enc, SENTEVAL)
    reference = au.align_uniform(EmbeddingCache(HashingEncoder(dim=48)), SENTEVAL)
    assert got["align"] == pytest.approx(reference["alignment"], rel=1e-12)
    assert got["uniform"] == pytest.approx(reference["uniformity"], rel=1e-12)
    assert got["spearman"] == stsb_dev_spearman(HashingEncoder(dim=48), SENTEVAL)
    calls = enc.calls
    assert calls == 1  # the score and both numbers came from one encoding
    numbers = dev_evaluator("stsb", data_dir=str(SENTEVAL))(HashingEncoder(dim=48))
    assert set(numbers) == {"stsb_dev", "align", "uniform"}
    assert numbers["stsb_dev"] == got["spearman"] and numbers["align"] == got["align"]


class Seen(Callback):
    def __init__(self) -> None:
        self.evaluations: list[tuple[int, dict]] = []

    def on_evaluate(self, step: int, metrics: dict) -> None:
        self.evaluations.append((step, dict(metrics)))


def test_training_logs_alignment_and_uniformity_at_every_evaluation(
    tiny_bert: Path, tmp_path: Path, one_thread
) -> None:
    config = load_config(
        None,
        [
            f"--model.name_or_path={tiny_bert}",
            f"--data.train_file={write_corpus(tmp_path, 48)}",
            f"--data.cache_dir={tmp_path / 'cache'}",
            f"--train.output_dir={tmp_path / 'out'}",
            f"--eval.data_dir={SENTEVAL}",
            "--train.batch_size=8", "--train.max_steps=6", "--train.lr=1e-3",
            "--train.eval_steps=3", "--train.log_steps=2", "--train.report_to=[]",
        ],
    )  # fmt: skip
    seen = Seen()
    results = build_trainer(config, [seen]).train()
    rows = list(csv.DictReader((tmp_path / "out/metrics.csv").open()))
    evaluated = [r for r in rows if r["stsb_dev"]]
    assert [int(r["step"]) for r in evaluated] == [0, 3, 6]
    for row in evaluated:
        assert 0 < float(row["align"]) < 4  # squared distances of unit vectors
        assert -4 <= float(row["uniform"]) <= 0  # log of a mean of exp(-2 d^2), d^2 <= 4
    assert not any(r["align"] for r in rows if not r["stsb_dev"])
    history = results["dev_history"]
    assert [h["step"] for h in history] == [0, 3, 6]
    for h, row in zip(history, evaluated, strict=True):
        assert math.isclose(h["align"], float(row["align"]), rel_tol=1e-12)
        assert math.isclose(h["uniform"], float(row["uniform"]), rel_tol=1e-12)
    assert [(s, set(m)) for s, m in seen.evaluations] == [
        (s, {"stsb_dev", "align", "uniform"}) for s in (0, 3, 6)
    ]
    saved = json.loads((tmp_path / "out/results.json").read_text())
    assert saved["dev_history"] == history
    # The numbers move with training: the trajectory is not a constant.
    assert len({round(h["uniform"], 9) for h in history}) > 1
