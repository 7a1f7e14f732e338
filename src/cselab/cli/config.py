"""``cselab config [PRESET]``: every run-config key with its default (or a preset's value), type
and meaning, printed as a YAML file with comments, and the presets that can be named.

The listing is generated from the config dataclasses (:mod:`cselab.config.keys`). The presets are
the package's own (:mod:`cselab.config.presets`), or ``--presets DIR`` / ``$CSELAB_CONFIGS``.
"""

from __future__ import annotations

import argparse
import dataclasses
import textwrap
from pathlib import Path
from typing import Any

import yaml

from ..config.presets import (
    PRESETS_ENV,
    SWEEPS,
    find_preset,
    find_sweep,
    preset_names,
    presets_dir,
)
from ..io.readers import yaml_dumper

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
        help=f"the presets folder (default: ${PRESETS_ENV}, else the presets cselab ships)",
    )
    p.set_defaults(func=cmd_config)


def _comment(text: str, indent: str) -> list[str]:
    return textwrap.wrap(
        text, WIDTH, initial_indent=f"{indent}# ", subsequent_indent=f"{indent}# ",
        break_long_words=False, break_on_hyphens=False,
    )  # fmt: skip


def _value(name: str, value: Any) -> str:
    """``name: value`` in YAML, a list in flow style (``report_to: [tensorboard]``)."""
    # a one-item flow sequence, unwrapped: YAML's quoting of the value without a "..." end mark
    item = yaml.dump(
        [value], Dumper=yaml_dumper(), default_flow_style=True, width=1 << 30, allow_unicode=True
    )
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
    names, sweeps = preset_names(folder), preset_names(folder / SWEEPS)
    if args.preset and args.preset in sweeps and args.preset not in names:
        # a sweep preset: its file as it is (configurations x seeds), and how to run it
        path = find_sweep(args.preset, folder)
        print(f"# cselab sweep preset {path}; run it with: cselab sweep {args.preset}")
        print(path.read_text(encoding="utf-8"), end="")
        return 0
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
        f"Presets ({folder}): {', '.join(names)}" if names else f"Presets: none in {folder}",
        "Show a preset's values: cselab config NAME; train with it: cselab train NAME"
        + (f" --presets {args.presets}" if args.presets else ""),
        f"Sweep presets ({folder / SWEEPS}): {', '.join(sweeps)}; run one: cselab sweep NAME"
        + (f" --presets {args.presets}" if args.presets else "")
        if sweeps
        else f"Sweep presets: none in {folder / SWEEPS}",
        backbones_summary(),
    ]
    print(render(config, header), end="")
    return 0
