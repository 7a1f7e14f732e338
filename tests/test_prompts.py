"""Users' prompts (docs/prompts.md): in training's token ids and cache key, left out of the
pooling, saved in the folder for sentence-transformers, in evaluation, MTEB and mining."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from backbone_models import make_tiny
from conftest import GREEK, make_tiny_bert
from cselab.core.errors import ConfigError
from cselab.core.prompts import exclude_prompt, prompt_length
from cselab.model.encoder import SentenceEncoder, load
from cselab.model.pooling import Pooler
from test_retrieval import write_beir

SENTENCES = ["alpha beta gamma delta", "epsilon", "zeta eta theta iota kappa lambda", "mu nu"]
PROMPTS = {"query": "query: ", "document": "passage: "}


@pytest.fixture(scope="module")
def bert64(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random BERT in float64 (comparisons at float64 rounding)."""
    return make_tiny_bert(tmp_path_factory.mktemp("bert64"), dtype=torch.float64)


def _pairs_file(folder: Path, rows: int = 24) -> Path:
    lines = ["anchor\tpositive\tnegative"]
    for i in range(rows):
        a = " ".join(GREEK[(i + j) % len(GREEK)] for j in range(2 + i % 3))
        p = " ".join(GREEK[(i * 3 + j) % len(GREEK)] for j in range(3))
        n = " ".join(GREEK[(i * 7 + j) % len(GREEK)] for j in range(4))
        lines.append(f"{a}\t{p}\t{n}")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "pairs.tsv"
    path.write_text("\n".join(lines) + "\n")
    return path


