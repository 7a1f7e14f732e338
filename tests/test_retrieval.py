"""Retrieval evaluation: the metrics against pytrec_eval, the BEIR reader's errors, the datasets
layout, `cselab evaluate --retrieval`, sentence-transformers' evaluator, model selection."""

from __future__ import annotations

import csv
import json
import re
import zlib
from pathlib import Path

import numpy as np
import pytest
import pytrec_eval
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cselab.core.errors import ConfigError, DataFormatError
from cselab.evaluation import retrieval
from cselab.evaluation.datasets import ScoredPairs
from cselab.io.readers import BeirCollection, is_beir_folder, read_beir

#: Every metric name against its pytrec_eval measure (``recip_rank`` is taken on the run cut
#: at k in trec order, see :func:`trec_reference`).
TREC = {
    "ndcg@1": "ndcg_cut_1", "ndcg@3": "ndcg_cut_3", "ndcg@10": "ndcg_cut_10",
    "recall@1": "recall_1", "recall@5": "recall_5", "recall@100": "recall_100",
    "map@3": "map_cut_3", "map@100": "map_cut_100", "mrr@3": "recip_rank", "mrr@10": "recip_rank",
}  # fmt: skip


def trec_reference(
    collection: BeirCollection, scores: np.ndarray, rows: np.ndarray
) -> dict[str, float]:
    """The mean of each metric of :data:`TREC` as pytrec_eval gives it for the same run."""
    qids, ids = collection.query_ids, collection.doc_ids
    qrels: dict[str, dict[str, int]] = {q: {} for q in qids}
    for q, d, rel in collection.qrels:
        qrels[qids[q]][ids[d]] = rel
    run = {
        qids[q]: {ids[int(r)]: float(s) for s, r in zip(scores[q], rows[q], strict=True)}
        for q in range(len(qids))
    }
    measures = {"ndcg_cut.1,3,10", "recall.1,5,100", "map_cut.3,100"}
    full = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)
    out = {}
    for name, measure in TREC.items():
        if name.startswith("mrr"):
            k = int(name.split("@")[1])
            # trec_eval's own order (score desc, then id desc), cut at k, then recip_rank
            cut = {}
            for q, docs in run.items():
                by_id = sorted(docs.items(), key=lambda item: item[0], reverse=True)
                cut[q] = dict(sorted(by_id, key=lambda item: -item[1])[:k])
            res = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(cut)
        else:
            res = full
        out[name] = float(np.mean([res[q][measure] for q in qids]))
    return out


@st.composite
def runs(draw: st.DrawFn) -> tuple[BeirCollection, np.ndarray, np.ndarray]:
    """A collection with graded judgements (0-3, some queries with none relevant), ids whose
    string order differs from their numeric one, and a run with many tied scores."""
    n_docs = draw(st.integers(1, 25))
    n_queries = draw(st.integers(1, 5))
    ids = draw(st.lists(st.integers(0, 120), min_size=n_docs, max_size=n_docs, unique=True))
    doc_ids = tuple(str(i) for i in ids)
    triples = []
    for q in range(n_queries):
        judged = draw(st.lists(st.integers(0, n_docs - 1), min_size=1, unique=True))
        triples += [(q, d, draw(st.integers(0, 3))) for d in judged]
    depth = draw(st.integers(1, n_docs))
    levels = draw(st.integers(1, 4))  # few distinct scores: ties everywhere
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    scores = rng.integers(0, levels, (n_queries, n_docs)).astype(np.float32) / levels
    rows = np.argsort(-scores, axis=1, kind="stable")[:, :depth]
    shuffle = rng.permuted(np.tile(np.arange(depth), (n_queries, 1)), axis=1)
    rows = np.take_along_axis(rows, shuffle, 1)  # any order within a row
    qids = tuple(f"q{i}" for i in range(n_queries))
    coll = BeirCollection(Path("."), "test", doc_ids, doc_ids, qids, qids, tuple(triples))
    return coll, np.take_along_axis(scores, rows, 1), rows


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs())
def test_metrics_equal_pytrec_eval(case: tuple[BeirCollection, np.ndarray, np.ndarray]) -> None:
    collection, scores, rows = case
    mine = retrieval.score_run(collection, scores, rows, list(TREC))
    reference = trec_reference(collection, scores, rows)
    for name in TREC:
        assert mine[name] == pytest.approx(reference[name], abs=1e-9), name


