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
    with pytest.raises(CorpusError, match="fewer than one batch"):
        BatchOrder(10, 64, seed=0)


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

    def boom(*args, **kwargs):  # noqa: ANN002, ANN003
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

    from cselab import hub

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
