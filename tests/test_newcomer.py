"""The newcomer's path (issue 31): presets shipped in the package and named by ``cselab train``,
the collection builder as a command, a wheel that carries both, and a failed start that does not
lock its output folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from conftest import REPO, write_corpus
from cselab.cli import main
from cselab.core.errors import UserError
from cselab.training.callbacks import Callback

PYTHON = sys.executable


# ------------------------------------------------------------------------ presets as package data


def test_presets_are_package_data() -> None:
    """importlib.resources finds the presets inside the package, and pyproject's package-data
    globs take every file of the folder (a preset the wheel would leave out fails here)."""
    from importlib import resources

    from cselab.config.presets import packaged_presets, preset_names

    folder = resources.files("cselab") / "presets"
    assert (folder / "simcse-bert-base.yaml").is_file()
    assert (folder / "sweeps" / "focal-vs-simcse.yaml").is_file()
    assert Path(str(folder)) == packaged_presets()
    assert {"simcse-bert-base", "demo-minilm", "promptbert-bert-base"} <= set(
        preset_names(packaged_presets())
    )
    import tomllib

    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["cselab"]
    shipped = {p for g in globs for p in (REPO / "src/cselab").glob(g)}
    every = {p for p in packaged_presets().rglob("*") if p.is_file()}
    assert every <= shipped
    assert not (REPO / "configs").exists()  # one home: the package's presets folder


def test_train_takes_a_preset_name(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cselab train NAME` reads the preset as `cselab config NAME` does: a wrong key given on
    the command line is reported against that preset's config, and an unknown name lists them."""
    assert main(["train", "nosuch-preset"]) == 2
    err = capsys.readouterr().err
    assert "unknown preset or config file 'nosuch-preset'" in err and "simcse-bert-base" in err
    assert main(["train", "configs/simcse-bert-base.yaml"]) == 2  # the old repository path
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            "config file not found: configs/simcse-bert-base.yaml (a preset is named without its "
            "folder: simcse-bert-base)"
        )
    )
    # the preset is read: its train file, relative to the repository root, is not found here
    monkeypatch.chdir(tmp_path)
    args = ["train", "demo-minilm", "--train.max_steps=1", f"--model.name_or_path={tiny_bert}"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "shared/data/wiki/wiki1m_for_simcse.first11914.txt: training file not found" in err


def test_sweep_preset_by_name(
    capsys: pytest.CaptureFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the preset's base is a preset name, found from any folder
    assert main(["sweep", "focal-vs-simcse", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "simcse" in out and "focal" in out


# ----------------------------------------------------------------------------------- the wheel


def _build_and_install(tmp_path: Path) -> Path:
    """Build the wheel from a copy of the source (the checkout stays clean) and unpack it into
    a folder of its own; the dependencies come from this interpreter's site-packages."""
    src = tmp_path / "src-copy"
    shutil.copytree(
        REPO / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    wheels = tmp_path / "wheels"
    pip = [PYTHON, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(src)],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = wheels.glob("cselab-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "cselab/presets/simcse-bert-base.yaml" in names
    assert "cselab/presets/sweeps/focal-vs-simcse.yaml" in names
    assert "cselab/cli/evaluate.py" in names  # the collection builder: `cselab collection`
    site = tmp_path / "site"
    subprocess.run(
        [*pip, "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
        check=True, capture_output=True,
    )  # fmt: skip
    return site


def test_the_wheel_carries_presets_and_the_collection_builder(
    tmp_path: Path, senteval_dir: Path
) -> None:
    pytest.importorskip("setuptools")  # the build backend, used without build isolation (offline)
    site = _build_and_install(tmp_path)
    work = tmp_path / "elsewhere"  # no configs/ folder, no source tree around
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "CSELAB_CONFIGS": ""}

    def cselab(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [PYTHON, "-m", "cselab", *args], cwd=work, env=env, capture_output=True, text=True
        )

    where = subprocess.run(
        [PYTHON, "-c", "import cselab; print(cselab.__file__)"],
        cwd=work, env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert where.startswith(str(site))
    proc = cselab("config", "simcse-bert-base")
    assert proc.returncode == 0, proc.stderr
    values = yaml.safe_load(proc.stdout)
    assert values["model"]["name_or_path"] == "bert-base-uncased"
    assert f"Presets ({site / 'cselab' / 'presets'}): " in " ".join(
        line.removeprefix("#").strip() for line in proc.stdout.splitlines()
    )
    proc = cselab("collection", "beir", "--data-dir", str(senteval_dir), "--no-download")
    assert proc.returncode == 0, proc.stderr
    assert (work / "beir" / "qrels" / "dev.tsv").is_file()


# ------------------------------------------------------------------- a failed start, corrected


def _tiny_run(tiny_bert: Path, tmp_path: Path, out: Path, *extra: str) -> list[str]:
    corpus = write_corpus(tmp_path / "data", 32)
    return ["train", f"--model.name_or_path={tiny_bert}", f"--data.train_file={corpus}",
            f"--data.cache_dir={tmp_path}/cache", "--train.batch_size=8", "--train.max_steps=2",
            "--train.eval_steps=1", "--train.report_to=[]", "--train.device=cpu",
            f"--train.output_dir={out}", *extra]  # fmt: skip


def test_missing_dev_data_names_trains_flag_and_the_retry_runs(
    tiny_bert: Path, tmp_path: Path, senteval_dir: Path, capsys: pytest.CaptureFixture, one_thread
) -> None:
    out = tmp_path / "out"
    empty = tmp_path / "no-senteval"
    empty.mkdir()
    assert main(_tiny_run(tiny_bert, tmp_path, out, f"--eval.data_dir={empty}")) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("cselab train: error: SentEval data missing in")
    assert "pass --eval.data_dir=DIR" in err and "--data-dir" not in err
    assert main(_tiny_run(tiny_bert, tmp_path, out, f"--eval.data_dir={senteval_dir}")) == 0
    assert (out / "results.json").is_file()


class _Crash(Callback):
    """A callback that fails the run at the first evaluation (``at=0``: after the step-0
    evaluation wrote its row and ``best/``) or at the first trained step."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_evaluate(self, step: int, numbers: dict) -> None:
        if step == self.at == 0:
            raise UserError("crashed before the first step")

    def on_step(self, step: int, numbers: dict) -> None:
        if step == self.at:
            raise UserError("crashed after a step")


@pytest.mark.parametrize("crash_at", [0, 1])
def test_a_folder_holds_a_run_once_training_started(
    tiny_bert: Path, tmp_path: Path, senteval_dir: Path, capsys: pytest.CaptureFixture,
    crash_at: int, one_thread,
) -> None:  # fmt: skip
    from cselab.app.train import train
    from cselab.config import load_config

    out = tmp_path / "out"
    args = _tiny_run(tiny_bert, tmp_path, out, f"--eval.data_dir={senteval_dir}")
    with pytest.raises(UserError, match="crashed"):
        train(load_config(None, args[1:]), callbacks=[_Crash(crash_at)])
    assert (out / "config.yaml").is_file() and (out / "best").is_dir()
    code = main(args)
    err = capsys.readouterr().err
    if crash_at == 0:  # no step ran: the corrected command simply runs
        assert code == 0, err
        assert (out / "results.json").is_file()
    else:  # a step ran: the folder holds a run, and is kept
        assert code == 2
        assert "already holds a run (best, config.yaml, plan.json, metrics.csv)" in err


# ------------------------------------------------------------------- the long description, make demo


def test_readme_speaks_to_pip_users() -> None:
    """The README is the wheel's long description: outside its "from a clone" section it asks
    for no `make` target, no bench/ script and no configs/ file; its Install names the extras
    that pyproject defines."""
    import tomllib

    text = (REPO / "README.md").read_text()
    # The first lines: the two commands of a fresh clone (the project's rule), said to be so.
    first_block, _, text = text.partition("```bash\n")[2].partition("```\n")
    assert [line.split()[:2] for line in first_block.splitlines()] == [
        ["make", "demo"], ["make", "test"],
    ]  # fmt: skip
    assert all("from a clone" in line for line in first_block.splitlines())
    pip_part, _, clone_part = text.partition("## Develop (from a clone)")
    assert clone_part and "make demo" in clone_part
    for needle in ("make demo", "make test", "bench/", "configs/", "make setup`"):
        assert needle not in pip_part.replace("`make setup` does both", ""), needle
    install = pip_part.split("## Install", 1)[1].split("\n## ", 1)[0]
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for extra in set(extras) - {"dev"}:
        assert f"`{extra}`" in install, extra
    assert "without AVX-512" not in text


def test_make_demo_runs_twice(
    tiny_bert: Path, tmp_path: Path, senteval_dir: Path, capsys: pytest.CaptureFixture, one_thread
) -> None:
    """The Makefile's demo command, on a tiny model, twice in one folder: both runs train."""
    import re

    makefile = (REPO / "Makefile").read_text()
    args = dict(re.findall(r"^(\w+) :?= ?(.*)$", makefile, re.M))
    recipe = makefile.split("\ndemo: setup\n", 1)[1].splitlines()[0].strip()
    argv = recipe.replace("$(BIN)/cselab ", "").replace("$(DEMO_ARGS)", args["DEMO_ARGS"]).split()
    assert argv[:2] == ["train", "demo-minilm"]
    tiny = _tiny_run(tiny_bert, tmp_path, tmp_path / "demo", f"--eval.data_dir={senteval_dir}")
    for _ in range(2):
        assert main([*argv, *tiny[1:]]) == 0, capsys.readouterr().err
        assert (tmp_path / "demo" / "results.json").is_file()


# ------------------------------------------------------------------------ report_to's default


@pytest.mark.parametrize("installed", [False, True])
def test_report_to_defaults_to_the_installed_loggers(
    tiny_bert: Path, tmp_path: Path, senteval_dir: Path, installed: bool
) -> None:
    """A plain install (no tensorboard) trains without a logger warning; with tensorboard
    installed the default logs to it."""
    out = tmp_path / "out"
    args = [a for a in _tiny_run(tiny_bert, tmp_path, out, f"--eval.data_dir={senteval_dir}")
            if not a.startswith("--train.report_to")]  # fmt: skip
    block = "" if installed else "sys.modules['tensorboard'] = None; "
    code = f"import sys; {block}from cselab.cli import main; sys.exit(main({args!r}))"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "not installed" not in proc.stderr and "WARNING" not in proc.stderr, proc.stderr
    assert (out / "tensorboard").is_dir() == installed


def test_card_says_what_the_pooler_is() -> None:
    """A cls + MLP model trained with mlp_only_train: the card says the head served training
    only, not "pooling `cls_before_pooler`, as trained"."""
    from cselab.model.config import ModelConfig
    from cselab.publish.usage import usage_snippets

    text = usage_snippets("m", ModelConfig(pooler="cls", mlp_only_train=True))
    assert "`cls_before_pooler`, as trained" not in text
    assert "trained with pooler `cls`, whose MLP head was used in training only" in text
    text = usage_snippets("m", ModelConfig(pooler="cls", mlp_only_train=False))
    assert "the [CLS] vector through an MLP head, pooling `cls`, as trained" in text


# ---------------------------------------------------- the Matryoshka table at the end of a run


def test_matryoshka_table_encodes_once_logs_and_counts_in_the_wall_time(
    tiny_bert: Path, tmp_path: Path, senteval_dir: Path, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch, one_thread,
) -> None:  # fmt: skip
    """The real STS-B dev evaluator at the end of a Matryoshka run: the selected model encodes
    the dev sentences once for all dimensions, each dimension's score is logged, and the
    time it takes is inside results.json's wall time."""
    import logging
    import time

    from cselab.app.train import build_trainer
    from cselab.config import load_config
    from cselab.model.sentence_encoder import SentenceEncoder

    out = tmp_path / "out"
    args = _tiny_run(tiny_bert, tmp_path, out, f"--eval.data_dir={senteval_dir}",
                     "--objective.matryoshka.dims=[16,8]")  # fmt: skip
    trainer = build_trainer(load_config(None, args[1:]))
    calls: list[int] = []
    done = [0.0]
    real_encode = SentenceEncoder.encode
    evaluator = trainer.selection.evaluator

    def counted(self, sentences, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        calls.append(len(sentences))
        return real_encode(self, sentences, *a, **k)

    import cselab.model.inference as inference

    real_batches = inference.encode_batches

    def counted_batches(encoder, batches, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        calls.append(len(batches.order))  # the dev set, tokenised once, encoded again
        return real_batches(encoder, batches, *a, **k)

    def slow_at_the_end(view):  # noqa: ANN001, ANN202
        score = evaluator(view)
        if trainer.step == trainer.loop.total_steps:  # the table: make its time visible
            time.sleep(0.3)
            done[0] = time.perf_counter()
        return score

    trainer.selection.evaluator = slow_at_the_end
    slow_at_the_end.name = evaluator.name
    before = len(calls)
    monkeypatch.setattr(SentenceEncoder, "encode", counted)
    monkeypatch.setattr(inference, "encode_batches", counted_batches)
    with caplog.at_level(logging.INFO, logger="cselab"):
        results = trainer.train()
    table = [r["dim"] for r in results["dev_at_dims"]]
    assert table == [32, 16, 8]
    evaluations = 1 + 2  # step 0, 1 and 2 (eval_steps=1)
    assert len(calls) - before == evaluations + 1  # one encoding for the whole table
    for dim in (32, 16, 8):
        assert any(f"dimension {dim} (" in r.getMessage() for r in caplog.records), dim
    assert results["wall_time_s"] >= round(done[0] - trainer._t0, 2) - 0.01


# --------------------------------------------------------------- a search model's card, end to end


def test_search_model_card_has_search_results_mining_and_intended_use(
    tiny_bert: Path, tmp_path: Path, senteval_dir: Path, capsys: pytest.CaptureFixture, one_thread
) -> None:
    """mine -> train on the triplets -> evaluate --retrieval --update-card: the card carries a
    model-index entry per collection, how the negatives were mined and the intended use; a
    later SentEval --update-card keeps the retrieval part."""
    from huggingface_hub import ModelCard

    pairs = tmp_path / "pairs.tsv"
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    rows = [f"{a} {b} one\t{a} {b} two" for a in words for b in words if a != b]
    pairs.write_text("anchor\tpositive\n" + "\n".join(rows) + "\n")
    triplets = tmp_path / "triplets.tsv"
    assert main(["mine", str(pairs), "--model", str(tiny_bert), "-o", str(triplets)]) == 0
    out = tmp_path / "out"
    args = [a for a in _tiny_run(tiny_bert, tmp_path, out, f"--eval.data_dir={senteval_dir}")
            if not a.startswith("--data.train_file")]  # fmt: skip
    assert main([*args, f"--data.train_file={triplets}"]) == 0
    beir = tmp_path / "beir"
    assert main(["collection", str(beir), "--data-dir", str(senteval_dir), "--no-download"]) == 0
    best = str(out / "best")
    code = main(["evaluate", best, "--retrieval", str(beir), "--split", "dev", "--update-card"])
    assert code == 0, capsys.readouterr().err
    card = ModelCard.load(out / "best" / "README.md")
    entries = [r for r in card.data.eval_results if r.task_type == "retrieval"]
    assert {r.dataset_type for r in entries} == {"beir"}
    assert {r.metric_type for r in entries} >= {"ndcg_at_10", "mrr_at_10", "map_at_100"}
    assert all(r.dataset_split == "validation" for r in entries)
    text = card.text
    assert "| hard negatives | mined by `cselab mine` with `" in text
    assert "3 per anchor" in text and "top sampling" in text
    assert "## Intended use\n\nSemantic search (trained on pairs with hard negatives)" in text
    assert "Retrieval: " in text and "ndcg@10" in text.split("## Evaluation")[1].lower()
    assert main(["evaluate", best, "--tasks", "STSBenchmark", "--data-dir", str(senteval_dir),
                 "--no-download", "--update-card"]) == 0  # fmt: skip
    card = ModelCard.load(out / "best" / "README.md")
    evaluation = card.text.split("## Evaluation")[1]
    assert "Retrieval: " in evaluation and "STS-B" in evaluation
    assert {r.dataset_type for r in card.data.eval_results} >= {"beir", "stsbenchmark"}


# ----------------------------------------------------------------------------------------- plots


def _metrics(folder: Path, rows: list[dict]) -> Path:
    import csv

    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "metrics.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        writer.writeheader()
        writer.writerows(rows)
    return folder


def test_compare_plot_draws_only_the_tasks_that_ran(
    tiny_bert: Path, tmp_path: Path, senteval_dir: Path, one_thread
) -> None:
    """`cselab evaluate --tasks STSBenchmark` twice, then `compare --plot`: one slot (STS-B), no
    empty STS12-16 or Avg slots that read as zeros."""
    import json

    from cselab.insight.plots import plot_task_scores

    files = []
    for pooler in ("avg", "cls_before_pooler"):
        out = tmp_path / f"{pooler}.json"
        assert main(["evaluate", str(tiny_bert), "--tasks", "STSBenchmark", "--pooler", pooler,
                     "--data-dir", str(senteval_dir), "--no-download", "-o", str(out)]) == 0  # fmt: skip
        files.append(str(out))
    assert main(["compare", *files, "--plot", str(tmp_path / "bars.png")]) == 0
    (ax,) = plot_task_scores([json.loads(Path(f).read_text()) for f in files], ["a", "b"]).axes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["STS-B"]
    assert len(ax.patches) == 2


def test_plot_labels_sweep_cells_and_shows_equal_schedules_and_each_metric(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Sweep cells (simcse/seed1, focal/seed1, ...) are named by configuration and seed, not
    `seed1, seed1`; two runs with the same lr schedule both show; a dev axis shared by STS-B
    Spearman and nDCG@10 names both."""
    import json

    from cselab.insight.plots import plot_runs, read_run, run_labels

    runs = []
    for config, score in (("simcse", "stsb_dev"), ("focal", "dev_ndcg@10")):
        rows = [{"step": s, "loss": 1.0 / s, "lr": 1e-3 * (1 - s / 8), score: 50.0 + s}
                for s in (2, 4, 6, 8)]  # fmt: skip
        cell = _metrics(tmp_path / "runs" / config / "seed1", rows)
        (cell / "cell.json").write_text(json.dumps({"config": config, "seed": 1}))
        runs.append(str(cell))
    png = tmp_path / "curves.png"
    assert main(["plot", *runs, "-o", str(png)]) == 0, capsys.readouterr().err
    labels = run_labels(runs)
    assert labels == ["simcse seed1", "focal seed1"]
    ax_loss, ax_lr, ax_dev = plot_runs(
        [read_run(r, n) for r, n in zip(runs, labels, strict=True)]
    ).axes
    lr_legend = [t.get_text() for t in ax_lr.get_legend().get_texts()]
    assert lr_legend == ["simcse seed1", "focal seed1 (same as simcse seed1)"]
    assert ax_lr.lines[0].get_linestyle() != ax_lr.lines[1].get_linestyle()
    assert ax_dev.get_ylabel() == "STS-B dev Spearman, dev nDCG@10 x 100"
    dev_legend = [t.get_text() for t in ax_dev.get_legend().get_texts()]
    assert dev_legend == ["simcse seed1 (STS-B dev Spearman)", "focal seed1 (dev nDCG@10)"]
    # plain runs of the same folder name: labelled by the config keys that differ
    plain = []
    for lr in ("1e-3", "3e-5"):
        folder = _metrics(tmp_path / f"lr{lr}" / "out", [{"step": 1, "loss": 1.0, "lr": 1.0}])
        (folder / "config.yaml").write_text(f"train:\n  lr: {lr}\n  output_dir: {folder}\n")
        plain.append(str(folder))
    assert run_labels(plain) == ["train.lr=0.001", "train.lr=3e-05"]  # numbers, as YAML 1.2


# ----------------------------------------------------------------------------------------- small


def test_report_help_prints_one_percent_sign(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "95% CI" in out and "%%" not in out


def test_encode_dim_too_wide_is_refused_before_the_model_loads(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cselab.model.sentence_encoder import SentenceEncoder

    loads: list[str] = []
    real = SentenceEncoder.from_pretrained.__func__

    def counted(cls, path, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        loads.append(str(path))
        return real(cls, path, *a, **k)

    monkeypatch.setattr(SentenceEncoder, "from_pretrained", classmethod(counted))
    text = tmp_path / "in.txt"
    text.write_text("a sentence\n")
    args = ["encode", str(tiny_bert), "--input", str(text), "--output", str(tmp_path / "v")]
    assert main([*args, "--dim", "500"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "cselab encode: error: --dim 500 is outside 1..32 (the vectors' width)"
    assert loads == []
    assert main([*args, "--dim", "16"]) == 0 and len(loads) == 1


def test_faiss_backends_are_refused_before_encoding_without_faiss(
    tiny_bert: Path, tmp_path: Path
) -> None:
    """Without FAISS, `index build --backend hnsw`, `evaluate --retrieval --backend hnsw` and
    `mine --backend hnsw` stop before any encoding, naming the extra."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line {i}\n" for i in range(50)))
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("anchor\tpositive\n" + "".join(f"a {i}\tb {i}\n" for i in range(20)))
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text('{"_id": "d1", "title": "", "text": "x"}\n')
    (beir / "queries.jsonl").write_text('{"_id": "q1", "text": "y"}\n')
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    commands = [
        ["index", "build", str(corpus), "--model", str(tiny_bert), "-o", str(tmp_path / "i"),
         "--backend", "hnsw"],
        ["evaluate", str(tiny_bert), "--retrieval", str(beir), "--backend", "hnsw"],
        ["mine", str(pairs), "--model", str(tiny_bert), "-o", str(tmp_path / "t.tsv"),
         "--backend", "hnsw"],
    ]  # fmt: skip
    code = (
        "import sys; sys.modules['faiss'] = None\n"
        "from cselab.model.sentence_encoder import SentenceEncoder\n"
        "def no(*a, **k): raise SystemExit('encoded before refusing')\n"
        "SentenceEncoder.encode = no\n"
        "from cselab.cli import main\n"
        "sys.exit(main(sys.argv[1:]))"
    )
    for args in commands:
        proc = subprocess.run([PYTHON, "-c", code, *args], capture_output=True, text=True)
        last = proc.stderr.strip().splitlines()[-1]
        assert proc.returncode == 2, (args[0], proc.stderr[-500:])
        assert last.endswith("this backend needs FAISS: pip install 'cselab[faiss]' (faiss-cpu)")


def test_card_throughput_is_a_measured_rate_in_the_data_unit() -> None:
    from cselab.publish.hardware import throughput

    assert throughput({"sentences_per_s": 1.2, "train_time_s": 3.0, "steps": 4}) == (
        "– (4 steps in 3.0 s: too short to measure a rate)"
    )
    long_run = {"sentences_per_s": 812.4, "train_time_s": 120.0, "steps": 500}
    assert throughput(long_run, "pairs") == "812 pairs/s"
    assert throughput({**long_run, "sentences_per_s": 12.345}) == "12.3 sentences/s"
