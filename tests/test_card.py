"""Model cards: front matter read back by huggingface_hub, the run's facts, runnable snippets."""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from huggingface_hub import ModelCard

from conftest import needs_senteval
from cselab.app.train import build_trainer
from cselab.cli import main
from cselab.core.datakind import DataKind
from cselab.data.source import TrainingData
from cselab.model.encoder import SentenceEncoder
from cselab.objectives import ObjectiveConfig, build_objective, objective_papers
from cselab.objectives.config import (
    BarlowTwinsConfig,
    DCLConfig,
    FocalConfig,
    GaussianConfig,
    MixCSEConfig,
    NoiseConfig,
    OffDropoutConfig,
)
from cselab.publish.card import (
    CARD_FILE,
    code_blocks,
    dev_curve,
    update_model_card,
    write_model_card,
)
from test_trainer import tiny_config as trainer_config


def tiny_config(tiny_bert: Path, tmp_path: Path, *extra: str):
    """test_trainer's tiny run, with the dev score every 4 steps (scripted by each test)."""
    return trainer_config(tiny_bert, tmp_path, "--train.eval_steps=4", *extra)


@pytest.fixture(scope="module")
def trained(tiny_bert: Path, tmp_path_factory: pytest.TempPathFactory, one_thread) -> Path:
    """A 12-step run with Focal + DCL; the dev scores are scripted so the best step is 8."""
    tmp = tmp_path_factory.mktemp("card-run")
    config = tiny_config(
        tiny_bert, tmp, "--objective.focal.enabled=true", "--objective.dcl.enabled=true"
    )
    trainer = build_trainer(config)
    scores = iter([10.0, 30.0, 50.0, 40.0])  # steps 0, 4, 8, 12
    trainer.selection.evaluator = lambda encoder: next(scores)
    trainer.train()
    return tmp


def test_card_front_matter_is_the_hub_format(trained: Path) -> None:
    for name, score in (("best", 50.0), ("last", 40.0)):
        card = ModelCard.load(trained / "out" / name / CARD_FILE)
        data = card.data
        assert data.library_name == "sentence-transformers"
        assert data.pipeline_tag == "sentence-similarity"
        assert {"sentence-transformers", "simcse", "focal-infonce", "dcl"} <= set(data.tags)
        assert "mixcse" not in data.tags
        (result,) = data.eval_results
        assert (result.dataset_type, result.dataset_split, result.metric_type) == (
            "stsbenchmark",
            "validation",
            "spearman_cosine",
        )
        assert result.metric_value == score
        assert data.base_model is None  # a local folder is no Hub id
        assert data.license is None  # the tiny base model has no card


def test_card_states_the_run(trained: Path) -> None:
    out = trained / "out"
    text = (out / "best" / CARD_FILE).read_text()
    corpus = trained / "corpus.txt"
    assert hashlib.sha256(corpus.read_bytes()).hexdigest() in text
    assert "| sentences | 200 |" in text
    assert "at step 8" in text and "hardness m = 0.3" in text and "τ_DCL = 5" in text
    # The dev curve is metrics.csv's rows with a dev score, in order.
    with (out / "metrics.csv").open() as fh:
        rows = [r for r in csv.DictReader(fh) if r["stsb_dev"]]
    curve = text.split("## STS-B dev during training")[1].split("##")[0]
    positions = [curve.index(f"\n| {r['step']} |") for r in rows]
    assert positions == sorted(positions) and len(rows) == 4
    assert f"| 8 | {float(rows[2]['loss']):.4f} | 50.00 |" in curve
    # BibTeX: SimCSE, Focal-InfoNCE, ImSimCSE (DCL); no MixCSE or GS-InfoNCE.
    for key in ("gao2021simcse", "hou2023focal", "xu2023imsimcse"):
        assert key in text
    for key in ("zhang2022mixcse", "wu2022smoothed"):
        assert key not in text
    results = json.loads((out / "results.json").read_text())
    # 8 steps in well under a second: no rate that would read as the model's speed
    assert f"| throughput | – ({results['steps']} steps in " in text


def test_dev_curve_thins_to_keep_first_best_last() -> None:
    rows = [{"step": float(s), "stsb_dev": float(s % 37), "loss": 1.0} for s in range(100)]
    points = dev_curve(rows)
    assert len(points) == 20
    steps = [p[0] for p in points]
    assert steps[0] == 0 and steps[-1] == 99 and 36 in steps  # 36 has the best score (36)
    assert steps == sorted(set(steps))


