"""Similarity and search: cosine matrix, exact top-k vs brute force, resumable builds, FAISS
backends, and one-line CLI errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import cselab
from conftest import write_corpus
from cselab.cli import main
from cselab.core.errors import IndexSettingError
from cselab.model.encoder import SentenceEncoder
from cselab.model.similarity import cosine_matrix
from cselab.search.index import (
    PROGRESS_FILE,
    Index,
    IndexSettings,
    SearchIndexError,
    build_faiss,
    exact_topk,
)


def brute_force_topk(queries: np.ndarray, vectors: np.ndarray, k: int):
    """Reference: float64 cosines of every pair, fully sorted (score desc, row asc)."""
    q = np.asarray(queries, dtype=np.float64)
    v = np.asarray(vectors, dtype=np.float64)
    q = q / np.linalg.norm(q, axis=1, keepdims=True)
    v = v / np.linalg.norm(v, axis=1, keepdims=True)
    scores = q @ v.T
    rows = np.array([sorted(range(len(v)), key=lambda j, r=r: (-r[j], j))[:k] for r in scores])
    return np.take_along_axis(scores, rows, 1), rows


@pytest.fixture(scope="module")
def encoder(tiny_bert: Path, one_thread) -> SentenceEncoder:
    return SentenceEncoder.from_pretrained(str(tiny_bert), pooler="avg").eval()


@pytest.fixture(scope="module")
def saved_model(encoder: SentenceEncoder, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("model") / "m"
    encoder.save(folder)
    return folder


# ------------------------------------------------------------------------------------- cosine
def test_cosine_matrix_matches_float64_definition() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((5, 16)) * 7, rng.standard_normal((3, 16))
    b[1] = 0.0  # a zero vector: cosine 0, not NaN
    want = np.zeros((5, 3))
    for i in range(5):
        for j in range(3):
            nb = np.linalg.norm(b[j])
            want[i, j] = 0.0 if nb == 0 else a[i] @ b[j] / (np.linalg.norm(a[i]) * nb)
    got = cosine_matrix(a, b)
    assert got.dtype == np.float32 and got.shape == (5, 3)
    # float32 rounding of unit-norm dot products of width 16: a few eps of float32.
    np.testing.assert_allclose(got, want, rtol=0, atol=16 * 16 * np.finfo(np.float32).eps)


def test_encoder_similarity(encoder: SentenceEncoder) -> None:
    a = ["a man plays a guitar .", "the cat sleeps ."]
    b = ["someone is playing music .", "a dog runs .", "the cat sleeps ."]
    sim = encoder.similarity(a, b, batch_size=2)
    assert sim.shape == (2, 3)
    va, vb = encoder.encode(a).astype(np.float64), encoder.encode(b).astype(np.float64)
    want = (va / np.linalg.norm(va, axis=1)[:, None]) @ (vb / np.linalg.norm(vb, axis=1)[:, None]).T
    np.testing.assert_allclose(sim, want, rtol=0, atol=1e-5)
    assert sim[1, 2] == pytest.approx(1.0, abs=1e-5)  # identical sentence
    np.testing.assert_array_equal(encoder.similarity(va, b), encoder.similarity(a, b))
    with pytest.raises(TypeError, match="single string"):
        encoder.similarity("one", b)


# -------------------------------------------------------------------------------------- exact
@pytest.mark.parametrize("block_rows", [7, 64, 10_000])
def test_exact_topk_equals_brute_force(block_rows: int) -> None:
    rng = np.random.default_rng(1)
    vectors = rng.standard_normal((300, 24)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    queries = rng.standard_normal((9, 24)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    scores, rows = exact_topk(queries, vectors, k=10, block_rows=block_rows)
    want_s, want_r = brute_force_topk(queries, vectors, 10)
    np.testing.assert_array_equal(rows, want_r)
    np.testing.assert_allclose(scores, want_s, rtol=0, atol=24 * np.finfo(np.float32).eps)


def test_exact_topk_ties_and_small_n() -> None:
    vectors = np.array([[1, 0], [0, 1], [1, 0], [-1, 0]], dtype=np.float32)
    scores, rows = exact_topk(np.array([[1, 0]], dtype=np.float32), vectors, k=10, block_rows=3)
    assert rows.tolist() == [[0, 2, 1, 3]]  # k clipped to N; tie broken by row
    assert scores.tolist() == [[1, 1, 0, -1]]


# -------------------------------------------------------------------------------------- build
def test_build_and_search_matches_brute_force(
    encoder: SentenceEncoder, saved_model: Path, tmp_path: Path
) -> None:
    corpus = write_corpus(tmp_path, n=60)
    with corpus.open("a") as fh:
        fh.write("\n   \nlast line after blanks\n")
    lines = corpus.read_text().split("\n")[:-1]
    index = cselab.Index.build(
        corpus, str(saved_model), tmp_path / "my.index", IndexSettings(chunk_size=16)
    )
    keep = [i for i, t in enumerate(lines) if t.strip()]
    assert len(index) == len(keep) == 61
    assert index.text(60) == "last line after blanks" and int(index.lines[60]) == len(lines)
    assert [int(index.lines[r]) for r in range(3)] == [1, 2, 3]
    queries = ["alpha beta gamma", "zeta eta theta iota"]
    hits = Index.open(tmp_path / "my.index").search(queries, k=5)
    corpus_vec = encoder.encode([lines[i] for i in keep])
    want_s, want_r = brute_force_topk(encoder.encode(queries), corpus_vec, 5)
    for q_hits, ws, wr in zip(hits, want_s, want_r, strict=True):
        got_rows = [h.row for h in q_hits]
        # Rows with equal text tie exactly; compare the texts and the scores.
        assert [index.text(r) for r in got_rows] == [index.text(r) for r in wr]
        np.testing.assert_allclose([h.score for h in q_hits], ws, rtol=0, atol=1e-5)
        assert all(h.text == lines[h.line - 1] for h in q_hits)
        assert [h.rank for h in q_hits] == [1, 2, 3, 4, 5]
    single = index.search("alpha beta gamma", k=2)
    assert [h.row for h in single] == [h.row for h in hits[0][:2]]


def test_resume_after_interruption_gives_same_index(
    encoder: SentenceEncoder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = write_corpus(tmp_path, n=70)
    full = Index.build(corpus, encoder, tmp_path / "full.index", IndexSettings(chunk_size=16))

    calls = {"n": 0}
    real_encode = encoder.encode

    def failing_encode(texts, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # Ctrl-C during the third chunk
        return real_encode(texts, **kwargs)

    monkeypatch.setattr(encoder, "encode", failing_encode)
    with pytest.raises(KeyboardInterrupt):
        Index.build(corpus, encoder, tmp_path / "part.index", IndexSettings(chunk_size=16))
    progress = json.loads((tmp_path / "part.index" / PROGRESS_FILE).read_text())
    assert progress == {"chunks_done": 2}
    with pytest.raises(SearchIndexError, match=r"incomplete index \(2 of 5 chunks"):
        Index.open(tmp_path / "part.index")

    calls["n"] = -100  # no more failures; count the resumed chunks
    resumed = Index.build(corpus, encoder, tmp_path / "part.index", IndexSettings(chunk_size=16))
    assert calls["n"] == -100 + 3  # only chunks 3, 4 and 5 were encoded again
    np.testing.assert_array_equal(np.asarray(resumed.vectors), np.asarray(full.vectors))
    assert [resumed.text(i) for i in range(len(resumed))] == [full.text(i) for i in range(70)]


def test_resume_refuses_other_settings(encoder: SentenceEncoder, tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path, n=20)
    Index.build(corpus, encoder, tmp_path / "x.index", IndexSettings(chunk_size=8))
    with pytest.raises(SearchIndexError, match="chunk_size 8 is there, not 4; pass overwrite=True"):
        Index.build(corpus, encoder, tmp_path / "x.index", IndexSettings(chunk_size=4))
    corpus.write_text("a changed corpus\n")
    with pytest.raises(SearchIndexError, match="an index with corpus_sha256"):
        Index.build(corpus, encoder, tmp_path / "x.index", IndexSettings(chunk_size=8))
    rebuilt = Index.build(
        corpus, encoder, tmp_path / "x.index", IndexSettings(chunk_size=8), overwrite=True
    )
    assert len(rebuilt) == 1 and rebuilt.text(0) == "a changed corpus"


def test_from_vectors(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    vectors = rng.standard_normal((50, 8)).astype(np.float32) * 3
    texts = [f"text {i}" for i in range(50)]
    index = Index.from_vectors(tmp_path / "v.index", vectors, texts, "org/m", "avg", block_rows=7)
    reopened = Index.open(tmp_path / "v.index")
    assert len(reopened) == 50 and reopened.text(49) == "text 49" and int(reopened.lines[0]) == 1
    assert reopened.meta["model"] == "org/m" and reopened.meta["pooler"] == "avg"
    scores, rows = index.search_vectors(vectors[:5], k=1)
    assert rows[:, 0].tolist() == [0, 1, 2, 3, 4]
    np.testing.assert_allclose(scores[:, 0], 1.0, rtol=0, atol=8 * np.finfo(np.float32).eps)
    with pytest.raises(SearchIndexError, match="50 vectors but 3 texts"):
        Index.from_vectors(tmp_path / "w.index", vectors, texts[:3], "org/m", "avg")


# -------------------------------------------------------------------------------------- faiss
def _unit(n: int, d: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_faiss_flat_equals_exact() -> None:
    pytest.importorskip("faiss")
    vectors, queries = _unit(500, 32, 2), _unit(20, 32, 3)
    flat = build_faiss(vectors, "flat", {})
    f_scores, f_rows = flat.search(queries, 10)
    e_scores, e_rows = exact_topk(queries, vectors, 10)
    np.testing.assert_array_equal(f_rows, e_rows)
    np.testing.assert_allclose(f_scores, e_scores, rtol=0, atol=32 * np.finfo(np.float32).eps)


@pytest.mark.parametrize("backend", ["hnsw", "ivf"])
def test_approximate_recall_is_sane(encoder: SentenceEncoder, tmp_path: Path, backend: str) -> None:
    pytest.importorskip("faiss")
    corpus = write_corpus(tmp_path, n=30)
    index = Index.build(
        corpus, encoder, tmp_path / "a.index", IndexSettings(chunk_size=30, backend=backend)
    )
    assert index.default_backend() == backend
    # Swap in 4,000 clustered unit vectors (the tiny model's vectors are too few to matter).
    rng = np.random.default_rng(4)
    centres = _unit(40, 32, 5)
    vectors = centres[rng.integers(0, 40, 4000)] + 0.3 * _unit(4000, 32, 6)
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    queries = vectors[rng.integers(0, 4000, 50)] + 0.1 * _unit(50, 32, 7)
    index.vectors = vectors
    index.meta["ann"][backend] = {"hnsw": {"m": 16, "ef_construction": 40, "ef_search": 64},
                                  "ivf": {"nlist": 64, "nprobe": 8}}[backend]  # fmt: skip
    index._ann[backend] = build_faiss(vectors, backend, index.meta["ann"][backend])
    _, approx = index.search_vectors(queries, 10, backend=backend)
    _, exact = index.search_vectors(queries, 10, backend="exact")
    recall = np.mean([len(set(a) & set(e)) / 10 for a, e in zip(approx, exact, strict=True)])
    assert recall >= 0.9
    if backend == "ivf":  # one cell of 64: recall drops, and the knob is honoured
        _, one = index.search_vectors(queries, 10, backend=backend, nprobe=1)
        low = np.mean([len(set(a) & set(e)) / 10 for a, e in zip(one, exact, strict=True)])
        assert low < recall
    # a depth below 1 is refused by name (0 searched at the default depth without a word)
    for name in ("k", "nprobe", "ef_search"):
        kwargs = {"k": 10, name: 0}
        with pytest.raises(IndexSettingError, match=f"{name}=0 is refused: it must be at least 1"):
            index.search_vectors(queries, backend=backend, **kwargs)


def test_ann_index_is_saved_and_reloaded(encoder: SentenceEncoder, tmp_path: Path) -> None:
    pytest.importorskip("faiss")
    corpus = write_corpus(tmp_path, n=80)
    Index.build(corpus, encoder, tmp_path / "h.index", IndexSettings(chunk_size=32))
    built = Index.build(
        corpus, encoder, tmp_path / "h.index", IndexSettings(chunk_size=32, backend="hnsw")
    )
    assert (tmp_path / "h.index" / "faiss-hnsw.index").is_file()
    reopened = Index.open(tmp_path / "h.index", model=encoder)
    assert reopened.default_backend() == "hnsw"
    q = encoder.encode(["alpha beta gamma delta"], normalize=True)
    np.testing.assert_array_equal(
        reopened.search_vectors(q, 5)[1], built.search_vectors(q, 5, backend="hnsw")[1]
    )
    with pytest.raises(SearchIndexError, match="no ivf index was built"):
        reopened.search_vectors(q, 5, backend="ivf")


# ---------------------------------------------------------------------------------------- CLI
def test_cli_build_and_search(saved_model: Path, tmp_path: Path, capsys) -> None:
    corpus = write_corpus(tmp_path, n=40)
    out = tmp_path / "cli.index"
    assert main(["-q", "index", "build", str(corpus), "--model", str(saved_model),
                 "-o", str(out), "--chunk-size", "16"]) == 0  # fmt: skip
    assert "40 lines" in capsys.readouterr().out
    (tmp_path / "q.txt").write_text("alpha beta\n\ngamma delta epsilon\n")
    assert (
        main(["search", str(out), "--queries", str(tmp_path / "q.txt"), "-k", "3", "--json"]) == 0
    )
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["query"] for r in rows] == ["alpha beta", "gamma delta epsilon"]
    api = Index.open(out).search(["alpha beta", "gamma delta epsilon"], k=3)
    assert [[h["row"] for h in r["hits"]] for r in rows] == [[h.row for h in q] for q in api]
    assert main(["search", str(out), "alpha beta", "-k", "2"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0] == "# alpha beta" and len(text) == 3 and text[1].startswith("1\t")


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["search", "{tmp}/none.index", "q"], "none.index: not a cselab index (no index.json)"),
        (["search", "{idx}"], "give either a QUERY or --queries FILE"),
        (["search", "{idx}", "--queries", "{tmp}/nq.txt"], "nq.txt: queries file not found"),
        (
            ["index", "build", "{tmp}/nc.txt", "--model", "{model}", "-o", "{tmp}/o"],
            "nc.txt: corpus file not found",
        ),  # fmt: skip
        (  # the reader's words, as `cselab encode` and a search's queries file say it
            ["index", "build", "{tmp}", "--model", "{model}", "-o", "{tmp}/o"],
            "corpus file is a folder, not a text file",
        ),  # fmt: skip
        (
            ["index", "build", "{tmp}/bad.txt", "--model", "{model}", "-o", "{tmp}/o"],
            "bad.txt:2: invalid UTF-8 at byte 3 of the line",
        ),  # fmt: skip
        (
            ["index", "build", "{tmp}/blank.txt", "--model", "{model}", "-o", "{tmp}/o"],
            "blank.txt: corpus file has no non-blank line",
        ),  # fmt: skip
    ],
)
def test_cli_errors_are_one_line(
    argv: list[str], needle: str, saved_model: Path, tmp_path: Path, capsys
) -> None:
    corpus = write_corpus(tmp_path, n=10)
    idx = tmp_path / "ok.index"
    assert (
        main(["-q", "index", "build", str(corpus), "--model", str(saved_model), "-o", str(idx)])
        == 0
    )
    (tmp_path / "bad.txt").write_bytes(b"fine\nbad\xff\xfe line\n")
    (tmp_path / "blank.txt").write_text("\n  \n")
    capsys.readouterr()
    argv = [a.format(tmp=tmp_path, idx=idx, model=saved_model) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1 and "Traceback" not in err


# ------------------------------------------------- every setting reaches what it sets (issue 28)
@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"pooler": "max"}, "pooler='max' is unknown; choose one of"),
        ({"chunk_size": 0}, "chunk_size=0 is refused: it must be at least 1"),
        ({"nlist": 0}, "nlist=0 is refused: it must be at least 1"),
        ({"hnsw_m": 0}, "hnsw_m=0 is refused"),
        ({"batch_size": 0}, "batch_size=0 is refused"),
        ({"backend": "flat"}, "backend='flat' is unknown; choose one of exact, hnsw, ivf"),
    ],
)
def test_index_settings_refuse_each_setting_by_name(given: dict, message: str) -> None:
    from cselab.core.errors import SettingError
    from cselab.search.settings import IndexSettings

    with pytest.raises(SettingError, match=message) as err:
        IndexSettings(**given).validate()
    assert (err.value.setting, err.value.value) == next(iter(given.items()))


def test_index_settings_open_a_model_with_their_pooler(tiny_bert: Path) -> None:
    from cselab.search.settings import IndexSettings

    assert cselab.load(str(tiny_bert)).pooler.kind != "avg"
    assert IndexSettings(pooler="avg", device="cpu").load(str(tiny_bert)).pooler.kind == "avg"


def test_hnsw_settings_reach_faiss(tiny_bert: Path, tmp_path: Path) -> None:
    pytest.importorskip("faiss")
    from cselab.search.settings import IndexSettings

    corpus = write_corpus(tmp_path, n=40)
    settings = IndexSettings(backend="hnsw", hnsw_m=6, ef_construction=20)
    index = Index.build(corpus, str(tiny_bert), tmp_path / "h.index", settings)
    faiss_index = Index.open(index.path)._faiss_index("hnsw")
    assert (faiss_index.hnsw.nb_neighbors(1), faiss_index.hnsw.efConstruction) == (6, 20)
