"""MTEB route: a local STS-B task through the real ``mteb.evaluate`` gives cselab's Spearman,
with the pooler honoured; CLI errors are one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mteb")

import cselab  # noqa: E402
from conftest import needs_senteval  # noqa: E402
from cselab.cli import main  # noqa: E402
from cselab.evaluation import evaluate  # noqa: E402
from cselab.evaluation.mteb import MTEBEncoder, SentEvalSTSBenchmark, run_mteb  # noqa: E402

pytestmark = needs_senteval


@pytest.fixture(scope="module")
def tiny_folder(tiny_bert: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved cselab folder with the avg pooler (the pooler MTEB must honour)."""
    from cselab.model.encoder import SentenceEncoder

    folder = tmp_path_factory.mktemp("mteb") / "tiny-avg"
    SentenceEncoder.from_pretrained(str(tiny_bert), pooler="avg").save(folder)
    return folder


def cselab_stsb_dev(encoder, senteval_dir: Path) -> float:
    out = evaluate(encoder, tasks="STSBenchmark", mode="dev", data_dir=senteval_dir, download=False)
    return 100.0 * out["results"]["STSBenchmark"]["spearman"]


@pytest.mark.parametrize("pooler", [None, "cls_before_pooler"])
def test_mteb_stsb_equals_cselab_evaluate(
    tiny_folder: Path, senteval_dir: Path, pooler: str | None, one_thread
) -> None:
    encoder = cselab.load(str(tiny_folder), pooler=pooler)
    assert encoder.pooler.kind == (pooler or "avg")
    out = run_mteb(str(tiny_folder), [SentEvalSTSBenchmark("dev", senteval_dir)], pooler=pooler)
    assert out["pooler"] == encoder.pooler.kind
    mteb_score = out["scores"]["SentEvalSTSBenchmark"]["dev"]["default"]
    ours = cselab_stsb_dev(encoder, senteval_dir)
    assert mteb_score == pytest.approx(ours, abs=0.01)  # x 100 scale: 1e-4 as a correlation
    task = out["results"]["SentEvalSTSBenchmark"]
    assert task["scores"]["dev"][0]["cosine_spearman"] == pytest.approx(mteb_score / 100)


def test_pooler_changes_the_score(tiny_folder: Path, senteval_dir: Path, one_thread) -> None:
    """Guards the test above: the two poolers must give different scores, or it shows nothing."""
    task = [SentEvalSTSBenchmark("dev", senteval_dir)]
    avg = run_mteb(str(tiny_folder), task)["scores"]["SentEvalSTSBenchmark"]["dev"]["default"]
    task = [SentEvalSTSBenchmark("dev", senteval_dir)]
    cls = run_mteb(str(tiny_folder), task, pooler="cls_before_pooler")
    assert abs(cls["scores"]["SentEvalSTSBenchmark"]["dev"]["default"] - avg) > 1.0


def test_local_task_reads_senteval_pairs(senteval_dir: Path) -> None:
    task = SentEvalSTSBenchmark("test", senteval_dir)
    task.load_data()
    rows = task.dataset["test"]
    assert len(rows) == 1379  # STS-B test pairs, as the shared data README counts them
    assert task.metadata.eval_splits == ["test"]
    assert min(rows["score"]) >= 0.0 and max(rows["score"]) <= 5.0
    with pytest.raises(ValueError, match="dev or test"):
        SentEvalSTSBenchmark("train")


def test_model_meta_records_pooler(tiny_folder: Path) -> None:
    meta = MTEBEncoder(cselab.load(str(tiny_folder))).mteb_model_meta
    assert meta.name == "cselab/" + "_".join(tiny_folder.parts[-2:])
    assert meta.experiment_kwargs == {"pooler": "avg"} and meta.embed_dim == 32