def every_paper() -> dict[str, str]:
    """``{key: BibTeX}`` of every paper: those of an objective with every part switched on."""
    on = {"enabled": True}
    cfg = ObjectiveConfig(
        focal=FocalConfig(**on), gaussian=GaussianConfig(**on), off_dropout=OffDropoutConfig(**on),
        dcl=DCLConfig(**on), barlow_twins=BarlowTwinsConfig(**on), mixcse=MixCSEConfig(**on),
        noise=NoiseConfig(enabled=True, side="positive"),
    )  # fmt: skip
    return {p.key: p.bibtex for p in objective_papers(build_objective(cfg))}


def test_bibtex_entries_are_well_formed() -> None:
    for key, entry in every_paper().items():
        assert entry.count("{") == entry.count("}"), key
        assert entry.startswith("@") and "title" in entry and "year" in entry


@pytest.mark.parametrize(
    ("pooler", "mlp_only_train"),
    [
        ("cls", True),
        ("cls", False),
        ("avg", False),
        ("avg_first_last", False),
        ("last", False),
        ("weighted_mean", False),
    ],
)
def test_usage_snippets_run_and_agree(
    tiny_bert: Path, tmp_path: Path, pooler: str, mlp_only_train: bool, one_thread
) -> None:
    """Each python block of the card runs as written; all three routes give the same vectors."""
    config = tiny_config(
        tiny_bert, tmp_path, f"--model.pooler={pooler}", f"--model.mlp_only_train={mlp_only_train}"
    )
    torch.manual_seed(0)
    encoder = SentenceEncoder.from_config(config.model)
    if encoder.pooler.mlp is not None:  # a head far from the identity, so skipping it would show
        torch.nn.init.normal_(encoder.pooler.mlp.dense.weight, std=1.0)
    folder = tmp_path / "model"
    encoder.save(folder)
    write_model_card(folder, config)
    blocks = code_blocks((folder / CARD_FILE).read_text())
    assert len(blocks) == 3
    spaces = []
    for block in blocks:
        ns: dict = {}
        exec(compile(block, f"{folder}/README.md", "exec"), ns)  # noqa: S102 - the test's point
        spaces.append(ns)
    st = np.asarray(spaces[0]["embeddings"])[:2]
    hf = spaces[1]["vectors"].numpy()[:2]
    cs = spaces[2]["vectors"]
    scale = float(np.abs(st).max())
    tol = 1e3 * np.finfo(np.float32).eps * scale  # same float32 computation, other padding
    np.testing.assert_allclose(hf, st, rtol=0, atol=tol)
    np.testing.assert_allclose(cs, st, rtol=0, atol=tol)


@needs_senteval
def test_evaluate_update_card_adds_tables_once(
    trained: Path, senteval_dir: Path, capsys: pytest.CaptureFixture, fresh_eval_cache
) -> None:
    folder = trained / "out" / "last"
    args = ["evaluate", str(folder), "--tasks", "STSBenchmark", "--mode", "dev"]
    args += ["--data-dir", str(senteval_dir), "--no-download", "-o", str(trained / "ev.json")]
    for _ in range(2):  # a second update replaces the first, it does not add a copy
        assert main([*args, "--update-card"]) == 0
    saved = json.loads((trained / "ev.json").read_text())
    spearman = round(100 * saved["results"]["STSBenchmark"]["spearman"], 2)
    card = ModelCard.load(folder / CARD_FILE)
    by_type = {r.dataset_type: r.metric_value for r in card.data.eval_results}
    # the dev score training wrote (40.0 here) is replaced by the one measured now: one entry
    assert by_type == {"stsbenchmark": spearman}
    assert card.text.count("## Evaluation") == 1
    assert f"{spearman:.2f}" in card.text.split("## Evaluation")[1]
    assert "Not evaluated yet" not in card.text


def test_update_card_needs_a_cselab_folder(tiny_bert: Path) -> None:
    with pytest.raises(FileNotFoundError, match="cselab_config.yaml"):
        update_model_card(tiny_bert, {"results": {}})


def test_update_card_refuses_a_hub_name(capsys: pytest.CaptureFixture) -> None:
    rc = main(["evaluate", "user/not-a-folder", "--update-card", "--no-download"])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--update-card needs a local model folder" in err


