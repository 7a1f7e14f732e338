"""Command-line options that several commands share, each defined once."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

from ..core.devices import AUTO, check_device, device_words
from ..core.errors import ConfigError, SettingError
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
    parser: argparse.ArgumentParser,
    help: str = "override the saved pooler (a plain Hugging Face folder: its architecture's "
    "default, docs/backbones.md: cls_before_pooler for BERT, avg for ModernBERT and decoders)",
) -> None:
    """``--pooler``: read the vectors with another pooler than the saved one."""
    parser.add_argument("--pooler", default=None, choices=POOLERS, help=help)


def check_output_path(path: str, option: str) -> None:
    """Raise :class:`ConfigError` naming ``option`` if ``path`` cannot be written, so that a bad
    output is reported before the work (an evaluation, an encoding) runs, not after."""
    p = Path(path)
    folder = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        reason = "is a folder"
    elif not folder.is_dir():
        reason = f"folder {folder} does not exist"
    elif not os.access(folder, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        reason = "permission denied"
    else:
        return
    raise ConfigError(f"{option} {path}: cannot write there ({reason})")


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (argparse names the option)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is refused: it must be at least 1")
    return value


def device_name(text: str) -> str:
    """An argparse type: a device name (:func:`~cselab.core.devices.check_device`)."""
    try:
        return check_device(text, auto=True)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_batch_size_flag(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """``--batch-size``: sentences per encoder call (:data:`~cselab.model.choices.BATCH_SIZE`)."""
    parser.add_argument("--batch-size", type=positive_int, default=BATCH_SIZE, help=help)


def add_device_flag(parser: argparse.ArgumentParser) -> None:
    """``--device``: where the model runs."""
    parser.add_argument("--device", default=AUTO, type=device_name,
                        help=f"{device_words(auto=True)} (default: auto, the GPU where there is "
                        "one: cuda, else mps, else cpu)")  # fmt: skip


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


def _flag(action: argparse.Action, value: object) -> str:
    """``value`` given to ``action``'s option: the long flag alone for a switch."""
    flag = max(action.option_strings, key=len)
    return flag if action.nargs == 0 else f"{flag} {value}"


def _subcommand(root: argparse.ArgumentParser, words: list[str]) -> argparse.ArgumentParser | None:
    """The parser of ``cselab WORDS...`` (``["index", "build"]``) under ``root``."""
    parser: argparse.ArgumentParser | None = root
    for word in words:
        subs = [a for a in (parser._actions if parser else []) if a.choices and a.nargs == "A..."]
        parser = subs[0].choices.get(word) if subs else None  # type: ignore[union-attr]
    return parser


def setting_words(
    err: SettingError, parser: argparse.ArgumentParser, root: argparse.ArgumentParser
) -> str:
    """The message of ``err`` with its setting spelled as this command line takes it: the
    option of ``parser`` (the failed command) whose ``dest`` is the setting (``--nlist 50``,
    ``--overwrite``); for a setting of another command, that command with its flag
    (``cselab index build ... --backend ivf``); on ``cselab train``, the config key as an
    override (``--model.pooler=avg``); else the Python keyword. Only the setting is spelled
    again: the rest of the message, paths and values included, is the library's, unchanged."""
    if err.command is not None:
        other = _subcommand(root, err.command.split())
        actions = {a.dest: a for a in other._actions if a.option_strings} if other else {}
        if err.setting in actions:
            action = actions[err.setting]
            return err.render(lambda v: f"`cselab {err.command} ... {_flag(action, v)}`")
        return str(err)
    actions = {a.dest: a for a in parser._actions if a.option_strings}
    if err.setting in actions:
        return err.render(lambda v: _flag(actions[err.setting], v))
    if err.key is not None and parser.get_default("config_overrides"):
        return err.render(lambda v: f"--{err.key}={v}")
    return str(err)


def hint_words(message: str, texts: Mapping[str, str] | None) -> str:
    """``message`` with a library hint it ends with (a constant that names a Python argument,
    ``columns=...``) replaced by the command's own (``--sts-columns``); only the message's
    tail, the library's own text, is replaced, never a path or value the user gave."""
    for library, command in (texts or {}).items():
        if message.endswith(library):
            return message[: -len(library)] + command
    return message
