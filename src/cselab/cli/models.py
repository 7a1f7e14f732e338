"""``cselab merge`` and ``cselab push``: a trained model folder made plain (LoRA adapters
folded in) or uploaded to the Hugging Face Hub."""

from __future__ import annotations

import argparse


def register_merge(subparsers: argparse._SubParsersAction) -> None:
    """Add ``merge`` to the main CLI."""
    p = subparsers.add_parser(
        "merge",
        help="merge a model's LoRA adapters into its weights (a plain model folder)",
        description="Fold the LoRA adapters of SOURCE (a model folder saved with model.lora, or "
        "a run folder: its best/) into the base weights and write a plain Hugging Face and "
        "sentence-transformers folder that needs neither peft nor the base model.",
    )
    p.add_argument("source", help="a run folder or a model folder holding adapters")
    p.add_argument("-o", "--output", required=True, help="the new folder (must not exist)")
    p.add_argument(
        "--bidirectional", action=argparse.BooleanOptionalAction, default=None,
        help="a decoder's attention in the merged model: --bidirectional for adapters trained "
        "without the causal mask (LLM2Vec's); default: what the folder records (cselab.json), "
        "else causal",
    )  # fmt: skip
    p.set_defaults(func=cmd_merge)


def register_push(subparsers: argparse._SubParsersAction) -> None:
    """Add ``push`` to the main CLI."""
    p = subparsers.add_parser(
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


def cmd_merge(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..publish.callbacks import write_merged_card
    from ..training.merge import adapter_source, merge_folder

    final = str(Path(args.output).resolve())  # what the card's snippets load
    source = adapter_source(args.source)  # a run folder's best/: the card reads the run
    out = merge_folder(
        source, args.output, lambda tmp: write_merged_card(tmp, final, source), args.bidirectional
    )
    print(f"wrote the merged model (LoRA adapters folded into the weights) to {out}")
    return 0


def cmd_push(args: argparse.Namespace) -> int:
    from ..publish.push import push_folder

    info = push_folder(args.folder, args.repo_id, private=args.private, message=args.message)
    print(f"pushed {args.folder} to {getattr(info, 'commit_url', None) or args.repo_id}")
    return 0