def test_license_comes_from_the_base_models_card_on_disk(minilm_path: Path, tmp_path: Path) -> None:
    from cselab.publish.hub_metadata import base_model_license

    # The packaged all-MiniLM-L6-v2 is found by its Hub name, offline.
    expected = ModelCard.load(minilm_path / CARD_FILE).data.license
    assert expected and base_model_license("sentence-transformers/all-MiniLM-L6-v2") == expected
    (tmp_path / CARD_FILE).write_text("---\nlicense: mit\n---\n# a model\n")
    assert base_model_license(str(tmp_path)) == "mit"
    assert base_model_license(str(tmp_path / "nowhere")) is None


def test_card_names_an_own_dev_set_and_the_final_cards_keep_its_score(
    tiny_bert: Path, tmp_path: Path, one_thread
) -> None:
    """Model selection on your own dev file by Pearson: every card names that score (text,
    curve, model-index), and the cards written at the end of training still carry it."""
    from test_eval_custom import PAIRS, write

    dev = write(tmp_path / "mydev.tsv", PAIRS, ("sentence1", "sentence2", "score"))
    config = tiny_config(tiny_bert, tmp_path, f"--eval.dev={dev}", "--eval.dev_metric=pearson")
    results = build_trainer(config).train()
    out = tmp_path / "out"
    with (out / "metrics.csv").open() as fh:
        scores = {int(r["step"]): float(r["dev_pearson"]) for r in csv.DictReader(fh) if r["dev_pearson"]}  # fmt: skip
    assert sorted(scores) == [0, 4, 8, 12]
    for name, step in (("best", results["best_step"]), ("last", results["steps"])):
        card = ModelCard.load(out / name / CARD_FILE)
        (result,) = card.data.eval_results
        assert (result.dataset_type, result.dataset_split, result.metric_type) == (
            "sts-file",
            "validation",
            "pearson_cosine",
        )
        assert result.metric_value == round(scores[step], 2)
        text = card.text
        assert f"Its dev set `mydev.tsv` Pearson (cosine, ×100) is **{scores[step]:.2f}**" in text
        curve = text.split("## Dev set `mydev.tsv` during training")[1].split("##")[0]
        assert "| step | training loss | dev set `mydev.tsv` Pearson ×100 |" in curve
        assert f"| {step} |" in curve
        assert "STS-B" not in text and "Spearman" not in text


def test_card_of_an_stsb_pearson_run_on_pairs(tiny_bert: Path, tmp_path: Path) -> None:
    """STS-B dev by Pearson is named so (card and push commit message); a run on pairs is
    supervised SimCSE, not unsupervised, and counts pairs."""
    from cselab.config import load_config
    from cselab.publish.push import commit_message

    pairs = tmp_path / "pairs.csv"
    pairs.write_text("anchor,positive\na man sings,someone sings\ntwo dogs run,dogs running\n")
    config = load_config(
        None,
        [f"--model.name_or_path={tiny_bert}", f"--data.train_file={pairs}", "--model.pooler=cls",
         f"--train.output_dir={tmp_path / 'out'}", "--eval.dev_metric=pearson"],
    )  # fmt: skip
    folder = tmp_path / "out" / "best"
    folder.mkdir(parents=True)
    data = TrainingData(pairs, DataKind(pairs=True), rows=2)
    write_model_card(folder, config, data=data, selection_score=61.234, step=8)
    card = ModelCard.load(folder / CARD_FILE)
    (result,) = card.data.eval_results
    assert (result.dataset_type, result.metric_type, result.metric_value) == (
        "stsbenchmark",
        "pearson_cosine",
        61.23,
    )
    text = card.text
    assert "Its STS-B dev Pearson (cosine, ×100) is **61.23**." in text
    assert "STS-B dev Spearman" not in text and "STS-B dev" not in commit_message(folder)
    prose = text.split("## Citation")[0].lower()
    assert "unsupervised" not in prose
    assert "by supervised contrastive learning on given sentence pairs" in text
    assert "(supervised SimCSE, Gao et al. 2021, Eq. 5)" in text
    assert "| pairs | 2 |" in text


