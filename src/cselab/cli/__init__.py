"""Command line: ``cselab train | config | merge | encode | push | evaluate | compare | collection | plot | sweep | report | index build | search | mine``, each in its module (``train``, ``encode``, ``models``: merge and push, ``evaluate``, ``insight``, ``search``, ``mine``, ``config``); here the parser, the config overrides and the one error path.

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
from .config import register as register_config
from .encode import register as register_encode
from .evaluate import register as register_evaluation
from .insight import register as register_insight
from .mine import register as register_mine
from .models import register_merge, register_push
from .options import hint_words, setting_words
from .search import register as register_index
from .train import register as register_train

log = logging.getLogger("cselab")


def _user_errors() -> tuple[type[BaseException], ...]:
    """What a user got wrong (each message names the file, key or value): the project's
    :class:`~cselab.core.errors.UserError` types and a missing file. Any other exception is a bug
    and keeps its traceback."""
    return (UserError, FileNotFoundError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cselab",
        description="Contrastive learning of sentence embeddings: train, evaluate, encode, "
        "search. The commands are listed below; each one's options: cselab COMMAND --help.",
    )
    parser.add_argument("--version", action="version", version=f"cselab {__version__}")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    sub = parser.add_subparsers(dest="command", required=True)

    register_train(sub)
    register_config(sub)

    register_merge(sub)
    register_encode(sub)
    register_push(sub)
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
        # only a training run has a checkpoint to continue from; the other commands are
        # run again (an index build continues from the chunks it wrote)
        said = (
            "the last complete checkpoint (if one was written) is kept in the output folder's "
            "checkpoint/; continue with --train.resume=true (without one: start again)"
            if args.command == "train"
            else "run the command again"
        )
        print(f"cselab {args.command}: interrupted; {said}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