# ------------------------------------------------------------------------- training's token ids
def test_prompts_reach_the_token_ids_and_the_cache_key(tiny_bert: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from cselab.data.cache import tokenize_corpus, tokenize_pairs

    tok = AutoTokenizer.from_pretrained(str(tiny_bert))
    path = _pairs_file(tmp_path)
    rows = [line.split("\t") for line in path.read_text().splitlines()[1:]]
    prompts = {"anchor": "query: ", "positive": "passage: ", "negative": "passage: "}
    cache = tmp_path / "cache"
    plain, _ = tokenize_pairs(path, tok, 32, cache_dir=cache)
    prompted, _ = tokenize_pairs(path, tok, 32, cache_dir=cache, prompts=prompts)
    in_memory, _ = tokenize_pairs(path, tok, 32, prompts=prompts)
    for store in (prompted, in_memory):
        for i, (a, p, n) in enumerate(rows):
            assert list(store.anchors.rows([i])[0]) == tok("query: " + a)["input_ids"]
            assert list(store.positives.rows([i])[0]) == tok("passage: " + p)["input_ids"]
            assert list(store.negatives[0].rows([i])[0]) == tok("passage: " + n)["input_ids"]
    assert list(plain.anchors.rows([0])[0]) == tok(rows[0][0])["input_ids"]
    # two entries: the prompts are part of the key; the same prompts find theirs again
    entries = sorted(p.name for p in cache.glob("tokens-*"))
    assert len(entries) == 2
    meta = [json.loads((cache / e / "meta.json").read_text())["tokenizer"] for e in entries]
    assert sorted(str(m.get("prompts")) for m in meta) == sorted([str(prompts), "None"])
    again, _ = tokenize_pairs(path, tok, 32, cache_dir=cache, prompts=prompts)
    assert sorted(p.name for p in cache.glob("tokens-*")) == entries
    assert list(again.anchors.rows([0])[0]) == tok("query: " + rows[0][0])["input_ids"]
    # a sentence corpus: one prompt before every line
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("alpha beta\ngamma\n")
    store, _ = tokenize_corpus(corpus, tok, 32, cache_dir=cache, prompt="query: ")
    assert list(store.rows([1])[0]) == tok("query: gamma")["input_ids"]
    assert len(list(cache.glob("tokens-*"))) == 3


def test_training_batches_carry_the_pool_mask(tiny_bert: Path, tmp_path: Path) -> None:
    """With ``pool_prompt=False`` every column's batch leaves its prompt's tokens out (a
    column without a prompt pools all of its tokens)."""
    from transformers import AutoTokenizer

    from cselab.data.config import DataConfig
    from cselab.data.source import TrainingSource

    tok = AutoTokenizer.from_pretrained(str(tiny_bert))
    data = DataConfig(train_file=str(_pairs_file(tmp_path)), prompts={"anchor": "query: "})
    store, _ = TrainingSource(data.train_file, data).tokenize(tok, 32, pool_prompt=False)
    step = store.step_inputs([0, 5, 9], tok.pad_token_id)
    p = prompt_length(tok, "query: ")
    assert p == 3  # [CLS] query :
    mask = step.anchors["attention_mask"]
    want = mask.clone()
    want[:, :p] = 0
    assert torch.equal(step.anchors["pool_mask"], want)
    assert torch.equal(step.positives["pool_mask"], step.positives["attention_mask"])
    assert torch.equal(step.negatives["pool_mask"], step.negatives["attention_mask"])
    pooled, _ = TrainingSource(data.train_file, data).tokenize(tok, 32)
    assert "pool_mask" not in pooled.step_inputs([0], tok.pad_token_id).anchors


def test_a_run_trains_with_prompts_and_saves_them(tiny_bert: Path, tmp_path: Path) -> None:
    from cselab.app.train import train
    from cselab.config import load_config

    config = load_config(None, [
        f"--model.name_or_path={tiny_bert}", "--model.pooler=avg", "--model.pool_prompt=false",
        f"--data.train_file={_pairs_file(tmp_path)}", f"--data.cache_dir={tmp_path / 'cache'}",
        f"--train.output_dir={tmp_path / 'out'}", "--train.batch_size=8", "--train.max_steps=2",
        "--train.eval_steps=0", "--train.report_to=[]",
        "--data.prompts={anchor: 'query: ', positive: 'passage: ', negative: 'passage: '}",
    ])  # fmt: skip
    train(config)
    folder = tmp_path / "out" / "best"
    saved = json.loads((folder / "config_sentence_transformers.json").read_text())
    assert saved["prompts"] == PROMPTS and saved["default_prompt_name"] is None
    assert json.loads((folder / "1_Pooling" / "config.json").read_text())["include_prompt"] is False
    model = load(str(folder))
    assert model.prompts == PROMPTS and not model.pooler.include_prompt
    card = (folder / "README.md").read_text()
    assert "### Prompts" in card and "prompt_name='query'" in card
    # WordPiece counts a prompt alike alone and in a row: nothing differs in sentence-transformers
    assert "prompt_counts" not in json.loads((folder / "cselab.json").read_text())
    assert "differ from the trained model's" not in card


def test_a_model_card_says_which_prompts_sentence_transformers_counts_differently(
    tmp_path: Path,
) -> None:
    """A decoder with a byte-level BPE tokenizer trained with its prompts left out of the
    pooling: ``cselab.json`` records each prompt's two counts, and the card's prompt section
    says that sentence-transformers' vectors with them differ, and how to get the model's."""
    from cselab.app.train import train
    from cselab.config import load_config

    config = load_config(None, [
        f"--model.name_or_path={_bpe_llama(tmp_path)}", "--model.pooler=avg",
        "--model.pool_prompt=false", f"--data.train_file={_pairs_file(tmp_path)}",
        f"--data.cache_dir={tmp_path / 'cache'}", f"--train.output_dir={tmp_path / 'out'}",
        "--train.batch_size=8", "--train.max_steps=1", "--train.eval_steps=0",
        "--train.report_to=[]",
        "--data.prompts={anchor: 'query: ', positive: 'passage: ', negative: 'passage: '}",
    ])  # fmt: skip
    train(config)
    folder = tmp_path / "out" / "best"
    counts = json.loads((folder / "cselab.json").read_text())["prompt_counts"]
    assert set(counts) == set(PROMPTS)
    assert all(c["sentence_transformers"] == c["cselab"] + 1 for c in counts.values()), counts
    card = (folder / "README.md").read_text()
    prompts = card.split("### Prompts")[1]
    assert "**Its vectors with these prompts differ from the trained model's**" in prompts
    for name, c in counts.items():
        want = f"`{name}` as {c['sentence_transformers']} tokens where the model was trained with"
        assert want in prompts


# ------------------------------------------------------------------------------------- pooling
def _masks(padding: str) -> torch.Tensor:
    lengths = [7, 4, 9, 5]
    mask = torch.zeros(len(lengths), 10, dtype=torch.long)
    for i, n in enumerate(lengths):
        if padding == "right":
            mask[i, :n] = 1
        else:
            mask[i, 10 - n :] = 1
    return mask


def _reference(kind: str, hidden: torch.Tensor, mask: torch.Tensor, p: int) -> torch.Tensor:
    """The poolers written from their definitions, a row and a token at a time: the row's real
    tokens numbered 1..n from the first, the first ``p`` of them the prompt's."""
    out = []
    for row in range(hidden.shape[0]):
        columns = [c for c in range(hidden.shape[1]) if mask[row, c]]
        kept = [(i + 1, c) for i, c in enumerate(columns) if i >= p]
        if kind == "avg":
            out.append(sum(hidden[row, c] for _, c in kept) / len(kept))
        elif kind == "weighted_mean":  # SGPT's weights i / sum(i), i the position among real
            total = sum(i for i, _ in kept)
            out.append(sum(i / total * hidden[row, c] for i, c in kept))
        else:  # last: the last real token (never the prompt's: the text follows it)
            out.append(hidden[row, columns[-1]])
    return torch.stack(out)


@pytest.mark.parametrize("padding", ["right", "left"])
@pytest.mark.parametrize("kind", ["avg", "weighted_mean", "last"])
def test_pooling_without_the_prompt_equals_its_definition(kind: str, padding: str) -> None:
    torch.manual_seed(0)
    hidden = torch.randn(4, 10, 6, dtype=torch.float64)
    mask = _masks(padding)
    pooler = Pooler(kind, 6, False, include_prompt=False)
    for p in (0, 2, 3):
        got = pooler(hidden, mask, pool_mask=exclude_prompt(mask, p))
        torch.testing.assert_close(got, _reference(kind, hidden, mask, p), rtol=0, atol=1e-12)
    # per-row lengths, as a tensor
    lengths = torch.tensor([1, 2, 3, 0])
    got = pooler(hidden, mask, pool_mask=exclude_prompt(mask, lengths))
    for row, p in enumerate(lengths.tolist()):
        want = _reference(kind, hidden[row : row + 1], mask[row : row + 1], p)
        torch.testing.assert_close(got[row : row + 1], want, rtol=0, atol=1e-12)
    if kind != "last":  # the prompt's tokens did count before
        assert not torch.allclose(pooler(hidden, mask), got)


@pytest.mark.parametrize("padding", ["right", "left"])
@pytest.mark.parametrize(
    ("kind", "mode"), [("avg", "mean"), ("weighted_mean", "weightedmean"), ("last", "lasttoken")]
)
def test_pooling_without_the_prompt_equals_sentence_transformers(
    kind: str, mode: str, padding: str
) -> None:
    from sentence_transformers.sentence_transformer.modules import Pooling

    torch.manual_seed(1)
    hidden = torch.randn(4, 10, 6, dtype=torch.float64)
    mask = _masks(padding)
    theirs = Pooling(6, mode, include_prompt=False)
    for p in (1, 3):
        features = {"token_embeddings": hidden, "attention_mask": mask, "prompt_length": p}
        want = theirs(features)["sentence_embedding"]
        got = Pooler(kind, 6, False, include_prompt=False)(
            hidden, mask, pool_mask=exclude_prompt(mask, p)
        )
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_llm2vec_instruction_excluded_mean_on_a_tiny_llama(tmp_path: Path) -> None:
    """LLM2Vec's mean pooling without its instruction (``embed_mask``, BehnamGhader et al.
    2024, ``LLM2Vec.tokenize`` and ``_skip_instruction``), written from its definition: the text
    is ``instruction + " " + text``, left-padded; ``embed_mask`` marks the last ``len(text
    tokenised alone, no special tokens)`` positions of each row; the vector is the mean of
    the last layer there."""
    from transformers import AutoModel, AutoTokenizer

    folder = make_tiny("llama", tmp_path / "llama", dtype=torch.float64)
    instruction = "This sentence means in one word :"
    texts = ["alpha beta gamma", "delta", "epsilon zeta eta theta iota"]
    tok = AutoTokenizer.from_pretrained(str(folder))
    tok.pad_token, tok.padding_side = tok.eos_token, "left"
    model = AutoModel.from_pretrained(str(folder)).eval()
    batch = tok([f"{instruction} {t}" for t in texts], padding=True, return_tensors="pt")
    embed_mask = torch.zeros_like(batch["attention_mask"])
    for i, t in enumerate(texts):
        n = len(tok(t, add_special_tokens=False)["input_ids"])
        embed_mask[i, -n:] = 1
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    want = (hidden * embed_mask.unsqueeze(-1)).sum(1) / embed_mask.sum(1, keepdim=True)

    ours = SentenceEncoder.from_pretrained(str(folder), pooler="avg", pool_prompt=False)
    got = ours.encode(texts, prompt=instruction + " ")
    np.testing.assert_allclose(got, want.float().numpy(), rtol=0, atol=1e-5)
    with_it = SentenceEncoder.from_pretrained(str(folder), pooler="avg")
    assert np.abs(with_it.encode(texts, prompt=instruction + " ") - got).max() > 1e-3


# ------------------------------------------------------------------------- the saved model
@pytest.mark.parametrize("kind", ["avg", "weighted_mean"])
@pytest.mark.parametrize("pool_prompt", [False, True])
def test_saved_folder_round_trips_in_sentence_transformers(
    bert64: Path, tmp_path: Path, kind: str, pool_prompt: bool
) -> None:
    from sentence_transformers import SentenceTransformer

    enc = SentenceEncoder.from_pretrained(
        str(bert64), pooler=kind, pool_prompt=pool_prompt, prompts=PROMPTS
    )
    enc.save(tmp_path / "m")
    st = SentenceTransformer(str(tmp_path / "m"), device="cpu")
    assert st.prompts == PROMPTS
    for name in PROMPTS:
        ours = enc.encode(SENTENCES, prompt_name=name)
        theirs = st.encode(SENTENCES, prompt_name=name)
        assert np.abs(ours - theirs).max() < 1e-6
    loaded = load(str(tmp_path / "m"))
    assert loaded.prompts == PROMPTS and loaded.pooler.include_prompt is pool_prompt
    np.testing.assert_array_equal(
        loaded.encode(SENTENCES, prompt_name="query"), loaded.encode(SENTENCES, prompt="query: ")
    )
    plain = loaded.encode(SENTENCES)  # no default prompt: none
    np.testing.assert_array_equal(plain, enc.encode(SENTENCES))
    assert np.abs(plain - loaded.encode(SENTENCES, prompt_name="query")).max() > 1e-3


def test_default_prompt_and_unknown_names(tiny_bert: Path, tmp_path: Path) -> None:
    enc = SentenceEncoder.from_pretrained(
        str(tiny_bert), pooler="avg", prompts=PROMPTS, default_prompt_name="query"
    )
    np.testing.assert_array_equal(enc.encode(SENTENCES), enc.encode(SENTENCES, prompt="query: "))
    np.testing.assert_array_equal(
        enc.encode(SENTENCES, prompt=""), SentenceEncoder.from_pretrained(
            str(tiny_bert), pooler="avg").encode(SENTENCES)
    )  # fmt: skip
    with pytest.raises(
        ConfigError, match=r"prompt_name 'qury': .*\(its prompts: document, query\)"
    ):
        enc.encode(SENTENCES, prompt_name="qury")
    enc.save(tmp_path / "m")
    assert load(str(tmp_path / "m")).default_prompt_name == "query"


def test_a_one_token_pooler_chosen_for_a_folder_that_leaves_its_prompts_out(
    tiny_bert: Path, tmp_path: Path
) -> None:
    """``--pooler cls_before_pooler`` on a folder saved with ``pool_prompt: false`` reads its
    one token (the prompt has nothing to be left out of), as for a sentence-transformers
    folder; the folder's own pooler still leaves the prompt out."""
    enc = SentenceEncoder.from_pretrained(
        str(tiny_bert), pooler="avg", pool_prompt=False, prompts=PROMPTS
    )
    enc.save(tmp_path / "m")
    cls = load(str(tmp_path / "m"), pooler="cls_before_pooler")
    assert cls.pooler.include_prompt and not load(str(tmp_path / "m")).pooler.include_prompt
    plain = load(str(tiny_bert), pooler="cls_before_pooler")
    np.testing.assert_array_equal(
        cls.encode(SENTENCES, prompt_name="query"), plain.encode(SENTENCES, prompt="query: ")
    )


def test_cli_encode_with_a_prompt_name(bert64: Path, tmp_path: Path) -> None:
    from cselab.cli import main

    enc = SentenceEncoder.from_pretrained(str(bert64), pooler="avg", pool_prompt=False,
                                          prompts=PROMPTS)  # fmt: skip
    enc.save(tmp_path / "m")
    (tmp_path / "in.txt").write_text("\n".join(SENTENCES) + "\n")
    for flags, want in (
        (["--prompt-name", "document"], enc.encode(SENTENCES, prompt_name="document")),
        (["--prompt", "query: "], enc.encode(SENTENCES, prompt_name="query")),
    ):
        out = tmp_path / "v.npy"
        argv = ["encode", str(tmp_path / "m"), "--input", str(tmp_path / "in.txt")]
        assert main([*argv, "--output", str(out), *flags]) == 0
        np.testing.assert_allclose(np.load(out), want, rtol=0, atol=1e-6)


# --------------------------------------------------------------------------------- bad config
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["--data.prompts={anchr: 'q: '}"], "data.prompts.anchr: no such column in pairs data"),
        (["--data.prompts={anchor: 3}"], "data.prompts.anchor: expected a string, got 3"),
        (["--data.prompts={text: 'q: '}"], "data.prompts.text: no such column in pairs data"),
        (["--model.prompts={query: [1]}"], "model.prompts.query: expected a string"),
        # a name that would not read as itself on one line is quoted (it broke the line)
        (['--model.prompts={"a\\nb": null}'], "model.prompts['a\\nb']: expected a string"),
        (["--model.prompts={query: 'q: '}", "--model.default_prompt_name=doc"],
         "model.default_prompt_name='doc' is not one of model.prompts (query)"),
        (["--model.pool_prompt=false", "--model.pooler=cls"],
         "model.pool_prompt=false: pooler 'cls' reads one token"),
        (["--data.prompts={anchor: 'q: '}", "--model.default_prompt_name=document"],
         "model.default_prompt_name='document' is not one of the prompts saved from "
         "data.prompts (query)"),
    ],
)  # fmt: skip
def test_a_bad_prompt_config_is_one_line_naming_the_key(
    tiny_bert: Path, tmp_path: Path, overrides: list[str], message: str
) -> None:
    from cselab.config import load_config

    base = [f"--model.name_or_path={tiny_bert}", f"--data.train_file={_pairs_file(tmp_path)}"]
    with pytest.raises(ConfigError) as err:
        load_config(None, [*base, *overrides])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_default_prompt_may_name_a_prompt_of_the_data(tiny_bert: Path, tmp_path: Path) -> None:
    """A model trained with ``data.prompts`` is saved with them (the anchor's as ``query``,
    the positive's as ``document``): ``model.default_prompt_name`` may name one of those."""
    from cselab.app.plan import resolve
    from cselab.app.train import saved_prompts
    from cselab.config import load_config
    from cselab.training.distributed import DistInfo

    pairs = _pairs_file(tmp_path)
    config = load_config(None, [
        f"--model.name_or_path={tiny_bert}", f"--data.train_file={pairs}",
        "--data.prompts={anchor: 'query: ', positive: 'passage: '}",
        "--model.default_prompt_name=query",
    ])  # fmt: skip
    plan, _ = resolve(config, pairs, DistInfo())
    assert saved_prompts(config, plan) == {
        "prompts": {"query": "query: ", "document": "passage: "},
        "default_prompt_name": "query",
    }