def test_card_of_a_pairs_run_names_its_columns(tiny_bert: Path, tmp_path: Path) -> None:
    """A pairs run's card says which columns were anchor, positive and hard negatives (it said
    only "pairs 400"), and the precision that ran rather than ``auto``."""
    from cselab.config import load_config

    pairs = tmp_path / "nli.csv"
    pairs.write_text("sent0,sent1,hard_neg\na man sings,someone sings,nobody sings\n")
    config = load_config(
        None,
        [f"--model.name_or_path={tiny_bert}", f"--data.train_file={pairs}", "--model.pooler=cls",
         f"--train.output_dir={tmp_path / 'out'}", "--data.columns.anchor=sent0",
         "--data.columns.positive=sent1", "--data.columns.negative=[hard_neg]",
         "--train.precision=auto"],
    )  # fmt: skip
    folder = tmp_path / "out" / "best"
    folder.mkdir(parents=True)
    data = TrainingData(pairs, DataKind(pairs=True, negatives=1), rows=1)
    write_model_card(folder, config, data=data, results={"precision": "fp32", "steps": 3})
    text = (folder / CARD_FILE).read_text(encoding="utf-8")
    assert "| columns | anchor `sent0`, positive `sent1`, hard negative `hard_neg` |" in text
    assert "| precision | fp32 |" in text


def test_the_card_reads_only_its_own_run_s_plan(
    tiny_bert: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A sentences model placed beside a pairs run's ``plan.json`` gets a sentences card (not
    "supervised ... pairs"), and a plan this version cannot read (an unknown objective key, as
    another cselab version writes) is taken as absent with one warning: ``--update-card``
    works. The plan of the model's own run, its training file given relative, is used."""
    import logging

    from conftest import write_corpus
    from cselab.config import load_config, save_config
    from cselab.config.plan import RunPlan
    from cselab.io.runfolder import RunFolder
    from cselab.publish.folder_plan import run_plan_of

    corpus = write_corpus(tmp_path, 16)
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("anchor,positive,negative\na man sings,someone sings,nobody sings\n")
    run = RunFolder(tmp_path / "out")
    config = load_config(
        None,
        [f"--model.name_or_path={tiny_bert}", f"--data.train_file={corpus}",
         "--model.pooler=cls", f"--train.output_dir={run.path}"],
    )  # fmt: skip
    folder = run.best
    folder.mkdir(parents=True)
    save_config(config, folder / RunFolder.MODEL_CONFIG)
    pairs_plan = RunPlan(
        train_file=str(pairs), kind=DataKind(pairs=True, negatives=1), dev=None, device="cpu",
        precision="fp32", world_size=1, pooler="cls", width=None, matryoshka_dims=(),
        objective=config.objective,
    )  # fmt: skip
    pairs_plan.save(run.path)

    def card_after_warnings() -> tuple[str, list[str]]:
        (folder / CARD_FILE).unlink(missing_ok=True)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="cselab"):
            update_model_card(folder, {"results": {}})
        warned = [r.getMessage() for r in caplog.records if str(run.plan) in r.getMessage()]
        return (folder / CARD_FILE).read_text(encoding="utf-8"), warned

    text, warned = card_after_warnings()
    assert "by unsupervised contrastive learning on raw sentences" in text
    assert "given sentence pairs" not in text and "| pairs |" not in text
    assert len(warned) == 1 and "another run" in warned[0]

    foreign = {**pairs_plan.to_dict(), "train_file": str(corpus), "kind": {"pairs": False}}
    foreign["objective"] = {**foreign["objective"], "a_later_paper": {"enabled": True}}
    run.plan.write_text(json.dumps(foreign), encoding="utf-8")
    text, warned = card_after_warnings()
    assert "by unsupervised contrastive learning on raw sentences" in text
    assert len(warned) == 1 and "a_later_paper" in warned[0]

    # the model's own run, its training file given relative to the run's working directory
    own = pairs_plan.replace(train_file=str(corpus), kind=DataKind(pairs=False))
    own.save(run.path)
    assert run_plan_of(folder, config) == own
    relative = load_config(None, [f"--data.train_file={corpus.parent.name}/{corpus.name}"])
    relative.objective = config.objective
    assert run_plan_of(folder, relative) == own
    assert run_plan_of(folder, load_config(None, ["--data.train_file=other.txt"])) is None


