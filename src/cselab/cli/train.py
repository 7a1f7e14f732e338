"""``cselab train``: a run from a preset or a YAML config and ``--section.key=value``
overrides, its headline printed when it ends."""

from __future__ import annotations

import argparse

from ..evaluation.names import STS_COLUMNS_HINT


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``train`` to the main CLI."""
    p = subparsers.add_parser(
        "train",
        help="train a sentence encoder",
        description="Train with a YAML config; override any key with --section.key=value "
        "(e.g. --train.lr=1e-5 --objective.temperature=0.05). Every key, its default, type and "
        "meaning: `cselab config`; a preset's values: `cselab config PRESET` (e.g. "
        "simcse-bert-base).",
    )
    p.add_argument(
        "config",
        nargs="?",
        help="a preset name (e.g. demo-minilm; the list: `cselab config`) or a YAML config file "
        "(default: SimCSE BERT-base unsup)",
    )
    p.add_argument(
        "--presets",
        metavar="DIR",
        help="look preset names up in this folder (default: $CSELAB_CONFIGS, else cselab's own)",
    )
    # a setting's error names its config key as an override (``--model.pooler=avg``); the STS
    # columns hint names the eval key (read_sts_file's own hint names its ``columns=``)
    p.set_defaults(
        func=cmd_train,
        config_overrides=True,
        flag_texts={STS_COLUMNS_HINT: "name the columns with --eval.dev_columns=[S1,S2,SCORE]"},
    )


def cmd_train(args: argparse.Namespace) -> int:
    from ..app.train import train
    from ..config import load_config
    from ..config.presets import find_preset, presets_dir
    from ..io.runfolder import RunFolder

    path = find_preset(args.config, presets_dir(args.presets)) if args.config else None
    config = load_config(path, args.overrides)
    results = train(config)
    if results:
        from ..core.metrics import STSB_DEV

        name = results.get("dev", {}).get("name", STSB_DEV)
        init = results.get(f"initial_{name}")
        best = results.get(f"best_{name}")
        if init is not None and best is not None:
            label = "STS-B dev Spearman" if name == STSB_DEV else f"{name} ({config.eval.dev})"
            print(f"{label}: before {init:.2f} -> best {best:.2f} (step {results['best_step']})")
        run = RunFolder(config.train.output_dir)
        print(f"best model: {run.best}; last: {run.last}")  # a finished run's retry writes none
        if config.train.save_merged and run.merged.is_dir():
            print(f"merged (the adapters folded into the weights): {run.merged}")
        for note in results.get("notes", []):
            print(f"note: {note}")
    return 0
