"""``cselab evaluate`` and ``cselab compare`` (registered on the main CLI's subparsers)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..config.devset import DEV_COLUMNS
from ..core.schema import ConfigError
from ..evaluation.names import (
    CLUSTERING_HINT,
    MODES,
    RETRIEVAL_HINT,
    RETRIEVAL_K,
    RETRIEVAL_KIND,
    STS_COLUMNS_HINT,
    STS_FILE_HINT,
    STS_FILE_KIND,
)
from ..model.choices import BATCH_SIZE
from ..search.index import SEARCH_BACKENDS
from ..search.settings import IndexSettings
from .options import (
    add_batch_size_flag,
    add_compile_flag,
    add_device_flag,
    add_pooler_flag,
    check_output_path,
)

#: what the files of the options that give the user's own data hold (their help, and what
#: ``--tasks`` naming such a task without its option is told)
STS_PAIRS = (
    "your own sentence pairs with a gold score (.tsv/.csv with a header, .jsonl, or a "
    "datasets save_to_disk folder)"
)
LABELLED_SENTENCES = "your own labelled sentences (a table with text and label columns)"
BEIR_FOLDER = (
    "a BEIR folder (corpus.jsonl, queries.jsonl, qrels/<split>.tsv, or the same parts as "
    "datasets folders)"
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``evaluate`` and ``compare``; each sets ``func(args) -> int`` (the exit code)."""
    ev = subparsers.add_parser(
        "evaluate",
        help="SentEval STS and transfer tasks (SimCSE's numbers), BEIR retrieval",
        description=(
            "Evaluate a sentence encoder on STS12-16, STS-B, SICK-R and the SentEval transfer "
            "tasks, as SentEval + SimCSE's evaluation.py do, or retrieval on a BEIR folder "
            "(--retrieval). Prints markdown tables; --output writes every number as JSON."
        ),
    )
    ev.add_argument("model", help="cselab output folder, sentence-transformers folder, or HF model")
    ev.add_argument(
        "--tasks",
        default=None,
        help="sts | transfer | all | comma-separated names (STS12..STS16, STSBenchmark, "
        "SICKRelatedness, MR, CR, SUBJ, MPQA, SST2, TREC, MRPC, AlignUniform); default: sts, "
        "or none when --sts-file or --clustering is given",
    )
    ev.add_argument(
        "--sts-file",
        action="append",
        default=[],
        metavar="PATH",
        help=f"{STS_PAIRS}, scored like STS-B; repeatable",
    )
    ev.add_argument(
        "--sts-columns",
        default=",".join(DEV_COLUMNS),
        help="the two sentence columns and the score column of --sts-file "
        f"(default: {','.join(DEV_COLUMNS)})",
    )
    ev.add_argument(
        "--clustering",
        action="append",
        default=[],
        metavar="PATH",
        help=f"{LABELLED_SENTENCES}: k-means with k the number of labels, scored by V-measure "
        "against the labels (as MTEB); repeatable",
    )
    ev.add_argument("--mode", choices=MODES, default="test", help="default: test")
    add_pooler_flag(ev)
    add_batch_size_flag(ev, f"encoding batch size ({BATCH_SIZE})")
    add_compile_flag(ev)
    add_device_flag(ev)
    ev.add_argument("--output", "-o", help="write the full results as JSON")
    ev.add_argument("--csv", help="write every number as long-format CSV")
    ev.add_argument(
        "--data-dir", help="SentEval data/downstream folder (else $CSELAB_DATA or cache)"
    )
    ev.add_argument("--no-download", action="store_true", help="never download missing data")
    ev.add_argument(
        "--update-card",
        action="store_true",
        help="add the result tables to MODEL's README.md model card (a local cselab folder)",
    )
    ev.add_argument(
        "--mteb",
        metavar="TASKS",
        help="run these MTEB tasks (comma-separated, e.g. STS12,SciFact) through mteb.evaluate "
        "instead of SentEval; SentEvalSTSBenchmark reads STS-B from --data-dir (needs cselab[mteb])",
    )
    ev.add_argument("--mteb-cache", help="MTEB result folder (default: none, always rerun)")
    ev.add_argument(
        "--split",
        help="with --mteb: evaluate this split of each task (one the task evaluates, e.g. dev or "
        "test for SentEvalSTSBenchmark; default: the task's own splits, dev for "
        "SentEvalSTSBenchmark); with --retrieval: the BEIR split to score (default test)",
    )
    # --- retrieval and Matryoshka dimensions (cselab.evaluation.retrieval)
    ev.add_argument(
        "--retrieval",
        metavar="FOLDER",
        help=f"evaluate retrieval on {BEIR_FOLDER}: nDCG@k, MRR@k, Recall@1/k/100, MAP@100; "
        "SentEval tasks then run only when --tasks or --sts-file asks for them",
    )
    ev.add_argument("--k", type=int, default=RETRIEVAL_K,
                    help=f"with --retrieval: the cut-off k ({RETRIEVAL_K})")  # fmt: skip
    ev.add_argument(
        "--backend",
        choices=SEARCH_BACKENDS,
        default=IndexSettings.backend,
        help=f"with --retrieval: {IndexSettings.backend} search (default) or a FAISS index built "
        "on the corpus (flat, hnsw, ivf; needs cselab[faiss])",
    )
    ev.add_argument(
        "--dims",
        metavar="D1,D2,...",
        help="also evaluate at these Matryoshka dimensions (the first D coordinates, "
        "re-normalised), encoding once; results keyed per dimension",
    )
    # --- prompts (docs/prompts.md)
    ev.add_argument(
        "--prompt",
        metavar="TEXT",
        help="put TEXT before every sentence of the SentEval tasks, STS and clustering files "
        "(default: the model's default prompt, if it has one)",
    )
    ev.add_argument("--query-prompt", metavar="TEXT",
                    help="with --retrieval: before every query (default: the model's saved "
                    "'query' prompt; '' for none)")  # fmt: skip
    ev.add_argument("--document-prompt", metavar="TEXT",
                    help="with --retrieval: before every document (default: the model's saved "
                    "'document' prompt; '' for none)")  # fmt: skip
    ev.add_argument(
        "--instructions",
        metavar="TABLE",
        help="task instructions: 'llm2vec' (LLM2Vec's MTEB table) or a YAML file of the same "
        "layout; with --mteb each task's, else the STS tasks' (one text for all; an STS file "
        "reads STSBenchmark's) before every STS sentence",
    )
    # the library's hints name Python arguments; this command's are its options
    hint = {
        STS_COLUMNS_HINT: "name the columns with --sts-columns S1,S2,SCORE",
        STS_FILE_HINT: f"give it with --sts-file PATH ({STS_PAIRS})",
        CLUSTERING_HINT: f"give it with --clustering PATH ({LABELLED_SENTENCES})",
        RETRIEVAL_HINT: f"give it with --retrieval FOLDER ({BEIR_FOLDER})",
    }
    ev.set_defaults(func=run_evaluate, flags_of=ev, flag_texts=hint)

    cmp_ = subparsers.add_parser(
        "compare",
        help="one table from several `cselab evaluate --output` files",
        description="Print the headline tables with one row per results file.",
    )
    cmp_.add_argument("results", nargs="+", help="JSON files written by `cselab evaluate -o`")
    cmp_.add_argument("--names", help="comma-separated row names (default: the model names)")
    cmp_.add_argument("--csv", help="write all runs' numbers as one long-format CSV")
    cmp_.add_argument("--plot", help="write a bar chart of the per-task scores (.png or .pdf)")
    cmp_.set_defaults(func=run_compare)

    col = subparsers.add_parser(
        "collection",
        help="write a BEIR retrieval collection made from STS-B pairs",
        description="Write a BEIR folder (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv) from an "
        "STS-B split: each sentence1 of a pair scored THRESHOLD or more is a query, its sentence2 "
        "the relevant document, every other sentence of the split the corpus. Evaluate on it with "
        "`cselab evaluate MODEL --retrieval FOLDER --split SPLIT`; select checkpoints on it with "
        "--eval.dev=FOLDER (the dev split).",
    )
    col.add_argument("out", metavar="FOLDER", help="the BEIR folder to write")
    col.add_argument(
        "--split", default="dev", choices=("train", "dev", "test"), help="STS-B split (dev)"
    )
    col.add_argument(
        "--threshold", type=float, default=4.0, help="least gold score of a judged pair (4)"
    )
    col.add_argument(
        "--data-dir", help="SentEval data/downstream folder (else $CSELAB_DATA or cache)"
    )
    col.add_argument("--no-download", action="store_true", help="never download missing data")
    col.set_defaults(func=run_collection)