def test_cli_mteb_writes_json(
    tiny_folder: Path, senteval_dir: Path, tmp_path: Path, capsys, one_thread
) -> None:
    out_file = tmp_path / "mteb.json"
    code = main(["-q", "evaluate", str(tiny_folder), "--mteb", "SentEvalSTSBenchmark",
                 "--data-dir", str(senteval_dir), "-o", str(out_file)])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "| SentEvalSTSBenchmark | dev | default |" in printed
    saved = json.loads(out_file.read_text())
    ours = cselab_stsb_dev(cselab.load(str(tiny_folder)), senteval_dir)
    assert saved["scores"]["SentEvalSTSBenchmark"]["dev"]["default"] == pytest.approx(
        ours, abs=0.01
    )


def test_cli_unknown_task_is_one_line(tiny_folder: Path, capsys) -> None:
    assert main(["evaluate", str(tiny_folder), "--mteb", "STS1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "cselab evaluate: error: unknown MTEB task 'STS1': KeyError: 'STS1' not found. " \
        "Did you mean: 'STS17'?"  # fmt: skip


def test_cli_offline_download_is_one_line(tiny_folder: Path) -> None:
    """MTEB's own tasks download their data; offline that is one line naming the dataset."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "cselab", "-q", "evaluate", str(tiny_folder), "--mteb", "STS12"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("cselab evaluate: error: ") and "mteb/sts12-sts" in last
    assert "Traceback" not in proc.stderr


def test_mteb_as_an_evaluation_task(tiny_folder: Path, senteval_dir: Path, one_thread) -> None:
    """``evaluate(encoder, tasks=[MTEBTask(...)])`` gives run_mteb's scores, beside SentEval's."""
    from cselab.evaluation.tasks import MTEBTask

    encoder = cselab.load(str(tiny_folder))
    task = MTEBTask((SentEvalSTSBenchmark("dev", senteval_dir),))
    out = evaluate(encoder, tasks=["STSBenchmark", task], mode="dev", data_dir=senteval_dir,
                   download=False)  # fmt: skip
    direct = run_mteb(encoder, [SentEvalSTSBenchmark("dev", senteval_dir)])
    assert out["results"]["mteb"]["kind"] == "mteb"
    assert out["results"]["mteb"]["scores"] == direct["scores"]
    ours = 100.0 * out["results"]["STSBenchmark"]["spearman"]
    assert direct["scores"]["SentEvalSTSBenchmark"]["dev"]["default"] == pytest.approx(
        ours, abs=0.01
    )


def test_cli_mteb_reads_and_records_the_instructions(
    tiny_folder: Path, senteval_dir: Path, tmp_path: Path, caplog, one_thread
) -> None:
    """``--mteb SentEvalSTSBenchmark --instructions llm2vec`` reads the table's STSBenchmark
    instruction (the score is SentEval's with that prompt) and the JSON names the table and the
    prompts given; a task the table has no instruction for is one warning line naming it."""
    import yaml

    from cselab.evaluation.embed import with_prompt

    out_file = tmp_path / "mteb.json"
    argv = ["-q", "evaluate", str(tiny_folder), "--mteb", "SentEvalSTSBenchmark",
            "--data-dir", str(senteval_dir), "-o", str(out_file)]  # fmt: skip
    assert main([*argv, "--instructions", "llm2vec"]) == 0
    saved = json.loads(out_file.read_text())
    instruction = "Retrieve semantically similar text: "
    assert saved["instructions"] == "llm2vec"
    assert saved["model_prompts"] == {"SentEvalSTSBenchmark": instruction}
    encoder = cselab.load(str(tiny_folder))
    ours = cselab_stsb_dev(with_prompt(encoder, instruction), senteval_dir)
    score = saved["scores"]["SentEvalSTSBenchmark"]["dev"]["default"]
    assert score == pytest.approx(ours, abs=0.01)
    assert abs(score - cselab_stsb_dev(encoder, senteval_dir)) > 0.1  # the instruction acted

    table = tmp_path / "twelve.yaml"
    table.write_text(yaml.safe_dump({"instructions": {"STS12": instruction}}))
    assert main([*argv, "--instructions", str(table)]) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert f"{table}: no instruction for SentEvalSTSBenchmark; read with the model's own " \
        "prompts" in warnings  # fmt: skip
    saved = json.loads(out_file.read_text())
    assert saved["instructions"] == str(table) and saved["model_prompts"] == {}
