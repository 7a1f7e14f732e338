"""The run plan (issue 28, points 4 and 5): what a run resolved once at its entry (data kind, dev
set, device, precision, pooler, width, Matryoshka's prefixes, the objective) is saved in the
run folder, the trainer runs on it, and a card written later from the saved folder reads the data
kind from it instead of deriving it again from the config with a rule of its own."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from backbone_models import make_tiny, make_tiny_decoder, tiny_run_argv
from cselab.app.plan import model_facts, resolve
from cselab.app.train import build_trainer
from cselab.config import Config, load_config
from cselab.config.devset import resolve_dev_set
from cselab.config.plan import RunPlan
from cselab.core.datakind import DataKind
from cselab.core.errors import ConfigError
from cselab.core.schema import from_dict
from cselab.io.files import file_digest
from cselab.io.runfolder import RunFolder
from cselab.objectives.config import ObjectiveConfig
from cselab.publish.card import CARD_FILE, data_of_config, write_model_card
from cselab.training.distributed import DistInfo

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
    assert plan.kind == DataKind(pairs=True, negatives=1) == trainer.plan.kind
    assert (plan.device, plan.precision, plan.world_size) == ("cpu", "fp32", 1)
    assert (plan.eval_batch_size, plan.eval_precision) == (128, "fp32")  # the CPU's
    assert plan.pooler == "cls" and config.model.pooler is None  # the config is never changed
    hidden = json.loads((tiny_bert / "config.json").read_text(encoding="utf-8"))["hidden_size"]
    assert plan.width == hidden
    assert plan.matryoshka_dims == (16, 8) == trainer.plan.matryoshka_dims
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
    import cselab.publish.folder_plan as folder_plan_module

    # with its run's plan, the card resolves nothing (a folder away from its run would)
    monkeypatch.setattr(folder_plan_module, "resolve_dev_set", derived_again)
    monkeypatch.setattr(card_module, "TrainingSource", derived_again)
    monkeypatch.setattr(card_module, "is_pairs_source", derived_again)
    text = write_model_card(best, saved_config).read_text(encoding="utf-8")
    assert "every hard negative of the batch (1 per pair)" in text
    assert "| pairs |" in text
    # a GPU run's dev scores are encoded under its autocast: the card says so by the score
    assert "(cosine, ×100) is **81.50**" in write_model_card(
        best, saved_config, plan=plan, selection_score=81.5, step=2
    ).read_text(encoding="utf-8")
    gpu = plan.replace(eval_precision="bf16")
    text = write_model_card(best, saved_config, plan=gpu, selection_score=81.5, step=2)
    assert "(cosine, ×100, encoded in bf16) is **81.50**" in text.read_text(encoding="utf-8")


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


def test_a_resume_at_the_default_precision_trains_on_in_the_checkpoint_s(
    tiny_bert: Path, tmp_path: Path, one_thread
) -> None:
    """``train.precision: auto`` (the default) on resume is the precision the checkpoint's run
    was given: a run saved with ``bf16`` (or with ``fp32``, the default before ``auto``) resumes
    in it, rather than being refused as a changed key or switched to what ``auto`` resolves to
    here (fp32 on a CPU); an explicit other precision is still refused, naming the key."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"sentence number {i} of the corpus\n" for i in range(32)))
    argv = [
        f"--model.name_or_path={tiny_bert}", f"--data.train_file={corpus}",
        f"--data.cache_dir={tmp_path / 'cache'}", f"--train.output_dir={tmp_path / 'out'}",
        "--train.batch_size=8", "--train.max_steps=2", "--train.eval_steps=0",
        "--train.device=cpu", "--eval.dev=none",
    ]  # fmt: skip
    build_trainer(load_config(None, [*argv, "--train.precision=bf16"])).train()
    trainer = build_trainer(load_config(None, [*argv, "--train.resume=true"]))
    assert trainer.amp_dtype == torch.bfloat16 and trainer.plan.precision == "bf16"
    with pytest.raises(ConfigError, match=r"train\.precision: 'bf16' -> 'fp32'"):
        build_trainer(load_config(None, [*argv, "--train.precision=fp32", "--train.resume=true"]))