#: ``(option, argparse attribute)`` of the SentEval route that ``--mteb`` has no use for.
SENTEVAL_ONLY = (
    ("--tasks", "tasks"),
    ("--sts-file", "sts_file"),
    ("--clustering", "clustering"),
    ("--csv", "csv"),
    ("--update-card", "update_card"),
)


def looks_like_path(model: str) -> bool:
    """Whether ``model`` can only be a folder: a Hub name is ``name`` or ``namespace/name``."""
    return (
        os.path.isabs(model)
        or model.startswith((".", "~"))
        or model.endswith(("/", os.sep))
        or model.count("/") > 1
        or (os.sep != "/" and os.sep in model)
    )


def check_model(model: str) -> None:
    """Raise a one-line error now if ``model`` is no model, before minutes go into fetching
    the evaluation data: a missing folder is named as such, and a Hub name is looked up (found in
    the cache or downloaded, as loading it would; :class:`ResolveError` names it)."""
    from ..model.hub import resolve_model

    path = Path(model).expanduser()
    if path.is_dir():
        return
    if path.exists():
        raise ConfigError(f"{model}: is a file; a model is a folder or a Hugging Face Hub name")
    if looks_like_path(model):
        raise ConfigError(f"{model}: model folder not found")
    resolve_model(model)


