"""Every training script in docs/sentence_transformers.md runs as written (tiny model, small file)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sentence_transformers import SentenceTransformer

from conftest import REPO, write_corpus
from cselab.publish.card import code_blocks

DOC = REPO / "docs" / "sentence_transformers.md"
SCRIPTS = code_blocks(DOC.read_text(encoding="utf-8").split("## Training scripts", 1)[1])


def test_one_script_per_paper() -> None:
    losses = [re.search(r"^from cselab.st import (\w+)$", s, re.M).group(1) for s in SCRIPTS]
    assert losses == [
        "CSELoss",
        "FocalInfoNCELoss",
        "GSInfoNCELoss",
        "ImSimCSELoss",
        "DCLLoss",
        "MixCSELoss",
    ]


@pytest.mark.parametrize("index", range(len(SCRIPTS)))
def test_script_runs(index: int, tiny_bert: Path, tmp_path: Path, one_thread) -> None:
    script = SCRIPTS[index]
    settings = {
        "MODEL": str(tiny_bert),
        "TRAIN_FILE": str(write_corpus(tmp_path)),  # 200 sentences: 3 steps of 64
        "OUTPUT": str(tmp_path / "out"),
    }
    for name, value in settings.items():
        script, n = re.subn(rf'^{name} = ".*"(.*)$', f"{name} = {value!r}", script, flags=re.M)
        assert n == 1, name
    exec(compile(script, f"{DOC}[{index}]", "exec"), {})  # noqa: S102 - the test's point
    model = SentenceTransformer(str(tmp_path / "out" / "final"), device="cpu")
    assert model.encode(["alpha beta gamma"]).shape == (1, 32)


def test_the_objective_config_block_runs(tiny_bert: Path) -> None:
    """The doc shows how to build CSELoss's objective config; its block runs as written (the
    three ways agree: its own assert) and the loss holds that objective."""
    section = DOC.read_text(encoding="utf-8").split("## The objective config of `CSELoss`", 1)
    (block,) = code_blocks(section[1].split("\n## ", 1)[0])
    script, n = re.subn(r'^MODEL = ".*"$', f"MODEL = {str(tiny_bert)!r}", block, flags=re.M)
    assert n == 1
    scope: dict = {}
    exec(compile(script, f"{DOC}[objective config]", "exec"), scope)  # noqa: S102
    assert scope["loss"].config.focal.enabled and scope["loss"].config.dcl.enabled
