"""``cselab config [PRESET]``: every run-config key with its default (or a preset's value), type
and meaning, printed as a YAML file with comments, and the presets that can be named.

The listing is generated from the config dataclasses (:mod:`cselab.config.keys`). The presets are
the ``configs/*.yaml`` files of the cselab repository; they are found in ``--presets DIR``, else
``$CSELAB_CONFIGS``, else the ``configs/`` folder of the source tree this cselab runs from (a
clone, or an editable install), else ``./configs``. A package installed from a wheel carries no
presets: clone the repository, or point ``--presets`` / ``$CSELAB_CONFIGS`` at its ``configs/``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import textwrap
from pathlib import Path
from typing import Any

import yaml

from ..core.errors import ConfigError

#: Where ``cselab config`` looks for presets when neither ``--presets`` nor this is given.
PRESETS_ENV = "CSELAB_CONFIGS"
WIDTH = 100


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``config`` to the main CLI."""
    p = subparsers.add_parser(
        "config",
        help="list every config key (default, type, meaning) and the presets",
        description="Print every key of a run config with its default, or the value PRESET "
        "gives it, its type and what it does, as a YAML file with comments (save it, edit it, "
        "and run `cselab train FILE`), followed by the presets. Any key can also be set with "
        "--section.key=value on the `cselab train` command line.",
    )
    p.add_argument(
        "preset", nargs="?", help="a preset name (e.g. simcse-bert-base) or a YAML config file"
    )
    p.add_argument(
        "--presets",
        metavar="DIR",
        help=f"the presets folder (default: ${PRESETS_ENV}, else the repository's configs/)",
    )
    p.set_defaults(func=cmd_config)


def presets_dir(explicit: str | None = None) -> Path | None:
    """The folder of preset YAML files (see the module docstring for the order), or ``None``."""
    if explicit:
        folder = Path(explicit).expanduser()
        if not folder.is_dir():
            raise ConfigError(f"--presets {explicit}: folder not found")
        return folder
    if os.environ.get(PRESETS_ENV):
        folder = Path(os.environ[PRESETS_ENV]).expanduser()
        if not folder.is_dir():
            raise ConfigError(f"${PRESETS_ENV}={folder}: folder not found")
        return folder
    # src/cselab/cli/config.py -> the repository root holding configs/ (a clone or editable install)
    repo = Path(__file__).resolve().parents[3] / "configs"
    for folder in (repo, Path("configs")):
        if folder.is_dir():
            return folder
    return None


def preset_names(folder: Path | None) -> list[str]:
    """The presets in ``folder``: its ``*.yaml`` files, by name without the ending."""
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder is not None else []


def find_preset(name: str, folder: Path | None) -> Path:
    """A YAML file given as a path, or a preset named in ``folder``."""
    if Path(name).expanduser().is_file():
        return Path(name).expanduser()
    stem = name.removesuffix(".yaml").removesuffix(".yml")
    # a preset is a name in the folder, never a path: "../x" would read any YAML file on disk
    is_name = stem not in ("", ".", "..") and not any(
        sep in stem for sep in ("/", "\\", os.sep, os.altsep or "/")
    )
    if is_name and folder is not None and (folder / f"{stem}.yaml").is_file():
        return folder / f"{stem}.yaml"
    names = preset_names(folder)
    if folder is None:
        where = f"no presets folder found; pass --presets DIR or set ${PRESETS_ENV}"
    else:
        where = f"presets in {folder}: {', '.join(names)}" if names else f"no presets in {folder}"
    if not is_name:
        raise ConfigError(
            f"config file not found: {name} (and a preset is a name without a path separator; "
            f"{where})"
        )
    raise ConfigError(f"unknown preset or config file {name!r} ({where})")


def _comment(text: str, indent: str) -> list[str]:
    return textwrap.wrap(
        text, WIDTH, initial_indent=f"{indent}# ", subsequent_indent=f"{indent}# ",
        break_long_words=False, break_on_hyphens=False,
    )  # fmt: skip


def _value(name: str, value: Any) -> str:
    """``name: value`` in YAML, a list in flow style (``report_to: [tensorboard]``)."""
    # a one-item flow sequence, unwrapped: YAML's quoting of the value without a "..." end mark
    item = yaml.safe_dump([value], default_flow_style=True, width=1 << 30, allow_unicode=True)
    return f"{name}: {item.strip()[1:-1]}"


def render(config: Any, header: list[str]) -> str:
    """``config`` as commented YAML: per key its meaning and type, then ``key: value``."""
    from ..config.keys import keys, summary

    lines = [line for h in header for line in (_comment(h, "") if h else ["#"])]
    for section in (f.name for f in dataclasses.fields(config)):
        lines.append("")
        cls = type(getattr(config, section))
        lines.append(f"{section}:  # {summary(cls)}")
        for key in keys(getattr(config, section), f"{section}."):
            depth = key.name.count(".")
            indent = "  " * depth
            short = key.name.rsplit(".", 1)[-1]
            if key.section:
                lines += _comment(key.meaning, indent)
                lines.append(f"{indent}{short}:")
                continue
            lines += _comment(f"{key.meaning} [{key.type}]", indent)
            lines.append(f"{indent}{_value(short, key.value)}")
    return "\n".join(lines) + "\n"


def _leading_comments(path: Path) -> list[str]:
    """The comment lines a preset starts with (what it reproduces, the paper's numbers)."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        out.append(line[1:].strip())
    return out


def cmd_config(args: argparse.Namespace) -> int:
    from ..config import Config, load_config
    from ..model.backbones import summary as backbones_summary

    folder = presets_dir(args.presets)
    names = preset_names(folder)
    if args.preset:
        path = find_preset(args.preset, folder)
        config = load_config(path)
        header = [
            f"cselab run config {path}: its values, and the defaults for the keys it leaves out.",
            *_leading_comments(path),
        ]
    else:
        config = Config()
        header = ["cselab run config: every key with its default, type [in brackets] and meaning."]
    header += [
        "Save this as a file, edit it and run `cselab train FILE`, or set any key on the command",
        "line: cselab train [FILE] --section.key=value (e.g. --train.max_steps=1000).",
        "",
        f"Presets ({folder}): {', '.join(names)}"
        if names
        else "Presets: none found (they are the configs/ folder of the cselab repository; pass "
        f"--presets DIR or set ${PRESETS_ENV})",
        "Show a preset's values: cselab config NAME; train with it: cselab train "
        f"{folder / 'NAME.yaml' if folder is not None else 'configs/NAME.yaml'}",
        backbones_summary(),
    ]
    print(render(config, header), end="")
    return 0