def parse_dims(text: str | None) -> list[int] | None:
    """``--dims 64,128`` -> ``[64, 128]``; a value that is not a positive integer is refused."""
    if text is None:
        return None
    try:
        dims = [int(d) for d in text.split(",") if d.strip()]
    except ValueError:
        dims = []
    if not dims or min(dims) < 1:
        raise ConfigError(f"--dims {text!r}: expected positive integers separated by commas")
    return list(dict.fromkeys(dims))


def check_dims(dims: list[int] | None, encoder: object) -> None:
    """Refuse a ``--dims`` entry wider than the model's vectors (before any encoding)."""
    from ..model.similarity import check_prefix

    width = getattr(encoder, "dim", None)
    if dims and isinstance(width, int):
        for dim in dims:
            check_prefix(dim, width, "--dims")


def senteval_prompt(args: argparse.Namespace, tasks: list[str] | None) -> str | None:
    """The prompt of the SentEval tasks, STS files and clustering files: ``--prompt``, else the
    STS tasks' one instruction in ``--instructions`` (each task's own, an STS file STS-B's;
    :func:`~cselab.evaluation.instructions.sts_prompt`), refused with the transfer tasks and
    clustering files, which no such table covers."""
    if not args.instructions:
        return args.prompt
    if args.prompt is not None:
        raise ConfigError("--prompt and --instructions both give the prompt; give one of them")
    from ..evaluation.instructions import load_instructions, sts_prompt
    from ..evaluation.names import TRANSFER_TASKS

    other = [t for t in tasks or [] if t in TRANSFER_TASKS]
    other += ["--clustering"] * bool(args.clustering)
    if other:
        raise ConfigError(
            f"--instructions without --mteb applies to the STS tasks and STS files; "
            f"{', '.join(other)} {'has' if len(other) == 1 else 'have'} no instruction there: "
            "give --prompt, or evaluate the STS tasks alone"
        )
    table = load_instructions(args.instructions)
    return sts_prompt(table, [*(tasks or []), *([STS_FILE_KIND] * bool(args.sts_file))])