def test_a_prompt_that_leaves_no_room_for_the_text_is_refused(
    tiny_bert: Path, tmp_path: Path
) -> None:
    """Rows are cut at the end: a prompt as long as ``max_seq_len`` would cut every sentence
    away (training on empty poolings, encoding zero vectors). One line, before tokenising."""
    from cselab.app.train import train
    from cselab.config import load_config

    long = "given a web search query retrieve relevant passages: "
    config = load_config(None, [
        f"--model.name_or_path={tiny_bert}", "--model.pooler=avg", "--model.pool_prompt=false",
        "--model.max_seq_len=6", f"--data.train_file={_pairs_file(tmp_path)}",
        f"--data.cache_dir={tmp_path / 'cache'}", f"--train.output_dir={tmp_path / 'out'}",
        "--train.batch_size=8", "--train.max_steps=1", "--train.eval_steps=0",
        "--train.report_to=[]", f"--data.prompts={{anchor: '{long}'}}",
    ])  # fmt: skip
    with pytest.raises(ConfigError, match=r"data.prompts.anchor='given .*' leaves no room for "
                       r"the text: with it a row needs \d+ tokens and max_seq_len is 6"):  # fmt: skip
        train(config)
    enc = load(str(tiny_bert), pooler="avg")
    with pytest.raises(ConfigError, match="prompt='given .*' leaves no room for the text"):
        enc.encode(SENTENCES, prompt=long, max_seq_len=6)
    assert np.isfinite(enc.encode(SENTENCES, prompt="q: ", max_seq_len=6)).all()  # room left


def test_a_sentence_corpus_takes_its_one_prompt(tiny_bert: Path, tmp_path: Path) -> None:
    from cselab.config import load_config

    corpus = tmp_path / "c.txt"
    corpus.write_text("alpha\nbeta\n")
    base = [f"--model.name_or_path={tiny_bert}", f"--data.train_file={corpus}"]
    assert load_config(None, [*base, "--data.prompts={text: 'q: '}"]).data.prompts == {
        "text": "q: "
    }
    with pytest.raises(ConfigError, match="data.prompts.anchor: no such column in a sentence"):
        load_config(None, [*base, "--data.prompts={anchor: 'q: '}"])


