"""Task parsing, headline tables, JSON/CSV, and the ``evaluate`` / ``compare`` commands."""

from __future__ import annotations

import argparse
import csv
import io
import json
from pathlib import Path

import pytest

from cselab.cli import evaluate as ecli
from cselab.evaluation import datasets as ds
from cselab.evaluation import parse_tasks, report
from fakes import HashingEncoder

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "senteval"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"SentEval data not found at {DATA}")


def test_parse_tasks_groups_aliases_and_dev_mode():
    assert parse_tasks("sts") == [
        "STS12",
        "STS13",
        "STS14",
        "STS15",
        "STS16",
        "STSBenchmark",
        "SICKRelatedness",
    ]
    assert parse_tasks("STS-B, sick-r,sst-2,trec") == [
        "STSBenchmark",
        "SICKRelatedness",
        "SST2",
        "TREC",
    ]
    assert parse_tasks("all")[-1] == "AlignUniform" and len(parse_tasks("all")) == 15
    assert parse_tasks("sts", mode="dev") == ["STSBenchmark", "SICKRelatedness"]
    with pytest.raises(ValueError, match="STS12 has no dev split"):
        parse_tasks("STS12", mode="dev")
    with pytest.raises(ValueError, match="unknown task 'STS17'"):
        parse_tasks("STS17")


def _fake_results(mode: str = "test") -> dict:
    sts_year = {"subsets": {}, "all": {"pearson": 0.5, "spearman": 0.61234, "n": 10},
                "mean": {"pearson": 0.5, "spearman": 0.6}, "wmean": {"pearson": 0.5, "spearman": 0.6}}  # fmt: skip
    results = {y: sts_year for y in ("STS12", "STS13", "STS14", "STS15", "STS16")}
    results["STSBenchmark"] = {"split": "test", "pearson": 0.7, "spearman": 0.8, "n": 3}
    results["SICKRelatedness"] = {"split": "test", "pearson": 0.7, "spearman": float("nan"), "n": 3}
    results["MRPC"] = {"devacc": 70.0, "acc": 71.5, "f1": 80.25, "ndev": 1, "ntest": 1}
    return {"model": "m", "mode": mode, "results": results}


def test_headline_values_and_avg():
    head = report.headline(_fake_results())
    assert head["sts"]["STS12"] == 61.23 and head["sts"]["STS-B"] == 80.0
    assert head["sts"]["SICK-R"] is None and head["sts"]["Avg"] is None  # NaN: no average
    assert head["transfer"]["MRPC"] == 71.5 and head["transfer"]["MR"] is None
    out = _fake_results()
    out["results"]["SICKRelatedness"]["spearman"] = 0.7
    head = report.headline(out)
    assert head["sts"]["Avg"] == round((5 * 61.23 + 80 + 70) / 7, 2)  # mean of the 2-decimal values


def test_markdown_json_csv(tmp_path):
    out = _fake_results()
    md = report.markdown(out)
    assert "| Model | STS12 | STS13 | STS14 | STS15 | STS16 | STS-B | SICK-R | Avg |" in md
    assert "| m | 61.23 | 61.23 | 61.23 | 61.23 | 61.23 | 80.00 | – | – |" in md
    assert "MRPC F1: m 80.25" in md
    report.save_json(out, tmp_path / "r.json")
    text = (tmp_path / "r.json").read_text()
    assert "NaN" not in text and json.loads(text)["results"]["SICKRelatedness"]["spearman"] is None
    rows = list(csv.DictReader(io.StringIO(report.to_csv(out, tmp_path / "r.csv"))))
    assert {
        "model": "m",
        "mode": "test",
        "task": "STS12",
        "subset": "all",
        "metric": "spearman",
        "value": "0.61234",
    } in rows
    assert any(r["task"] == "MRPC" and r["metric"] == "f1" for r in rows)
    assert (tmp_path / "r.csv").read_text().startswith("model,mode,task,subset,metric,value")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cselab")
    ecli.register(parser.add_subparsers(dest="command", required=True))
    return parser


