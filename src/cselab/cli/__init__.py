"""Command line: ``cselab train | config | merge | encode | push | evaluate | compare | collection | plot | sweep | report | index build | search | mine``.

User errors (bad config, missing or malformed files, offline downloads, divergence) print one
line naming the problem and exit with status 2; tracebacks are for bugs.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Sequence

from ..core.errors import ConfigError, SettingError, UserError
from ..core.logs import LOG_DATEFMT, LOG_FORMAT
from ..core.version import __version__
from ..evaluation.names import STS_COLUMNS_HINT
from ..io.readers import Lines
from ..model.choices import PRECISIONS
from .config import register as register_config
from .evaluate import register as register_evaluation
from .insight import register as register_insight
from .mine import register as register_mine
from .options import (
    add_batch_size_flag,
    add_compile_flag,
    add_device_flag,
    add_pooler_flag,
    hint_words,
    setting_words,
)
from .search import register as register_index

log = logging.getLogger("cselab")


def _user_errors() -> tuple[type[BaseException], ...]:
    """What a user got wrong (each message names the file, key or value): the project's
    :class:`~cselab.core.errors.UserError` types and a missing file. Any other exception is a bug
    and keeps its traceback."""
    return (UserError, FileNotFoundError)


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
        print(f"saved best model to {run.best}, last to {run.last}")
        for note in results.get("notes", []):
            print(f"note: {note}")
    return 0


def cmd_encode(args: argparse.Namespace) -> int:
    import numpy as np

    from ..io.files import atomic_path
    from ..model.encoder import load
    from ..model.similarity import check_prefix

    # One vector per line, blank lines included, by the plain-line rule the training corpus is
    # read with (only "\n" ends a line: str.splitlines() would also split on U+2028 and form
    # feeds, and the vectors would no longer line up with the file's lines). Read before the
    # model loads, so a bad input is reported at once.
    source = sys.stdin.buffer if args.input == "-" else args.input
    lines = [text for _, text in Lines(source, keep_blank=True, what="input file")]
    # the width is in the folder's config.json: a wrong --dim is refused before the model loads
    if args.dim is not None and (width := _declared_width(args.model)) is not None:
        check_prefix(args.dim, width, "--dim")
    encoder = load(
        args.model, pooler=args.pooler, device=args.device, compile_inference=args.compile_inference
    )
    if args.dim is not None:
        check_prefix(args.dim, encoder.dim, "--dim")
    vectors = encoder.encode(
        lines, batch_size=args.batch_size, normalize=args.normalize, precision=args.precision,
        dim=args.dim, prompt_name=args.prompt_name, prompt=args.prompt,
        show_progress=not args.quiet,  # a bar on stderr: batches done, ETA
    )  # fmt: skip
    # np.save adds ".npy" to a name without it; the file is written whole or not at all
    output = args.output if args.output.endswith(".npy") else args.output + ".npy"
    # the .npy header (a multiple of 64 bytes, 128 for a 2-D float32 array) and the vectors
    needed = 128 + vectors.nbytes
    with atomic_path(output, "vectors", needed) as tmp:
        np.save(tmp, vectors)
    print(f"wrote {vectors.shape[0]} x {vectors.shape[1]} float32 to {output}")
    return 0


def _declared_width(model: str) -> int | None:
    """The vectors' width a local model folder declares (``config.json``'s ``hidden_size``,
    which every cselab pooler keeps), or ``None`` when it does not say (checked after loading)."""
    from pathlib import Path

    from ..io.readers import read_json

    try:
        config = read_json(Path(model).expanduser() / "config.json")
    except (OSError, ValueError):  # a folder that cannot say: the width is checked after loading
        return None
    width = config.get("hidden_size") if isinstance(config, dict) else None
    return width if isinstance(width, int) and not isinstance(width, bool) else None


def cmd_merge(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..publish.callbacks import write_merged_card
    from ..training.merge import merge_folder

    final = str(Path(args.output).resolve())  # what the card's snippets load
    out = merge_folder(args.source, args.output, lambda tmp: write_merged_card(tmp, final))
    print(f"wrote the merged model (LoRA adapters folded into the weights) to {out}")
    return 0


def cmd_push(args: argparse.Namespace) -> int:
    from ..publish.push import push_folder

    info = push_folder(args.folder, args.repo_id, private=args.private, message=args.message)
    print(f"pushed {args.folder} to {getattr(info, 'commit_url', None) or args.repo_id}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cselab",
        description="Contrastive learning of sentence embeddings: train, evaluate, encode, "
        "search. The commands are listed below; each one's options: cselab COMMAND --help.",
    )
    parser.add_argument("--version", action="version", version=f"cselab {__version__}")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
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

    register_config(sub)

    p = sub.add_parser(
        "merge",
        help="merge a model's LoRA adapters into its weights (a plain model folder)",
        description="Fold the LoRA adapters of SOURCE (a model folder saved with model.lora, or "
        "a run folder: its best/) into the base weights and write a plain Hugging Face and "
        "sentence-transformers folder that needs neither peft nor the base model.",
    )
    p.add_argument("source", help="a run folder or a model folder holding adapters")
    p.add_argument("-o", "--output", required=True, help="the new folder (must not exist)")
    p.set_defaults(func=cmd_merge)

    p = sub.add_parser("encode", help="encode sentences (one per line) to a .npy file")
    p.add_argument("model", help="cselab output folder, sentence-transformers folder or HF model")
    p.add_argument(
        "--input", required=True, help="text file, one sentence per line, or - for stdin"
    )
    p.add_argument("--output", required=True, help="output .npy path")
    add_pooler_flag(p)
    add_batch_size_flag(p)
    p.add_argument(
        "--normalize",
        action="store_true",
        help="L2-normalise the vectors (always done for a folder whose modules end in Normalize)",
    )
    p.add_argument(
        "--dim",
        type=int,
        default=None,
        help="keep the first DIM coordinates of each vector, re-normalised (a model trained "
        "with objective.matryoshka.dims; implies --normalize)",
    )
    p.add_argument(
        "--precision",
        default="fp32",
        choices=PRECISIONS,
        help="compute precision; bf16 is faster on CPUs with AMX/AVX512-BF16 and on GPUs",
    )
    p.add_argument(
        "--prompt-name",
        metavar="NAME",
        help="put the model's saved prompt NAME (e.g. query) before every sentence",
    )
    p.add_argument("--prompt", metavar="TEXT",
                   help="put TEXT before every sentence (wins over --prompt-name; default: the "
                   "model's default prompt, if it has one)")  # fmt: skip
    add_device_flag(p)
    add_compile_flag(p)
    p.set_defaults(func=cmd_encode)

    p = sub.add_parser(
        "push",
        help="upload a saved model folder to the Hugging Face Hub",
        description="Create REPO_ID if needed and upload FOLDER (weights, tokenizer, model card) "
        "in one commit. Uses $HF_TOKEN (or the saved login) and $HF_ENDPOINT.",
    )
    p.add_argument("folder", help="a folder saved by cselab train (best/ or last/)")
    p.add_argument("repo_id", help="user/name or org/name")
    p.add_argument("--private", action="store_true", help="create the repo private")
    p.add_argument("--message", default=None, help="commit message")
    p.set_defaults(func=cmd_push)

    register_evaluation(sub)
    register_insight(sub)
    register_index(sub)  # `index build` and `search`
    register_mine(sub)
    # library errors name settings (``presets='x'``, ``pooler=NAME``, a SettingError): each
    # command shows its own flag for them (options.setting_words)
    for command in sub.choices.values():
        if command.get_default("flags_of") is None:
            command.set_defaults(flags_of=command)
    return parser


#: A config override, ``--section.key=value`` (a dotted key, then ``=``). Overrides are taken
#: out of the command line before argparse sees it: argparse reads any argument that holds a
#: space as a positional one, so ``--train.output_dir='a b'`` would become the config file.
OVERRIDE = re.compile(r"--[A-Za-z_][\w-]*(?:\.[\w-]+)+=")


#: A config key written with its value in the next argument (``--train.lr 1e-5``): argparse
#: would take the value for the config file.
SPACED_OVERRIDE = re.compile(r"--[A-Za-z_][\w-]*(?:\.[\w-]+)+$")


def spaced_override(argv: Sequence[str]) -> str | None:
    """The one-line refusal of an override written ``--section.key value`` (the value in the
    next argument) in ``argv``, naming the ``--section.key=value`` form; ``None`` if none is."""
    for arg, value in zip(argv, argv[1:], strict=False):
        if arg == "--":
            break
        if SPACED_OVERRIDE.match(arg) and not value.startswith("--"):
            return (
                f"override {arg} {value}: a config override takes its value after '=': "
                f"write {arg}={value}"
            )
    return None


def split_overrides(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``argv`` without its ``--section.key=value`` overrides, and the overrides in order
    (everything after a ``--`` stays where it is)."""
    rest: list[str] = []
    overrides: list[str] = []
    for i, arg in enumerate(argv):
        if arg == "--":
            rest.extend(argv[i:])
            break
        (overrides if OVERRIDE.match(arg) else rest).append(arg)
    return rest, overrides


