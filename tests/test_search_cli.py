"""``cselab search`` and ``cselab index build`` on what a user gets wrong: a blank query, an
output path that is a file, an ``index.json`` with missing keys or wrong types; each is one line
naming the file, key or value (exit status 2). And a property: any bytes as ``index.json`` give
a working index or :class:`SearchIndexError`, never another exception."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest import write_corpus
from cselab.cli import main
from cselab.core.errors import IndexSettingError, SettingError
from cselab.model.encoder import SentenceEncoder
from cselab.model.pooling import POOLERS
from cselab.search.index import META_FILE, PROGRESS_FILE, Index, SearchIndexError, check_queries

DIM = 8


def vector_index(folder: Path) -> Path:
    """A finished 12-line index (no model needed to open it or to search it with vectors)."""
    vectors = np.random.default_rng(3).standard_normal((12, DIM)).astype(np.float32)
    Index.from_vectors(folder, vectors, [f"text {i}" for i in range(12)], "org/model", "avg")
    return folder


def error_line(capsys: pytest.CaptureFixture) -> str:
    """The whole of stderr, which must be exactly one line."""
    (line,) = capsys.readouterr().err.splitlines()
    return line


@pytest.mark.parametrize("query", ["", "   ", "\t"])
def test_blank_query_is_refused(query: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    index = vector_index(tmp_path / "v.index")
    assert main(["search", str(index), query]) == 2
    assert error_line(capsys) == (
        "cselab search: error: the query is blank; give some text to search for"
    )


def test_blank_query_is_refused_by_the_library_too(tmp_path: Path) -> None:
    """Before any encoder is loaded (the index's model, org/model, does not exist)."""
    index = Index.open(vector_index(tmp_path / "v.index"))
    with pytest.raises(SearchIndexError, match="^the query is blank"):
        index.search(" ")
    with pytest.raises(SearchIndexError, match="^query 2 of 3 is blank"):
        index.search(["a", "", "c"])
    check_queries(["a man plays", " x "])  # text with spaces around it is a query


def test_index_build_into_a_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    corpus = write_corpus(tmp_path, n=10)
    taken = tmp_path / "notes.txt"
    taken.write_text("keep me\n")
    # the model does not exist: the output is checked before the model is looked for
    argv = ["index", "build", str(corpus), "--model", str(tmp_path / "none"), "-o", str(taken)]
    assert main(argv) == 2
    assert error_line(capsys) == (
        f"cselab index: error: {taken}: exists and is not a folder (an index is a folder); "
        "choose another output"
    )
    assert taken.read_text() == "keep me\n"


def _meta(index: Path) -> dict:
    return json.loads((index / META_FILE).read_text())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m: m.pop("dim"), "key 'dim' is missing"),
        (lambda m: m.pop("pooler"), "key 'pooler' is missing"),
        (lambda m: m.update(count="12"), "key 'count' must be a whole number >= 0, not '12'"),
        (lambda m: m.update(chunk_size=0), "key 'chunk_size' must be a whole number >= 1, not 0"),
        (lambda m: m.update(dim=8.0), "key 'dim' must be a whole number >= 1, not 8.0"),
        (lambda m: m.update(model=["a"]), "key 'model' must be a model name or path or null, not ['a']"),
        (
            lambda m: m.update(pooler="max"),
            f"key 'pooler' must be one of {', '.join(POOLERS)}, not 'max'",
        ),
        (
            lambda m: m.update(ann={"hnsw": {"m": "32"}}),
            "key 'ann' must be a mapping of hnsw/ivf to their whole-number settings, not "
            "{'hnsw': {'m': '32'}}",
        ),
        (lambda m: m.update(format=True), "index format True, this cselab reads 1"),
        (lambda m: m.update(format=2), "index format 2, this cselab reads 1"),
        (lambda m: m.update(normalized="yes"), "key 'normalized' must be true or false, not 'yes'"),
        (
            lambda m: m.update(prompts={"query": "q: "}),
            "key 'prompts' must be a mapping of query and document to their prompts, not "
            "{'query': 'q: '}",
        ),
    ],
)  # fmt: skip
def test_malformed_index_json_is_one_line(
    change, message: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    index = vector_index(tmp_path / "v.index")
    meta = _meta(index)
    change(meta)
    (index / META_FILE).write_text(json.dumps(meta))
    assert main(["search", str(index), "a query"]) == 2
    assert error_line(capsys) == f"cselab search: error: {index / META_FILE}: {message}"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"[1, 2]", "not an index description (a JSON object was expected, not list)"),
        (b'{"format": 1,', "not valid JSON (Expecting property name enclosed in double quotes"),
        (b"\xff\xfe\x00{", "not valid JSON ("),
        (b"[" * 100_000, "not valid JSON (nested too deeply)"),
    ],
)
def test_unreadable_index_json_is_one_line(
    content: bytes, message: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    index = vector_index(tmp_path / "v.index")
    (index / META_FILE).write_bytes(content)
    assert main(["search", str(index), "a query"]) == 2
    assert error_line(capsys).startswith(f"cselab search: error: {index / META_FILE}: {message}")


def test_resuming_over_a_malformed_index_json_says_to_overwrite(
    tiny_bert: Path, tmp_path: Path
) -> None:
    index = vector_index(tmp_path / "v.index")
    meta = _meta(index)
    del meta["count"]
    (index / META_FILE).write_text(json.dumps(meta))
    corpus = write_corpus(tmp_path, n=5)
    encoder = SentenceEncoder.from_pretrained(str(tiny_bert), pooler="avg")
    with pytest.raises(SearchIndexError) as err:
        Index.build(corpus, encoder, index)
    assert str(err.value) == (
        f"{index / META_FILE}: key 'count' is missing; pass overwrite=True to start over"
    )


# ------------------------------------------------------------------------------------ property
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)  # fmt: skip
META_KEYS = ["format", "model", "pooler", "corpus", "corpus_sha256", "dim", "chunk_size", "count",
             "lines", "normalized", "ann", "prompts"]  # fmt: skip


