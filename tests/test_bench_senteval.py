"""``bench/bench_senteval.py`` takes only a SentEval that scores STS-B and SICK-R by cosine.

The whole benchmark needs a SentEval checkout (not on PyPI, not in CI); what is checked here is
the refusal, before any work, of a folder that is not SentEval and of facebookresearch's own
copy, whose ``STSBenchmark`` trains a regressor and so would not be the numbers cselab reports.
"""

from __future__ import annotations

from pathlib import Path

import bench_senteval
import pytest


def _checkout(root: Path, sts_source: str) -> Path:
    (root / "senteval").mkdir(parents=True)
    (root / "senteval" / "engine.py").write_text("", encoding="utf-8")
    (root / "senteval" / "sts.py").write_text(sts_source, encoding="utf-8")
    return root


def test_refuses_what_is_not_simcses_senteval(tmp_path):
    with pytest.raises(SystemExit, match="senteval/engine.py"):
        bench_senteval.main(["--senteval", str(tmp_path)])
    facebook = _checkout(tmp_path / "fb", "class STSBenchmarkEval(SICKEval): ...\n")
    with pytest.raises(SystemExit, match="trains a regressor"):
        bench_senteval.main(["--senteval", str(facebook)])
