"""``cselab index build`` and ``cselab search``: the search index on the command line."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from ..search.index import (
    BUILD_BACKENDS,
    SEARCH_BACKENDS,
    Index,
    SearchIndexError,
    check_queries,
    read_lines,
)
from ..search.settings import DEFAULT_CHUNK, HNSW_DEFAULTS, IndexSettings
from .options import (
    add_batch_size_flag,
    add_compile_flag,
    add_device_flag,
    add_model_flag,
    add_pooler_flag,
    positive_int,
    settings_from,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``index build`` and ``search`` to the main CLI."""
    idx = subparsers.add_parser("index", help="build a similarity-search index over a corpus")
    idx_sub = idx.add_subparsers(dest="index_command", required=True)
    b = idx_sub.add_parser(
        "build",
        help="encode a corpus (one text per line) into an index folder",
        description="Encode every non-blank line of CORPUS into a memory-mapped index folder. "
        "Interrupted builds resume when the same command is run again.",
    )
    d = IndexSettings()
    b.add_argument("corpus", help="UTF-8 text file, one text per line")
    add_model_flag(b)
    b.add_argument("-o", "--output", required=True, help="index folder to write (e.g. my.index)")
    add_pooler_flag(b)
    b.add_argument("--backend", choices=BUILD_BACKENDS, default=d.backend,
                   help=f"{d.backend} (default, no extra index) or a FAISS index: hnsw | ivf")  # fmt: skip
    b.add_argument("--chunk-size", type=int, default=d.chunk_size,
                   help=f"lines encoded between progress records ({DEFAULT_CHUNK})")  # fmt: skip
    add_batch_size_flag(b)
    b.add_argument("--hnsw-m", type=int, default=d.hnsw_m,
                   help=f"HNSW links per node ({HNSW_DEFAULTS['m']})")  # fmt: skip
    b.add_argument("--ef-construction", type=int, default=d.ef_construction,
                   help=f"HNSW build depth ({HNSW_DEFAULTS['ef_construction']})")  # fmt: skip
    b.add_argument("--nlist", type=int, default=d.nlist, help="IVF cells (default sqrt(N))")
    b.add_argument("--dim", type=int, default=d.dim,
                   help="store the first DIM coordinates of each vector, re-normalised (a model "
                   "trained with objective.matryoshka.dims); queries are encoded so too")  # fmt: skip
    b.add_argument("--query-prompt", metavar="TEXT", default=None,
                   help="put TEXT before every query a search of the index reads (default: "
                   "the model's saved 'query' prompt, else its default prompt; '' for none)")  # fmt: skip
    b.add_argument("--document-prompt", metavar="TEXT", default=None,
                   help="put TEXT before every corpus line (default: the model's saved "
                   "'document' prompt, else its default prompt; '' for none)")  # fmt: skip
    b.add_argument("--overwrite", action="store_true", help="start over instead of resuming")
    add_device_flag(b)
    add_compile_flag(b)
    b.set_defaults(func=cmd_index_build, flags_of=b)

    s = subparsers.add_parser(
        "search",
        help="search an index with text queries",
        description="Print the k most similar corpus lines (cosine) for each query.",
    )
    s.add_argument("index", help="index folder written by `cselab index build`")
    s.add_argument("query", nargs="?", help="query text")
    s.add_argument("--queries", help="file of queries, one per line (instead of QUERY)")
    s.add_argument("-k", type=positive_int, default=10, help="results per query (10)")
    s.add_argument("--backend", choices=SEARCH_BACKENDS, default=None,
                   help="exact | flat | hnsw | ivf (default: the built FAISS index, else exact)")  # fmt: skip
    s.add_argument("--nprobe", type=positive_int, default=None, help="IVF cells visited per query")
    s.add_argument(
        "--ef-search",
        type=positive_int,
        default=None,
        help=f"HNSW search depth ({HNSW_DEFAULTS['ef_search']})",
    )
    add_model_flag(s, required=False, help="encode queries with this model instead")
    s.add_argument("--query-prompt", metavar="TEXT", default=None,
                   help="put TEXT before every query (default: the query prompt recorded in "
                   "the index; '' for none)")  # fmt: skip
    s.add_argument("--json", action="store_true", help="one JSON object per query")
    add_device_flag(s)
    s.set_defaults(func=cmd_search, flags_of=s)


def cmd_index_build(args: argparse.Namespace) -> int:
    try:
        # the options are named as the settings' fields: each default and name is the dataclass'
        settings = settings_from(IndexSettings, args)
        index = Index.build(
            args.corpus, args.model, args.output, settings, overwrite=args.overwrite,
            show_progress=True, query_prompt=args.query_prompt,
            document_prompt=args.document_prompt,
        )  # fmt: skip
    except KeyboardInterrupt:
        print(
            f"interrupted; the chunks already encoded are kept in {args.output}: run the same "
            "command again to resume",
            file=sys.stderr,
        )
        return 130
    print(
        f"index {args.output}: {len(index)} lines x {index.meta['dim']} ({index.default_backend()})"
    )
    return 0


#: The most characters of a query the text output repeats above its hits (``--json`` keeps it
#: whole, for programs that match results to queries).
ECHO_CHARS = 200


def echo(query: str) -> str:
    """``query`` as the text output repeats it: whole up to :data:`ECHO_CHARS` characters, else
    its start and its length (a 10 MB query is not printed back)."""
    if len(query) <= ECHO_CHARS:
        return query
    return f"{query[:ECHO_CHARS]}… ({len(query):,} characters)"


def cmd_search(args: argparse.Namespace) -> int:
    if (args.query is None) == (args.queries is None):
        raise SearchIndexError("give either a QUERY or --queries FILE")
    if args.query is not None:
        check_queries([args.query])
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # search output is the hits, not weight-loading bars
    if args.queries is not None:
        queries, _ = read_lines(args.queries, "queries file")
    else:
        queries = [args.query]
    index = Index.open(
        args.index, model=args.model, device=args.device, query_prompt=args.query_prompt
    )
    results = index.search(
        queries, k=args.k, backend=args.backend, nprobe=args.nprobe, ef_search=args.ef_search
    )
    for query, hits in zip(queries, results, strict=True):
        if args.json:
            print(json.dumps({"query": query, "hits": [asdict(h) for h in hits]}))
            continue
        print(f"# {echo(query)}")
        for h in hits:
            print(f"{h.rank}\t{h.score:.4f}\t{h.line}\t{h.text}")
    return 0
