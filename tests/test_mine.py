"""search.mine / `cselab mine`: the same negatives as sentence-transformers' miner, each filter
on a hand-made example, and the output read by training as it is."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import pytest

from conftest import WIKI
from cselab.cli import main
from cselab.core.errors import ConfigError
from cselab.data.config import PairColumns
from cselab.data.pairs import read_pairs
from cselab.search.mine import MineSettings, mine_hard_negatives, select_negatives
from cselab.search.settings import IndexSettings


# ------------------------------------------------------------------ against sentence-transformers
def _wiki_pairs(n: int) -> list[tuple[str, str]]:
    """Anchors are the first half of a wiki line, positives the line; every 10th anchor is
    repeated with a second positive (an anchor with two positives). No anchor is a corpus text,
    where sentence-transformers and cselab differ on purpose (see search.mine)."""
    if not WIKI.is_file():
        pytest.skip("shared wiki sentences not found")
    lines = [t.strip() for t in WIKI.read_text(encoding="utf-8").splitlines()]
    lines = [t for t in lines if len(t.split()) >= 8][: n + n // 10]
    pairs = [(" ".join(t.split()[: len(t.split()) // 2]), t) for t in lines[:n]]
    extra = [(pairs[i][0], lines[n + j]) for j, i in enumerate(range(0, n, 10))]
    return pairs + extra


class _Cached:
    """A cselab encoder whose vectors are computed once per text (the settings below search the
    same texts: encoding them again would only cost time)."""

    def __init__(self, encoder) -> None:
        self.encoder, self.vectors = encoder, {}
        self.pooler, self.dim, self.source = encoder.pooler, encoder.dim, encoder.source

    def encode(self, texts, batch_size: int = 128, normalize: bool = False) -> np.ndarray:
        new = [t for t in dict.fromkeys(texts) if t not in self.vectors]
        if new:
            vectors = self.encoder.encode(new, batch_size=batch_size, normalize=normalize)
            self.vectors.update(zip(new, vectors, strict=True))
        return np.stack([self.vectors[t] for t in texts])


@pytest.fixture(scope="module")
def models(minilm_path: Path, tmp_path_factory: pytest.TempPathFactory):
    st = pytest.importorskip("sentence_transformers")
    from cselab.model.encoder import load

    st_model = st.SentenceTransformer(str(minilm_path), device="cpu")
    return _Cached(load(str(minilm_path))), st_model, tmp_path_factory.mktemp("st-cache")


SETTINGS = {
    "plain": {},
    "range": {"range_min": 2, "range_max": 9},
    "max_score": {"max_score": 0.55},
    "absolute_margin": {"absolute_margin": 0.1, "num_negatives": 2},
    "relative_margin": {"relative_margin": 0.2, "num_negatives": 2},
    "n-tuple": {"relative_margin": 0.05, "output_format": "n-tuple", "num_negatives": 2},
    "faiss": {"range_min": 1, "max_score": 0.6, "use_faiss": True},  # cselab: backend flat
}


@pytest.mark.parametrize("name", list(SETTINGS))
def test_same_negatives_as_sentence_transformers(models, name: str) -> None:
    from datasets import Dataset
    from sentence_transformers.util import mine_hard_negatives as st_mine

    encoder, st_model, cache = models
    pairs = _wiki_pairs(60)
    kwargs = SETTINGS[name]
    st_kwargs = dict(kwargs)
    if "absolute_margin" not in inspect.signature(st_mine).parameters:  # before v5: `margin`
        if "relative_margin" in kwargs:
            pytest.skip("this sentence-transformers has no relative_margin")
        if "absolute_margin" in st_kwargs:
            st_kwargs["margin"] = st_kwargs.pop("absolute_margin")
    backend = "exact"
    if st_kwargs.pop("use_faiss", False):
        pytest.importorskip("faiss")
        backend, st_kwargs["use_faiss"] = "flat", True
        kwargs = {k: v for k, v in kwargs.items() if k != "use_faiss"}
    settings = MineSettings(**kwargs, index=IndexSettings(backend=backend))
    ours = mine_hard_negatives(encoder, pairs, None, settings)
    data = Dataset.from_dict({"anchor": [a for a, _ in pairs], "positive": [p for _, p in pairs]})
    if "cache_folder" in inspect.signature(st_mine).parameters:  # the same texts, encoded once
        st_kwargs["cache_folder"] = str(cache)
    theirs = st_mine(data, st_model, verbose=False, batch_size=64, **st_kwargs)
    expected = [tuple(r[c] for c in theirs.column_names) for r in theirs]
    assert list(theirs.column_names) == ours.header
    assert ours.rows == expected
    assert len(expected) > 20  # the filters leave something to compare


# ------------------------------------------------------------------------ each filter, by hand
def _select(settings: MineSettings, own=(7,), positive=0.8, pool=None, **kw):
    # candidates 0..9 with cosines 0.9, 0.85, ..., 0.45; row 7 (score 0.55) is the positive
    scores = np.array([0.9 - 0.05 * i for i in range(10)], dtype=np.float32)
    rows = np.arange(10)
    pool = pool if pool is not None else 10
    return select_negatives(scores, rows, own, positive, pool, settings, **kw).tolist()


def test_each_filter_on_a_hand_made_example() -> None:
    assert _select(MineSettings(num_negatives=3, range_max=10)) == [0, 1, 2]
    # the anchor's positives never, whatever their score
    assert _select(MineSettings(num_negatives=3, range_max=10), own=(0, 2)) == [1, 3, 4]
    # ranks counted among the candidates that pass: 0, 1 skipped, then 2 (0 and 1 were 'own')
    assert _select(MineSettings(num_negatives=2, range_min=1, range_max=10), own=(0,)) == [2, 3]
    assert _select(MineSettings(num_negatives=5, range_min=2, range_max=4)) == [2, 3]
    assert _select(MineSettings(num_negatives=2, max_score=0.8, range_max=10)) == [2, 3]
    # absolute: score <= 0.8 - 0.1; relative: score <= 0.8 - 0.8 * 0.25 = 0.6
    assert _select(MineSettings(num_negatives=2, absolute_margin=0.1, range_max=10)) == [4, 5]
    assert _select(MineSettings(num_negatives=2, relative_margin=0.25, range_max=10)) == [6, 8]
    # a negative positive score: the threshold is pos - |pos| * r, below pos (not above it)
    got = _select(MineSettings(num_negatives=1, relative_margin=0.5, range_max=10), positive=-0.1)
    assert got == []
    # the pool: only the first `pool` results are candidates
    assert _select(MineSettings(num_negatives=5, range_max=10), pool=3) == [0, 1, 2]


def test_the_anchors_own_text_is_never_a_negative_and_fills_its_reserved_place() -> None:
    """As sentence-transformers 6.3: the pool holds one place for the anchor's own text
    (``range_max + P + 1`` candidates), which is masked when found there."""
    scores = np.array([1.0, 0.7, 0.6, 0.5], dtype=np.float32)
    rows = np.array([3, 1, 2, 0])
    settings = MineSettings(num_negatives=3, range_max=10)
    got = select_negatives(scores, rows, [9], 0.9, 3, settings, same_text={3}.__contains__)
    assert got.tolist() == [1, 2]  # row 3 is the anchor: its place in the pool of 3 goes unused
    assert select_negatives(scores, rows, [9], 0.9, 3, settings).tolist() == [3, 1, 2]


def test_random_sampling_is_a_seeded_sample_of_the_window_in_score_order() -> None:
    settings = MineSettings(num_negatives=3, range_max=10, sampling="random", seed=1)
    draws = {tuple(_select(settings, rng=np.random.default_rng(s))) for s in range(20)}
    assert len(draws) > 5
    for draw in draws:
        assert len(draw) == 3 and list(draw) == sorted(draw) and 7 not in draw
    again = _select(settings, rng=np.random.default_rng(3))
    assert again == _select(settings, rng=np.random.default_rng(3))


def test_options_are_refused_with_their_name() -> None:
    for kwargs, message in [
        ({"num_negatives": 0}, "num_negatives=0 is refused: it must be at least 1"),
        ({"range_min": -1}, "range_min=-1 is refused: it must be 0 or more"),
        ({"seed": -1}, "seed=-1 is refused: it must be 0 or more"),
        (
            {"range_min": 3, "range_max": 4, "num_negatives": 2},
            "range_max=4 leaves 1 candidates after the 3 top",
        ),
        ({"relative_margin": 1.5}, r"relative_margin=1\.5 is refused: it must be in \[0, 1\)"),
        ({"max_score": float("nan")}, "max_score=nan is refused: it must be a finite number"),
    ]:
        with pytest.raises(ConfigError, match=message):
            MineSettings(**kwargs).validate()


# ------------------------------------------------------------------------------ the command
def _write_pairs(path: Path, n: int = 24) -> Path:
    words = ["red", "blue", "green", "cat", "dog", "bird", "runs", "sleeps", "sings", "fast"]
    rows = [
        {"q": f"{words[i % 10]} {words[(i * 3) % 10]} {i}",
         "doc": f"the {words[(i * 7) % 10]} {words[i % 10]} thing number {i}"}
        for i in range(n)
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_cli_writes_triplets_that_training_reads_as_they_are(
    tiny_bert: Path, tmp_path: Path
) -> None:
    pairs = _write_pairs(tmp_path / "pairs.jsonl")
    out = tmp_path / "triplets.tsv"
    argv = ["-q", "mine", str(pairs), "--model", str(tiny_bert), "-o", str(out),
            "--anchor-column", "q", "--positive-column", "doc", "--num-negatives", "2"]  # fmt: skip
    assert main(argv) == 0
    records = read_pairs(out)
    assert len(records) == 48 and len(records.negatives) == 1
    for a, p, n in zip(records.anchors, records.positives, records.negatives[0], strict=True):
        assert n != p and n != a
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left
    train = ["-q", "train", f"--model.name_or_path={tiny_bert}", "--model.pooler=avg",
             f"--data.train_file={out}", f"--data.cache_dir={tmp_path / 'cache'}",
             f"--train.output_dir={tmp_path / 'run'}", "--train.batch_size=8",
             "--train.max_steps=2", "--train.eval_steps=0", "--train.device=cpu",
             "--objective.hard_negative_weight=0"]  # fmt: skip
    assert main(train) == 0

    ntuple = tmp_path / "tuples.csv"
    argv = [*argv[:6], str(ntuple), *argv[7:], "--output-format", "n-tuple"]
    assert main(argv) == 0
    columns = PairColumns(negative=["negative_1", "negative_2"])
    assert len(read_pairs(ntuple, columns).negatives) == 2


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--num-negatives", "0"], "--num-negatives 0 is refused: it must be at least 1"),
        (["--range-min", "-2"], "--range-min -2 is refused: it must be 0 or more"),
        (
            ["--anchor-column", "query"],
            "no column 'query' in the first object (the file has columns: q, doc); name the columns with --anchor-column",
        ),
        (["--relative-margin", "5"], "--relative-margin 5.0 is refused: it must be in [0, 1)"),
        (["--margin", "nan"], "--margin nan is refused: it must be a finite number"),
        (
            ["--range-min", "3", "--range-max", "4"],
            "--range-max 4 leaves 1 candidates after the 3 top ranks skipped, fewer than the 3",
        ),
    ],
)
def test_cli_errors_are_one_line(tiny_bert: Path, tmp_path: Path, capsys, extra, message) -> None:
    pairs = _write_pairs(tmp_path / "pairs.jsonl")
    argv = ["mine", str(pairs), "--model", str(tiny_bert), "-o", str(tmp_path / "o.tsv"),
            "--positive-column", "doc", *extra]  # fmt: skip
    if "--anchor-column" not in extra:
        argv += ["--anchor-column", "q"]
    assert main(argv) == 2
    # stderr also carries the progress bars; the error is one line of its own
    err = [x for x in capsys.readouterr().err.splitlines() if "error" in x]
    assert len(err) == 1 and err[0].startswith("cselab mine: error: ") and message in err[0]
    assert not (tmp_path / "o.tsv").exists()


def test_a_corpus_file_without_text_is_refused_as_for_index_build(
    tiny_bert: Path, tmp_path: Path, capsys
) -> None:
    """An empty or blank --corpus is a wrong file, as a search corpus or a training corpus is:
    refused, not mined as if it had not been given."""
    pairs = _write_pairs(tmp_path / "pairs.jsonl")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n  \n")
    argv = ["mine", str(pairs), "--model", str(tiny_bert), "-o", str(tmp_path / "o.tsv"),
            "--anchor-column", "q", "--positive-column", "doc", "--corpus", str(corpus)]  # fmt: skip
    assert main(argv) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if "error" in x]
    assert err == [f"cselab mine: error: {corpus}: corpus file has no non-blank line"]
    assert not (tmp_path / "o.tsv").exists()


def test_an_unclosed_quote_in_a_csv_pairs_file_is_named_where_it_opens(
    tmp_path: Path, capsys
) -> None:
    lines = ["anchor,positive", *(f"a{i},b{i}" for i in range(2, 61))]
    lines[36] = '"broken, here'
    pairs = tmp_path / "open37.csv"
    pairs.write_text("\n".join(lines) + "\n")
    out = tmp_path / "o.tsv"
    assert main(["mine", str(pairs), "--model", str(tmp_path / "no-model"), "-o", str(out)]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if "error" in x]
    assert err == [f"cselab mine: error: {pairs}:37: a quote opened here is never closed"]
    assert not out.exists()


def test_unknown_output_format_is_refused_before_any_work(tiny_bert: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"o\.txt: the output must end in"):
        mine_hard_negatives(str(tiny_bert), [("a b", "c d")], tmp_path / "o.txt")


def test_a_corpus_file_adds_candidates_once_and_never_the_anchor_itself(
    tiny_bert: Path, tmp_path: Path
) -> None:
    pairs = [("red cat runs", "a red cat is running"), ("blue dog sleeps", "the dog sleeps")]
    corpus = tmp_path / "corpus.txt"
    # the anchors themselves, a positive and a text twice: each is one candidate
    corpus.write_text("red cat runs\nblue dog sleeps\nthe dog sleeps\ngreen bird\ngreen bird\n")
    report = mine_hard_negatives(
        str(tiny_bert), pairs, None, MineSettings(num_negatives=5), corpus=corpus
    )
    assert report.corpus == 5  # 3 distinct corpus lines + "a red cat is running" + "green bird"
    negatives = {a: [n for a2, _, n in report.rows if a2 == a] for a, _ in pairs}
    assert sorted(negatives["red cat runs"]) == ["blue dog sleeps", "green bird", "the dog sleeps"]
    assert sorted(negatives["blue dog sleeps"]) == [
        "a red cat is running",
        "green bird",
        "red cat runs",
    ]
    assert report.short == 2  # 5 asked, 3 there


def test_output_in_a_missing_folder_is_refused_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="its folder does not exist"):
        mine_hard_negatives("no-model", [("a b", "c d")], tmp_path / "nope" / "o.tsv")


# ------------------------------------------------------------- the input and outputs (issue 31)
@pytest.mark.parametrize("link", ["same", "symlink", "hardlink"])
def test_an_output_that_is_the_input_is_refused_before_encoding(
    tmp_path: Path, capsys, link: str
) -> None:
    pairs = _write_pairs(tmp_path / "pairs.jsonl")
    before = pairs.read_bytes()
    out = pairs if link == "same" else tmp_path / "out.jsonl"
    if link == "symlink":
        out.symlink_to(pairs)
    elif link == "hardlink":
        out.hardlink_to(pairs)
    # a model that does not exist: the refusal must come before it is opened
    argv = ["mine", str(pairs), "--model", str(tmp_path / "no-model"), "-o", str(out),
            "--anchor-column", "q", "--positive-column", "doc"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"cselab mine: error: {out}: is the pairs file {pairs} (writing it would replace the "
        "input); choose another output file"
    ]
    assert pairs.read_bytes() == before


def test_the_corpus_file_as_output_is_refused(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.tsv"
    corpus.write_text("x\n")
    with pytest.raises(ConfigError, match="is the corpus file"):
        mine_hard_negatives("no-model", [("a b", "c d")], corpus, corpus=corpus)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--sampling", "random", "--seed", "-1"], "--seed -1 is refused: it must be 0 or more"),
        (["-o", "{tmp}/folder.tsv"], "folder.tsv: is a folder; name the output file"),
    ],
)
def test_settings_and_outputs_are_checked_before_the_model_opens(
    tmp_path: Path, capsys, extra: list[str], message: str
) -> None:
    (tmp_path / "folder.tsv").mkdir()
    pairs = _write_pairs(tmp_path / "pairs.jsonl")
    argv = ["mine", str(pairs), "--model", str(tmp_path / "no-model"), "-o",
            str(tmp_path / "o.tsv"), "--anchor-column", "q", "--positive-column", "doc",
            *(x.format(tmp=tmp_path) for x in extra)]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("cselab mine: error: ") and message in err[0]


def test_a_killed_runs_working_folder_is_removed_and_a_live_one_kept(
    tiny_bert: Path, tmp_path: Path
) -> None:
    from cselab.io.runfolder import RunFolder

    pairs = _write_pairs(tmp_path / "pairs.jsonl", n=6)
    # what a run killed by SIGKILL leaves: its working folder, the lock file and a partial index
    dead = tmp_path / ".cselab-mine-0123456789ab"
    (dead / "corpus.index").mkdir(parents=True)
    (dead / RunFolder.LOCK).write_text("12345\n")
    (dead / "corpus.index" / "vectors.npy").write_bytes(b"\0" * 4096)
    live = tmp_path / ".cselab-mine-live00000000"
    argv = ["-q", "mine", str(pairs), "--model", str(tiny_bert), "-o", str(tmp_path / "t.tsv"),
            "--anchor-column", "q", "--positive-column", "doc", "--num-negatives", "1"]  # fmt: skip
    with RunFolder(live).lock():  # a run mining beside the same output right now
        (live / "corpus.index").mkdir()
        assert main(argv) == 0
        assert live.is_dir()
    assert not dead.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        live.name,
        "pairs.jsonl",
        "t.tsv",
        "t.tsv.mining.json",
    ]


def test_a_rerun_after_sigkill_removes_the_killed_runs_working_folder(
    tiny_bert: Path, tmp_path: Path
) -> None:
    """A ``cselab mine`` killed while encoding leaves its ``.cselab-mine-*`` folder (nothing
    can clean up after SIGKILL); the next run beside the same output removes it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pairs = _write_pairs(tmp_path / "pairs.jsonl", n=3000)
    out = tmp_path / "t.tsv"
    argv = ["mine", str(pairs), "--model", str(tiny_bert), "-o", str(out), "--anchor-column",
            "q", "--positive-column", "doc", "--num-negatives", "1", "--batch-size", "1"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "cselab", "-q", *argv],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob(".cselab-mine-*/corpus.index")):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    (left,) = tmp_path.glob(".cselab-mine-*")
    assert not out.exists()
    assert main(["-q", *argv[:-2], "--batch-size", "128"]) == 0
    assert not left.exists() and out.is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "pairs.jsonl",
        "t.tsv",
        "t.tsv.mining.json",
    ]


