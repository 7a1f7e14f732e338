"""Pairs and triplets: the readers (CSV/TSV/JSONL/parquet/saved datasets, SICK), their errors,
the pair views, and supervised training end to end on SICK triplets with a tiny model."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from conftest import SENTEVAL
from cselab.config import ConfigError, load_config
from cselab.core.datakind import DataKind
from cselab.data import CorpusError
from cselab.data.pairs import (
    PairColumns,
    TokenizedPairs,
    is_pairs_source,
    read_pairs,
    sick_triplets,
    source_digest,
)

REPO = Path(__file__).resolve().parents[1]
SICK_TRAIN = SENTEVAL / "SICK" / "SICK_train.txt"
ROWS = [
    {"sent0": "a man plays a guitar", "sent1": "a person plays music", "hard_neg": "nobody plays"},
    {"sent0": "two dogs run", "sent1": "animals are running", "hard_neg": "the dogs sleep"},
    {"sent0": "a child eats", "sent1": "a kid is eating", "hard_neg": "a child is starving"},
]
NLI = PairColumns(anchor="sent0", positive="sent1", negative=["hard_neg"])


def write_delimited(path: Path, rows: list[dict], delimiter: str = ",") -> Path:
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]), delimiter=delimiter)
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def expected() -> tuple[list[str], list[str], list[list[str]]]:
    return (
        [r["sent0"] for r in ROWS],
        [r["sent1"] for r in ROWS],
        [[r["hard_neg"] for r in ROWS]],
    )


@pytest.mark.parametrize("fmt", ["csv", "tsv", "tab", "jsonl", "parquet", "saved"])
def test_every_format_reads_the_same_named_columns(tmp_path: Path, fmt: str) -> None:
    """Every table the readers read is a pairs file to ``data.format: auto`` (``.tab``, a TSV
    ending the readers take, was read as one sentence a line)."""
    if fmt == "csv":
        path = write_delimited(tmp_path / "d.csv", ROWS)
    elif fmt in ("tsv", "tab"):
        path = write_delimited(tmp_path / f"d.{fmt}", ROWS, "\t")
    elif fmt == "jsonl":
        path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    else:
        datasets = pytest.importorskip("datasets")
        ds = datasets.Dataset.from_list(ROWS)
        if fmt == "parquet":
            path = tmp_path / "d.parquet"
            ds.to_parquet(str(path))
        else:
            path = tmp_path / "saved"
            ds.save_to_disk(str(path))
    assert is_pairs_source(str(path))
    rec = read_pairs(path, NLI)
    assert (rec.anchors, rec.positives, rec.negatives) == expected()


def test_quoted_csv_fields_with_commas_and_newlines(tmp_path: Path) -> None:
    rows = [{"anchor": 'he said "hi, there"', "positive": "line one\nline two"}] * 2
    rec = read_pairs(write_delimited(tmp_path / "q.csv", rows))
    assert rec.anchors[0] == 'he said "hi, there"' and rec.positives[1] == "line one\nline two"
    assert rec.negatives == []


def test_negative_column_is_used_when_present_and_several_can_be_named(tmp_path: Path) -> None:
    rows = [{"anchor": "a", "positive": "b", "negative": "c", "other": "d"}] * 2
    path = write_jsonl(tmp_path / "n.jsonl", rows)
    assert read_pairs(path).negatives == [["c", "c"]]
    assert read_pairs(path, PairColumns(negative=[])).negatives == []
    two = read_pairs(path, PairColumns(negative=["negative", "other"]))
    assert two.negatives == [["c", "c"], ["d", "d"]]


def test_missing_column_names_the_file_and_the_columns_it_has(tmp_path: Path) -> None:
    path = write_delimited(tmp_path / "d.csv", ROWS)
    needle = r"d\.csv:1: no column 'anchor' in the header \(the file has columns: sent0"
    with pytest.raises(CorpusError, match=needle):
        read_pairs(path)
    with pytest.raises(CorpusError, match=r"no column 'hard_negative'"):
        read_pairs(path, PairColumns("sent0", "sent1", ["hard_negative"]))


def test_empty_value_names_file_line_and_column(tmp_path: Path) -> None:
    rows = [dict(r) for r in ROWS]
    rows[2]["hard_neg"] = "  "
    path = write_delimited(tmp_path / "d.csv", rows)
    with pytest.raises(CorpusError, match=r"d\.csv:4: column 'hard_neg' is empty"):
        read_pairs(path, NLI)
    rows = [dict(r) for r in ROWS]
    del rows[1]["sent1"]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(CorpusError, match=r"d\.jsonl:2: column 'sent1' is missing"):
        read_pairs(path, NLI)
    rows[1]["sent1"] = None
    with pytest.raises(CorpusError, match=r"d\.jsonl:2: column 'sent1' holds null, not text"):
        read_pairs(write_jsonl(tmp_path / "d.jsonl", rows), NLI)


def test_empty_value_in_a_saved_dataset_names_the_row(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    rows = [dict(r) for r in ROWS]
    rows[1]["sent0"] = ""
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    with pytest.raises(CorpusError, match=r"ds: row 1: column 'sent0' is empty"):
        read_pairs(tmp_path / "ds", NLI)


def test_other_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="training file not found"):
        read_pairs(tmp_path / "absent.csv")
    (tmp_path / "h.csv").write_text("anchor,positive\n")
    with pytest.raises(CorpusError, match=r"h\.csv: no rows"):
        read_pairs(tmp_path / "h.csv")
    (tmp_path / "x.csv").write_text("anchor,positive\na,b,c\n")
    with pytest.raises(CorpusError, match=r"x\.csv:2: 3 fields, the header names 2"):
        read_pairs(tmp_path / "x.csv")
    (tmp_path / "j.jsonl").write_text('{"anchor": "a", "positive": "b"}\n[1]\n')
    with pytest.raises(CorpusError, match=r"j\.jsonl:2: expected a JSON object"):
        read_pairs(tmp_path / "j.jsonl")


@pytest.mark.skipif(not SICK_TRAIN.is_file(), reason="shared SICK data not found")
def test_sick_train_gives_506_triplets_of_entailment_and_contradiction() -> None:
    rec = sick_triplets(SICK_TRAIN)
    assert len(rec) == 506 and len(rec.negatives) == 1
    # Counted independently: every triplet's (anchor, positive) is an ENTAILMENT pair of the file
    # in some order, and (anchor, negative) a CONTRADICTION pair.
    with SICK_TRAIN.open(newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    assert len(rows) == 4500
    pairs = {
        label: {frozenset((r["sentence_A"], r["sentence_B"])) for r in rows if r["entailment_judgment"] == label}
        for label in ("ENTAILMENT", "CONTRADICTION")
    }  # fmt: skip
    for a, p, n in zip(rec.anchors, rec.positives, rec.negatives[0], strict=True):
        assert frozenset((a, p)) in pairs["ENTAILMENT"]
        assert frozenset((a, n)) in pairs["CONTRADICTION"]
    # Hand-checked with grep: pair 87 (ENTAILMENT) is the first kept; pair 88 contradicts its A.
    assert (rec.anchors[0], rec.negatives[0][0]) == (
        "A lone biker is jumping in the air",
        "There is no biker jumping in the air",
    )


def test_source_digest_of_a_folder_changes_with_its_content(tmp_path: Path) -> None:
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "a").write_text("1")
    first = source_digest(tmp_path / "ds")
    (tmp_path / "ds" / "a").write_text("2")
    assert source_digest(tmp_path / "ds") != first


def test_pair_inputs_keep_each_rows_negatives_on_its_row(tiny_bert: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_bert))
    from cselab.data.pairs import PairRecords

    records = PairRecords("x", ["a b", "c", "d e f"], ["p", "q r", "s"], [["n1", "n2 m", "n3"], ["o1", "o2", "o3 o3 o3"]])  # fmt: skip
    tp = TokenizedPairs.build(records, tok, 16)
    inputs = tp.step_inputs([2, 0], pad_id=0)
    assert len(inputs) == 2 and inputs.negatives["input_ids"].shape[:2] == (2, 2)
    assert inputs.num_negatives == 2 and inputs.masked is None
    decoded = tok.decode(inputs.negatives["input_ids"][0, 1], skip_special_tokens=True)
    assert decoded == "o3 o3 o3"
    assert tok.decode(inputs.anchors["input_ids"][0], skip_special_tokens=True) == "d e f"
    assert tok.decode(inputs.positives["input_ids"][1], skip_special_tokens=True) == "p"


def test_pair_views_are_one_pass_over_the_stacked_columns(tiny_bert: Path) -> None:
    """z1/z2/neg equal the anchors, positives and negatives encoded on their own (dropout off),
    and the pass really is one (the encoder is called once)."""
    from cselab.data.pairs import PairRecords
    from cselab.model.encoder import SentenceEncoder
    from cselab.training.views import compute_views

    enc = SentenceEncoder.from_pretrained(str(tiny_bert), pooler="avg", dropout=0.0).double()
    enc.train()
    records = PairRecords("x", ["a b", "c"], ["p", "q r s t"], [["n1", "n2 m"], ["o1", "o2"]])
    inputs = TokenizedPairs.build(records, enc.tokenizer, 16).step_inputs([0, 1], 0)
    calls = []
    enc.register_forward_hook(lambda *a: calls.append(1))
    kind = DataKind(pairs=True, negatives=2)
    views = compute_views(enc, inputs, {"z1", "z2", "neg"}, kind)
    assert len(calls) == 1 and views["neg"].shape == (2, 2, enc.dim)
    alone = {c: enc(**enc.tokenize(t)) for c, t in (("z1", ["a b", "c"]), ("z2", ["p", "q r s t"]))}
    alone["neg"] = enc(**enc.tokenize(["n1", "o1", "n2 m", "o2"])).reshape(2, 2, -1)
    for name, want in alone.items():
        torch.testing.assert_close(views[name], want, rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="off-dropout view"):
        compute_views(enc, inputs, {"z1", "z2", "off"}, kind)


def test_config_rejects_off_dropout_for_pairs_before_training(tmp_path: Path) -> None:
    path = write_delimited(tmp_path / "d.csv", ROWS)
    with pytest.raises(ConfigError, match="off_dropout is defined for the dropout views"):
        load_config(None, [f"--data.train_file={path}", "--objective.off_dropout.enabled=true"])
    with pytest.raises(ConfigError, match="hard_negative_weight=1.0"):
        load_config(None, ["--data.train_file=corpus.txt", "--objective.hard_negative_weight=1"])
    cfg = load_config(None, [f"--data.train_file={path}", "--data.columns.negative=[hard_neg]"])
    assert is_pairs_source(cfg.data.train_file, cfg.data.format)
    assert cfg.data.columns.negative == ["hard_neg"]
    sick = load_config(None, ["--data.train_file=x.txt", "--data.format=sick"]).data
    assert is_pairs_source(sick.train_file, sick.format)


def test_presets_load() -> None:
    sup = load_config(REPO / "src/cselab/presets/sup-simcse-bert-base.yaml")
    assert (sup.train.batch_size, sup.train.lr, sup.train.epochs) == (512, 5e-5, 3)
    assert (sup.model.max_seq_len, sup.objective.temperature) == (32, 0.05)
    assert sup.data.train_file == "nli_for_simcse.csv"
    assert is_pairs_source(sup.data.train_file, sup.data.format)
    assert (sup.data.columns.anchor, sup.data.columns.positive) == ("sent0", "sent1")
    assert sup.data.columns.negative == ["hard_neg"] and sup.objective.hard_negative_weight == 0
    demo = load_config(REPO / "src/cselab/presets/sup-sick-minilm.yaml")
    assert demo.data.format == "sick" and (REPO / demo.data.train_file).is_file()


def test_nli_name_downloads_like_wiki1m(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cselab.model import hub

    seen = []

    def offline(repo: str, filename: str) -> Path:
        seen.append((repo, filename))
        raise hub.ResolveError("the Hub cannot be reached")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(hub, "hub_dataset_file", offline)
    with pytest.raises(hub.ResolveError, match="nli_for_simcse.csv: the Hub cannot be reached"):
        hub.resolve_train_file("nli_for_simcse.csv", str(tmp_path / "cache"))
    assert seen == [(hub.SIMCSE_DATA_REPO, "nli_for_simcse.csv")]
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "nli_for_simcse.csv").write_text("sent0,sent1,hard_neg\n")
    got = hub.resolve_train_file("nli_for_simcse.csv", str(tmp_path / "cache"))
    assert got == tmp_path / "cache" / "nli_for_simcse.csv"


@pytest.mark.skipif(not SICK_TRAIN.is_file(), reason="shared SICK data not found")
def test_short_supervised_run_on_sick_triplets(
    tiny_bert: Path, tmp_path: Path, one_thread, capsys: pytest.CaptureFixture
) -> None:
    """A tiny BERT trained for a few steps on SICK triplets through the config, the run's
    assembly and the trainer: the batches carry the hard negatives, the objective asks for
    them, the loss falls and a model is saved."""
    from cselab.app.train import build_trainer

    cfg = load_config(
        None,
        [
            f"--model.name_or_path={tiny_bert}",
            "--model.pooler=avg",
            f"--data.train_file={SICK_TRAIN}",
            "--data.format=sick",
            f"--data.cache_dir={tmp_path / 'cache'}",
            f"--train.output_dir={tmp_path / 'out'}",
            "--train.batch_size=16",
            "--train.max_steps=8",
            "--train.lr=1e-3",
            "--train.eval_steps=0",
            "--train.log_steps=1",
            "--objective.hard_negative_weight=0.5",
        ],
    )
    trainer = build_trainer(cfg)
    assert isinstance(trainer.batches.corpus, TokenizedPairs) and len(trainer.batches.corpus) == 506
    assert "neg" in trainer.task.objective.required_views
    batch = trainer.batch_for(0)
    assert batch.inputs.negatives["input_ids"].shape[:2] == (16, 1)
    results = trainer.train()
    assert results["steps"] == 8
    lines = (tmp_path / "out" / "metrics.csv").read_text().splitlines()
    header, rows = lines[0].split(","), [dict(zip(lines[0].split(","), r.split(","), strict=True)) for r in lines[1:]]  # fmt: skip
    assert "infonce" in header
    losses = [float(r["infonce"]) for r in rows]
    assert losses[-1] < losses[0]
    assert (tmp_path / "out" / "best" / "model.safetensors").is_file()

    # SICK-R is not unseen for this model: said in results.json and by `cselab evaluate`.
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["notes"] == results["notes"] and "SICK-R is not an unseen" in saved["notes"][0]
    from cselab.cli import main

    out_json = tmp_path / "eval.json"
    argv = ["evaluate", str(tmp_path / "out" / "best"), "--tasks", "sickr",
            "--data-dir", str(SENTEVAL), "--no-download", "--output", str(out_json)]  # fmt: skip
    assert main(argv) == 0
    assert "Note: SICK-R is not an unseen test set" in capsys.readouterr().out
    assert json.loads(out_json.read_text())["notes"] == results["notes"]


def test_only_sick_training_data_gets_the_note() -> None:
    from cselab.config import DataConfig
    from cselab.data.pairs import evaluation_notes

    assert evaluation_notes(DataConfig(train_file="x.txt", format="sick"))
    assert evaluation_notes({"train_file": "../SICK/SICK_train.txt"})
    assert not evaluation_notes(DataConfig(train_file="nli_for_simcse.csv"))
    assert not evaluation_notes({})
