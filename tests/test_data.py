"""Training corpus: reading, errors naming file and line, token cache, batch order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cselab.data import (
    BatchOrder,
    CorpusError,
    TokenizedCorpus,
    collate,
    read_corpus,
    shard,
    tokenize_corpus,
)


def test_blank_lines_skipped_and_counted(tmp_path: Path) -> None:
    f = tmp_path / "c.txt"
    f.write_bytes(b"\xef\xbb\xbfone\r\n\n  \ntwo words\nthree\n")
    sentences, stats = read_corpus(f)
    assert sentences == ["one", "two words", "three"]
    assert (stats.lines, stats.sentences, stats.blank_lines) == (5, 3, 2)


def test_invalid_utf8_names_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "bad.txt"
    f.write_bytes(b"fine\nalso fine\nbroken \xff byte\n")
    with pytest.raises(CorpusError, match=r"bad\.txt:3: invalid UTF-8"):
        read_corpus(f)
    sentences, stats = read_corpus(f, errors="replace")
    assert sentences[2] == "broken \ufffd byte" and stats.replaced_lines == 1


def test_missing_and_empty(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="not found"):
        read_corpus(tmp_path / "none.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(CorpusError, match="no sentences"):
        read_corpus(empty)
    empty.write_bytes(b"")  # not "0 lines, all blank": empty, as the table readers say
    with pytest.raises(CorpusError) as nothing:
        read_corpus(empty)
    assert str(nothing.value) == f"{empty}: no sentences (the file is empty)"
    with pytest.raises(CorpusError, match="fewer than one batch"):
        BatchOrder(10, 64, seed=0)
    with pytest.raises(CorpusError) as err:  # the file named, and what it counts
        BatchOrder(1, 8, seed=0, source="pairs.csv", unit="pairs")
    assert str(err.value) == (
        "pairs.csv: the training data has 1 pair, fewer than one batch of 8 (train.batch_size)"
    )


def test_wiki_file_count(wiki_file: Path) -> None:
    sentences, stats = read_corpus(wiki_file)
    assert stats.sentences == 11914 and stats.blank_lines == 0
    assert sentences[0] == "YMCA in South Australia"
    assert "\u00a0" in sentences[1]  # the no-break space is kept, not normalised away


def test_tokenize_once_then_cache(
    tmp_path: Path, tiny_bert: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_bert)
    f = tmp_path / "c.txt"
    f.write_text("a short one\n" + "a much longer sentence " * 20 + "\n")
    corpus, _ = tokenize_corpus(f, tok, max_seq_len=8, cache_dir=tmp_path / "cache")
    assert list(corpus.lengths()) == [5, 8]  # [CLS] a short one [SEP]; truncated to 8
    assert corpus.rows([0])[0].tolist() == tok("a short one")["input_ids"]

    def boom(*args, **kwargs):
        raise AssertionError("re-tokenised although the cache matches")

    monkeypatch.setattr(TokenizedCorpus, "build", boom)
    again, stats = tokenize_corpus(f, tok, max_seq_len=8, cache_dir=tmp_path / "cache")
    assert np.array_equal(again.ids, corpus.ids) and stats.sentences == 2
    with pytest.raises(AssertionError):  # another max_seq_len is another cache entry
        tokenize_corpus(f, tok, max_seq_len=16, cache_dir=tmp_path / "cache")


def test_batch_order_random_drop_last_reproducible() -> None:
    order = BatchOrder(103, 10, seed=7)
    assert order.batches_per_epoch == 10
    e0 = [order.batch(0, i) for i in range(10)]
    flat = np.concatenate(e0)
    assert len(set(flat.tolist())) == 100  # no repeats within an epoch, 3 dropped
    assert not np.array_equal(order.epoch_order(0), order.epoch_order(1))
    assert np.array_equal(BatchOrder(103, 10, seed=7).batch(0, 3), e0[3])
    assert not np.array_equal(np.sort(flat), flat)  # random, not sorted/bucketed


def test_shard_partitions_the_global_batch() -> None:
    batch = np.arange(8)
    parts = [shard(batch, r, 4) for r in range(4)]
    assert np.array_equal(np.concatenate(parts), batch)
    with pytest.raises(ValueError):
        shard(np.arange(6), 0, 4)


def test_collate_pads_to_longest() -> None:
    out = collate([np.array([1, 2, 3]), np.array([4])], pad_id=0)
    assert out["input_ids"].tolist() == [[1, 2, 3], [4, 0, 0]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]


def test_wiki1m_download_error_names_the_source_and_alternative(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(Against a fake Hub end to end: tests/test_hub_downloads.py.)"""
    import huggingface_hub

    from cselab.model import hub

    asked = []

    def offline(repo_id, filename, **kwargs):  # noqa: ANN001, ANN003
        asked.append((repo_id, filename, kwargs.get("repo_type")))
        raise OSError("Name or service not known")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    with pytest.raises(hub.ResolveError) as info:
        hub.resolve_train_file("wiki1m", str(tmp_path))
    assert asked == [("princeton-nlp/datasets-for-simcse", "wiki1m_for_simcse.txt", "dataset")]
    msg = str(info.value)
    assert "datasets/princeton-nlp/datasets-for-simcse (wiki1m_for_simcse.txt)" in msg
    assert "Name or service not known" in msg and "--data.train_file" in msg
    assert not list(tmp_path.iterdir())  # nothing written
    (tmp_path / "wiki1m_for_simcse.txt").write_text("cached\n")  # an earlier version's copy
    assert hub.resolve_train_file("wiki1m", str(tmp_path)) == tmp_path / "wiki1m_for_simcse.txt"


