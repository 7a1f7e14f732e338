"""``--device auto``, the default of the commands that encode: the GPU where there is one
(CUDA, else MPS, else the CPU), the choice logged in one line."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from cselab.cli import build_parser, main
from cselab.model import devices


@pytest.mark.parametrize(
    ("cuda", "mps", "expected"),
    [(True, True, "cuda:0"), (False, True, "mps"), (False, False, "cpu")],
)
def test_auto_is_cuda_else_mps_else_the_cpu(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    cuda: bool,
    mps: bool,
    expected: str,
) -> None:
    """Only the availability answers are replaced: nothing is moved to a device here."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some GPU")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    with caplog.at_level(logging.INFO, logger="cselab"):
        assert devices.resolve_device("auto") == torch.device(expected)
    gpu = " (Some GPU)" if cuda else ""
    assert [r.getMessage() for r in caplog.records] == [f"device auto: {expected}{gpu}"]


def test_a_named_device_is_checked_as_before() -> None:
    assert devices.resolve_device("cpu") == torch.device("cpu")
    if not torch.backends.mps.is_available():
        with pytest.raises(devices.ConfigSettingError, match="device='mps' is not available"):
            devices.resolve_device("mps")


@pytest.mark.parametrize(
    "argv",
    [
        ["encode", "M", "--input", "x", "--output", "y"],
        ["evaluate", "M"],
        ["mine", "P", "--model", "M", "--output", "y"],
        ["index", "build", "C", "--model", "M", "--output", "y"],
        ["search", "I", "q"],
    ],
)
def test_the_commands_that_encode_default_to_auto(argv: list[str]) -> None:
    args, _ = build_parser().parse_known_args(argv)
    assert args.device == "auto"


def test_encode_at_the_default_device_logs_its_choice(
    tiny_bert: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = tmp_path / "s.txt"
    text.write_text("a sentence\nanother one\n", encoding="utf-8")
    out = tmp_path / "e.npy"
    with caplog.at_level(logging.INFO, logger="cselab"):
        assert main(["encode", str(tiny_bert), "--input", str(text), "--output", str(out)]) == 0
    chosen = devices.best_device()
    assert f"device auto: {chosen}" in [r.getMessage().split(" (")[0] for r in caplog.records]
    assert np.load(out).shape[0] == 2