# ------------------------------------------------- every setting reaches what it sets (issue 28)
def test_cmd_mine_hands_every_option_to_the_library(tmp_path: Path, monkeypatch, capsys) -> None:
    """``cselab mine``'s options arrive in ``mine_hard_negatives``' one settings object (the
    search's backend, chunk size, batch size, pooler, device and compiled graph included), and
    ``--index`` is the index folder, not ``MineSettings.index``."""
    import cselab.search.mine as mine
    from cselab.search.mine import MineReport

    got: dict = {}

    def record(model, pairs, output, settings, **kwargs):
        got.update(settings=settings, **kwargs)
        return MineReport(header=settings.header())

    monkeypatch.setattr(mine, "mine_hard_negatives", record)
    argv = ["mine", "p.jsonl", "--model", "m", "-o", str(tmp_path / "o.tsv"), "--backend", "flat",
            "--chunk-size", "5", "--batch-size", "3", "--pooler", "avg", "--device", "cpu",
            "--compile", "--num-negatives", "2", "--index", "dir"]  # fmt: skip
    assert main(argv) == 0
    index = IndexSettings(backend="flat", chunk_size=5, batch_size=3, pooler="avg",
                          device="cpu", compile_inference=True)  # fmt: skip
    assert got["settings"] == MineSettings(num_negatives=2, index=index)
    assert got["index_dir"] == "dir"