def test_ties_go_by_document_id_descending_as_strings() -> None:
    """trec_eval's order: "9" before "10", "b" before "ab" (sentence-transformers' evaluator
    puts them the other way round)."""
    ids = ("10", "9", "ab", "b")
    coll = BeirCollection(Path("."), "t", ids, ids, ("q",), ("q",), ((0, 1, 1),))
    scores = np.ones((1, 4), dtype=np.float32)
    rows = np.array([[0, 1, 2, 3]])
    assert retrieval.score_run(coll, scores, rows, ["mrr@10"])["mrr@10"] == pytest.approx(1 / 3)
    assert trec_reference(coll, scores, rows)["mrr@10"] == pytest.approx(1 / 3)


# ----------------------------------------------------------------------------------- reader

CORPUS = [
    ("d1", "", "a man plays a guitar"),
    ("d2", "Music", "a person plays music"),
    ("d3", "", "the cat sleeps on the mat"),
    ("d4", "", "a dog barks at night"),
    ("d5", "", "it is raining in the city"),
    ("d6", "", "markets dropped sharply today"),
]
QUERIES = [("q1", "someone playing an instrument"), ("q2", "rain falls"), ("q3", "unjudged")]
QRELS = [("q1", "d1", 1), ("q1", "d2", 2), ("q2", "d5", 1), ("q2", "d3", 0)]


