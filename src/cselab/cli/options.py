"""Command-line options that several commands share, each defined once."""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from dataclasses import fields
from typing import Any, TypeVar

from ..model.choices import BATCH_SIZE, POOLERS

T = TypeVar("T")


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
    """``--batch-size``: sentences per encoder call (:data:`~cselab.model.choices.BATCH_SIZE`)."""
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE, help=help)


def add_device_flag(parser: argparse.ArgumentParser) -> None:
    """``--device``: where the model runs."""
    parser.add_argument("--device", default=None, help="cpu, cuda, ... (default: cpu)")


def add_model_flag(
    parser: argparse.ArgumentParser,
    required: bool = True,
    help: str = "cselab output folder, ST folder or HF model",
) -> None:
    """``--model``: the model that encodes (a folder or a Hub name)."""
    parser.add_argument("--model", required=required, default=None, help=help)


def settings_from(cls: type[T], args: argparse.Namespace, **given: Any) -> T:
    """A settings dataclass (``IndexSettings``, ``MineSettings``) from a command's options:
    each field from the option of the same name (``dest``), the dataclass' default where the
    command has no such option, ``given`` before both. A command's options are named as the
    fields, so no setting is spelled twice."""
    values = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}  # type: ignore[arg-type]
    return cls(**{**values, **given})


#: A setting named as a Python keyword in a library error: ``name=value`` (a quoted value, or
#: one up to a space or punctuation), not part of a dotted key or a path.
SETTING = re.compile(r"(?<![\w./-])([a-z][a-z0-9_]*)=('[^']*'|[^\s,;:()]+)")


def flag_words(
    message: str, parser: argparse.ArgumentParser, texts: Mapping[str, str] | None = None
) -> str:
    """``message`` with each setting a library error names as a keyword (``overwrite=True``,
    ``nlist=50``, ``backend='ivf'``) spelled as ``parser``'s option of that ``dest``
    (``--overwrite``, ``--nlist 50``, ``--backend ivf``): library errors name settings, the
    command line its flags. A keyword no option stores is left as it is; ``texts`` replaces a
    library hint that names a Python argument with no option of its own (``columns=``)."""
    for library, command in (texts or {}).items():
        message = message.replace(library, command)
    options = {a.dest: a for a in parser._actions if a.option_strings}

    def spell(match: re.Match[str]) -> str:
        action = options.get(match[1])
        if action is None:
            return match[0]
        flag = max(action.option_strings, key=len)
        value = match[2].strip("'")
        if action.nargs == 0:  # a switch (store_true): its name alone says the value
            return flag
        return f"{flag} {value}"

    return SETTING.sub(spell, message)