def quiet_transformers() -> None:
    """No progress bars of transformers' own ("Loading weights", "Writing model shards" at every
    load and save): they drown a command's lines. Set before transformers is imported (no
    import here: most commands that load no model never import it); a value the user set in
    ``HF_HUB_DISABLE_PROGRESS_BARS`` is kept."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1":
        from transformers.utils import logging as hf_logging  # imported already: tell it

        hf_logging.disable_progress_bar()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv, overrides = split_overrides(list(sys.argv[1:] if argv is None else argv))
    spaced = spaced_override(argv)
    args, rest = parser.parse_known_args(argv)
    rest = overrides + rest
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        format=LOG_FORMAT,
        datefmt=LOG_DATEFMT,
    )
    # huggingface_hub's logger has a handler of its own (its retries, its warnings): printed
    # there, and not again through the root's
    logging.getLogger("huggingface_hub").propagate = False
    if rest and args.command != "train":
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.overrides = rest  # only `train` accepts --section.key=value overrides
    try:
        if spaced is not None and args.command == "train":
            raise ConfigError(spaced)
        quiet_transformers()
        return int(args.func(args) or 0)
    except _user_errors() as err:
        message = str(err)
        if isinstance(err, SettingError):  # library errors name settings; a command its flags
            message = setting_words(err, args.flags_of, parser)
        message = hint_words(message, getattr(args, "flag_texts", None))
        print(f"cselab {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "interrupted; the last complete checkpoint (if one was written) is kept in the "
            "output folder's checkpoint/; continue with --train.resume=true",
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":
    sys.exit(main())
