"""Where two features meet: combinations that must run, or be refused in one line before work.

Each case was found by a review of the merged features (the prompt pooler, ESimCSE's word
repetition, Matryoshka, retrieval evaluation, mining, the compiled step); each test fails on the
code before its fix.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cselab.cli import main


def long_corpus(folder: Path, n: int = 8, words: int = 200) -> Path:
    """Rows longer than the tiny BERT's 128 positions, so every row is cut at max_seq_len."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "long.txt"
    path.write_text("\n".join(" ".join(["alpha", "beta"] * (words // 2)) for _ in range(n)) + "\n")
    return path


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--objective.word_repetition.enabled=true"], "word repetition adds up to 9"),
        (["--model.pooler=prompt"], "after the prompt template's"),
    ],
)
def test_a_row_longer_than_the_positions_is_refused_before_training(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture, extra: list[str], said: str
) -> None:
    """``max_seq_len`` = the model's 128 positions leaves no room for what the step adds to a
    row (ESimCSE's repeated tokens, PromptBERT's template): one line naming the key, not an
    ``IndexError`` in the position embeddings at the first step."""
    rc = main([
        "train", f"--model.name_or_path={tiny_bert}", f"--data.train_file={long_corpus(tmp_path)}",
        f"--data.cache_dir={tmp_path / 'cache'}", f"--train.output_dir={tmp_path / 'out'}",
        "--model.max_seq_len=128", "--train.batch_size=2", "--train.max_steps=1",
        "--train.eval_steps=0", *extra,
    ])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1
    assert "model.max_seq_len=128 is too long" in err and said in err


def test_compiled_training_with_template_denoising_is_refused(tmp_path: Path) -> None:
    from cselab.config import load_config
    from cselab.core.errors import ConfigError

    for asked in ("--train.compile=true", "--train.compile_mode=default"):  # a mode asks too
        with pytest.raises(ConfigError, match="train.compile=true does not support"):
            load_config(None, ["--model.pooler=prompt", asked])
    # the prompt pooler a saved folder records (model.pooler: null): refused by the plan
    from cselab.app.plan import compile_mode

    with pytest.raises(ConfigError, match="train.compile=true does not support"):
        compile_mode(load_config(None, ["--train.compile=true"]), "cpu", pooler="prompt")
    # without denoising the prompt pooler compiles as one graph
    load_config(
        None, ["--model.pooler=prompt", "--train.compile=true", "--model.prompt.denoise=false"]
    )


def test_mine_into_a_folder_holding_an_index_leaves_it_alone(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``cselab mine --index DIR`` on a built index: refused in one line, the index intact
    (it was replaced by the mined corpus, at another width, without a word)."""
    import json

    from conftest import write_corpus

    corpus = write_corpus(tmp_path, n=40)
    index = tmp_path / "idx"
    assert main(["-q", "index", "build", str(corpus), "--model", str(tiny_bert), "-o", str(index),
                 "--dim", "8"]) == 0  # fmt: skip
    before = {p.name: p.read_bytes() for p in index.iterdir() if p.is_file()}
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(
        "".join(json.dumps({"anchor": f"a {i}", "positive": f"p {i} q"}) + "\n" for i in range(6))
    )
    rc = main(["mine", str(pairs), "--model", str(tiny_bert), "-o", str(tmp_path / "t.tsv"),
               "--index", str(index)])  # fmt: skip
    err = [x for x in capsys.readouterr().err.splitlines() if "error" in x]
    assert rc == 2 and len(err) == 1 and "holds an index already" in err[0]
    assert {p.name: p.read_bytes() for p in index.iterdir() if p.is_file()} == before


@pytest.mark.parametrize("option", ["--csv"])
def test_retrieval_with_senteval_only_outputs_is_refused(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture, option: str
) -> None:
    """``--csv`` wrote the retrieval numbers as a Python dict: refused in one line before
    anything is encoded, and the card is left as it was. (``--update-card`` takes retrieval
    results, each collection in its own part of the card: tests/test_newcomer.py.)"""
    from test_retrieval import write_beir

    card = tmp_path / "model" / "README.md"
    card.parent.mkdir()
    card.write_text("# a card\n")
    target = {"--update-card": [], "--csv": [str(tmp_path / "out.csv")]}[option]
    rc = main(["evaluate", str(card.parent), "--retrieval", str(write_beir(tmp_path / "b")),
               "--split", "dev", option, *target])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and f"{option} carries the SentEval" in err
    assert card.read_text() == "# a card\n" and not (tmp_path / "out.csv").exists()


def test_mlflow_takes_a_retrieval_dev_score(tmp_path: Path, monkeypatch) -> None:
    """``eval.dev=<BEIR folder>`` logs ``dev_ndcg@10``; MLflow refuses ``@`` in a metric name,
    so the MLflow logger writes it as ``dev_ndcg_at_10`` (the other loggers keep the name)."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from cselab.training.callbacks import MLflowLogger

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    logger = MLflowLogger(tmp_path, {"eval": {"dev": "beir"}})
    logger.on_evaluate(2, {"dev_ndcg@10": 51.5, "loss": 0.25})
    logger.finish()
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    history = client.get_metric_history(logger.run_id, "dev_ndcg_at_10")
    assert [(m.step, m.value) for m in history] == [(2, 51.5)]


@pytest.mark.parametrize(("pooler", "library"), [("cls", "sentence-transformers"),
                                                 ("prompt", "transformers")])  # fmt: skip
def test_the_card_names_the_library_that_reproduces_the_vectors(pooler: str, library: str) -> None:
    """sentence-transformers has no module for the prompt pooler (it would load the folder as a
    [CLS] pooler and give other vectors), so a prompt model's card does not advertise it."""
    from cselab.model.config import ModelConfig
    from cselab.publish.hub_metadata import front_matter

    data = front_matter("m", ModelConfig(name_or_path="org/base", pooler=pooler), ["simcse"], [])
    assert data.library_name == library
    assert ("sentence-transformers" in data.tags) == (library == "sentence-transformers")


def test_another_pooler_on_a_saved_head_folder_reads_its_own_vector(
    tiny_bert: Path, tmp_path: Path
) -> None:
    """A folder saved with ``cls`` and its head used at inference (``mlp_only_train: false``),
    opened with ``pooler="prompt"``: the [MASK] vector as the prompt pooler gives it, not the
    ``cls`` head applied to it (the head was trained on the [CLS] vector)."""
    import numpy as np
    import torch

    from cselab.model.encoder import SentenceEncoder, load

    torch.manual_seed(0)
    saved = SentenceEncoder.from_pretrained(str(tiny_bert), pooler="cls", mlp_only_train=False)
    saved.save(tmp_path / "cls")
    sentences = ["a cat sat on the mat", "rain"]
    got = load(str(tmp_path / "cls"), pooler="prompt").encode(sentences)
    want = SentenceEncoder.from_pretrained(str(tmp_path / "cls"), pooler="prompt").encode(sentences)
    np.testing.assert_array_equal(got, want)
    again = load(str(tmp_path / "cls"))  # its own pooler keeps its head
    np.testing.assert_array_equal(again.encode(sentences), saved.eval().encode(sentences))