def run_evaluate(args: argparse.Namespace) -> int:
    if args.mteb:  # refused rather than silently ignored: the user expects them to act
        ignored = [option for option, attr in SENTEVAL_ONLY if getattr(args, attr)]
        ignored += ["--retrieval"] * bool(args.retrieval) + ["--dims"] * bool(args.dims)
        ignored += ["--prompt"] * (args.prompt is not None)
        if ignored:
            raise ConfigError(
                f"--mteb does not take {', '.join(ignored)} (SentEval options); drop them, or "
                "run the SentEval tasks without --mteb"
            )
    elif args.split is not None and not args.retrieval:
        raise ConfigError(
            "--split goes with --mteb or --retrieval; the SentEval tasks choose their split with "
            f"--mode ({', '.join(MODES)})"
        )
    if not args.retrieval and (args.k != RETRIEVAL_K or args.backend != IndexSettings.backend):
        raise ConfigError("--k and --backend go with --retrieval FOLDER")
    if not args.retrieval and (args.query_prompt, args.document_prompt) != (None, None):
        raise ConfigError("--query-prompt and --document-prompt go with --retrieval FOLDER")
    if args.k < 1:
        raise ConfigError(f"--k must be at least 1, not {args.k}")
    if args.retrieval:
        from ..search.index import check_backend

        check_backend(args.backend)  # before the model and the collection are encoded
    dims = parse_dims(args.dims)
    if args.retrieval and args.csv:
        # the long-format CSV holds SentEval's numbers; the retrieval ones would be text in it
        raise ConfigError(
            "--csv carries the SentEval tables only, not --retrieval results; write them with "
            "-o/--output (JSON), and run the SentEval tasks without --retrieval for --csv"
        )
    for option, path in (("--output", args.output), ("--csv", args.csv)):
        if path:
            check_output_path(path, option)
    if args.mteb:
        check_model(args.model)
        try:
            from ..evaluation.mteb import run_cli
        except ImportError as exc:
            raise ConfigError(f"--mteb needs MTEB: pip install 'cselab[mteb]' ({exc})") from None
        return run_cli(args)
    from ..evaluation import api, report

    if args.update_card and not Path(args.model).is_dir():
        raise ConfigError(f"--update-card needs a local model folder; {args.model} is not one")
    own_files = args.sts_file or args.clustering
    senteval = args.tasks is not None or own_files or not args.retrieval
    spec = args.tasks if args.tasks is not None or own_files else "sts"
    from ..evaluation.clustering import KIND as CLUSTERING_KIND

    # the kinds whose data is given: ``--tasks clustering`` then names no benchmark
    given = {
        kind
        for kind, data in (
            (STS_FILE_KIND, args.sts_file), (CLUSTERING_KIND, args.clustering),
            (RETRIEVAL_KIND, args.retrieval),
        )
        if data
    }  # fmt: skip
    tasks = api.parse_tasks(spec, args.mode, given) if spec is not None and senteval else None
    given_prompts = ["--prompt"] * (args.prompt is not None) + ["--instructions"] * bool(
        args.instructions
    )
    if not senteval and given_prompts:
        raise ConfigError(
            f"{' and '.join(given_prompts)} {'apply' if len(given_prompts) > 1 else 'applies'} "
            "to the SentEval tasks, STS files and clustering files; --retrieval takes "
            "--query-prompt and --document-prompt"
        )
    prompt = senteval_prompt(args, tasks)  # a bad table is told before the data is read
    columns = [c.strip() for c in args.sts_columns.split(",")]
    # Local files first, then the model (a wrong path is reported at once, not after a minute
    # of fetching SentEval's data), then the data, all before time goes into loading the model.
    from ..evaluation.clustering import ClusteringTask, read_labelled_file
    from ..evaluation.custom import read_sts_file

    files = [read_sts_file(f, columns) for f in args.sts_file]
    plan: list = [ClusteringTask(read_labelled_file(f)) for f in args.clustering]
    if args.retrieval:
        from ..evaluation.tasks import RetrievalTask
        from ..io.readers import read_beir
        from ..search.index import vector_search

        split = args.split or "test"
        plan.append(
            RetrievalTask(
                read_beir(args.retrieval, split), split, args.k, tuple(dims) if dims else None,
                args.backend, vector_search(IndexSettings(backend=args.backend)),
                args.query_prompt, args.document_prompt,
            )
        )  # fmt: skip
    check_model(args.model)
    if tasks:
        from ..evaluation.download import ensure_data

        ensure_data(tasks, args.data_dir, download_missing=not args.no_download)
    from ..model.encoder import load  # lazy: model loading pulls in transformers

    encoder = load(
        args.model, pooler=args.pooler, device=args.device,
        compile_inference=args.compile_inference,
    )  # fmt: skip
    check_dims(dims, encoder)
    from ..evaluation.embed import effective_prompt, with_prompt

    # the task list: the SentEval names and STS files (when asked for), then retrieval (which
    # takes its own prompts, not --prompt)
    out = api.evaluate(
        with_prompt(encoder, prompt), tasks=[*(tasks or []), *plan] if senteval else plan, mode=args.mode,
        data_dir=args.data_dir, batch_size=args.batch_size, download=not args.no_download,
        model_name=args.model, sts_files=files if senteval else (), dims=dims,
    )  # fmt: skip
    if args.pooler:
        out["pooler"] = args.pooler
    # the SentEval tasks' scores depend on the prompt read, the model's default included
    # (retrieval records its own)
    if senteval and (read := effective_prompt(encoder, prompt)):
        out["prompt"] = read
        if args.instructions:
            out["instructions"] = args.instructions
    report.add_model_notes(out, args.model)
    print(report.evaluation_markdown(out))
    if args.output:
        report.save_json(out, args.output)
        print(f"\nresults: {args.output}")
    if args.csv:
        report.to_csv(out, args.csv)
    if args.update_card:
        from ..publish.card import update_model_card

        print(f"model card: {update_model_card(args.model, out)}")
    return 0


