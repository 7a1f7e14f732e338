"""Command-line options that several commands share, each defined once."""

from __future__ import annotations

import argparse

from ..model.choices import POOLERS


def add_compile_flag(parser: argparse.ArgumentParser) -> None:
    """``--compile``: encode through one compiled graph (``load(..., compile_inference=True)``)."""
    parser.add_argument(
        "--compile",
        action="store_true",
        dest="compile_inference",
        help="encode through a torch.compile graph: faster per sentence, but the first batches "
        "pay 15-30 s of compiling (MiniLM, 2 cores), so it pays off on large corpora",
    )


def add_pooler_flag(
    parser: argparse.ArgumentParser, help: str = "override the saved pooler"
) -> None:
    """``--pooler``: read the vectors with another pooler than the saved one."""
    parser.add_argument("--pooler", default=None, choices=POOLERS, help=help)


def add_batch_size_flag(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """``--batch-size``: sentences per encoder call (128)."""
    parser.add_argument("--batch-size", type=int, default=128, help=help)


def add_device_flag(parser: argparse.ArgumentParser) -> None:
    """``--device``: where the model runs."""
    parser.add_argument("--device", default=None, help="cpu, cuda, ... (default: cpu)")