# ---------------------------------------------------------------------------------- evaluation
def test_retrieval_with_prompts_equals_the_prompted_texts_by_hand(
    tiny_bert: Path, tmp_path: Path
) -> None:
    from cselab.evaluation.retrieval import RetrievalScorer, evaluate_retrieval

    folder = write_beir(tmp_path / "b", split="test")
    enc = SentenceEncoder.from_pretrained(str(tiny_bert), pooler="avg")
    scorer = RetrievalScorer(folder, "test")
    c = scorer.collection
    docs = enc.encode(["passage: " + t for t in c.doc_texts])
    queries = enc.encode(["query: " + t for t in c.query_texts])
    by_hand = scorer.score_vectors(docs, queries)
    given = evaluate_retrieval(enc, folder, query_prompt="query: ", document_prompt="passage: ")
    assert given["metrics"] == pytest.approx(by_hand, abs=1e-9)
    assert given["prompts"] == {"query": "query: ", "document": "passage: "}
    plain = evaluate_retrieval(enc, folder)["metrics"]
    assert plain == pytest.approx(scorer.score_vectors(enc.encode(list(c.doc_texts)),
                                                       enc.encode(list(c.query_texts))), abs=1e-9)  # fmt: skip
    # the model's saved prompts are the default; "" turns one off
    enc.prompts = dict(PROMPTS)
    saved = evaluate_retrieval(enc, folder)
    assert saved["metrics"] == pytest.approx(by_hand, abs=1e-9)
    no_query = evaluate_retrieval(enc, folder, query_prompt="")["metrics"]
    queries_plain = enc.encode(list(c.query_texts), prompt="")
    assert no_query == pytest.approx(scorer.score_vectors(docs, queries_plain), abs=1e-9)


STS_ROWS = [("alpha beta", "beta alpha", 5), ("gamma", "delta", 1), ("epsilon zeta", "epsilon", 3),
            ("eta", "theta iota", 0), ("kappa lambda", "kappa mu", 4), ("nu xi", "omicron", 2)]  # fmt: skip


def _sts_file(path: Path) -> Path:
    path.write_text(
        "sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in STS_ROWS)
    )
    return path


def _table(path: Path, instructions: dict[str, str]) -> Path:
    import yaml

    path.write_text(yaml.safe_dump({"instructions": instructions}))
    return path


def _error(capsys: pytest.CaptureFixture) -> str:
    """The one line a refused command prints (without its ``cselab evaluate: error:``)."""
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    return err.removeprefix("cselab evaluate: error: ")


def test_cli_evaluate_takes_retrieval_and_sts_prompts(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from cselab.cli import main
    from cselab.evaluation.retrieval import evaluate_retrieval

    folder = write_beir(tmp_path / "b", split="test")
    out = tmp_path / "r.json"
    argv = ["evaluate", str(tiny_bert), "--retrieval", str(folder), "-o", str(out)]
    assert main([*argv, "--query-prompt", "query: ", "--document-prompt", "passage: "]) == 0
    # the report's table (and a card's) names the prompts behind the scores
    assert "; queries after `query: `; documents after `passage: `" in capsys.readouterr().out
    saved = json.loads(out.read_text())["results"]["retrieval:b"]
    want = evaluate_retrieval(load(str(tiny_bert)), folder, query_prompt="query: ",
                              document_prompt="passage: ")  # fmt: skip
    assert saved["metrics"] == pytest.approx(want["metrics"], abs=1e-9)
    assert main(["evaluate", str(tiny_bert), "--query-prompt", "q: "]) == 2
    assert "--query-prompt and --document-prompt go with --retrieval" in capsys.readouterr().err
    sts = tmp_path / "sts.tsv"
    sts.write_text("sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in
                           [("alpha beta", "beta alpha", 5), ("gamma", "delta", 1),
                            ("epsilon zeta", "epsilon", 3), ("eta", "theta iota", 0),
                            ("kappa lambda", "kappa mu", 4), ("nu xi", "omicron", 2)]))  # fmt: skip
    argv = ["evaluate", str(tiny_bert), "--sts-file", str(sts), "-o", str(out)]
    assert main([*argv, "--prompt", "query: "]) == 0
    saved = json.loads(out.read_text())
    with_prompt = saved["results"]
    assert saved["prompt"] == "query: "  # the scores' prompt, recorded beside them
    assert main(argv) == 0
    saved = json.loads(out.read_text())
    assert saved["results"] != with_prompt and "prompt" not in saved


def test_an_empty_prompt_turns_a_default_prompt_off_and_the_prompt_read_is_recorded(
    tiny_bert: Path, tmp_path: Path
) -> None:
    """A model with a default prompt (``query``) and no ``document`` prompt: evaluation reads
    its sentences after the default unless told ``--prompt ''``, which gives the vectors of no
    prompt; the JSON records the prompt read (the default too), and nothing when none was.
    Retrieval and mining fall back to the default where no ``query``/``document`` prompt is
    saved, as sentence-transformers' ``encode_query``/``encode_document`` do."""
    from cselab.cli import main
    from cselab.evaluation.embed import query_document_prompts, with_prompt

    enc = SentenceEncoder.from_pretrained(
        str(tiny_bert), pooler="avg", prompts={"query": "query: "}, default_prompt_name="query"
    )
    enc.save(tmp_path / "m")
    plain = load(str(tiny_bert), pooler="avg").encode(SENTENCES)
    np.testing.assert_array_equal(with_prompt(enc, "").encode(SENTENCES), plain)
    assert np.abs(with_prompt(enc, None).encode(SENTENCES) - plain).max() > 1e-3
    assert query_document_prompts(enc, None, None) == ("query: ", "query: ")
    assert query_document_prompts(enc, "", "") == ("", "")
    sts = tmp_path / "sts.tsv"
    sts.write_text("sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in
                           [("alpha beta", "beta alpha", 5), ("gamma", "delta", 1),
                            ("epsilon zeta", "epsilon", 3), ("eta", "theta iota", 0),
                            ("kappa lambda", "kappa mu", 4), ("nu xi", "omicron", 2)]))  # fmt: skip
    out = tmp_path / "r.json"
    runs = {}
    for name, model, extra in (
        ("default", tmp_path / "m", []), ("given", tmp_path / "m", ["--prompt", "query: "]),
        ("off", tmp_path / "m", ["--prompt", ""]), ("plain", tiny_bert, ["--pooler", "avg"]),
    ):  # fmt: skip
        assert main(["evaluate", str(model), "--sts-file", str(sts), "-o", str(out), *extra]) == 0
        runs[name] = json.loads(out.read_text())
    assert runs["default"]["prompt"] == runs["given"]["prompt"] == "query: "
    assert runs["default"]["results"] == runs["given"]["results"]
    assert "prompt" not in runs["off"] and runs["off"]["results"] == runs["plain"]["results"]
    assert runs["off"]["results"] != runs["default"]["results"]
    from cselab.publish.card import evaluation_parts

    # the card (--update-card) names the prompt behind the scores
    assert "after the prompt `query: `" in "".join(evaluation_parts(runs["default"]).values())
    assert "after the prompt" not in "".join(evaluation_parts(runs["off"]).values())


