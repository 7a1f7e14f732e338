"""Reading a config and printing the command line's help never load torch (issue 28, point 7):
checked in a fresh interpreter, where ``sys.modules`` shows what an import really pulled in."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


def modules_after(code: str) -> set[str]:
    """The top-level modules loaded in a fresh interpreter after running ``code``."""
    probe = f"{code}\nimport sys\nprint(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    return set(out.stdout.split())


def test_reading_a_config_loads_no_torch(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("objective:\n  focal: {enabled: true}\n", encoding="utf-8")
    loaded = modules_after(
        "from cselab.config import load_config\n"
        f"c = load_config({str(config)!r}, [])\n"
        "assert c.objective.focal.enabled\n"
        "import cselab, cselab.data, cselab.objectives, cselab.evaluation, cselab.search\n"
        "assert cselab.Config is cselab.load_config.__globals__['Config']"
    )
    assert "cselab" in loaded
    assert "torch" not in loaded


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["train", "--help"], ["evaluate", "--help"], ["mine", "--help"],
     ["index", "build", "--help"], ["encode", "--help"], ["config", "--help"]],
)  # fmt: skip
def test_help_loads_no_torch(argv: list[str]) -> None:
    loaded = modules_after(
        "from cselab.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit as e:\n    assert e.code == 0, e.code"
    )
    assert "cselab" in loaded
    assert not {"torch", "transformers"} & loaded


def test_a_lazy_face_still_gives_every_name() -> None:
    """The package faces import their names on first use: every ``__all__`` name resolves."""
    import importlib

    packages = ("cselab", "cselab.data", "cselab.objectives", "cselab.evaluation", "cselab.search")
    for package in packages:
        module = importlib.import_module(package)
        for name in module.__all__:
            assert getattr(module, name) is not None, (package, name)
        with pytest.raises(AttributeError):
            module.no_such_name  # noqa: B018


def test_the_public_face() -> None:
    """The root's documented names (docs/api.md) are the homes' objects."""
    import cselab
    from cselab.config import Config, load_config
    from cselab.evaluation.api import evaluate
    from cselab.search.index import Index
    from cselab.search.mine import mine_hard_negatives
    from cselab.training.callbacks import Callback

    assert (cselab.Config, cselab.load_config, cselab.evaluate) == (Config, load_config, evaluate)
    assert (cselab.Index, cselab.mine, cselab.Callback) == (Index, mine_hard_negatives, Callback)
    from cselab.search.mine import MineSettings
    from cselab.search.settings import IndexSettings

    assert (cselab.IndexSettings, cselab.MineSettings) == (IndexSettings, MineSettings)
    documented = Path(__file__).resolve().parents[1] / "docs" / "api.md"
    text = documented.read_text(encoding="utf-8")
    assert all(f"`cselab.{name}" in text or f"`{name}`" in text for name in cselab.__all__
               if name != "__version__")  # fmt: skip
    # the removed module's users are told where it went, and the root's entry is the one to use
    assert "Moved: `cselab.training.run` -> `cselab.app.train`" in text
    assert "`cselab.train` is the entry for training from Python" in text