def write_beir(
    folder: Path,
    corpus: list = CORPUS,
    queries: list = QUERIES,
    qrels: list = QRELS,
    split: str = "dev",
) -> Path:
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    with (folder / "corpus.jsonl").open("w") as fh:
        for i, title, text in corpus:
            fh.write(json.dumps({"_id": i, "title": title, "text": text}) + "\n")
    with (folder / "queries.jsonl").open("w") as fh:
        for i, text in queries:
            fh.write(json.dumps({"_id": i, "text": text}) + "\n")
    lines = ["query-id\tcorpus-id\tscore", *("\t".join(map(str, r)) for r in qrels)]
    (folder / "qrels" / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    return folder


def test_read_beir_joins_title_and_text_and_keeps_judged_queries(tmp_path: Path) -> None:
    c = read_beir(write_beir(tmp_path / "b"), "dev")
    assert is_beir_folder(tmp_path / "b") and not is_beir_folder(tmp_path)
    assert c.doc_texts[1] == "Music a person plays music" and c.doc_texts[0] == CORPUS[0][2]
    assert c.query_ids == ("q1", "q2")  # q3 is not judged in this split
    assert c.qrels == ((0, 0, 1), (0, 1, 2), (1, 4, 1), (1, 2, 0))


@pytest.mark.parametrize(
    ("change", "where", "message"),
    [
        (dict(corpus=[*CORPUS, ("d2", "", "again")]), "corpus.jsonl:7",
         "_id 'd2' appears twice (first on line 2)"),
        (dict(queries=[*QUERIES, ("q1", "again")]), "queries.jsonl:4",
         "_id 'q1' appears twice (first on line 1)"),
        (dict(qrels=[*QRELS, ("q1", "d9", 1)]), "dev.tsv:6", "corpus-id 'd9' is not in corpus.jsonl"),
        (dict(qrels=[("q7", "d1", 1)]), "dev.tsv:2", "query-id 'q7' is not in queries.jsonl"),
        (dict(qrels=[("q1", "d1", "1.5")]), "dev.tsv:2", "score '1.5' is not a non-negative integer"),
        (dict(qrels=[("q1", "d1", "-1")]), "dev.tsv:2", "score '-1' is not a non-negative integer"),
        (dict(qrels=[("q1", "d1", 1), ("q1", "d1", 2)]), "dev.tsv:3",
         "query 'q1' and document 'd1' are judged twice"),
        (dict(corpus=[("d1", "", "")]), "corpus.jsonl:1",
         "the document has no text (columns 'title' and 'text' are empty)"),
    ],
)  # fmt: skip
def test_read_beir_errors_name_file_and_line(
    tmp_path: Path, change: dict, where: str, message: str
) -> None:
    folder = write_beir(tmp_path / "b", **change)
    with pytest.raises(DataFormatError) as err:
        read_beir(folder, "dev")
    assert where in str(err.value) and str(err.value).endswith(message)


def test_read_beir_missing_parts(tmp_path: Path) -> None:
    folder = write_beir(tmp_path / "b")
    with pytest.raises(DataFormatError, match=r"no qrels for split 'test' \(splits: dev\)"):
        read_beir(folder, "test")
    (folder / "queries.jsonl").unlink()
    with pytest.raises(DataFormatError, match=r"queries.jsonl: file not found"):
        read_beir(folder, "dev")
    assert not is_beir_folder(folder)


def test_read_beir_datasets_folders(tmp_path: Path) -> None:
    """The same parts as ``datasets`` save_to_disk folders read as the JSONL files do."""
    import datasets

    folder = tmp_path / "ds"
    datasets.Dataset.from_dict(
        {k: [r[i] for r in CORPUS] for i, k in enumerate(("_id", "title", "text"))}
    ).save_to_disk(str(folder / "corpus"))
    datasets.Dataset.from_dict(
        {k: [r[i] for r in QUERIES] for i, k in enumerate(("_id", "text"))}
    ).save_to_disk(str(folder / "queries"))
    datasets.Dataset.from_dict(
        {k: [r[i] for r in QRELS] for i, k in enumerate(("query-id", "corpus-id", "score"))}
    ).save_to_disk(str(folder / "qrels" / "dev"))
    assert is_beir_folder(folder)
    got, want = read_beir(folder, "dev"), read_beir(write_beir(tmp_path / "b"), "dev")
    assert (got.doc_texts, got.query_texts, got.qrels) == (
        want.doc_texts, want.query_texts, want.qrels,
    )  # fmt: skip


def test_collection_from_sts(tmp_path: Path) -> None:
    pairs = ScoredPairs(
        "toy",
        ("a b", "c d", "a b", "e f", "g h"),
        ("x y", "c d", "z z", "a b", "i j"),
        np.array([4.5, 5.0, 4.0, 4.2, 1.0]),
        tmp_path,
    )
    folder = retrieval.collection_from_sts(pairs, tmp_path / "c")
    c = read_beir(folder, "dev")
    # queries: "a b" (two relevant docs); "e f" is left out (its partner "a b" is a query),
    # so is "c d" (equal to its partner); "g h" scores too low
    assert c.query_texts == ("a b",) and "a b" not in c.doc_texts
    assert sorted(c.doc_texts[d] for _, d, _ in c.qrels) == ["x y", "z z"]
    assert set(c.doc_texts) == {"x y", "c d", "z z", "e f", "g h", "i j"}
    # a file where the collection's folder would go: one line naming it, as other settings are
    (tmp_path / "taken").write_text("x", encoding="utf-8")
    for where, blocker in ((tmp_path / "taken", ""), (tmp_path / "taken/c", "taken")):
        said = f"{where} is under {tmp_path / blocker}, which" if blocker else f"{where}"
        with pytest.raises(ConfigError, match=re.escape(f"{said} is a file, not a folder")):
            retrieval.collection_from_sts(pairs, where)


# ----------------------------------------------------------------------- with an encoder


def bag_of_words(sentences: list[str]) -> np.ndarray:
    """A deterministic stand-in encoder: hashed word counts (32 dims)."""
    out = np.zeros((len(sentences), 32), dtype=np.float32)
    for i, s in enumerate(sentences):
        for w in s.lower().split():
            out[i, zlib.crc32(w.encode()) % 32] += 1.0
    return out


def test_evaluate_retrieval_equals_pytrec_eval_on_exact_search(tmp_path: Path) -> None:
    """Encode, search the whole corpus by cosine (brute force in float64), and hand the run to
    pytrec_eval: the numbers are those of evaluate_retrieval; at a dimension likewise."""
    folder = write_beir(tmp_path / "b")
    c = read_beir(folder, "dev")
    out = retrieval.evaluate_retrieval(bag_of_words, folder, "dev", k=3, dims=[8])
    for dim, metrics in ((None, out["metrics"]), (8, out["dims"]["8"])):
        d = bag_of_words(list(c.doc_texts)).astype(np.float64)[:, :dim]
        q = bag_of_words(list(c.query_texts)).astype(np.float64)[:, :dim]
        d /= np.maximum(np.linalg.norm(d, axis=1, keepdims=True), 1e-30)
        q /= np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-30)
        scores = (q @ d.T).astype(np.float32)
        rows = np.tile(np.arange(len(c.doc_ids)), (len(c.query_ids), 1))
        reference = trec_reference(c, scores, rows)
        for name in ("ndcg@3", "mrr@3", "recall@1", "recall@100", "map@100"):
            assert metrics[name] == pytest.approx(100 * reference[name], abs=1e-6), (dim, name)
    assert out["queries"] == 2 and out["documents"] == 6
    assert list(out["metrics"]) == ["ndcg@3", "mrr@3", "recall@1", "recall@3", "recall@100",
                                    "map@100"]  # fmt: skip