@needs_data
def test_evaluate_and_compare_commands(tmp_path, monkeypatch, capsys):
    import cselab.model.encoder

    ds.clear_cache()
    loaded = []

    def fake_load(path, pooler=None, **options):
        loaded.append((path, pooler))
        return HashingEncoder(dim=32, seed=len(loaded))

    # the CLI loads through cselab.model.encoder; the model names are folders (checked first)
    monkeypatch.setattr(cselab.model.encoder, "load", fake_load)
    monkeypatch.chdir(tmp_path)
    for i in range(2):
        (tmp_path / f"model{i}").mkdir()
    outs = []
    for i in range(2):
        out_json, out_csv = tmp_path / f"r{i}.json", tmp_path / f"r{i}.csv"
        args = _parser().parse_args(
            ["evaluate", f"model{i}", "--tasks", "STS13,STS-B", "--pooler", "avg",
             "--data-dir", str(DATA), "--output", str(out_json), "--csv", str(out_csv)]
        )  # fmt: skip
        assert args.func(args) == 0
        outs.append(out_json)
    assert loaded == [("model0", "avg"), ("model1", "avg")]
    printed = capsys.readouterr().out
    assert "| model0 (avg) |" in printed and "STS13" in printed
    saved = json.loads(outs[0].read_text())
    assert saved["pooler"] == "avg" and set(saved["results"]) == {"STS13", "STSBenchmark"}
    assert set(saved["results"]["STS13"]["subsets"]) == {"FNWN", "headlines", "OnWN"}

    args = _parser().parse_args(["compare", *map(str, outs), "--names", "A,B"])
    assert args.func(args) == 0
    table = capsys.readouterr().out
    assert "| A |" in table and "| B |" in table and "STS-B" in table
    ds.clear_cache()


def test_evaluate_command_reports_missing_data(tmp_path, monkeypatch, capsys):
    import cselab.model.encoder
    from cselab.cli import main

    monkeypatch.setattr(
        cselab.model.encoder, "load", lambda path, pooler=None, **options: HashingEncoder()
    )
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m").mkdir()  # the model is checked before the data: it must be a folder
    assert main(["evaluate", "m", "--tasks", "STS12", "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cselab evaluate: error: SentEval data missing") and err.count("\n") == 1
    assert "STS/STS12-en-test/STS.input.MSRpar.txt" in err
    assert "then pass --data-dir DIR or set $" in err  # the library's data_dir=DIR, as a flag
    from cselab.core.errors import MissingDataError
    from cselab.evaluation.download import ensure_files

    with pytest.raises(MissingDataError, match=r"then pass data_dir=DIR or set \$") as caught:
        ensure_files(["STS/none.txt"], tmp_path, download_missing=False)
    assert caught.value.setting == "data_dir"


def test_compare_rejects_non_results_file(tmp_path, capsys):
    from cselab.cli import main

    bad = tmp_path / "x.json"
    bad.write_text("{}")
    assert main(["compare", str(bad)]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"cselab compare: error: {bad}: not a cselab evaluation results file (no 'results' key)\n"
    )
    bad.write_bytes(b"\xff{")
    assert main(["compare", str(bad)]) == 2
    assert capsys.readouterr().err.startswith(
        f"cselab compare: error: {bad}: not a JSON results file"
    )
    assert main(["compare", str(bad), "--names", "a,b"]) == 2
    assert main(["evaluate", "m", "--tasks", "STS99"]) == 2
    assert "unknown task 'STS99'" in capsys.readouterr().err


def test_compare_shows_retrieval_results_a_row_per_run() -> None:
    """``cselab compare`` of a SentEval file and retrieval files: the STS table keeps its mode
    (a retrieval-only file's ``mode`` is its BEIR split), and each collection gets a table with
    a row per run that has it."""

    def retrieval(ndcg: float, split: str = "dev") -> dict:
        entry = {"kind": "retrieval", "folder": "/x/my-beir", "split": split, "documents": 9,
                 "metrics": {"ndcg@10": ndcg, "mrr@10": ndcg + 1}}  # fmt: skip
        return {"model": "m", "mode": split, "results": {"retrieval:my-beir": entry}}

    sts = {"model": "s", "mode": "test", "results": {},
           "headline": {"sts": {"STSb": 80.0}}}  # fmt: skip
    text = report.compare([sts, retrieval(40.0), retrieval(50.0)], ["sts", "a", "b"])
    assert "dev/test" not in text
    table = text.split("**Retrieval: my-beir (dev, x 100)**")[1]
    assert "| a | 40.00 | 41.00 |" in table and "| b | 50.00 | 51.00 |" in table
    assert "| sts |" not in table
    # one run's report shows its own retrieval markdown instead
    assert "Retrieval: my-beir" not in report.compare([retrieval(40.0)])
