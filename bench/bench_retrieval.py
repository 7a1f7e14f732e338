"""Benchmark: retrieval evaluation, cselab vs sentence-transformers' InformationRetrievalEvaluator.

Collection: STS-B pairs scored 4 or more (``--split``, default ``dev``: 259 queries over
2,650 sentences; ``train``: 1,332 over 9,186), written as a BEIR folder by
:func:`cselab.evaluation.retrieval.collection_from_sts`. Model: the packaged all-MiniLM-L6-v2,
loaded by each side its own way (cselab's loader; ``SentenceTransformer``). In one process the
two sides alternate ``--rounds`` times (ABBA), each round a whole evaluation from texts to
numbers: encoding every document and query, top-100 search, nDCG@10, MRR@10, Recall@{1,10,100},
MAP@100. cselab also reports its encoding and search+metrics times apart; the evaluator is also
timed on the same vectors handed in (``corpus_embeddings``, and a stand-in model that returns
the query vectors), i.e. its search and metrics alone.

    python bench/bench_retrieval.py --out docs/results/retrieval_benchmark.md
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import harness
import numpy as np

NAMES = ("ndcg@10", "mrr@10", "recall@1", "recall@10", "recall@100", "map@100")


def build_collection(folder: Path, split: str, pairs: int | None) -> Path:
    from cselab.evaluation.datasets import ScoredPairs, load_stsb
    from cselab.evaluation.retrieval import collection_from_sts

    p = load_stsb(split, harness.SENTEVAL)
    if pairs:
        p = ScoredPairs(p.name, p.sent1[:pairs], p.sent2[:pairs], p.scores[:pairs], p.path)
    return collection_from_sts(p, folder, split="test")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", default="dev", help="STS-B split the collection is made of")
    ap.add_argument("--pairs", type=int, default=None, help="only the first N pairs (smoke runs)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--out", default=str(harness.RESULTS / "retrieval_benchmark.md"))
    args = ap.parse_args(argv)

    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.evaluation import InformationRetrievalEvaluator

    from cselab.evaluation.retrieval import RetrievalScorer, evaluate_retrieval
    from cselab.io.readers import read_beir
    from cselab.model.encoder import load

    load_before = harness.load1()
    tmp = Path(tempfile.mkdtemp(prefix="bench-retrieval-"))
    folder = build_collection(tmp / "beir", args.split, args.pairs)
    c = read_beir(folder, "test")
    ours_model = load(harness.minilm_path())
    st_model = SentenceTransformer(harness.minilm_path(), device="cpu")
    evaluator = InformationRetrievalEvaluator(
        dict(zip(c.query_ids, c.query_texts, strict=True)),
        dict(zip(c.doc_ids, c.doc_texts, strict=True)),
        {qid: {c.doc_ids[d] for q2, d, r in c.qrels if q2 == q and r >= 1}
         for q, qid in enumerate(c.query_ids)},
        mrr_at_k=[10], ndcg_at_k=[10], accuracy_at_k=[1], precision_recall_at_k=[1, 10, 100],
        map_at_k=[100], batch_size=args.batch_size, write_csv=False,
    )  # fmt: skip

    times: dict[str, list[float]] = {"cselab": [], "st": []}
    parts: dict[str, list[float]] = {"encode": [], "search": []}
    numbers: dict[str, dict[str, float]] = {}
    for _, side in harness.alternation(["cselab", "st"], args.rounds, abba=True):
        t0 = time.perf_counter()
        if side == "cselab":
            out = evaluate_retrieval(ours_model, c, batch_size=args.batch_size)
            numbers["cselab"] = out["metrics"]
            parts["encode"].append(out["timing"]["encode"])
            parts["search"].append(out["timing"]["search"])
        else:
            res = evaluator(st_model)
            numbers["st"] = {n: 100 * res[f"cosine_{n}"] for n in NAMES}
        times[side].append(time.perf_counter() - t0)

    # search and metrics alone, on the same vectors: cselab's scorer, and the evaluator given
    # the corpus vectors and a stand-in model whose encode_query returns the query vectors
    scorer = RetrievalScorer(c, batch_size=args.batch_size)
    docs, queries, _ = scorer.vectors(ours_model)
    corpus_t = torch.from_numpy(np.ascontiguousarray(docs))
    query_t = torch.from_numpy(np.ascontiguousarray(queries))
    given_model = SimpleNamespace(encode_query=lambda *a, **k: query_t)
    given = {"cselab": [], "st": []}
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        scorer.score_vectors(docs, queries)
        given["cselab"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        evaluator.compute_all_metrics(given_model, corpus_embeddings=corpus_t)
        given["st"].append(time.perf_counter() - t0)
    load_after = harness.load1()

    med = {k: harness.median(v) for k, v in times.items()}
    rows = [
        ("cselab `evaluate_retrieval`", f"{med['cselab']:.2f}",
         f"{harness.median(parts['encode']):.2f}", f"{harness.median(parts['search']) * 1e3:.0f}"),
        ("sentence-transformers `InformationRetrievalEvaluator`", f"{med['st']:.2f}", "", ""),
    ]  # fmt: skip
    from cselab.evaluation.report import markdown_table

    agree = [(n, f"{numbers['cselab'][n]:.4f}", f"{numbers['st'][n]:.4f}") for n in NAMES]
    cpu = harness.cpu_model()
    text = f"""# Retrieval evaluation: cselab vs InformationRetrievalEvaluator

1-minute load average {load_before:.1f} before the run and {load_after:.1f} after it (the run's own
{torch.get_num_threads()} torch threads count in the second; on a shared machine compare the ratio,
the two sides alternate in one process, more than the seconds). CPU: {cpu}.

Collection: STS-B {args.split} pairs scored >= 4 as a BEIR folder
(`collection_from_sts`): {len(c.query_ids)} queries, {len(c.doc_ids)} documents,
{len(c.qrels)} judgements. Model: all-MiniLM-L6-v2 (packaged), batch size {args.batch_size}.
Median of {args.rounds} rounds each, alternating ABBA; every round encodes all texts.

{markdown_table(["side", "total s", "of which encoding s", "search + metrics ms"], rows, "lrrr")}

cselab / sentence-transformers total: **{med["cselab"] / med["st"]:.2f}**.

Search and metrics alone, on the same vectors (cselab's `RetrievalScorer.score_vectors`; the
evaluator's `compute_all_metrics` given `corpus_embeddings` and a stand-in model whose
`encode_query` returns the query vectors): cselab {harness.median(given["cselab"]) * 1e3:.0f} ms,
the evaluator {harness.median(given["st"]) * 1e3:.0f} ms. Encoding is the same model's on
both sides and is nearly all of the time.

The numbers (x 100) of the last round of each side: equal where the definitions match (binary
judgements and at most 100 relevant documents a query, so MAP's denominators agree; no tied
scores; see docs/evaluation.md).

{markdown_table(["metric", "cselab", "sentence-transformers"], agree, "lrr")}

Reproduce (from the repository root):

    {harness.command("bench_retrieval.py", argv)}

Versions: {", ".join(f"{k} {v}" for k, v in harness.versions().items())}.
"""
    harness.write_page(args.out, text)
    print(text)
    return {"times": times, "numbers": numbers, "given": given, "parts": parts}


if __name__ == "__main__":
    main()