def test_a_best_card_written_during_training_reads_only_the_rows_before_its_step(
    tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog, one_thread
) -> None:
    """The card of a ``best/`` written on the writer's thread reads ``metrics.csv`` while the
    loop appends to it: it shows the rows before its step and its own score, whatever the loop
    wrote meanwhile (here the step-4 card is written only once step 8's row is in the file, and
    an append is in flight: a last line without its end, left out without a warning)."""
    import threading
    import time

    import cselab.training.metrics as metrics_module
    from cselab.training.callbacks import Callback, SavedModel

    cards: dict[int, str] = {}

    class Recorder(Callback):  # runs after the card's callback, on the same thread
        def on_model_save(self, model: SavedModel) -> None:
            if model.model_id and Path(model.model_id).name == "best":  # during training
                cards[model.step] = (model.folder / CARD_FILE).read_text()

    trainer = build_trainer(tiny_config(tiny_bert, tmp_path, "--train.log_steps=1"), [Recorder()])
    scores = iter([10.0, 50.0, 40.0, 30.0])  # steps 0, 4, 8, 12: best/ written at 0 and 4
    trainer.selection.evaluator = lambda encoder: next(scores)
    metrics_csv, real_save, saves = tmp_path / "out" / "metrics.csv", SentenceEncoder.save, []

    def save_slowly(self, path):  # noqa: ANN001, ANN202 - the step-4 best/ waits for step 8
        real_save(self, path)
        saves.append(path)
        deadline = time.monotonic() + 60
        while len(saves) == 2 and time.monotonic() < deadline:
            if any(line.startswith("8,") for line in metrics_csv.read_text().splitlines()):
                break
            time.sleep(0.02)

    real_read = metrics_module.read_text

    def read_during_an_append(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        text = real_read(path, *args, **kwargs)
        on_writer = threading.current_thread().name == "cselab-model"
        return text + "13,0.2" if on_writer and text.endswith("\n") else text

    monkeypatch.setattr(SentenceEncoder, "save", save_slowly)
    monkeypatch.setattr(metrics_module, "read_text", read_during_an_append)
    with caplog.at_level("WARNING"):
        trainer.train()
    assert trainer.selection.best_step == 4 and sorted(cards) == [0, 4]
    assert "8," in metrics_csv.read_text()  # the run did log step 8
    curves = {
        s: c.split("## STS-B dev during training")[1].split("##")[0] for s, c in cards.items()
    }
    assert "| 0 | – | 10.00 |" in curves[0] and "\n| 4 |" not in curves[0]
    assert "| 0 | – | 10.00 |" in curves[4] and "| 4 | – | 50.00 |" in curves[4]
    assert "\n| 8 |" not in curves[4] and "\n| 12 |" not in curves[4]
    assert not [r for r in caplog.records if "no line end" in r.getMessage()]


def test_a_resume_whose_best_folder_is_gone_selects_again(
    tiny_bert: Path, tmp_path: Path, one_thread, caplog: pytest.LogCaptureFixture
) -> None:
    """``best/`` removed before a resume (its card could not be written at the end): model
    selection starts over from the checkpoint's step, said in one warning, and the run ends
    with a ``best/`` and its card."""
    import logging
    import shutil

    from cselab.training.callbacks import Callback

    class Stop(Callback):
        def on_save(self, step: int, folder: Path) -> None:
            if step == 8:
                raise KeyboardInterrupt  # Ctrl-C once the step-8 checkpoint is written

    config = tiny_config(tiny_bert, tmp_path, "--train.save_steps=4")
    first = build_trainer(config, [Stop()])
    scores = iter([10.0, 30.0, 50.0])  # steps 0, 4, 8: the best at 8
    first.selection.evaluator = lambda encoder: next(scores)
    with pytest.raises(KeyboardInterrupt):
        first.train()
    out = tmp_path / "out"
    shutil.rmtree(out / "best")
    resumed = build_trainer(tiny_config(tiny_bert, tmp_path, "--train.save_steps=4",
                                        "--train.resume=true"))  # fmt: skip
    resumed.selection.evaluator = lambda encoder: 40.0  # step 12: below step 8's 50
    with caplog.at_level(logging.WARNING, logger="cselab"):
        results = resumed.train()
    assert results["best_step"] == 12 and (out / "best" / CARD_FILE).is_file()
    assert (
        f"{out / 'best'} is missing (the best model of step 8): model selection starts "
        "over from step 8" in caplog.text
    )