def test_faiss_flat_backend_equals_exact(tmp_path: Path) -> None:
    pytest.importorskip("faiss")
    from cselab.search.index import IndexSettings, vector_search

    folder = write_beir(tmp_path / "b")
    exact = retrieval.evaluate_retrieval(bag_of_words, folder, "dev")
    flat = retrieval.evaluate_retrieval(
        bag_of_words,
        folder,
        "dev",
        search=vector_search(IndexSettings(backend="flat")),
        backend="flat",
    )
    assert flat["metrics"] == pytest.approx(exact["metrics"], abs=1e-9)
    assert flat["backend"] == "flat"


def test_cli_evaluate_retrieval_table_and_json(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from cselab.cli import main
    from cselab.model.encoder import load

    folder = write_beir(tmp_path / "b", split="test")
    out = tmp_path / "res.json"
    assert main(["evaluate", str(tiny_bert), "--retrieval", str(folder), "--k", "5",
                 "--dims", "16", "-o", str(out)]) == 0  # fmt: skip
    table = capsys.readouterr().out
    assert "| dim | ndcg@5 | mrr@5 | recall@1 | recall@5 | recall@100 | map@100 |" in table
    assert "| 16 |" in table and "STS12" not in table
    record = json.loads(out.read_text())
    assert record["pooler"] == load(str(tiny_bert)).pooler.kind  # retrieval alone names it too
    saved = record["results"]["retrieval:b"]
    expected = retrieval.evaluate_retrieval(load(str(tiny_bert)), folder, k=5, dims=[16])
    assert saved["metrics"] == pytest.approx(expected["metrics"], abs=1e-9)
    assert saved["dims"]["16"] == pytest.approx(expected["dims"]["16"], abs=1e-9)
    # bad input: one line each, before the model is loaded
    assert main(["evaluate", "no/such/model", "--retrieval", str(folder), "--split", "dev"]) == 2
    assert "no qrels for split 'dev' (splits: test)" in capsys.readouterr().err
    assert main(["evaluate", str(tiny_bert), "--retrieval", str(folder), "--dims", "999"]) == 2
    assert "--dims 999 is outside 1..32" in capsys.readouterr().err
    assert main(["evaluate", str(tiny_bert), "--k", "5"]) == 2
    assert "--k and --backend go with --retrieval FOLDER" in capsys.readouterr().err


def test_cli_dims_for_sts_files(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``--dims`` on STS: each dimension's numbers are those of the encoder seen at it."""
    from cselab.cli import main
    from cselab.evaluation.custom import PairsScorer, read_sts_file
    from cselab.evaluation.embed import at_dimension
    from cselab.model.encoder import load

    pairs = tmp_path / "p.tsv"
    rows = [("a man plays", "a person plays", 4.2), ("the cat sleeps", "a dog barks", 0.4),
            ("rain falls", "it rains", 4.8), ("stocks fell", "markets dropped", 3.9),
            ("a child reads", "the sun is hot", 0.0), ("she sings", "a woman sings", 4.0)]  # fmt: skip
    pairs.write_text(
        "sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in rows)
    )
    out = tmp_path / "res.json"
    assert main(["evaluate", str(tiny_bert), "--sts-file", str(pairs), "--dims", "8,16",
                 "-o", str(out)]) == 0  # fmt: skip
    assert "**Dimension 8**" in capsys.readouterr().out
    saved = json.loads(out.read_text())
    encoder = load(str(tiny_bert))
    for dim in (8, 16):
        expected = PairsScorer(read_sts_file(pairs))(at_dimension(encoder, dim))
        got = saved["dims"][str(dim)]["results"]["p.tsv"]["spearman"] * 100
        assert got == pytest.approx(expected, abs=1e-9)


def test_equals_sentence_transformers_evaluator(minilm_path: Path, tmp_path: Path) -> None:
    """Binary judgements, one relevant document per query (R <= k) and no tied scores: every
    number equals InformationRetrievalEvaluator's on the same model."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.evaluation import InformationRetrievalEvaluator

    from cselab.model.encoder import load

    qrels = [("q1", "d1", 1), ("q2", "d5", 1), ("q3", "d6", 1), ("q4", "d3", 1), ("q5", "d1", 1)]
    queries = [("q1", "someone playing a guitar"), ("q2", "rain falls"), ("q3", "stocks fell"),
               ("q4", "a dog is sleeping"), ("q5", "music")]  # fmt: skip
    folder = write_beir(tmp_path / "b", queries=queries, qrels=qrels, split="test")
    c = read_beir(folder)
    ours = retrieval.evaluate_retrieval(load(str(minilm_path)), folder, k=3)["metrics"]
    st_eval = InformationRetrievalEvaluator(
        dict(zip(c.query_ids, c.query_texts, strict=True)),
        dict(zip(c.doc_ids, c.doc_texts, strict=True)),
        {c.query_ids[q]: {c.doc_ids[d]} for q, d, _ in c.qrels},
        mrr_at_k=[3], ndcg_at_k=[3], accuracy_at_k=[1], precision_recall_at_k=[1, 3, 100],
        map_at_k=[100], write_csv=False,
    )  # fmt: skip
    theirs = st_eval(SentenceTransformer(str(minilm_path), device="cpu"))
    assert ours["mrr@3"] < 100  # not every relevant document comes first
    for name in ("ndcg@3", "mrr@3", "recall@1", "recall@3", "recall@100", "map@100"):
        assert ours[name] == pytest.approx(100 * theirs[f"cosine_{name}"], abs=1e-9), name


# ------------------------------------------------------------------------- model selection


def test_config_checks_dev_metric_against_dev(tmp_path: Path) -> None:
    from cselab.config import load_config

    folder = write_beir(tmp_path / "b")
    from cselab.config import dev_metric_for

    assert load_config(None, [f"eval.dev={folder}"]).eval.dev_metric is None  # the default
    assert dev_metric_for(str(folder), None) == "ndcg@10"
    assert dev_metric_for("stsb", None) == "spearman"
    assert dev_metric_for(str(folder), "MAP@100") == "map@100"
    for dev, metric, message in (
        (folder, "spearman", "eval.dev_metric=spearman is a correlation of STS pairs"),
        ("stsb", "ndcg@10", "eval.dev_metric=ndcg@10 is a retrieval measure; eval.dev=stsb is not"),
        (folder, "ndcg@7", "eval.dev_metric=ndcg@7: K must be one of 1, 3, 5, 10"),
        (folder, "auc", "eval.dev_metric: unknown metric 'auc'"),
    ):
        with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
            load_config(None, [f"eval.dev={dev}", f"eval.dev_metric={metric}"])


def test_training_selects_on_a_beir_folder(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture, one_thread: None
) -> None:
    from conftest import write_corpus
    from cselab.cli import main

    corpus = write_corpus(tmp_path)
    folder = write_beir(tmp_path / "b")
    out = tmp_path / "out"
    assert main([
        "train", f"--model.name_or_path={tiny_bert}", f"--data.train_file={corpus}",
        f"--data.cache_dir={tmp_path / 'cache'}", "--train.batch_size=8", "--train.max_steps=4",
        "--train.eval_steps=2", f"--eval.dev={folder}", "--eval.dev_metric=mrr@10",
        f"--train.output_dir={out}",
    ]) == 0  # fmt: skip
    assert f"dev_mrr@10 ({folder}): before" in capsys.readouterr().out
    with (out / "metrics.csv").open() as fh:
        logged = [r for r in csv.DictReader(fh) if r.get("dev_mrr@10")]
    assert [int(r["step"]) for r in logged] == [0, 2, 4]
    results = json.loads((out / "results.json").read_text())
    assert results["dev"]["name"] == "dev_mrr@10"
    best = max(logged, key=lambda r: float(r["dev_mrr@10"]))
    assert results["best_dev_mrr@10"] == pytest.approx(float(best["dev_mrr@10"]))
    # the kept model scores what selection recorded
    from cselab.model.encoder import load

    again = retrieval.RetrievalScorer(folder, "dev", ["mrr@10"])(load(str(out / "best")))
    assert again["mrr@10"] == pytest.approx(results["best_dev_mrr@10"], abs=1e-6)
    # the card names the score as a retrieval measure, in its text and its model-index
    from huggingface_hub import ModelCard

    card = ModelCard.load(out / "best" / "README.md")
    assert f"retrieval dev set `{folder.name}` MRR@10" in card.text
    (result,) = [r for r in card.data.eval_results if r.dataset_split == "validation"]
    assert (result.task_type, result.metric_type) == ("retrieval", "mrr_at_10")
    assert result.metric_value == round(results["best_dev_mrr@10"], 2)


@pytest.mark.parametrize("score", ["1e20", "99999999999999999999999"])
def test_a_huge_relevance_is_one_line_in_evaluate_and_train(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture, score: str
) -> None:
    """A relevance past what a float holds exactly was an OverflowError in evaluation and at the
    start of training (issue 31): the reader refuses it, naming file, line and value."""
    from conftest import write_corpus
    from cselab.cli import main

    folder = write_beir(tmp_path / "b", qrels=[*QRELS[:2], ("q2", "d5", score)])
    where = f"{folder / 'qrels' / 'dev.tsv'}:4"
    message = f"{where}: score '{score}' is too large (a relevance is at most 2**53 = {2**53})"
    assert main(["evaluate", str(tiny_bert), "--retrieval", str(folder), "--split", "dev"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"cselab evaluate: error: {message}"
    argv = ["train", f"--model.name_or_path={tiny_bert}", "--model.pooler=avg",
            f"--data.train_file={write_corpus(tmp_path / 'data', 32)}",
            f"--data.cache_dir={tmp_path / 'cache'}", f"--train.output_dir={tmp_path / 'run'}",
            "--train.batch_size=8", "--train.max_steps=2", "--train.eval_steps=1",
            f"--eval.dev={folder}", "--train.device=cpu"]  # fmt: skip
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"cselab train: error: {message}"


def test_cli_evaluate_retrieval_searches_with_its_backend(
    tiny_bert: Path, tmp_path: Path, monkeypatch
) -> None:
    """``--backend flat`` is the search that runs (FAISS), not only the label of the results."""
    pytest.importorskip("faiss")
    import cselab.search.index as index_module
    from cselab.cli import main

    asked: list[str] = []
    real = index_module.vector_search

    def search(settings=None):
        asked.append(settings.backend)
        return real(settings)

    monkeypatch.setattr(index_module, "vector_search", search)
    folder = write_beir(tmp_path / "b", split="test")
    out = tmp_path / "res.json"
    assert main(["-q", "evaluate", str(tiny_bert), "--retrieval", str(folder), "--backend",
                 "flat", "-o", str(out)]) == 0  # fmt: skip
    assert asked == ["flat"]
    assert json.loads(out.read_text())["results"]["retrieval:b"]["backend"] == "flat"