@st.composite
def index_json(draw: st.DrawFn, valid: dict) -> bytes:
    """Bytes for ``index.json``: arbitrary bytes, arbitrary JSON, or the valid description with
    keys dropped or given other values (to reach every check, and past them)."""
    kind = draw(st.sampled_from(["bytes", "json", "mutated"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "json":
        return json.dumps(draw(json_values)).encode()
    meta = dict(valid)
    for key in draw(st.lists(st.sampled_from(META_KEYS), max_size=3)):
        if draw(st.booleans()):
            meta.pop(key, None)
        else:
            meta[key] = draw(
                json_values | st.integers(-2, 20) | st.sampled_from(["avg", "cls", "hnsw"])
                | st.dictionaries(st.sampled_from(["hnsw", "ivf", "flat"]),
                                  st.dictionaries(st.sampled_from(["m", "nlist", "nprobe"]),
                                                  st.integers(-1, 64) | json_values, max_size=2),
                                  max_size=2)
            )  # fmt: skip
    return json.dumps(meta).encode()


@pytest.fixture(scope="module")
def base_index(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    index = vector_index(tmp_path_factory.mktemp("prop") / "v.index")
    return index, _meta(index)


def test_index_json_property(base_index: tuple[Path, dict]) -> None:
    index, valid = base_index
    query = np.random.default_rng(0).standard_normal((2, DIM)).astype(np.float32)

    @settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(content=index_json(valid))
    @example(content=json.dumps(valid).encode())
    @example(content=b"")
    @example(content=b'{"format": 1.0}')
    @example(content=b"[" * 50_000)
    def check(content: bytes) -> None:
        (index / META_FILE).write_bytes(content)
        try:
            opened = Index.open(index)
            # a description that passed the checks gives an index that works
            assert len(opened) == 12 and opened.text(11) == "text 11"
            for backend in {opened.default_backend(), "exact"}:
                scores, rows = opened.search_vectors(query, k=3, backend=backend)
                assert rows.shape == (2, 3)
        except SearchIndexError as err:
            assert "\n" not in str(err)

    try:
        check()
    finally:
        (index / META_FILE).write_text(json.dumps(valid))
    assert len(Index.open(index)) == 12


def test_a_second_index_build_into_the_same_folder_is_refused_at_once(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Two builds into one folder both encoded everything (issue 31): a build holds the
    folder's lock (``RunFolder.lock``, as ``cselab train`` does), and a second one is refused in
    one line before its model loads."""
    import subprocess
    import sys

    corpus = write_corpus(tmp_path / "data", 20)
    out = tmp_path / "idx"
    holder = subprocess.Popen(  # the first build, as another process holding the folder
        [sys.executable, "-c", "import sys, time\nfrom cselab.io.runfolder import RunFolder\n"
         f"with RunFolder({str(out)!r}).lock():\n    print('held', flush=True)\n"
         "    sys.stdin.readline()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        argv = [
            "index",
            "build",
            str(corpus),
            "--model",
            str(tmp_path / "no-model"),
            "-o",
            str(out),
        ]
        assert main(argv) == 2
        assert capsys.readouterr().err.strip().splitlines() == [
            f"cselab index: error: {out} is in use by another cselab process (it holds "
            f"{out / '.cselab.lock'}); wait for it to finish or choose another folder"
        ]
    finally:
        holder.communicate("\n", timeout=60)
    argv = ["-q", "index", "build", str(corpus), "--model", str(tiny_bert), "-o", str(out)]
    assert main(argv) == 0
    assert len(Index.open(out)) == 20


def test_a_long_query_is_not_echoed_in_full(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A 10 MB query was printed back whole above its hits (issue 31)."""
    corpus = write_corpus(tmp_path / "data", 8)
    out = tmp_path / "idx"
    assert (
        main(["-q", "index", "build", str(corpus), "--model", str(tiny_bert), "-o", str(out)]) == 0
    )
    capsys.readouterr()
    query = "alpha beta " * 100_000  # 1.1 MB
    assert main(["search", str(out), query, "-k", "2"]) == 0
    printed = capsys.readouterr().out
    assert len(printed) < 2000
    assert printed.splitlines()[0] == f"# {query[:200]}… (1,100,000 characters)"
    assert len(printed.splitlines()) == 3  # the echo and two hits


def test_two_concurrent_index_builds_the_second_is_refused(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Two real ``cselab index build`` processes into one folder: the second is refused in one
    line while the first runs, and the first finishes its index."""
    import os
    import subprocess
    import sys
    import time

    corpus = write_corpus(tmp_path / "data", 3000)
    out = tmp_path / "idx"
    argv = ["index", "build", str(corpus), "--model", str(tiny_bert), "-o", str(out),
            "--chunk-size", "64"]  # fmt: skip
    first = subprocess.Popen(
        [sys.executable, "-m", "cselab", "-q", *argv, "--batch-size", "1"],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (out / PROGRESS_FILE).is_file():  # encoding: the lock is held
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        assert main(argv) == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            f"cselab index: error: {out} is in use by another cselab process (it holds "
            f"{out / '.cselab.lock'}); wait for it to finish or choose another folder"
        )
        assert first.poll() is None  # still encoding
    finally:
        first.kill()
        first.wait()
    assert main(["-q", *argv]) == 0  # the killed build's lock is free: the next one resumes
    assert len(Index.open(out)) == 3000


# ------------------------------------------------------------------ settings and their flags
def test_library_errors_name_the_setting_and_the_cli_its_flag(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The library names ``overwrite=True`` and ``backend='ivf'``; the same errors through
    ``cselab index build`` / ``cselab search`` name ``--overwrite`` and ``--backend ivf``."""
    from cselab.search.settings import IndexSettings

    corpus = write_corpus(tmp_path, n=12)
    out = tmp_path / "x.index"
    build = ["index", "build", str(corpus), "--model", str(tiny_bert), "-o", str(out)]
    assert main([*build, "--chunk-size", "8"]) == 0
    with pytest.raises(SearchIndexError) as err:
        Index.build(corpus, str(tiny_bert), out, IndexSettings(chunk_size=4))
    said = f"{out}: an index with chunk_size 8 is there, not 4; pass "
    assert str(err.value) == said + "overwrite=True or another output folder"
    capsys.readouterr()
    assert main([*build, "--chunk-size", "4"]) == 2
    errors = [x for x in capsys.readouterr().err.splitlines() if "error" in x]
    assert errors == [f"cselab index: error: {said}--overwrite or another output folder"]

    with pytest.raises(SearchIndexError) as err:
        Index.open(out).search("alpha", backend="ivf")
    hint = "build one with Index.build(..., IndexSettings(backend='ivf')) (available: exact"
    assert "no ivf index was built; " + hint in str(err.value)
    assert main(["search", str(out), "alpha", "--backend", "ivf"]) == 2
    errors = [x for x in capsys.readouterr().err.splitlines() if "error" in x]
    hint = "build one with `cselab index build ... --backend ivf` ("
    assert len(errors) == 1 and "no ivf index was built; " + hint in errors[0]

    # --dim out of range names the flag (the library: the keyword)
    with pytest.raises(SettingError, match=r"^dim=1000 is outside 1\.\.32"):
        Index.build(corpus, str(tiny_bert), tmp_path / "d.index", IndexSettings(dim=1000))
    assert main(["index", "build", str(corpus), "--model", str(tiny_bert), "-o",
                 str(tmp_path / "d.index"), "--dim", "1000"]) == 2  # fmt: skip
    errors = [x for x in capsys.readouterr().err.splitlines() if "error" in x]
    assert errors == ["cselab index: error: --dim 1000 is outside 1..32 (the vectors' width)"]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["search", "k=3", "q"], "cselab search: error: k=3: not a cselab index"),
        (["mine", "seed=1.jsonl", "--model", "M", "-o", "t.jsonl"],
         "cselab mine: error: seed=1.jsonl: pairs file not found"),
        (["encode", "M", "--input", "dim=4.txt", "--output", "e.npy"],
         "cselab encode: error: dim=4.txt: input file not found"),
        (["evaluate", "M", "--tasks", "mode=dev"],
         "cselab evaluate: error: unknown task 'mode=dev'; expected one of"),
        (["config", "presets=foo"],
         "cselab config: error: unknown preset or config file 'presets=foo' ("),
        (["train", "presets=foo"],
         "cselab train: error: unknown preset or config file 'presets=foo' ("),
    ],
)  # fmt: skip
def test_the_cli_spells_settings_never_the_users_text(
    argv: list[str], said: str, tmp_path: Path, monkeypatch, capsys: pytest.CaptureFixture
) -> None:
    """A path or value that looks like ``name=value`` is the user's: only a
    :class:`SettingError`'s setting is shown as a flag, and nothing else is rewritten."""
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    errors = [x for x in capsys.readouterr().err.splitlines() if "error:" in x]
    assert len(errors) == 1 and errors[0].startswith(said), errors


def test_setting_words_spells_only_the_setting() -> None:
    """The library names the keyword; a command its option of that ``dest`` (a switch alone),
    ``cselab train`` the config key as an override, a setting of another command that command;
    the message's fields (paths, values) stay as given, ``{...}`` and ``name=value`` included."""
    from cselab.cli import build_parser
    from cselab.cli.options import _subcommand, setting_words
    from cselab.core.errors import ConfigSettingError, ModelSettingError

    root = build_parser()
    build, search, mine, train, evaluate = (
        _subcommand(root, words.split())
        for words in ("index build", "search", "mine", "train", "evaluate")
    )
    err = IndexSettingError("overwrite", True, "{out}: pass {setting}", out="/a/nlist=2 {x}")
    assert str(err) == "/a/nlist=2 {x}: pass overwrite=True"
    assert setting_words(err, build, root) == "/a/nlist=2 {x}: pass --overwrite"
    err = IndexSettingError("nlist", 50, "ivf: {setting} is more; seed=3 {n}", n="k=1")
    assert str(err) == "ivf: nlist=50 is more; seed=3 k=1"
    assert setting_words(err, build, root) == "ivf: --nlist 50 is more; seed=3 k=1"
    assert setting_words(err, mine, root) == str(err)  # mine has no --nlist: the keyword
    err = ConfigSettingError("absolute_margin", 0.5, "{setting} is bad")
    assert setting_words(err, mine, root) == "--margin 0.5 is bad"  # the option of that dest
    err = ModelSettingError("pooler", "NAME", "choose {setting}", placeholder=True,
                            key="model.pooler")  # fmt: skip
    assert str(err) == "choose pooler=NAME"
    assert setting_words(err, evaluate, root) == "choose --pooler NAME"
    assert setting_words(err, train, root) == "choose --model.pooler=NAME"
    err = IndexSettingError("backend", "hnsw", "build one with {setting}", command="index build",
                            call="Index.build(..., IndexSettings({}))")  # fmt: skip
    assert str(err) == "build one with Index.build(..., IndexSettings(backend='hnsw'))"
    assert setting_words(err, search, root) == (
        "build one with `cselab index build ... --backend hnsw`"
    )
    assert isinstance(err, SearchIndexError) and isinstance(err, ValueError)


def test_the_commands_defaults_are_the_settings_defaults() -> None:
    """``cselab index build`` and ``cselab mine`` without options give the dataclasses' own
    defaults (the options read them from there), and every option that is a setting's field
    reaches it."""
    from cselab.cli import build_parser
    from cselab.cli.options import settings_from
    from cselab.search.mine import MineSettings
    from cselab.search.settings import IndexSettings

    parser = build_parser()
    args = parser.parse_args(["index", "build", "c.txt", "--model", "m", "-o", "x"])
    assert settings_from(IndexSettings, args) == IndexSettings()
    args = parser.parse_args(["mine", "p.jsonl", "--model", "m", "-o", "o.tsv"])
    got = settings_from(MineSettings, args, index=settings_from(IndexSettings, args))
    assert got == MineSettings()
    args = parser.parse_args(["mine", "p.jsonl", "--model", "m", "-o", "o.tsv", "--margin",
                              "0.1", "--chunk-size", "7", "--backend", "flat"])  # fmt: skip
    got = settings_from(MineSettings, args, index=settings_from(IndexSettings, args))
    assert (got.absolute_margin, got.index.chunk_size, got.index.backend) == (0.1, 7, "flat")


@pytest.mark.parametrize("option", ["--nprobe", "--ef-search", "-k"])
def test_search_depths_below_one_are_refused_as_k_is(tmp_path: Path, capsys, option: str) -> None:
    """A search-time FAISS setting below 1 is refused on the command line, as ``-k`` and the
    build-time settings are: ``--nprobe 0`` silently searched with the default depth."""
    with pytest.raises(SystemExit) as exit_:
        main(["search", str(tmp_path / "none.index"), "a query", option, "0"])
    assert exit_.value.code == 2
    # argparse names the option, and the search is not started
    assert f"argument {option}" in (err := capsys.readouterr().err)
    assert "0 is refused: it must be at least 1" in err