def test_mteb_passes_the_prompt_of_each_task_type(tiny_bert: Path) -> None:
    pytest.importorskip("mteb")
    import mteb
    from mteb.types import PromptType

    from cselab.evaluation.instructions import (
        instruction_prompt,
        load_instructions,
        mteb_prompts,
    )
    from cselab.evaluation.mteb import MTEBEncoder, SentEvalSTSBenchmark

    enc = SentenceEncoder.from_pretrained(str(tiny_bert), pooler="avg", pool_prompt=False,
                                          prompts=PROMPTS)  # fmt: skip
    table = load_instructions("llm2vec")
    scifact, sts = mteb.get_task("SciFact").metadata, SentEvalSTSBenchmark.metadata
    prompts = mteb_prompts(table, {scifact.name: scifact.type, sts.name: "STS", "STS12": "STS"})
    assert prompts == {  # cselab's SentEvalSTSBenchmark reads the table's STSBenchmark
        "SciFact-query": instruction_prompt(table.instructions["SciFact"]),
        "SentEvalSTSBenchmark": "Retrieve semantically similar text: ",
        "STS12": "Retrieve semantically similar text: ",
    }
    wrapped = MTEBEncoder(enc, prompts=prompts)
    loader = [{"text": SENTENCES[:2]}, {"text": SENTENCES[2:]}]

    def run(meta: object, kind: PromptType | None) -> np.ndarray:
        return wrapped.encode(loader, task_metadata=meta, hf_split="test", hf_subset="default",
                              prompt_type=kind)  # fmt: skip

    # a retrieval task's queries get its instruction, its documents the model's document prompt
    instruction = "Given a scientific claim, retrieve documents that support or refute the claim: "
    np.testing.assert_array_equal(
        run(scifact, PromptType.query), enc.encode(SENTENCES, prompt=instruction)
    )
    np.testing.assert_array_equal(
        run(scifact, PromptType.document), enc.encode(SENTENCES, prompt_name="document")
    )
    np.testing.assert_array_equal(
        run(sts, None), enc.encode(SENTENCES, prompt="Retrieve semantically similar text: ")
    )
    # a task these prompts do not name, and no prompt type: the model's default (none here)
    banking = mteb.get_task("Banking77Classification").metadata
    np.testing.assert_array_equal(run(banking, None), enc.encode(SENTENCES))


def test_the_sts_tasks_read_their_own_instruction_as_one_prompt(tmp_path: Path) -> None:
    """Each STS task reads its own task's instruction (SICKRelatedness under MTEB's SICK-R, an
    STS file and AlignUniform STS-B's); the tasks evaluated together share one encoding, so
    their instructions must be one text; a task the table lacks is one line naming the file."""
    from cselab.evaluation.api import TASK_GROUPS
    from cselab.evaluation.instructions import load_instructions, sts_prompt

    llm2vec = load_instructions("llm2vec")
    every = [*TASK_GROUPS["sts"], "AlignUniform", "sts-file"]
    assert sts_prompt(llm2vec, every) == "Retrieve semantically similar text: "
    path = _table(tmp_path / "t.yaml", {"STS12": "Twelve:", "SICK-R": "Sick:", "STS13": "Twelve:"})
    table = load_instructions(str(path))
    assert sts_prompt(table, ["STS12", "STS13"]) == "Twelve: "
    assert sts_prompt(table, ["SICKRelatedness"]) == "Sick: "
    for tasks, message in (
        (["STSBenchmark"], f"{path}: no instruction for STSBenchmark; add one"),
        (["STS12", "sts-file"], f"{path}: no instruction for STSBenchmark (an STS file reads"),
        (["STS12", "STS14"], f"{path}: no instruction for STS14"),
        (["STS12", "SICKRelatedness"], "instructions differ (STS12: 'Twelve:', SICK-R: 'Sick:')"),
    ):
        with pytest.raises(ConfigError) as err:
            sts_prompt(table, tasks)
        assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("text", ["", "  "])
def test_an_empty_instruction_is_refused_when_the_table_is_read(tmp_path: Path, text: str) -> None:
    from cselab.evaluation.instructions import load_instructions

    path = _table(tmp_path / "t.yaml", {"STS12": "Twelve:", "STSBenchmark": text})
    with pytest.raises(ConfigError, match=f"^{path}: instructions.STSBenchmark: empty; give"):
        load_instructions(str(path))


