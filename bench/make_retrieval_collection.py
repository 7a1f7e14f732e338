"""Write a BEIR retrieval collection made from STS-B pairs (the offline collection of the tests,
docs and ``bench/bench_retrieval.py``): each sentence1 of a pair scored 4 or more is a query, its
sentence2 the relevant document, every other sentence of the split the corpus.

    python bench/make_retrieval_collection.py --split dev --out stsb-dev-beir
    cselab evaluate MODEL --retrieval stsb-dev-beir --split dev

The qrels split is named after the STS-B split (``qrels/dev.tsv`` from STS-B dev: the one to
select models on with ``eval.dev``).
"""

from __future__ import annotations

import argparse

import harness


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", default="dev", choices=("train", "dev", "test"))
    ap.add_argument("--threshold", type=float, default=4.0, help="least gold score of a pair (4)")
    ap.add_argument("--data-dir", default=str(harness.SENTEVAL), help="SentEval data folder")
    ap.add_argument("--out", required=True, help="the BEIR folder to write")
    args = ap.parse_args(argv)

    from cselab.evaluation.datasets import load_stsb
    from cselab.evaluation.retrieval import collection_from_sts

    pairs = load_stsb(args.split, args.data_dir)
    folder = collection_from_sts(pairs, args.out, split=args.split, threshold=args.threshold)
    print(f"{folder}: corpus.jsonl, queries.jsonl, qrels/{args.split}.tsv")


if __name__ == "__main__":
    main()
