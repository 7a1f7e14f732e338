"""Command-line options that several commands share, each defined once."""

from __future__ import annotations

import argparse


def add_compile_flag(parser: argparse.ArgumentParser) -> None:
    """``--compile``: encode through one compiled graph (``load(..., compile_inference=True)``)."""
    parser.add_argument(
        "--compile",
        action="store_true",
        dest="compile_inference",
        help="encode through a torch.compile graph: faster per sentence, but the first batches "
        "pay 15-30 s of compiling (MiniLM, 2 cores), so it pays off on large corpora",
    )
