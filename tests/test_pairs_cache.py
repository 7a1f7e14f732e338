"""Pairs and triplets through the token store: the cached columns equal the in-memory
tokenisation, an entry is found again without tokenising, an interrupted build leaves none,
and a pairs run trains and resumes on the cached columns."""

from __future__ import annotations

import csv
import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from cselab.config import load_config
from cselab.data import CorpusError, TokenizedCorpus, tokenize_pairs
from cselab.data import cache as data_cache
from cselab.data.pairs import PairColumns, TokenizedPairs, read_pairs, source_digest

COLUMNS = PairColumns(anchor="sent0", positive="sent1", negative=["hard_neg", "other"])
ROWS = 9000  # more than one 8192-row chunk: the seam between chunks is covered


def _write_triplets(path: Path, sentences: list[str], n: int) -> Path:
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["sent0", "sent1", "hard_neg", "other", "label"])
        for i in range(n):
            writer.writerow([sentences[(i + k) % len(sentences)] for k in range(4)] + [i % 3])
    return path


@pytest.fixture(scope="module")
def triplets(tmp_path_factory: pytest.TempPathFactory, wiki_file: Path) -> Path:
    """9,000 rows of wiki sentences (quotes and commas included), two hard negatives each,
    and a column no one reads; last modified an hour ago (a settled file)."""
    sentences = wiki_file.read_text(encoding="utf-8").splitlines()
    path = _write_triplets(tmp_path_factory.mktemp("pairs") / "nli.csv", sentences, ROWS)
    hour_ago = path.stat().st_mtime_ns - 3600 * 10**9
    os.utime(path, ns=(hour_ago, hour_ago))
    return path


@pytest.fixture(scope="module")
def tok(tiny_bert: Path):  # noqa: ANN201
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_bert))


def _entries(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if p.is_dir())


def _columns(pairs: TokenizedPairs) -> list[TokenizedCorpus]:
    return [pairs.anchors, pairs.positives, *pairs.negatives]


def _never_tokenise(monkeypatch: pytest.MonkeyPatch, tok) -> None:  # noqa: ANN001
    def boom(*args, **kwargs):  # noqa: ANN002, ANN003
        raise AssertionError("re-tokenised although the cache matches")

    monkeypatch.setattr(type(tok), "__call__", boom)