@pytest.mark.parametrize(
    ("index", "message"),
    [
        (IndexSettings(dim=8), "dim=8: mining searches at the model's full width"),
        (IndexSettings(backend="annoy"), "backend='annoy' is unknown"),
        (IndexSettings(chunk_size=0), "chunk_size=0 is refused: it must be at least 1"),
        (IndexSettings(pooler="max"), "pooler='max' is unknown"),
    ],
)
def test_mine_settings_check_their_index_settings(index: IndexSettings, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        MineSettings(index=index).validate()
    IndexSettings(backend="flat").validate(("exact", "flat"))  # flat: a search backend


def _counting_searches(monkeypatch) -> list[tuple[str, int]]:
    """Each ``Index.search_vectors`` call of mining as ``(backend, anchors)``, the real search
    still done."""
    from cselab.search.index import Index

    calls: list[tuple[str, int]] = []
    search = Index.search_vectors

    def counted(self, vectors, k, *args, **kwargs):
        calls.append((kwargs.get("backend"), len(vectors)))
        return search(self, vectors, k, *args, **kwargs)

    monkeypatch.setattr(Index, "search_vectors", counted)
    return calls


def test_mining_searches_with_its_backend_and_chunk_rule(tiny_bert: Path, monkeypatch) -> None:
    """The search backend is the settings' (``flat``: FAISS); anchors go ``MINE_CHUNK`` at a
    time where ``chunk_size`` is not given, whatever else ``index`` sets, else ``chunk_size``."""
    import cselab.search.mine as mine
    from cselab.model.encoder import load

    encoder = load(str(tiny_bert))
    pairs = [(f"anchor {i}", f"positive text {i}") for i in range(12)]
    assert MineSettings(index=IndexSettings(backend="flat")).index.chunk(mine.MINE_CHUNK) == 4096
    monkeypatch.setattr(mine, "MINE_CHUNK", 5)
    calls = _counting_searches(monkeypatch)
    flat = MineSettings(num_negatives=1, index=IndexSettings(backend="flat"))
    found = mine_hard_negatives(encoder, pairs, None, flat).rows
    assert calls == [("flat", 5), ("flat", 5), ("flat", 2)]
    calls.clear()
    exact = MineSettings(num_negatives=1, index=IndexSettings(chunk_size=7))
    assert mine_hard_negatives(encoder, pairs, None, exact).rows == found
    assert calls == [("exact", 7), ("exact", 5)]


def test_the_mining_record_names_the_pooler_and_backend(tiny_bert: Path, tmp_path: Path) -> None:
    from cselab.data.pairs import mining_record_path

    pairs = _write_pairs(tmp_path / "pairs.jsonl", n=8)
    out = tmp_path / "t.tsv"
    assert main(["-q", "mine", str(pairs), "--model", str(tiny_bert), "-o", str(out),
                 "--anchor-column", "q", "--positive-column", "doc", "--num-negatives", "1",
                 "--pooler", "avg", "--backend", "flat"]) == 0  # fmt: skip
    record = json.loads(mining_record_path(out).read_text())
    assert (record["pooler"], record["backend"]) == ("avg", "flat")


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["mine", "p", "--model", "m", "-o", "o.tsv", "--device", "bogus"],
         "argument --device: 'bogus' is not a device"),
        (["mine", "p", "--model", "m", "-o", "o.tsv", "--batch-size", "0"],
         "argument --batch-size: 0 is refused: it must be at least 1"),
        (["encode", "m", "--input", "x", "--output", "y", "--batch-size", "0"],
         "argument --batch-size: 0 is refused"),
        (["evaluate", "m", "--retrieval", "b", "--batch-size", "-2"],
         "argument --batch-size: -2 is refused"),
        (["encode", "m", "--input", "x", "--output", "y", "--device", "cuda:x"],
         "argument --device: 'cuda:x' is not a device"),
        (["search", "idx", "q", "-k", "0"], "argument -k: 0 is refused: it must be at least 1"),
    ],
)  # fmt: skip
def test_shared_options_refuse_bad_values_at_parse_time(argv, said, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and said in capsys.readouterr().err


def test_device_names_that_torch_takes_are_accepted() -> None:
    from cselab.cli.options import device_name

    assert [device_name(d) for d in ("cpu", "cuda", "cuda:1", "mps")] == [
        "cpu", "cuda", "cuda:1", "mps"
    ]  # fmt: skip
