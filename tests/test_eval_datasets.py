"""Loaders: published counts on the real files, format quirks, malformed files, data folder."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest

from conftest import SENTEVAL, needs_senteval
from cselab.evaluation import datasets as ds
from cselab.evaluation import download as dl
from cselab.model.hub import ResolveError

DATA = SENTEVAL
needs_data = needs_senteval
pytestmark = pytest.mark.usefixtures("fresh_eval_cache")


# --------------------------------------------------------------------------------------------
# real files


@needs_data
@pytest.mark.parametrize(
    ("year", "total", "per_subset"),
    [
        ("STS12", 3108, {"MSRpar": 750, "MSRvid": 750, "SMTeuroparl": 459, "surprise.OnWN": 750, "surprise.SMTnews": 399}),
        ("STS13", 1500, {"FNWN": 189, "headlines": 750, "OnWN": 561}),
        ("STS14", 3750, {"deft-forum": 450, "deft-news": 300, "headlines": 750, "images": 750, "OnWN": 750, "tweet-news": 750}),
        ("STS15", 3000, {"answers-forums": 375, "answers-students": 750, "belief": 375, "headlines": 750, "images": 750}),
        ("STS16", 1186, {"answer-answer": 254, "headlines": 249, "plagiarism": 230, "postediting": 244, "question-question": 209}),
    ],
)  # fmt: skip
def test_sts_years_scored_pair_counts(year, total, per_subset):
    data = ds.load_sts_year(year, DATA)
    assert {k: len(v) for k, v in data.items()} == per_subset
    assert list(data) == list(per_subset)  # SentEval's subset order
    assert sum(len(v) for v in data.values()) == total
    for pairs in data.values():
        assert len(pairs.sent1) == len(pairs.sent2) == len(pairs.scores)
        assert np.all((pairs.scores >= 0) & (pairs.scores <= 5))


@needs_data
def test_sts16_empty_gold_lines_keep_alignment():
    """A scored pair keeps the sentences of its own line, not of the n-th scored line."""
    folder = DATA / "STS" / "STS16-en-test"
    gold = (folder / "STS.gs.answer-answer.txt").read_text().splitlines()
    inputs = (folder / "STS.input.answer-answer.txt").read_text().splitlines()
    scored = [i for i, g in enumerate(gold) if g != ""]
    assert len(scored) == 254 and scored[-1] > 253  # there are gaps
    pairs = ds.load_sts_year("STS16", DATA)["answer-answer"]
    for k in (0, 100, 253):
        line = inputs[scored[k]]
        assert pairs.sent1[k] == " ".join(line.split("\t")[0].split())
        assert pairs.scores[k] == float(gold[scored[k]])


@needs_data
@pytest.mark.parametrize(
    ("loader", "counts"),
    [
        (ds.load_stsb, {"train": 5749, "dev": 1500, "test": 1379}),
        (ds.load_sick, {"train": 4500, "dev": 500, "test": 4927}),
        (ds.load_sst2, {"train": 67349, "dev": 872, "test": 1821}),
        (ds.load_trec, {"train": 5452, "test": 500}),
        (ds.load_mrpc, {"train": 4076, "test": 1725}),
    ],
)
def test_split_counts(loader, counts):
    assert {s: len(loader(s, DATA)) for s in counts} == counts


@needs_data
@pytest.mark.parametrize(
    ("task", "n", "n_pos"),
    [("MR", 10662, 5331), ("CR", 3775, 2407), ("SUBJ", 10000, 5000), ("MPQA", 10606, 3312)],
)
def test_binary_counts(task, n, n_pos):
    data = ds.load_binary(task, DATA)
    assert len(data) == n and int(data.labels.sum()) == n_pos
    assert data.labels[:n_pos].all() and not data.labels[n_pos:].any()  # label-1 file first


@needs_data
def test_transfer_quirks():
    cr = ds.load_binary("CR", DATA)
    mpqa = ds.load_binary("MPQA", DATA)
    assert sum(s == "" for s in cr.sentences) == 4  # empty lines are samples (SentEval)
    assert sum(s == "" for s in mpqa.sentences) == 3
    # SUBJ: SentEval passes subj.objective first, so objective sentences carry label 1
    subj = ds.load_binary("SUBJ", DATA)
    first_obj = (DATA / "SUBJ" / "subj.objective").read_text("latin-1").splitlines()[0]
    assert subj.sentences[0] == " ".join(first_obj.split()) and subj.labels[0] == 1
    # MR keeps cat -v sequences as text; trailing spaces are gone
    mr = ds.load_binary("MR", DATA)
    assert any("M-" in s for s in mr.sentences)
    assert all(s == s.strip() for s in mr.sentences)
    # TREC: latin-1 (a raw 0xF0 byte in train line 66), coarse labels
    trec = ds.load_trec("train", DATA)
    assert (
        trec.sentences[65]
        == "Which city has the oldest relationship as a sister\u00f0city with Los Angeles ?"
    )
    assert np.bincount(trec.labels).tolist() == [86, 1162, 1250, 1223, 835, 896]
    # SICK test has CRLF endings: nothing of the \r survives
    sick = ds.load_sick("test", DATA)
    assert not any("\r" in s for s in sick.sent1 + sick.sent2)
    assert sick.scores.min() >= 1 and sick.scores.max() <= 5
    # MRPC: BOM + header dropped, labels as published
    mrpc = ds.load_mrpc("train", DATA)
    assert int(mrpc.labels.sum()) == 2753 and not mrpc.sent1[0].startswith("\ufeff")
    # SST-2 label balance as published
    assert int(ds.load_sst2("train", DATA).labels.sum()) == 37569


@needs_data
def test_parsed_files_are_cached():
    a = ds.load_stsb("dev", DATA)
    assert ds.load_stsb("dev", DATA) is a


@needs_data
def test_real_copy_matches_validated_checksums():
    assert dl.verify(DATA) == []


# --------------------------------------------------------------------------------------------
# malformed files


def _write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_gold_file_one_line_short(tmp_path):
    inp = _write(tmp_path / "STS.input.x.txt", "a b\tc d\ne f\tg h\ni j\tk l\n")
    gold = _write(tmp_path / "STS.gs.x.txt", "1.0\n\n")
    with pytest.raises(ds.DataFormatError) as err:
        ds.read_sts_subset(inp, gold, "x")
    msg = str(err.value)
    assert f"{gold}:3:" in msg and "STS.input.x.txt has 3" in msg
    assert err.value.path == gold and err.value.line == 3


def test_non_numeric_sts_score_names_file_and_line(tmp_path):
    inp = _write(tmp_path / "STS.input.x.txt", "a\tb\nc\td\n")
    gold = _write(tmp_path / "STS.gs.x.txt", "1\nhigh\n")
    with pytest.raises(
        ds.DataFormatError, match=r"STS\.gs\.x\.txt:2: score 'high' is not a number"
    ):
        ds.read_sts_subset(inp, gold, "x")


def test_sts_input_with_wrong_field_count(tmp_path):
    inp = _write(tmp_path / "STS.input.x.txt", "a\tb\nc\td\te\n")
    gold = _write(tmp_path / "STS.gs.x.txt", "1\n2\n")
    with pytest.raises(ds.DataFormatError, match=r"STS\.input\.x\.txt:2: expected 2 tab-separated"):
        ds.read_sts_subset(inp, gold, "x")


def test_unscored_line_may_have_any_input(tmp_path):
    inp = _write(tmp_path / "STS.input.x.txt", "a  b\tc\nbroken line\ne\tf\n")
    gold = _write(tmp_path / "STS.gs.x.txt", "1\n\n3.5\n")
    pairs = ds.read_sts_subset(inp, gold, "x")
    assert pairs.sent1 == ("a b", "e") and pairs.scores.tolist() == [1.0, 3.5]


def test_stsb_bad_score_and_short_line(tmp_path):
    good = "main-captions\tMSRvid\t2012test\t0001\t5.000\ta plane .\tan air plane .\n"
    path = _write(tmp_path / "sts-dev.csv", good + good.replace("5.000", "x5"))
    with pytest.raises(ds.DataFormatError, match=r"sts-dev\.csv:2: score 'x5'"):
        ds.read_stsb(path)
    path = _write(tmp_path / "sts-test.csv", good + "main\tMSRvid\t2012\t1\t2.0\tonly one\n")
    with pytest.raises(ds.DataFormatError, match=r"sts-test\.csv:2: expected at least 7"):
        ds.read_stsb(path)
    raw9 = good.rstrip("\n") + "\tsource\tlicence\n"  # raw release: 9 fields
    assert len(ds.read_stsb(_write(tmp_path / "raw.csv", raw9))) == 1


def test_sick_requires_header_and_handles_crlf(tmp_path):
    header = "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\r\n"
    path = _write(
        tmp_path / "SICK_test_annotated.txt", header + "1\tA dog\tA cat\t4.5\tNEUTRAL\r\n"
    )
    pairs = ds.read_sick(path)
    assert pairs.sent2 == ("A cat",) and pairs.scores.tolist() == [4.5]
    no_header = _write(tmp_path / "SICK_trial.txt", "1\tA dog\tA cat\t4.5\tNEUTRAL\n")
    with pytest.raises(ds.DataFormatError, match=r"SICK_trial\.txt:1: expected the header"):
        ds.read_sick(no_header)


def test_transfer_malformed(tmp_path):
    with pytest.raises(ds.DataFormatError, match=r"sentiment-dev:2: label 2 is not one of"):
        ds.read_sst2(_write(tmp_path / "sentiment-dev", "good movie \t1\nbad \t2\n"))
    with pytest.raises(ds.DataFormatError, match=r"t\.label:1: unknown TREC class 'FOO'"):
        ds.read_trec(_write(tmp_path / "t.label", "FOO:bar What is it ?\n"))
    with pytest.raises(ds.DataFormatError, match=r"m\.txt:2: label 'x'"):
        ds.read_mrpc(
            _write(
                tmp_path / "m.txt",
                "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\nx\t1\t2\ta\tb\n",
            )
        )


def test_invalid_utf8_names_the_line(tmp_path):
    path = _write(tmp_path / "sentiment-test", b"fine \t1\nbad \xff byte \t0\n")
    with pytest.raises(
        ds.DataFormatError, match=r"sentiment-test:2: invalid UTF-8 at byte 4 of the line \(0xff\)"
    ):
        ds.read_sst2(path)


# --------------------------------------------------------------------------------------------
# data folder, missing files, download


def test_resolve_data_dir_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(ds.ENV_VAR, raising=False)
    assert ds.resolve_data_dir(None) == tmp_path / "xdg" / "cselab" / "senteval"
    monkeypatch.setenv(ds.ENV_VAR, str(tmp_path / "env"))
    assert ds.resolve_data_dir(None) == tmp_path / "env"
    assert ds.resolve_data_dir(tmp_path / "explicit") == tmp_path / "explicit"
    (tmp_path / "senteval_data" / "downstream").mkdir(parents=True)  # SentEval's data/ layout
    assert (
        ds.resolve_data_dir(tmp_path / "senteval_data") == tmp_path / "senteval_data" / "downstream"
    )


def test_missing_files_error_lists_files_and_never_downloads_into_named_dir(tmp_path, monkeypatch):
    def no_network(*_a, **_k):
        raise AssertionError("must not download into a folder the user named")

    monkeypatch.setattr(dl, "_fetch", no_network)
    monkeypatch.setattr(dl, "hub_dataset_file", no_network)
    with pytest.raises(ds.MissingDataError) as err:
        dl.ensure_data(["STSBenchmark", "SICKRelatedness"], tmp_path)
    msg = str(err.value)
    for rel in ds.TASK_FILES["STSBenchmark"] + ds.TASK_FILES["SICKRelatedness"]:
        assert rel in msg
    assert dl.ARCHIVE_URL in msg and str(tmp_path) in msg


def test_offline_download_into_cache_fails_cleanly(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(ds.ENV_VAR, raising=False)
    calls = []

    def offline(url, dest, timeout=60.0):
        calls.append(url)
        raise OSError("network is unreachable")

    def hub_offline(repo_id, filename):
        calls.append(f"hub:{repo_id}/{filename}")
        raise ResolveError("could not download ...: HF_HUB_OFFLINE is set")

    monkeypatch.setattr(dl, "_fetch", offline)
    monkeypatch.setattr(dl, "hub_dataset_file", hub_offline)
    with pytest.raises(ds.MissingDataError, match="download failed"):
        dl.ensure_data(["MRPC"])
    assert calls[0] == "hub:princeton-nlp/datasets-for-simcse/senteval.tar"
    assert any("msr_paraphrase" in u for u in calls[1:])
    assert not list(tmp_path.rglob("*.txt"))  # no partial file left


def test_download_extracts_archive_members_and_checks_sums(tmp_path, monkeypatch):
    """The archive path: only wanted members are written, under their SentEval names."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in {
            "senteval_data/STS/STSBenchmark/sts-dev.csv": b"g\tf\ty\t1\t4.0\ta b\tc d\n",
            "senteval_data/STS/STSBenchmark/sts-test.csv": b"g\tf\ty\t1\t2.0\te\tf\n",
            "senteval_data/../../evil.txt": b"no",
        }.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    archive_bytes = buf.getvalue()

    def fake_hub(repo_id, filename):
        assert (repo_id, filename) == ("princeton-nlp/datasets-for-simcse", "senteval.tar")
        (tmp_path / "senteval.tar").write_bytes(archive_bytes)
        return tmp_path / "senteval.tar"

    monkeypatch.setattr(dl, "hub_dataset_file", fake_hub)
    root = tmp_path / "cache"
    with pytest.warns(UserWarning, match="SHA-256 mismatch"):
        left = dl.download(list(ds.TASK_FILES["STSBenchmark"]), root)
    assert left == []
    assert ds.read_stsb(root / "STS" / "STSBenchmark" / "sts-dev.csv").scores.tolist() == [4.0]
    assert not (tmp_path / "evil.txt").exists()