def test_the_plan_keeps_the_training_file_absolute(
    tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative ``data.train_file`` is kept absolute: a card written later from another
    working directory hashes the file the run trained on, not a file of the same name there."""
    run_dir, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    for folder, word in ((run_dir, "alpha"), (elsewhere, "beta")):
        (folder / "data").mkdir(parents=True)
        (folder / "data" / "corpus.txt").write_text(f"{word} one\n{word} two\n", encoding="utf-8")
    monkeypatch.chdir(run_dir)
    config = load_config(
        None,
        [f"--model.name_or_path={tiny_bert}", "--data.train_file=data/corpus.txt",
         "--train.device=cpu", "--eval.dev=none"],
    )  # fmt: skip
    plan, _ = resolve(config, config.data.train_file, DistInfo())
    trained = run_dir / "data" / "corpus.txt"
    assert Path(plan.train_file).is_absolute() and Path(plan.train_file).samefile(trained)
    monkeypatch.chdir(elsewhere)
    assert data_of_config(config, plan=plan).sha256 == file_digest(trained)


@pytest.mark.parametrize("device", ["auto", "cuda"])
def test_the_bf16_check_asks_the_rank_s_gpu(
    tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, device: str
) -> None:
    """Rank 1 of 2 asks cuda:1 (its LOCAL_RANK) whether it has bf16, not the current device
    (cuda:0 on every rank until the process group forms), and makes no device current."""
    import torch

    asked: list[torch.device] = []

    def properties(which: torch.device) -> SimpleNamespace:
        asked.append(torch.device(which))
        return SimpleNamespace(major=8)

    def no_current_device(*args: object) -> None:
        raise AssertionError("resolve() asked or set the current CUDA device")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    monkeypatch.setattr(torch.cuda, "current_device", no_current_device)
    monkeypatch.setattr(torch.cuda, "set_device", no_current_device)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("alpha one\nalpha two\n", encoding="utf-8")
    config = load_config(
        None,
        [f"--model.name_or_path={tiny_bert}", f"--data.train_file={corpus}",
         f"--train.device={device}", "--eval.dev=none"],
    )  # fmt: skip
    plan, _ = resolve(config, corpus, DistInfo(rank=1, world_size=2, local_rank=1))
    assert asked == [torch.device("cuda", 1)]
    assert plan.precision == "bf16"


def test_a_resume_in_another_precision_says_so(
    tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture, one_thread,
) -> None:  # fmt: skip
    """A run trained in fp32 (``train.precision: auto`` on the CPU) and resumed where ``auto``
    resolves to bf16 (as on another device) resumes, with one warning naming both precisions
    and ``train.precision`` as this run's plan resolved it."""
    import logging

    import torch

    import cselab.app.plan as plan_module

    argv = tiny_run_argv(
        tiny_bert, tmp_path, "--train.device=cpu", "--train.precision=auto",
        "--train.max_steps=2", rows=32,
    )  # fmt: skip
    build_trainer(load_config(None, argv)).train()
    monkeypatch.setattr(plan_module, "autocast_dtype", lambda *args: torch.bfloat16)
    trainer = build_trainer(load_config(None, [*argv, "--train.resume=true"]))
    with caplog.at_level(logging.WARNING, logger="cselab"):
        trainer.train()
    warned = [r.getMessage() for r in caplog.records if "precision" in r.getMessage()]
    assert len(warned) == 1
    assert "trained in fp32" in warned[0] and "resumes it in bf16" in warned[0]
    assert "train.precision as resolved on cpu" in warned[0]


@pytest.mark.parametrize("family", ["bert", "modernbert", "llama"])
def test_the_plan_s_pooler_and_width_are_those_the_load_resolves(
    family: str, tmp_path: Path
) -> None:
    """``model.pooler: null`` is resolved twice by nature: by the plan from ``config.json``
    (no weights) and by the model's load. Both read the table of backbones, and they agree
    for an encoder, ModernBERT and a decoder (cls, avg, avg), with the width."""
    from cselab.model.encoder import SentenceEncoder

    folder = (
        make_tiny_decoder(tmp_path / family)
        if family == "llama"
        else make_tiny(family, tmp_path / family)
    )
    pooler, width = model_facts(str(folder), None)
    encoder = SentenceEncoder.from_pretrained(str(folder))
    assert (pooler, width) == (encoder.pooler.kind, encoder.dim)
    assert pooler == {"bert": "cls", "modernbert": "avg", "llama": "avg"}[family]


@pytest.mark.parametrize(
    ("device", "argv", "graphs", "eager_default"),
    [
        ("cpu", [], None, None),  # the CPU trains eagerly unless asked
        ("cuda:0", [], "reduce-overhead", None),  # a GPU: the encoder in CUDA graphs
        ("cuda:0", ["--train.compile=false"], None, None),
        ("cuda:0", ["--train.gradient_checkpointing=true"], None, None),  # unmeasured: eager
        ("cuda:0", ["--model.lora.r=8"], None, None),
        ("cuda:0", ["--model.pooler=prompt"], None, None),  # PromptBERT's denoising
        ("cuda:0", ["--train.compile_mode=max-autotune"], "max-autotune", "max-autotune"),
        ("cuda:0", ["--train.compile_mode=reduce-overhead"], "reduce-overhead", "reduce-overhead"),
        ("cuda:0", ["--train.compile=false", "--train.compile_mode=default"], None, None),
        ("cpu", ["--train.compile=true"], "default", "default"),
        ("cuda:0", ["--train.compile=true"], "reduce-overhead", "default"),
        ("cuda:0", ["--train.compile=true", "--train.compile_mode=reduce-overhead"],
         "reduce-overhead", "reduce-overhead"),
        ("cuda:0", ["--train.compile=true", "--model.lora.r=8"], "reduce-overhead", "default"),
    ],
)  # fmt: skip
def test_the_plan_resolves_train_compile_for_the_device(
    device: str,
    argv: list[str],
    graphs: str | None,
    eager_default: str | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``train.compile``/``compile_mode: null``: with CUDA graphs by default
    (``GRAPHS_BY_DEFAULT``), graphs on a GPU where every part of the run was measured through
    them, eager on the CPU; without (today), eager everywhere and ``compile=true`` Inductor's
    default mode, the graphs only when ``compile_mode=reduce-overhead`` asks. An explicit
    value is kept."""
    from cselab.app import plan

    config = load_config(None, argv)
    monkeypatch.setattr(plan, "GRAPHS_BY_DEFAULT", True)
    assert plan.compile_mode(config, device) == graphs
    monkeypatch.setattr(plan, "GRAPHS_BY_DEFAULT", False)
    assert plan.compile_mode(config, device) == eager_default


@pytest.mark.parametrize(
    ("asked", "device", "precision", "dev", "expected"),
    [
        (None, "cpu", "fp32", "stsb", (128, "fp32")),
        (None, "cpu", "bf16", "stsb", (128, "fp32")),  # the CPU's dev vectors are encode()'s
        (None, "cuda:0", "bf16", "stsb", (1024, "bf16")),  # a few large batches, autocast
        (None, "cuda:1", "fp32", "stsb", (1024, "fp32")),
        (32, "cuda:0", "fp16", "stsb", (32, "fp16")),  # an explicit eval.batch_size is kept
        (256, "cpu", "bf16", "stsb", (256, "fp32")),
        (None, "cuda:0", "bf16", "file", (128, "bf16")),  # a file's texts may be long
        (None, "cuda:0", "bf16", "beir", (128, "fp32")),  # encoded through encode()
        (None, "cuda:0", "bf16", "none", (128, "fp32")),
    ],
)
def test_the_plan_resolves_how_the_dev_set_is_encoded(
    asked: int | None,
    device: str,
    precision: str,
    dev: str,
    expected: tuple[int, str],
    tmp_path: Path,
) -> None:
    """``eval.batch_size: null`` is 1024 for STS-B dev on a GPU, else 128; on a GPU the STS
    pairs are encoded in the run's precision, a BEIR folder and anything on the CPU in fp32."""
    from cselab.app.plan import dev_encoding
    from cselab.config.devset import DevSet

    kinds = {"stsb": "stsb", "file": "sts-file", "beir": "retrieval"}
    dev_set = None if dev == "none" else DevSet(kinds[dev], "x", "dev", "spearman", "d", None)
    assert dev_encoding(asked, device, precision, dev_set) == expected


def test_a_resume_keeps_the_dev_encoding_its_scores_were_measured_with() -> None:
    """A run resumed on the same kind of device takes its plan's (``previous``) precision, and
    with ``eval.batch_size: null`` its batch size, that its scores so far were measured with: a
    run begun before the encoding was resolved (128, fp32) is not switched to 1024 and bf16 on
    a GPU. Resumed on the CPU, a GPU run's encoding is the CPU's."""
    from cselab.app.plan import dev_encoding
    from cselab.config.devset import resolve_dev_set

    old = RunPlan.from_dict(
        {k: v for k, v in _plan().to_dict().items() if not k.startswith("eval_")}
    )
    stsb = resolve_dev_set("stsb")
    assert dev_encoding(None, "cuda:0", "bf16", stsb, old) == (128, "fp32")
    assert dev_encoding(64, "cuda:0", "bf16", stsb, old) == (64, "fp32")
    assert dev_encoding(None, "cuda:0", "bf16", stsb) == (1024, "bf16")
    # a GPU run resumed on the CPU: the CPU's encoding, as its training precision is resolved
    assert dev_encoding(None, "cpu", "fp32", stsb, _plan()) == (128, "fp32")
    assert dev_encoding(None, "cuda:1", "bf16", stsb, _plan()) == (1024, "bf16")


def _plan() -> RunPlan:
    return RunPlan(
        "/data/train.txt", DataKind(pairs=False, negatives=0), None, "cuda:0", "bf16", 1,
        "cls", 32, (), ObjectiveConfig(), eval_batch_size=1024, eval_precision="bf16",
    )  # fmt: skip


def test_a_plan_saved_before_the_dev_encoding_was_resolved_loads_with_the_old_one(
    tmp_path: Path,
) -> None:
    """A ``plan.json`` without ``eval_batch_size``/``eval_precision`` (runs of earlier
    versions) reads as the encoding those runs used: batches of 128 in fp32."""
    plan = _plan()
    old = {k: v for k, v in plan.to_dict().items() if not k.startswith("eval_")}
    loaded = RunPlan.from_dict(old)
    assert (loaded.eval_batch_size, loaded.eval_precision) == (128, "fp32")
    assert RunPlan.from_dict(plan.to_dict()) == plan


def test_the_trainer_s_evaluator_encodes_as_its_plan_says(
    tiny_bert: Path, tmp_path: Path, one_thread
) -> None:
    """The run plan's ``eval_batch_size`` (``eval.batch_size=7``) reaches model selection's
    evaluator, which batches the dev sentences at that size."""
    dev = tmp_path / "dev.tsv"
    rows = [f"a man plays {i}\tsomeone plays {i}\t{i % 5}" for i in range(20)]
    dev.write_text("sentence1\tsentence2\tscore\n" + "\n".join(rows) + "\n", encoding="utf-8")
    config = load_config(None, [
        f"--model.name_or_path={tiny_bert}", f"--data.train_file={pairs_file(tmp_path / 'p.csv')}",
        f"--data.cache_dir={tmp_path / 'cache'}", f"--train.output_dir={tmp_path / 'out'}",
        "--train.batch_size=8", "--train.max_steps=2", "--train.eval_steps=2",
        "--train.device=cpu", f"--eval.dev={dev}", "--eval.batch_size=7",
    ])  # fmt: skip
    trainer = build_trainer(config)
    assert (trainer.plan.eval_batch_size, trainer.plan.eval_precision) == (7, "fp32")
    trainer.train()
    scorer = trainer.selection.evaluator._scorer
    assert scorer.batch_size == 7 and scorer.repeated._batches.key[3] == 7
