"""``cselab mine``: hard negatives for a pairs file, written as triplets ``cselab train`` reads."""

from __future__ import annotations

import argparse

from ..data.config import PairColumns
from ..io.files import TABLE_WRITE_SUFFIXES
from ..search.index import SEARCH_BACKENDS
from ..search.mine import COLUMNS_HINT, MINE_CHUNK, OUTPUT_FORMATS, SAMPLING, MineSettings
from ..search.settings import IndexSettings
from .options import (
    add_batch_size_flag,
    add_compile_flag,
    add_device_flag,
    add_model_flag,
    add_pooler_flag,
    settings_from,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``mine`` to the main CLI."""
    p = subparsers.add_parser(
        "mine",
        help="mine hard negatives for (anchor, positive) pairs",
        description="Encode the distinct positives of PAIRS (and --corpus), search them with "
        "each anchor and write (anchor, positive, negative) rows that `cselab train` reads as "
        "they are. The filters are those of sentence-transformers' mine_hard_negatives.",
    )
    p.add_argument("pairs", help="pairs file (.tsv/.csv/.jsonl/.parquet or a saved dataset)")
    add_model_flag(p)
    p.add_argument("-o", "--output", required=True,
                   help=f"output table: {', '.join(TABLE_WRITE_SUFFIXES)}")  # fmt: skip
    p.add_argument("--corpus", default=None, help="text file of more candidates, one per line")
    p.add_argument("--anchor-column", default=PairColumns.anchor,
                   help=f"column of the anchors ({PairColumns.anchor})")  # fmt: skip
    p.add_argument("--positive-column", default=PairColumns.positive,
                   help=f"column of the positives ({PairColumns.positive})")  # fmt: skip
    d = MineSettings()
    p.add_argument("--num-negatives", type=int, default=d.num_negatives,
                   help=f"negatives per anchor ({d.num_negatives})")  # fmt: skip
    p.add_argument("--range-min", type=int, default=d.range_min,
                   help=f"skip this many best candidates ({d.range_min})")  # fmt: skip
    p.add_argument("--range-max", type=int, default=d.range_max,
                   help="negatives rank below this (default: range-min + num-negatives + the "
                   "most positives of an anchor; x10 negatives with a score filter)")  # fmt: skip
    p.add_argument("--max-score", type=float, default=d.max_score,
                   help="highest cosine a negative may have with its anchor")  # fmt: skip
    p.add_argument("--margin", type=float, default=d.absolute_margin, dest="absolute_margin",
                   help="a negative's cosine is at most the positive's minus this")  # fmt: skip
    p.add_argument("--relative-margin", type=float, default=d.relative_margin,
                   help="a negative's cosine is at most pos - |pos| x this (NV-Retriever's "
                   "TopK-PercPos 95%%: 0.05)")  # fmt: skip
    p.add_argument("--sampling", choices=SAMPLING, default=d.sampling,
                   help="top: the best of the window; random: a sample of it (top)")  # fmt: skip
    p.add_argument("--seed", type=int, default=d.seed, help=f"seed of random sampling ({d.seed})")
    p.add_argument("--output-format", choices=OUTPUT_FORMATS, default=d.output_format,
                   help="triplet: a row per negative; n-tuple: a row per positive with "
                   "negative_1..negative_K (train with --data.columns.negative=[...])")  # fmt: skip
    p.add_argument("--backend", choices=SEARCH_BACKENDS, default=d.index.backend,
                   help=f"exact | flat (FAISS) | hnsw | ivf (approximate) ({d.index.backend})")  # fmt: skip
    # not `index`: that is MineSettings' field (the IndexSettings), which settings_from fills
    p.add_argument("--index", default=None, dest="index_dir", metavar="DIR",
                   help="keep the corpus index in this folder")  # fmt: skip
    add_batch_size_flag(p)
    p.add_argument("--chunk-size", type=int, default=d.index.chunk_size,
                   help=f"anchors searched at a time ({MINE_CHUNK})")  # fmt: skip
    p.add_argument("--query-prompt", metavar="TEXT", default=d.query_prompt,
                   help="put TEXT before every anchor (default: the model's saved 'query' "
                   "prompt; '' for none)")  # fmt: skip
    p.add_argument("--document-prompt", metavar="TEXT", default=d.document_prompt,
                   help="put TEXT before every positive and corpus text (default: the model's "
                   "saved 'document' prompt; '' for none)")  # fmt: skip
    add_pooler_flag(p)
    add_device_flag(p)
    add_compile_flag(p)
    # the library's hint names `columns=`; this command has two options for it
    hint = {COLUMNS_HINT: "name the columns with --anchor-column/--positive-column"}
    p.set_defaults(func=cmd_mine, flags_of=p, flag_texts=hint)


def cmd_mine(args: argparse.Namespace) -> int:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    from ..search.mine import mine_hard_negatives

    # the options are named as the settings' fields: each default and name is the dataclass'
    settings = settings_from(MineSettings, args, index=settings_from(IndexSettings, args))
    report = mine_hard_negatives(
        args.model, args.pairs, args.output, settings, corpus=args.corpus,
        columns=PairColumns(anchor=args.anchor_column, positive=args.positive_column),
        index_dir=args.index_dir, show_progress=True,
    )  # fmt: skip
    print(
        f"mined {report.written} rows for {report.anchors} anchors ({report.pairs} pairs, "
        f"corpus {report.corpus} texts, ranks {args.range_min}..{report.range_max}) to "
        f"{args.output}"
    )
    if report.short:
        print(
            f"note: {report.short} anchors got fewer than {args.num_negatives} negatives"
            + (" and were left out" if args.output_format == "n-tuple" else "")
            + "; a larger --range-max or looser filters find more"
        )
    if args.output_format == "n-tuple":
        names = ",".join(report.header[2:])
        print(f"train on it with --data.columns.negative=[{names}]")
    return 0
