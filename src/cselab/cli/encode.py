"""``cselab encode``: sentences, one per line, to a ``.npy`` file of vectors."""

from __future__ import annotations

import argparse
import sys

from ..io.readers import Lines
from ..model.choices import PRECISIONS
from .options import (
    add_batch_size_flag,
    add_compile_flag,
    add_device_flag,
    add_pooler_flag,
    check_output_path,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``encode`` to the main CLI."""
    p = subparsers.add_parser("encode", help="encode sentences (one per line) to a .npy file")
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


def cmd_encode(args: argparse.Namespace) -> int:
    import numpy as np

    from ..io.files import atomic_path
    from ..model.encoder import load
    from ..model.similarity import check_prefix

    # One vector per line, blank lines included, by the plain-line rule the training corpus is
    # read with (only "\n" ends a line: str.splitlines() would also split on U+2028 and form
    # feeds, and the vectors would no longer line up with the file's lines). Read before the
    # model loads, so a bad input is reported at once.
    # np.save adds ".npy" to a name without it; the file is written whole or not at all
    output = args.output if args.output.endswith(".npy") else args.output + ".npy"
    check_output_path(output, "--output")  # before minutes of encoding, not after
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