# ------------------------------------------------------------------------------------------
# Streaming tokenisation into a memory-mapped, content-addressed cache


def _tokenizer(tiny_bert: Path):  # noqa: ANN202
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_bert)


def _entries(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if p.is_dir())


def test_streamed_store_is_memory_mapped_and_equals_a_direct_tokenisation(
    tmp_path: Path, tiny_bert: Path, wiki_file: Path
) -> None:
    tok = _tokenizer(tiny_bert)
    corpus, stats = tokenize_corpus(wiki_file, tok, 32, cache_dir=tmp_path, progress=False)
    assert isinstance(corpus.ids, np.memmap) and isinstance(corpus.offsets, np.memmap)
    assert len(corpus) == stats.sentences == 11914  # 2 chunks of 8192: the seam is covered
    sentences, _ = read_corpus(wiki_file)
    for i in (0, 1, 8191, 8192, 11913):
        expected = tok(sentences[i], truncation=True, max_length=32)["input_ids"]
        assert corpus.rows([i])[0].tolist() == expected
    in_memory = TokenizedCorpus.build(sentences, tok, 32, chunk=1000)
    assert np.array_equal(in_memory.ids, corpus.ids)
    assert np.array_equal(in_memory.offsets, corpus.offsets)
    (entry,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert sorted(f.name for f in entry.iterdir()) == [
        "meta.json",
        "text.ids.npy",
        "text.offsets.npy",
    ]
    assert corpus.nbytes == 4 * len(corpus.ids) + 8 * (len(corpus) + 1)


def test_interrupted_tokenisation_leaves_no_cache_entry(
    tmp_path: Path, tiny_bert: Path, wiki_file: Path
) -> None:
    tok = _tokenizer(tiny_bert)
    calls = 0

    class Dies:
        name_or_path = tok.name_or_path

        def __len__(self) -> int:
            return len(tok)

        def __call__(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN204
            nonlocal calls
            calls += 1
            if calls == 2:  # after the first chunk was written to disk
                raise KeyboardInterrupt
            return tok(*args, **kwargs)

    with pytest.raises(KeyboardInterrupt):
        tokenize_corpus(wiki_file, Dies(), 32, cache_dir=tmp_path, progress=False)
    assert calls == 2 and list(tmp_path.iterdir()) == []
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\n" * 9000 + b"broken \xff\n")
    cache = tmp_path / "cache"
    with pytest.raises(CorpusError, match=r"bad\.txt:9001: invalid UTF-8"):
        tokenize_corpus(bad, tok, 32, cache_dir=cache, progress=False)
    assert list(cache.iterdir()) == []
    blank = tmp_path / "blank.txt"
    blank.write_text("\n \n")
    with pytest.raises(CorpusError, match="no sentences"):
        tokenize_corpus(blank, tok, 32, cache_dir=cache, progress=False)
    assert list(cache.iterdir()) == []


def test_cache_found_by_content_reading_the_text_at_most_once(
    tmp_path: Path, tiny_bert: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from cselab.data import cache as data

    tok = _tokenizer(tiny_bert)
    f = tmp_path / "c.txt"
    f.write_text("one two\nthree four five\n")
    hour_ago = f.stat().st_mtime_ns - 3600 * 10**9
    os.utime(f, ns=(hour_ago, hour_ago))
    cache = tmp_path / "cache"
    first, _ = tokenize_corpus(f, tok, 16, cache_dir=cache, progress=False)
    entries = _entries(cache)

    def boom(*args, **kwargs):  # noqa: ANN002, ANN003
        raise AssertionError("re-tokenised although the cache matches")

    reads = []
    real_digest = data.file_digest
    monkeypatch.setattr(TokenizedCorpus, "build", boom)
    monkeypatch.setattr(data, "file_digest", lambda p: reads.append(p) or real_digest(p))
    # unchanged and settled: the stat record is enough, the text is not read at all
    again, _ = tokenize_corpus(f, tok, 16, cache_dir=cache, progress=False)
    assert reads == [] and np.array_equal(again.ids, first.ids)
    # touched (new mtime, same bytes): one hashing pass finds the same entry
    os.utime(f, ns=(hour_ago + 10**9, hour_ago + 10**9))
    tokenize_corpus(f, tok, 16, cache_dir=cache, progress=False)
    assert reads == [f] and _entries(cache) == entries
    # the same tokenizer saved in another folder is the same tokenizer: same entry
    from transformers import AutoTokenizer

    tok.save_pretrained(tmp_path / "copy")
    copy = AutoTokenizer.from_pretrained(tmp_path / "copy")
    assert copy.name_or_path != tok.name_or_path
    tokenize_corpus(f, copy, 16, cache_dir=cache, progress=False)
    assert reads == [f] and _entries(cache) == entries  # found by its record, not re-read
    # a copy under another name: hashed once and found, not re-tokenised
    moved = tmp_path / "moved.txt"
    moved.write_bytes(f.read_bytes())
    tokenize_corpus(moved, tok, 16, cache_dir=cache, progress=False)
    assert reads == [f, moved] and _entries(cache) == entries
    monkeypatch.undo()
    # rewritten in place with the same size, inode and mtime as the record: a stat-only check
    # would use the stale tokens; the record was taken less than 2 s after the write it saw...
    g = tmp_path / "g.txt"
    g.write_text("one two\n")
    tokenize_corpus(g, tok, 16, cache_dir=cache, progress=False)
    mtime = g.stat().st_mtime_ns
    with g.open("r+") as fh:  # same inode
        fh.write("six ten\n")
    os.utime(g, ns=(mtime, mtime))
    changed, _ = tokenize_corpus(g, tok, 16, cache_dir=cache, progress=False)
    # ...so the digest decides, and the new words are tokenised
    assert changed.rows([0])[0].tolist() == tok("six ten")["input_ids"]


def test_tokenisation_shows_a_progress_bar_with_rate(
    tmp_path: Path, tiny_bert: Path, wiki_file: Path, capsys: pytest.CaptureFixture
) -> None:
    tokenize_corpus(wiki_file, _tokenizer(tiny_bert), 32, cache_dir=tmp_path)
    err = capsys.readouterr().err
    assert "tokenising wiki1m_for_simcse.first11914.txt" in err and "B/s" in err
    assert "1.28M/1.28M" in err  # the bar's total is the file size, so it has an ETA


def test_a_store_holds_several_columns(tmp_path: Path) -> None:
    from cselab.data import ColumnWriter

    for name, rows in (("anchor", [[1, 2], [3]]), ("positive", [[4], [5, 6, 7]])):
        w = ColumnWriter(tmp_path, name)
        w.append(rows[:1])
        w.append(rows[1:])
        w.close()
    assert [r.tolist() for r in TokenizedCorpus.open(tmp_path, "anchor").rows([0, 1])] == [
        [1, 2],
        [3],
    ]
    positive = TokenizedCorpus.open(tmp_path, "positive")
    assert positive.offsets.tolist() == [0, 1, 4] and positive.rows([1])[0].tolist() == [5, 6, 7]