def run_collection(args: argparse.Namespace) -> int:
    """``cselab collection FOLDER``: :func:`~cselab.evaluation.retrieval.collection_from_sts`
    over STS-B ``--split``, fetched like ``cselab evaluate``'s data."""
    from ..evaluation.datasets import load_stsb, stsb_file
    from ..evaluation.download import ensure_files
    from ..evaluation.retrieval import check_collection_output, collection_from_sts

    check_collection_output(args.out, args.threshold)  # before the data is fetched
    data = ensure_files([stsb_file(args.split)], args.data_dir, not args.no_download)
    pairs = load_stsb(args.split, data)
    folder = collection_from_sts(pairs, args.out, split=args.split, threshold=args.threshold)
    print(f"wrote {folder}: corpus.jsonl, queries.jsonl, qrels/{args.split}.tsv")
    return 0


def run_compare(args: argparse.Namespace) -> int:
    from ..evaluation import report

    outs = [report.load_json(p) for p in args.results]
    names = [n.strip() for n in args.names.split(",")] if args.names else None
    if names is not None and len(names) != len(outs):
        raise ConfigError(f"--names gives {len(names)} names for {len(outs)} results files")
    if names is None:
        names = [
            report.model_name(o, Path(p).stem) for o, p in zip(outs, args.results, strict=True)
        ]
    print(report.compare(outs, names))
    if args.csv:
        report.to_csv(outs, args.csv)
    if args.plot:
        from cselab.insight.plots import plot_task_scores

        plot_task_scores(outs, names, args.plot)
        print(f"\nplot: {args.plot}")
    return 0