def test_cached_triplets_are_the_in_memory_tokenisation_memory_mapped(
    tmp_path: Path, triplets: Path, tok
) -> None:  # noqa: ANN001
    cached, digest = tokenize_pairs(
        triplets, tok, 32, columns=COLUMNS, cache_dir=tmp_path, progress=False
    )
    in_memory = TokenizedPairs.build(read_pairs(triplets, COLUMNS), tok, 32)
    assert digest == source_digest(triplets)
    assert len(cached) == len(in_memory) == ROWS and cached.num_negatives == 2
    for got, want in zip(_columns(cached), _columns(in_memory), strict=True):
        assert isinstance(got.ids, np.memmap) and isinstance(got.offsets, np.memmap)
        assert np.array_equal(got.offsets, want.offsets)  # every row's length...
        assert np.array_equal(got.ids, want.ids)  # ...and every id, per column
    assert cached.negatives[1].rows([8191])[0].tolist() == in_memory.negatives[1].rows([8191])[0].tolist()  # fmt: skip
    (entry,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    names = ("anchor", "positive", "negative.0", "negative.1")
    files = [f"{c}.{a}.npy" for c in names for a in ("ids", "offsets")]
    assert sorted(f.name for f in entry.iterdir()) == sorted(["meta.json", *files])
    # a step's inputs are the same tensors, whichever path tokenised the rows
    indices = [8191, 0, 8192, 17, ROWS - 1, 4000]
    got = cached.step_inputs(indices, pad_id=0)
    want = in_memory.step_inputs(indices, pad_id=0)
    assert want.negatives is not None and want.negatives["input_ids"].shape[:2] == (6, 2)
    for column in ("anchors", "positives", "negatives"):
        a, b = getattr(got, column), getattr(want, column)
        assert a.keys() == b.keys()
        for key in b:
            assert torch.equal(a[key], b[key]), (column, key)


def test_an_entry_is_found_again_without_tokenising(
    tmp_path: Path, triplets: Path, tok, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001
    cache = tmp_path / "cache"
    first, digest = tokenize_pairs(triplets, tok, 32, columns=COLUMNS, cache_dir=cache, progress=False)  # fmt: skip
    entries = _entries(cache)
    reads: list[Path] = []
    real_digest = data_cache.source_digest
    monkeypatch.setattr(data_cache, "source_digest", lambda p: reads.append(p) or real_digest(p))
    _never_tokenise(monkeypatch, tok)
    # unchanged and settled: the stat record finds the entry, the file is not read at all
    again, again_digest = tokenize_pairs(
        triplets, tok, 32, columns=COLUMNS, cache_dir=cache, progress=False
    )
    assert reads == [] and again_digest == digest and _entries(cache) == entries
    for got, want in zip(_columns(again), _columns(first), strict=True):
        assert np.array_equal(got.ids, want.ids) and np.array_equal(got.offsets, want.offsets)
    # a copy under another name: one hashing pass finds the same entry
    copy = tmp_path / "copy.csv"
    copy.write_bytes(triplets.read_bytes())
    tokenize_pairs(copy, tok, 32, columns=COLUMNS, cache_dir=cache, progress=False)
    assert reads == [copy] and _entries(cache) == entries
    # other columns read from the same bytes are other rows: another entry, so tokenised
    with pytest.raises(AssertionError, match="re-tokenised"):
        tokenize_pairs(triplets, tok, 32, columns=PairColumns("sent0", "sent1", []),
                       cache_dir=cache, progress=False)  # fmt: skip


def test_an_interrupted_build_leaves_no_entry(tmp_path: Path, triplets: Path, tok) -> None:  # noqa: ANN001
    calls = 0

    class Dies:
        name_or_path = tok.name_or_path

        def __len__(self) -> int:
            return len(tok)

        def __call__(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN204
            nonlocal calls
            calls += 1
            if calls == 5:  # the first chunk's four columns are on disk
                raise KeyboardInterrupt
            return tok(*args, **kwargs)

    with pytest.raises(KeyboardInterrupt):
        tokenize_pairs(triplets, Dies(), 32, columns=COLUMNS, cache_dir=tmp_path, progress=False)
    assert calls == 5 and list(tmp_path.iterdir()) == []
    # a bad row near the end fails before anything is tokenised, and leaves nothing
    calls = 0
    bad = tmp_path / "bad.csv"
    bad.write_text(triplets.read_text(encoding="utf-8") + "a,b,,d,0\n", encoding="utf-8")
    cache = tmp_path / "cache"
    with pytest.raises(CorpusError, match=rf"bad\.csv:{ROWS + 2}: column 'hard_neg' is empty"):
        tokenize_pairs(bad, Dies(), 32, columns=COLUMNS, cache_dir=cache, progress=False)
    assert calls == 0 and list(cache.iterdir()) == []


def test_a_file_changed_while_tokenised_gives_no_entry(
    tmp_path: Path, tok, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001
    path = _write_triplets(tmp_path / "t.csv", ["one two", "three", "four five", "six"], 40)
    real_write = TokenizedPairs.write

    def write_then_edit(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        out = real_write(*args, **kwargs)
        with path.open("a", encoding="utf-8") as fh:
            fh.write("seven,eight,nine,ten,0\n")
        return out

    monkeypatch.setattr(TokenizedPairs, "write", staticmethod(write_then_edit))
    cache = tmp_path / "cache"
    with pytest.raises(CorpusError, match=r"t\.csv: the file changed while it was tokenised"):
        tokenize_pairs(path, tok, 32, columns=COLUMNS, cache_dir=cache, progress=False)
    assert list(cache.iterdir()) == []


def test_a_saved_dataset_folder_is_found_by_its_files(
    tmp_path: Path, tok, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001
    datasets = pytest.importorskip("datasets")
    folder, cache = tmp_path / "ds", tmp_path / "cache"
    rows = [{"anchor": f"sentence {i}", "positive": f"line {i}"} for i in range(30)]
    datasets.Dataset.from_list(rows).save_to_disk(str(folder))
    for f in [*folder.rglob("*"), folder]:  # settled: written an hour ago
        os.utime(f, ns=(f.stat().st_mtime_ns - 3600 * 10**9,) * 2)
    first, digest = tokenize_pairs(folder, tok, 16, cache_dir=cache, progress=False)
    assert digest == source_digest(folder) and len(first) == 30 and first.num_negatives == 0
    with monkeypatch.context() as m:
        _never_tokenise(m, tok)
        m.setattr(data_cache, "source_digest", lambda p: pytest.fail("hashed a known folder"))
        tokenize_pairs(folder, tok, 16, cache_dir=cache, progress=False)
    # other rows written into the same files (the folder's own entry unchanged): the files'
    # stat changed, so the folder is hashed and tokenised
    rows[3]["positive"] = "something else"
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds2"))
    folder_time = folder.stat().st_mtime_ns
    for f in (tmp_path / "ds2").iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    assert folder.stat().st_mtime_ns == folder_time
    changed, changed_digest = tokenize_pairs(folder, tok, 16, cache_dir=cache, progress=False)
    assert changed_digest != digest and len(_entries(cache)) == 2
    assert tok.decode(changed.positives.rows([3])[0], skip_special_tokens=True) == "something else"


def test_tokenising_pairs_shows_a_progress_bar_with_rate_and_total(
    tmp_path: Path, triplets: Path, tok, capsys: pytest.CaptureFixture
) -> None:  # noqa: ANN001
    tokenize_pairs(triplets, tok, 32, columns=COLUMNS, cache_dir=tmp_path)
    err = capsys.readouterr().err
    assert "tokenising nli.csv" in err and "rows/s" in err
    assert "9.00k/9.00k" in err  # the total is the rows counted first, so the bar has an ETA


def _pairs_config(tiny_bert: Path, train_file: Path, folder: Path, *extra: str):  # noqa: ANN202
    return load_config(
        None,
        [
            f"--model.name_or_path={tiny_bert}",
            "--model.pooler=avg",
            f"--data.train_file={train_file}",
            "--data.columns.anchor=sent0",
            "--data.columns.positive=sent1",
            "--data.columns.negative=[hard_neg]",
            f"--data.cache_dir={folder.parent / 'cache'}",
            f"--train.output_dir={folder}",
            "--train.batch_size=8",
            "--train.max_steps=6",
            "--train.save_steps=3",
            "--train.lr=1e-3",
            "--train.eval_steps=0",
            "--objective.hard_negative_weight=0.5",
            *extra,
        ],
    )


def test_a_pairs_run_trains_on_the_cached_columns_and_resumes(
    tiny_bert: Path, tmp_path: Path, wiki_file: Path, one_thread
) -> None:
    """A pairs run reads its columns from the token cache; a run stopped at its step-3
    checkpoint resumes (the checkpoint's data digest is the file's) to the same weights as an
    uninterrupted run, and a changed file is refused."""
    from safetensors.torch import load_file

    from cselab.app.train import build_trainer
    from cselab.core.schema import ConfigError

    sentences = wiki_file.read_text(encoding="utf-8").splitlines()[:200]
    train_file = _write_triplets(tmp_path / "train.csv", sentences, 64)
    whole = build_trainer(_pairs_config(tiny_bert, train_file, tmp_path / "whole"))
    assert (
        isinstance(whole.batches.corpus, TokenizedPairs) and whole.batches.corpus.num_negatives == 1
    )
    assert isinstance(whole.batches.corpus.negatives[0].ids, np.memmap)
    assert whole.train()["steps"] == 6
    stopped = build_trainer(_pairs_config(tiny_bert, train_file, tmp_path / "part"))
    stopped.loop = dataclasses.replace(stopped.loop, total_steps=3)  # a killed run stops so
    stopped.train()
    resumed = build_trainer(
        _pairs_config(tiny_bert, train_file, tmp_path / "part", "--train.resume=true")
    )
    assert resumed.train()["steps"] == 6
    a = load_file(str(tmp_path / "whole" / "last" / "model.safetensors"))
    b = load_file(str(tmp_path / "part" / "last" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with train_file.open("a", encoding="utf-8") as fh:
        fh.write("one more,row,here,x,0\n")
    with pytest.raises(ConfigError, match=r"data\.train_file \(content sha256\)"):
        build_trainer(_pairs_config(tiny_bert, train_file, tmp_path / "part", "--train.resume=true"))  # fmt: skip