def test_cli_evaluate_reads_the_instruction_of_what_it_evaluates(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """An STS file reads the table's STSBenchmark instruction (none there: one line naming the
    table, not silence); the JSON records the prompt and the table. Retrieval alone takes no
    --prompt/--instructions, clustering files no table instruction, and --prompt and
    --instructions do not go together: each refused in one line."""
    from cselab.cli import main

    sts, out = _sts_file(tmp_path / "sts.tsv"), tmp_path / "r.json"
    argv = ["evaluate", str(tiny_bert), "--sts-file", str(sts), "-o", str(out)]
    twelve = _table(tmp_path / "twelve.yaml", {"STS12": "Retrieve semantically similar text:"})
    assert main([*argv, "--instructions", str(twelve)]) == 2
    assert _error(capsys) == (
        f"{twelve}: no instruction for STSBenchmark (an STS file reads STSBenchmark's); add one, "
        "or leave the task out"
    )
    assert main([*argv, "--instructions", "llm2vec"]) == 0
    saved = json.loads(out.read_text())
    assert saved["prompt"] == "Retrieve semantically similar text: "
    assert saved["instructions"] == "llm2vec"
    assert main([*argv, "--prompt", "Retrieve semantically similar text: "]) == 0
    assert json.loads(out.read_text())["results"] == saved["results"]

    folder = write_beir(tmp_path / "b", split="test")
    labelled = tmp_path / "topics.tsv"
    labelled.write_text(
        "text\tlabel\n" + "".join(f"{w} {w}\t{i % 2}\n" for i, w in enumerate(GREEK[:6]))
    )
    retrieval = ["evaluate", str(tiny_bert), "--retrieval", str(folder)]
    for extra, message in (
        (["--instructions", "llm2vec"], "--instructions applies to the SentEval tasks, STS files "
         "and clustering files; --retrieval takes --query-prompt and --document-prompt"),
        (["--prompt", "x: "], "--prompt applies to the SentEval tasks"),
    ):  # fmt: skip
        assert main([*retrieval, *extra]) == 2
        assert _error(capsys).startswith(message)
    for args, message in (
        ([*retrieval, "--clustering", str(labelled), "--instructions", "llm2vec"],
         "--instructions without --mteb applies to the STS tasks and STS files; --clustering has "
         "no instruction there: give --prompt"),
        (["evaluate", str(tiny_bert), "--tasks", "STS12,MR", "--instructions", "llm2vec"],
         "MR has no instruction there"),
        ([*argv, "--instructions", "llm2vec", "--prompt", "x: "],
         "--prompt and --instructions both give the prompt; give one of them"),
    ):  # fmt: skip
        assert main(args) == 2
        assert message in _error(capsys)
    # with a SentEval task beside retrieval, --prompt applies to it
    assert main([*retrieval, "--sts-file", str(sts), "--prompt", "x: ", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["prompt"] == "x: "


def test_llm2vec_table_is_shipped_with_its_source() -> None:
    from cselab.evaluation.instructions import BUILTIN, load_instructions, sts_prompt

    table = load_instructions("llm2vec")
    assert "McGill-NLP/llm2vec" in table.source and "BehnamGhader" in table.source
    assert table.instructions["MSMARCO"] == (
        "Given a web search query, retrieve relevant passages that answer the query:"
    )
    assert sts_prompt(table) == "Retrieve semantically similar text: "
    assert table.query_only_types == ("Retrieval", "Reranking")
    assert BUILTIN["llm2vec"].is_file()
    with pytest.raises(ConfigError, match="instructions .nope.: neither"):
        load_instructions("nope")


# ------------------------------------------------------------------------------------- mining
def test_mining_encodes_queries_and_corpus_with_their_prompts(
    tiny_bert: Path, tmp_path: Path
) -> None:
    """Mining with prompts equals mining the prompted texts (the prompts cut off again)."""
    from cselab.search.mine import MineSettings, mine_hard_negatives

    enc = SentenceEncoder.from_pretrained(str(tiny_bert), pooler="avg")
    pairs = [(f"{GREEK[i]} {GREEK[i + 1]}", f"{GREEK[(3 * i) % len(GREEK)]} {GREEK[i + 2]} zz")
             for i in range(12)]  # fmt: skip
    settings = MineSettings(num_negatives=2, query_prompt="query: ", document_prompt="passage: ")
    got = mine_hard_negatives(enc, pairs, settings=settings, index_dir=tmp_path / "kept").rows
    # the index mining keeps records its prompts, as cselab index build's (searches read them)
    kept = json.loads((tmp_path / "kept" / "index.json").read_text())
    assert kept["prompts"] == {"query": "query: ", "document": "passage: "}
    prompted = [("query: " + a, "passage: " + p) for a, p in pairs]
    by_hand = mine_hard_negatives(enc, prompted, settings=MineSettings(num_negatives=2)).rows
    strip = [(a.removeprefix("query: "), *(t.removeprefix("passage: ") for t in rest))
             for a, *rest in by_hand]  # fmt: skip
    assert got == strip
    # the model's saved prompts are the default
    enc.prompts = dict(PROMPTS)
    assert mine_hard_negatives(enc, pairs, settings=MineSettings(num_negatives=2)).rows == got
    plain = MineSettings(num_negatives=2, query_prompt="", document_prompt="")
    assert plain.prompts(enc) == ("", "")


def test_a_prompted_view_is_the_prompt_mining_and_retrieval_fall_back_to(
    tiny_bert: Path, tmp_path: Path
) -> None:
    """``with_prompt(model, p)`` reads every sentence after ``p``: mining and retrieval with
    that view read both sides after it and record it (before, they fell back to the model's own
    default, dropping ``p`` from what was read or recorded); saved query / document prompts
    still come first, as for MTEB."""
    from cselab.data.pairs import read_mining_record
    from cselab.evaluation.embed import effective_prompt, query_document_prompts, with_prompt
    from cselab.search.mine import MineSettings, mine_hard_negatives

    enc = SentenceEncoder.from_pretrained(str(tiny_bert), pooler="avg")
    view = with_prompt(enc, "x: ")
    assert query_document_prompts(view, None, None) == ("x: ", "x: ")
    assert query_document_prompts(view, "q: ", None) == ("q: ", "x: ")
    assert effective_prompt(view, None) == "x: "
    pairs = [(f"{GREEK[i]} {GREEK[i + 1]}", f"{GREEK[(5 * i) % len(GREEK)]} {GREEK[i + 2]}")
             for i in range(12)]  # fmt: skip
    given = MineSettings(num_negatives=2, query_prompt="x: ", document_prompt="x: ")
    want = mine_hard_negatives(enc, pairs, settings=given).rows
    out = tmp_path / "m.jsonl"
    assert mine_hard_negatives(view, pairs, settings=MineSettings(num_negatives=2), output=out)
    assert read_mining_record(out)["prompts"] == {"query": "x: ", "document": "x: "}
    assert mine_hard_negatives(view, pairs, settings=MineSettings(num_negatives=2)).rows == want
    enc.prompts = dict(PROMPTS)  # saved query / document prompts come before the view's
    assert query_document_prompts(view, None, None) == (PROMPTS["query"], PROMPTS["document"])


# ------------------------------------------------------------------------------------ indexes
QUERIES = ["alpha beta gamma", "zeta eta theta iota", "mu"]


def _searched_by_hand(index: Any, query_vectors: np.ndarray) -> list[list[tuple[int, float]]]:
    scores, rows = index.search_vectors(query_vectors, k=5, backend="exact")
    return [
        list(zip(r.tolist(), s.tolist(), strict=True)) for s, r in zip(scores, rows, strict=True)
    ]


def _hits(hits: list) -> list[list[tuple[int, float]]]:
    return [[(h.row, h.score) for h in q] for q in hits]


def _same_hits(got: list, want: list) -> None:
    assert [[r for r, _ in q] for q in got] == [[r for r, _ in q] for q in want]
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=1e-5)


def test_an_index_reads_its_lines_and_queries_after_their_prompts(
    tiny_bert: Path, tmp_path: Path
) -> None:
    """``Index.build`` of a model with saved ``query``/``document`` prompts: the vectors are the
    lines read after the document prompt, searches (in the same process and reopened) read the
    queries after the query prompt, and ``index.json`` records both."""
    from cselab.search.index import META_FILE, Index

    enc = SentenceEncoder.from_pretrained(str(tiny_bert), pooler="avg", prompts=PROMPTS)
    enc.save(tmp_path / "m")
    corpus = _corpus(tmp_path)
    lines = corpus.read_text().splitlines()
    built = Index.build(corpus, str(tmp_path / "m"), tmp_path / "p.index")
    assert json.loads((tmp_path / "p.index" / META_FILE).read_text())["prompts"] == PROMPTS
    model = load(str(tmp_path / "m"))
    documents = model.encode(lines, prompt="passage: ", normalize=True)
    np.testing.assert_allclose(np.asarray(built.vectors), documents, rtol=0, atol=1e-6)
    plain = model.encode(lines, normalize=True)
    assert np.abs(plain - documents).max() > 1e-3
    queries = model.encode(QUERIES, prompt="query: ", normalize=True)
    want = _searched_by_hand(built, queries)
    assert want != _searched_by_hand(built, model.encode(QUERIES, normalize=True))
    reopened = Index.open(tmp_path / "p.index")
    assert built.query_prompt() == reopened.query_prompt() == "query: "
    for index in (built, reopened):
        _same_hits(_hits(index.search(QUERIES, k=5)), want)
    # another query prompt when opening; '' reads the queries after none
    off = Index.open(tmp_path / "p.index", query_prompt="")
    _same_hits(_hits(off.search(QUERIES, k=5)),
               _searched_by_hand(off, model.encode(QUERIES, normalize=True)))  # fmt: skip


def _corpus(folder: Path) -> Path:
    path = folder / "corpus.txt"
    path.write_text("".join(f"{GREEK[i % len(GREEK)]} {GREEK[(5 * i + 2) % len(GREEK)]} "
                            f"{GREEK[(3 * i + 1) % len(GREEK)]}\n" for i in range(20)))  # fmt: skip
    return path


def test_index_build_and_search_take_prompts_on_the_command_line(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``cselab index build --document-prompt ''`` stores the plain vectors and records the
    prompts read; ``cselab search`` reads its queries after the recorded query prompt, or after
    ``--query-prompt``."""
    from cselab.cli import main
    from cselab.search.index import META_FILE, Index

    enc = SentenceEncoder.from_pretrained(str(tiny_bert), pooler="avg", prompts=PROMPTS)
    enc.save(tmp_path / "m")
    corpus = _corpus(tmp_path)
    lines = corpus.read_text().splitlines()
    out = tmp_path / "cli.index"
    assert main(["-q", "index", "build", str(corpus), "--model", str(tmp_path / "m"), "-o",
                 str(out), "--document-prompt", ""]) == 0  # fmt: skip
    capsys.readouterr()
    assert json.loads((out / META_FILE).read_text())["prompts"] == {
        "query": "query: ", "document": ""
    }  # fmt: skip
    model = load(str(tmp_path / "m"))
    np.testing.assert_allclose(
        np.asarray(Index.open(out).vectors), model.encode(lines, normalize=True), rtol=0, atol=1e-6
    )

    def searched(*extra: str) -> list[list[tuple[int, float]]]:
        assert main(["search", str(out), QUERIES[1], "-k", "5", "--json", *extra]) == 0
        rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        return [[(h["row"], h["score"]) for h in r["hits"]] for r in rows]

    index = Index.open(out)
    prompted = _searched_by_hand(index, model.encode(QUERIES[1:2], prompt="query: "))
    _same_hits(searched(), prompted)
    _same_hits(searched("--query-prompt", "q: "),
               _searched_by_hand(index, model.encode(QUERIES[1:2], prompt="q: ")))  # fmt: skip
    plain = _searched_by_hand(index, model.encode(QUERIES[1:2]))
    assert plain != prompted
    _same_hits(searched("--query-prompt", ""), plain)
    # built again with another query prompt: the vectors (the document prompt's) are kept,
    # and the query prompt recorded; another document prompt would need other vectors
    before = (out / "vectors.npy").stat().st_mtime_ns
    build = ["-q", "index", "build", str(corpus), "--model", str(tmp_path / "m"), "-o", str(out)]
    assert main([*build, "--document-prompt", "", "--query-prompt", "q: "]) == 0
    assert json.loads((out / META_FILE).read_text())["prompts"]["query"] == "q: "
    assert (out / "vectors.npy").stat().st_mtime_ns == before
    capsys.readouterr()
    assert main([*build, "--document-prompt", "d: "]) == 2
    assert "an index with prompts.document '' is there, not 'd: '" in capsys.readouterr().err


def test_a_prompted_model_indexes_its_lines_only_and_an_older_index_searches_as_before(
    tiny_bert: Path, tmp_path: Path
) -> None:
    """A prompted view (``with_prompt(model, "passage: ")``) given to ``Index.build`` reads the
    lines after its prompt, not the queries; an index whose ``index.json`` records no prompts
    (built before they were recorded) opens, searches with its model's plain ``encode`` and
    takes a second build (a FAISS index added) without encoding anything again."""
    from cselab.evaluation.embed import with_prompt
    from cselab.search.index import META_FILE, Index

    model = SentenceEncoder.from_pretrained(str(tiny_bert), pooler="avg")
    corpus = _corpus(tmp_path)
    lines = corpus.read_text().splitlines()
    built = Index.build(corpus, with_prompt(model, "passage: "), tmp_path / "v.index")
    meta = json.loads((tmp_path / "v.index" / META_FILE).read_text())
    assert meta["prompts"] == {"query": "", "document": "passage: "}
    np.testing.assert_allclose(np.asarray(built.vectors),
                               model.encode(lines, prompt="passage: ", normalize=True),
                               rtol=0, atol=1e-6)  # fmt: skip
    plain = _searched_by_hand(built, model.encode(QUERIES))
    assert plain != _searched_by_hand(built, model.encode(QUERIES, prompt="passage: "))
    _same_hits(_hits(built.search(QUERIES, k=5)), plain)
    _same_hits(_hits(Index.open(tmp_path / "v.index", model=model).search(QUERIES, k=5)), plain)

    # an index written before prompts were recorded, of a model with a default prompt
    older = SentenceEncoder.from_pretrained(
        str(tiny_bert), pooler="avg", prompts={"query": "query: "}, default_prompt_name="query"
    )
    Index.build(corpus, older, tmp_path / "old.index")
    meta = json.loads((tmp_path / "old.index" / META_FILE).read_text())
    meta.pop("prompts")
    (tmp_path / "old.index" / META_FILE).write_text(json.dumps(meta))
    index = Index.open(tmp_path / "old.index", model=older)
    assert index.query_prompt() is None
    _same_hits(_hits(index.search(QUERIES, k=5)), _searched_by_hand(index, older.encode(QUERIES)))
    again = Index.build(corpus, older, tmp_path / "old.index")  # finished: nothing encoded
    assert "prompts" not in again.meta


def _subword_tokenizer(kind: str) -> Any:
    """A small trained subword tokenizer of the kind decoders ship: byte-level BPE (GPT-2,
    Llama 3, Qwen; a space is ``Ġ``) or SentencePiece-style BPE (Llama 2, Mistral; ``▁``),
    with ``<s>`` put before each text as their BOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [
        "query: a man plays the guitar", "passage: the cat sleeps on the mat",
        "Instruct: retrieve passages; that answer the question", "the quick brown fox",
    ] * 20  # fmt: skip
    specials = ["<unk>", "<s>", "</s>"]
    if kind == "bytelevel":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        alphabet = []
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=alphabet
    )
    tok.train_from_iterator(texts, trainer)
    bos = ("<s>", tok.token_to_id("<s>"))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[bos])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


@pytest.mark.parametrize("kind", ["bytelevel", "metaspace", "wordpiece"])
@pytest.mark.parametrize(
    "prompt", ["query: ", "passage: ", "query:", "Instruct: retrieve passages; "]
)
def test_the_prompt_s_tokens_are_those_before_the_text_s(
    kind: str, prompt: str, minilm_path: Path
) -> None:
    """In a prompted row the first :func:`prompt_length` tokens are the prompt's and the rest
    are the sentence's, also where a subword tokenizer makes the prompt's trailing space a token
    of its own when the prompt is tokenised alone (``Ġ``, ``▁``) but part of the first word in
    the row (``Ġthe``): the old count, the prompt's tokens alone, pooled one word too few."""
    from transformers import AutoTokenizer

    tok = (
        AutoTokenizer.from_pretrained(str(minilm_path))
        if kind == "wordpiece"
        else _subword_tokenizer(kind)
    )
    n = prompt_length(tok, prompt)
    for sentence in ["the cat sleeps", "a man plays the guitar", "quick brown fox"]:
        row = tok(prompt + sentence, add_special_tokens=True)["input_ids"]
        tokens = tok.convert_ids_to_tokens(row)
        text = tok.decode(row[n:], skip_special_tokens=True)
        assert _letters(text) == _letters(sentence), (tokens, n)
        assert _letters(tok.decode(row[:n], skip_special_tokens=True)) == _letters(prompt)


def _letters(text: str) -> str:
    """``text`` as a tokenizer's decode can give it back: lowercased, spaces dropped
    (WordPiece decodes ``query:`` as ``query :``)."""
    return "".join(text.lower().split())


def test_retrieval_mining_and_mteb_choose_prompts_alike_through_a_view() -> None:
    """One rule for every command that encodes queries and documents: a prompt given is used
    (``""``: none), else the model's saved ``query`` / ``document`` prompt, also through a view
    of the model (a Matryoshka prefix, a prompted encoder), which mining and MTEB did not see
    through before."""
    pytest.importorskip("mteb")
    from cselab.evaluation.embed import at_dimension, query_document_prompts, with_prompt
    from cselab.evaluation.mteb import MTEBEncoder
    from cselab.evaluation.retrieval import RetrievalScorer
    from cselab.search.mine import MineSettings

    class Model:
        prompts = {"query": "query: ", "document": "passage: "}  # noqa: RUF012
        dim = 8

        def encode(self, sentences: list[str], batch_size: int = 8) -> np.ndarray:
            return np.zeros((len(sentences), self.dim), dtype=np.float32)

    for view in (Model(), at_dimension(Model(), 4), with_prompt(at_dimension(Model(), 4), "x: ")):
        assert query_document_prompts(view, None, None) == ("query: ", "passage: ")
        assert query_document_prompts(view, "", "doc: ") == ("", "doc: ")
        assert MineSettings().prompts(view) == ("query: ", "passage: ")
        assert MineSettings(query_prompt="q: ").prompts(view) == ("q: ", "passage: ")
        scorer = RetrievalScorer.__new__(RetrievalScorer)
        scorer.query_prompt, scorer.document_prompt = None, ""
        assert scorer.prompts(view) == ("query: ", "")
        assert MTEBEncoder(view).model_prompts == Model.prompts
    assert query_document_prompts(object(), None, None) == ("", "")

    class E5(Model):  # an E5-style folder names its document prompt "passage"
        prompts = {"query": "query: ", "passage": "passage: ", "corpus": "c: "}  # noqa: RUF012

    assert query_document_prompts(E5(), None, None) == ("query: ", "passage: ")


@pytest.mark.parametrize("kind", ["avg", "weighted_mean"])
def test_a_decoder_with_a_subword_tokenizer_in_sentence_transformers(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A Llama saved with a byte-level BPE tokenizer (BOS, no EOS: Llama 3's layout) and its
    prompts left out of the pooling. cselab leaves out ``<s> query :`` and pools the text from
    ``Ġthe`` on; sentence-transformers 6 counts the prompt alone, ``<s> query : Ġ``, and so also
    drops the text's first token. The saved folder says so (``cselab.json`` and a warning), and
    the two differ by that count only: cselab counting the prompt alone gives its vectors."""
    import logging

    from sentence_transformers import SentenceTransformer

    import cselab.model.st_folder as st_folder

    monkeypatch.setattr(st_folder, "_WARNED", set())  # each note is logged once a process
    enc = SentenceEncoder.from_pretrained(
        str(_bpe_llama(tmp_path)), pooler=kind, pool_prompt=False, prompts=PROMPTS
    )
    with caplog.at_level(logging.WARNING, logger="cselab"):
        enc.save(tmp_path / "m")
    meta = json.loads((tmp_path / "m" / "cselab.json").read_text())
    for name, text in PROMPTS.items():
        said = f"sentence-transformers counts prompt {name!r} ({text!r}) as 4 tokens"
        assert said in meta["sentence_transformers"]
        assert meta["prompt_counts"][name] == {"sentence_transformers": 4, "cselab": 3}
        assert any(said in r.getMessage() for r in caplog.records)
    st = SentenceTransformer(str(tmp_path / "m"), device="cpu")
    texts = ["the cat sleeps on the mat", "a man plays the guitar"]
    ours = {name: enc.encode(texts, prompt_name=name) for name in PROMPTS}
    enc.prompt_count = "alone"
    for name in PROMPTS:
        theirs = st.encode(texts, prompt_name=name)
        assert np.abs(ours[name] - theirs).max() > 1e-3  # the first word pooled or not
        np.testing.assert_allclose(enc.encode(texts, prompt_name=name), theirs, atol=1e-5)


def _bpe_llama(tmp_path: Path) -> Path:
    """A random tiny Llama with :func:`_subword_tokenizer`'s byte-level BPE (BOS, no EOS)."""
    from transformers import AutoModel

    from backbone_models import tiny_config

    tok = _subword_tokenizer("bytelevel")
    tok.pad_token = "<unk>"
    folder = tmp_path / "llama"
    torch.manual_seed(0)
    AutoModel.from_config(tiny_config("llama", len(tok))).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("origin", ["cselab-before", "sentence-transformers"])
def test_a_model_trained_with_the_prompt_counted_alone_is_encoded_so(
    tmp_path: Path, origin: str
) -> None:
    """Where the pooling leaves the prompts out, a model is encoded with the count it was
    trained with: a folder cselab saves records ``prompt_count: row``; one saved by an earlier
    cselab (``pool_prompt: false`` without the record) or by sentence-transformers
    (``include_prompt: false``) counted the prompt alone, and loads with that count, giving
    sentence-transformers' vectors."""
    from sentence_transformers import SentenceTransformer

    enc = SentenceEncoder.from_pretrained(
        str(_bpe_llama(tmp_path)), pooler="avg", pool_prompt=False, prompts=PROMPTS
    )
    folder = tmp_path / "m"
    enc.save(folder)
    meta_file = folder / "cselab.json"
    meta = json.loads(meta_file.read_text())
    assert meta["prompt_count"] == "row" and load(str(folder)).prompt_count == "row"
    if origin == "cselab-before":
        del meta["prompt_count"]
        meta_file.write_text(json.dumps(meta))
    else:
        meta_file.unlink()
    loaded = load(str(folder))
    assert loaded.prompt_count == "alone" and not loaded.pooler.include_prompt
    st = SentenceTransformer(str(folder), device="cpu")
    texts = ["the cat sleeps on the mat", "a man plays the guitar"]
    for name in PROMPTS:
        theirs = st.encode(texts, prompt_name=name)
        np.testing.assert_allclose(loaded.encode(texts, prompt_name=name), theirs, atol=1e-5)
        assert np.abs(enc.encode(texts, prompt_name=name) - theirs).max() > 1e-3
    with pytest.raises(ConfigError, match=r"prompt_count='words'.*expected one of row, alone"):
        load(str(folder), prompt_count="words")
    loaded.save(tmp_path / "again")  # kept as it was trained
    assert json.loads((tmp_path / "again" / "cselab.json").read_text())["prompt_count"] == "alone"


def test_a_bidirectional_model_leaves_its_prompt_out_in_sentence_transformers(
    tmp_path: Path,
) -> None:
    """A bidirectional decoder (LLM2Vec's) whose pooling leaves the instruction out is saved
    as cselab's own sentence-transformers module: ``SentenceTransformer(folder,
    trust_remote_code=True)`` gives ``encode``'s vectors for each prompt name, the prompt's
    tokens left out as cselab counts them."""
    from sentence_transformers import SentenceTransformer

    enc = SentenceEncoder.from_pretrained(
        str(_bpe_llama(tmp_path)), pooler="avg", bidirectional=True, pool_prompt=False,
        prompts=PROMPTS,
    )  # fmt: skip
    enc.save(tmp_path / "m")
    st = SentenceTransformer(str(tmp_path / "m"), device="cpu", trust_remote_code=True)
    texts = ["the cat sleeps on the mat", "a man plays the guitar"]
    for name in PROMPTS:
        ours = enc.encode(texts, prompt_name=name)
        np.testing.assert_allclose(st.encode(texts, prompt_name=name), ours, atol=1e-5)
        pooled = SentenceEncoder.from_pretrained(
            str(tmp_path / "llama"), pooler="avg", bidirectional=True, prompts=PROMPTS
        ).encode(texts, prompt_name=name)
        assert np.abs(pooled - ours).max() > 1e-3  # leaving the prompt out matters here


@pytest.mark.parametrize(
    ("settings", "remote", "words"),
    [
        ({"pooler": "avg"}, False, "their tokens are pooled with the sentence's"),
        ({"pooler": "avg", "pool_prompt": False}, False, "left out of the pooling"),
        ({"pooler": "avg", "bidirectional": True}, True, "pooled with the sentence's"),
        ({"pooler": "prompt"}, True, "reads them with the sentence inside its template"),
    ],
)
def test_the_card_s_prompt_snippet_loads_the_folder_as_sentence_transformers_must(
    settings: dict[str, Any], remote: bool, words: str
) -> None:
    """A folder whose one module is cselab's (PromptBERT's template, a bidirectional decoder)
    needs ``trust_remote_code`` in sentence-transformers: the card's prompt line says so."""
    from cselab.model.config import ModelConfig
    from cselab.publish.usage import prompt_usage

    text = prompt_usage("org/m", ModelConfig(prompts=PROMPTS, **settings))
    load_line = "SentenceTransformer(model_id, trust_remote_code=True).encode(texts, prompt_name"
    assert (load_line in text) is remote and words in text
    assert ("SentenceTransformer(model_id).encode(texts, prompt_name" in text) is not remote
