"""Retrieval evaluation on a BEIR collection: nDCG, MRR, recall and MAP at cut-offs, as trec_eval.

A collection is a BEIR folder (Thakur et al. 2021, "BEIR: A Heterogeneous Benchmark for Zero-shot
Evaluation of Information Retrieval Models"), read by :func:`cselab.io.readers.read_beir`:
``corpus.jsonl`` (``_id``, ``title``, ``text``; a document is ``title + " " + text``, as BEIR's
dense models join them), ``queries.jsonl`` (``_id``, ``text``) and ``qrels/<split>.tsv``
(``query-id``, ``corpus-id``, ``score``), or the same parts as saved ``datasets`` folders.

Every document and query is encoded once (:class:`~cselab.evaluation.embed.EmbeddingCache`),
scored by cosine and searched with cselab's one top-k search, exact by default
(:func:`cselab.model.similarity.exact_topk`; a FAISS search from
:func:`cselab.search.index.vector_search` can be passed in). At Matryoshka ``dims`` the vectors
are cut with :func:`cselab.model.similarity.truncate_rows` and searched again, without encoding.

**Definitions** (per query, then the mean over every query the split's qrels name, as
``pytrec_eval`` / BEIR / MTEB average). ``rel(d)`` is the qrels relevance (0 if unjudged); a
document is *relevant* when ``rel >= 1``; ``R`` is the number of relevant documents of the query;
``d_1, d_2, ...`` the ranking:

* ``ndcg@k``: ``DCG / IDCG`` with linear gain, ``DCG = sum_{i<=k} rel(d_i) / log2(i + 1)`` and
  IDCG the DCG of the judged relevances sorted descending (trec_eval's ``ndcg_cut.k``, Järvelin
  & Kekäläinen 2002); 0 when the query has no relevant document.
* ``mrr@k``: ``1 / i`` of the first relevant ``d_i`` with ``i <= k``, else 0 (trec_eval's
  ``recip_rank`` on the ranking cut at k).
* ``recall@k``: relevant documents among the first k, divided by ``R`` (``recall.k``).
* ``map@k``: ``sum_{i<=k, d_i relevant} precision@i / R`` (``map_cut.k``: divided by all ``R``
  relevant documents, also those beyond k).

**Ties** are ordered as trec_eval orders a run: by score descending, then by document id
descending as strings (byte order: ``"b"`` before ``"ab"``, ``"9"`` before ``"10"``). The search
returns the ``max(k, 100)`` best documents of each query; the metrics re-sort those in that
order, so they equal ``pytrec_eval`` given the same run. (A tie exactly at the search depth is
cut by the search, whose order is by row.)

Differences from sentence-transformers' ``InformationRetrievalEvaluator``: it breaks ties by
document id *ascending*; its relevance is binary (a set of ids per query, so nDCG has gain 1);
its ``map@k`` divides by ``min(k, R)``, not ``R``; it leaves out queries without a relevant
document (here they count 0). With binary qrels, ``R <= k`` and no tied scores the two give the
same numbers (``tests/test_retrieval.py`` checks it).

The metrics are hand-written in numpy, vectorised over the ``(queries, depth)`` matrix of
retrieved rows, because the alternative (``pytrec_eval`` on Python dicts of every query's run)
costs more than the search itself at model-selection time; the tests hold them to
``pytrec_eval`` to 1e-6.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import ConfigError, ConfigSettingError, check_count
from ..core.metrics import retrieval_metric
from ..core.prompts import DOCUMENT, QUERY
from ..core.schema import finite
from ..io.files import refuse_file_in_the_way, write_table
from ..io.readers import (
    BEIR_CORPUS,
    BEIR_QRELS,
    BEIR_QRELS_COLUMNS,
    BEIR_QUERIES,
    BeirCollection,
    read_beir,
)
from ..model.choices import BATCH_SIZE
from ..model.similarity import TopK, exact_topk, truncate_rows
from .datasets import ScoredPairs
from .embed import EmbeddingCache, EncoderLike, query_document_prompts, with_prompt
from .names import RETRIEVAL_K, RETRIEVAL_KIND
from .table import markdown_table

log = logging.getLogger(__name__)

#: Marks a result entry as a retrieval evaluation.
KIND = RETRIEVAL_KIND
#: The least depth searched (recall@100 and map@100 are always reported).
MIN_DEPTH = 100


def metric_names(k: int = RETRIEVAL_K) -> list[str]:
    """What ``cselab evaluate --retrieval --k K`` reports: nDCG@K, MRR@K, Recall@{1,K,100},
    MAP@100."""
    check_count("k", k)
    return list(dict.fromkeys([f"ndcg@{k}", f"mrr@{k}", "recall@1", f"recall@{k}",
                               "recall@100", "map@100"]))  # fmt: skip


def _parse(names: Sequence[str]) -> list[tuple[str, str, int]]:
    out = []
    for name in names:
        parsed = retrieval_metric(name)
        if parsed is None:
            raise ConfigError(f"unknown retrieval metric {name!r}; expected ndcg@K, mrr@K, "
                              "recall@K or map@K")  # fmt: skip
        out.append((name, *parsed))
    return out


@dataclass(frozen=True)
class Judgements:
    """A split's qrels as arrays: the relevance of each judged ``(query, document)`` looked up
    by a sorted key, the number of relevant documents per query, the ideal gains."""

    n_queries: int
    n_docs: int
    keys: np.ndarray  # int64, sorted: query * n_docs + document
    rel: np.ndarray  # int64, the relevance of each key
    n_relevant: np.ndarray  # (Q,) float64: documents with rel >= 1
    ideal: np.ndarray  # (Q, depth) float64: the judged gains sorted descending, 0-padded

    @classmethod
    def from_triples(
        cls, triples: Sequence[tuple[int, int, int]], n_queries: int, n_docs: int, depth: int
    ) -> Judgements:
        t = np.asarray(triples, dtype=np.int64).reshape(-1, 3)
        q, d, rel = t[:, 0], t[:, 1], t[:, 2]
        keys = q * n_docs + d
        order = np.argsort(keys, kind="stable")
        n_relevant = np.bincount(q[rel >= 1], minlength=n_queries).astype(np.float64)
        # ideal ranking: each query's gains sorted descending, placed in columns 0, 1, ...
        by_gain = np.lexsort((-rel, q))
        qs, gains = q[by_gain], rel[by_gain]
        first = np.searchsorted(qs, qs, side="left")
        place = np.arange(len(qs)) - first
        keep = (place < depth) & (gains > 0)
        ideal = np.zeros((n_queries, depth), dtype=np.float64)
        ideal[qs[keep], place[keep]] = gains[keep]
        return cls(n_queries, n_docs, keys[order], rel[order], n_relevant, ideal)

    def gains(self, rows: np.ndarray) -> np.ndarray:
        """``(Q, K)`` relevance of retrieved ``rows`` (0 for unjudged and for row ``-1``)."""
        keys = np.arange(self.n_queries)[:, None] * self.n_docs + rows
        at = np.clip(np.searchsorted(self.keys, keys), 0, max(len(self.keys) - 1, 0))
        hit = (self.keys[at] == keys) & (rows >= 0) if len(self.keys) else np.zeros_like(rows, bool)
        return np.where(hit, self.rel[at], 0).astype(np.float64)


def trec_order(scores: np.ndarray, rows: np.ndarray, id_rank: np.ndarray) -> np.ndarray:
    """Rows reordered as trec_eval ranks a run: score descending, then document id descending
    (``id_rank[row]``: the row's place among the ids sorted as strings). Missing places (row
    ``-1``) go last."""
    s = np.where(rows >= 0, scores.astype(np.float64), -np.inf)
    r = np.where(rows >= 0, id_rank[np.maximum(rows, 0)], -1)
    order = np.lexsort((-r, -s), axis=-1)
    return np.take_along_axis(rows, order, -1)


def per_query(
    rows: np.ndarray, judgements: Judgements, names: Sequence[str]
) -> dict[str, np.ndarray]:
    """Each metric of ``names`` for each query, from ``rows`` ranked best first (trec order)."""
    gains = judgements.gains(rows)
    relevant = (gains >= 1).astype(np.float64)
    n = gains.shape[1]
    discount = 1.0 / np.log2(np.arange(2, n + 2, dtype=np.float64))
    ideal = judgements.ideal
    denominator = np.where(judgements.n_relevant > 0, judgements.n_relevant, 1.0)
    out: dict[str, np.ndarray] = {}
    for name, measure, k in _parse(names):
        kk = min(k, n)
        if measure == "ndcg":
            dcg = gains[:, :kk] @ discount[:kk]
            kd = min(k, ideal.shape[1])
            idcg = ideal[:, :kd] @ (1.0 / np.log2(np.arange(2, kd + 2, dtype=np.float64)))
            out[name] = np.where(idcg > 0, dcg / np.where(idcg > 0, idcg, 1.0), 0.0)
        elif measure == "mrr":
            hit = relevant[:, :kk] > 0
            first = np.argmax(hit, axis=1)
            out[name] = np.where(hit.any(axis=1), 1.0 / (first + 1.0), 0.0)
        elif measure == "recall":
            out[name] = relevant[:, :kk].sum(axis=1) / denominator
        else:  # map
            rel_k = relevant[:, :kk]
            precision = np.cumsum(rel_k, axis=1) / np.arange(1, kk + 1, dtype=np.float64)
            out[name] = (precision * rel_k).sum(axis=1) / denominator
    return out


def _id_rank(ids: Sequence[str]) -> np.ndarray:
    """Each id's place among all ids sorted as strings (code-point order = UTF-8 byte order, the
    order of trec_eval's ``strcmp``)."""
    order = sorted(range(len(ids)), key=ids.__getitem__)
    rank = np.empty(len(ids), dtype=np.int64)
    rank[np.asarray(order, dtype=np.int64)] = np.arange(len(ids))
    return rank


def score_run(
    collection: BeirCollection,
    scores: np.ndarray,
    rows: np.ndarray,
    names: Sequence[str],
    judgements: Judgements | None = None,
) -> dict[str, float]:
    """The mean of each metric over the collection's queries, for a run of ``(Q, depth)``
    ``scores`` and corpus ``rows`` (any order within a row: they are put in trec order)."""
    depth = max(k for _, _, k in _parse(names))
    judgements = judgements or Judgements.from_triples(
        collection.qrels, len(collection.query_ids), len(collection.doc_ids), depth
    )
    ranked = trec_order(scores, rows, _id_rank(collection.doc_ids))
    return {name: float(v.mean()) for name, v in per_query(ranked, judgements, names).items()}


class RetrievalScorer:
    """``encoder -> {metric: value}`` on one split of a BEIR collection: every document and
    query encoded once, searched at each Matryoshka ``dims`` entry (``None``: full width).

    Args:
        collection: a BEIR folder (read with :func:`~cselab.io.readers.read_beir`) or the read
            collection.
        split: the qrels split when ``collection`` is a folder.
        names: the metrics (``ndcg@10`` ...); default :func:`metric_names` at ``k``.
        search: the top-k search (default exact); ``backend`` names it in the results.
        query_prompt, document_prompt: the text put before every query and every document
            (``docs/prompts.md``); ``None``: the model's saved ``query`` / ``document`` prompt
            if it has one; ``""``: none.
    """

    def __init__(
        self,
        collection: BeirCollection | str | os.PathLike[str],
        split: str = "test",
        names: Sequence[str] | None = None,
        k: int = RETRIEVAL_K,
        search: TopK | None = None,
        backend: str = "exact",
        batch_size: int = BATCH_SIZE,
        query_prompt: str | None = None,
        document_prompt: str | None = None,
    ) -> None:
        self.query_prompt, self.document_prompt = query_prompt, document_prompt
        self.collection = (
            collection if isinstance(collection, BeirCollection) else read_beir(collection, split)
        )
        self.names = list(names) if names is not None else metric_names(k)
        self.depth = max(MIN_DEPTH, *(c for _, _, c in _parse(self.names)))
        self.search = search or exact_topk
        self.backend, self.batch_size = backend, batch_size
        c = self.collection
        self.judgements = Judgements.from_triples(
            c.qrels, len(c.query_ids), len(c.doc_ids), self.depth
        )
        self.id_rank = _id_rank(c.doc_ids)

    def vectors(self, encoder: EncoderLike) -> tuple[np.ndarray, np.ndarray, float]:
        """The documents' and queries' vectors (each distinct text encoded once, with its
        side's prompt) and the seconds spent encoding."""
        q_prompt, d_prompt = self.prompts(encoder)
        if q_prompt == d_prompt:  # one encoding of the texts both sides share
            cache = EmbeddingCache(with_prompt(encoder, q_prompt), self.batch_size)
            cache.add([*self.collection.doc_texts, *self.collection.query_texts])
            docs = cache.embed(self.collection.doc_texts)
            return docs, cache.embed(self.collection.query_texts), cache.encode_seconds
        doc_cache = EmbeddingCache(with_prompt(encoder, d_prompt), self.batch_size)
        query_cache = EmbeddingCache(with_prompt(encoder, q_prompt), self.batch_size)
        docs = doc_cache.embed(self.collection.doc_texts)
        queries = query_cache.embed(self.collection.query_texts)
        return docs, queries, doc_cache.encode_seconds + query_cache.encode_seconds

    def prompts(self, encoder: EncoderLike) -> tuple[str, str]:
        """The query and document prompts used for ``encoder`` (``""``: none)."""
        return query_document_prompts(encoder, self.query_prompt, self.document_prompt)

    def score_vectors(
        self, docs: np.ndarray, queries: np.ndarray, dim: int | None = None
    ) -> dict[str, float]:
        """The metrics of a search at ``dim`` (``None``: full width) over given vectors."""
        d, q = truncate_rows(docs, dim), truncate_rows(queries, dim)
        scores, rows = self.search(q, d, self.depth)
        ranked = trec_order(scores, rows, self.id_rank)
        values = per_query(ranked, self.judgements, self.names)
        return {name: 100.0 * float(v.mean()) for name, v in values.items()}

    def __call__(self, encoder: EncoderLike) -> dict[str, float]:
        docs, queries, _ = self.vectors(encoder)
        return self.score_vectors(docs, queries)


def evaluate_retrieval(
    encoder: EncoderLike,
    collection: BeirCollection | str | os.PathLike[str],
    split: str = "test",
    k: int = RETRIEVAL_K,
    dims: Sequence[int] | None = None,
    search: TopK | None = None,
    backend: str = "exact",
    batch_size: int = BATCH_SIZE,
    query_prompt: str | None = None,
    document_prompt: str | None = None,
) -> dict[str, Any]:
    """Evaluate ``encoder`` on one split of a BEIR collection (see the module docstring);
    ``query_prompt`` / ``document_prompt`` as :class:`RetrievalScorer` takes them (the results
    name the prompts used under ``"prompts"``).

    Returns:
        ``{"kind": "retrieval", "folder", "split", "queries", "documents", "backend", "k",
        "metrics": {name: value x 100}, "timing": {"encode", "search"}}``; with ``dims`` also
        ``"dims": {"64": {name: value}, ...}`` (one encoding; ``metrics`` is then the full width).
    """
    scorer = RetrievalScorer(
        collection, split, None, k, search, backend, batch_size, query_prompt, document_prompt
    )
    c = scorer.collection
    docs, queries, encode_s = scorer.vectors(encoder)
    t0 = time.perf_counter()
    out: dict[str, Any] = {
        "kind": KIND,
        "folder": str(c.folder),
        "split": c.split,
        "queries": len(c.query_ids),
        "documents": len(c.doc_ids),
        "backend": backend,
        "k": k,
        "metrics": scorer.score_vectors(docs, queries),
    }
    if any(scorer.prompts(encoder)):
        out["prompts"] = dict(zip((QUERY, DOCUMENT), scorer.prompts(encoder), strict=True))
    if dims:
        out["dims"] = {str(d): scorer.score_vectors(docs, queries, int(d)) for d in dims}
    out["timing"] = {"encode": encode_s, "search": time.perf_counter() - t0}
    return out


def markdown(result: dict[str, Any]) -> str:
    """A table of one retrieval evaluation: a row for the full width and one per ``dims``."""
    names = list(result["metrics"])
    rows = [("full", *(f"{result['metrics'][n]:.2f}" for n in names))]
    rows += [(d, *(f"{m[n]:.2f}" for n in names)) for d, m in result.get("dims", {}).items()]
    prompts = result.get("prompts") or {}
    read = "; ".join(
        f"{side} after `{prompts[name]}`"
        for side, name in (("queries", QUERY), ("documents", DOCUMENT))
        if prompts.get(name)
    )
    title = (
        f"Retrieval: {result['folder']} ({result['split']}, {result['queries']} queries, "
        f"{result['documents']} documents, {result['backend']} search; x 100)"
        + (f"; {read}" if read else "")
    )
    return f"{title}\n\n" + markdown_table(["dim", *names], rows, "l" + "r" * len(names))


# ------------------------------------------------------------------- a collection from STS pairs


def check_collection_output(folder: str | os.PathLike[str], threshold: float) -> None:
    """Refuse, before anything is read or written, a ``threshold`` that is not a number and a
    ``folder`` that is a file or holds files already (a user's BEIR folder would be half
    replaced: its corpus and queries rewritten, another split's qrels left judging the old
    corpus). Raises :class:`ConfigError` / :class:`ConfigSettingError`."""
    if not finite(threshold):
        raise ConfigSettingError(
            "threshold",
            threshold,
            "{setting} is refused: the least gold score must be a finite number",
        )
    root = Path(folder)
    refuse_file_in_the_way(root, error=ConfigError)  # the collection is a folder
    if root.is_dir() and any(root.iterdir()):
        raise ConfigError(
            f"{root}: is not empty; write the collection into a new or empty folder (nothing "
            "of a folder that holds files is replaced)"
        )


def collection_from_sts(
    pairs: ScoredPairs,
    folder: str | os.PathLike[str],
    split: str = "dev",
    threshold: float = 4.0,
) -> Path:
    """Write a BEIR folder made from STS pairs (e.g. STS-B dev): each distinct ``sentence1`` of
    a pair scored at least ``threshold`` is a query, the pair's ``sentence2`` a relevant
    document (relevance 1); the corpus is every sentence of the pairs that is not a query.

    A pair whose ``sentence2`` is itself the ``sentence1`` of such a pair (or equals its own
    ``sentence1``) is left out, so no query finds its own text in the corpus. Ids are ``q<N>``
    and ``d<N>`` in file order. Returns ``folder``, which must be new or empty
    (:func:`check_collection_output`).
    """
    check_collection_output(folder, threshold)
    root = Path(folder)
    high = [(a, b) for a, b, s in zip(pairs.sent1, pairs.sent2, pairs.scores, strict=True)
            if s >= threshold and a != b]  # fmt: skip
    candidates = {a for a, _ in high}
    judged_pairs = list(dict.fromkeys((a, b) for a, b in high if b not in candidates))
    queries = list(dict.fromkeys(a for a, _ in judged_pairs))
    is_query = set(queries)
    corpus = [s for s in dict.fromkeys([*pairs.sent1, *pairs.sent2]) if s not in is_query]
    doc_id = {s: f"d{i}" for i, s in enumerate(corpus)}
    query_id = {s: f"q{i}" for i, s in enumerate(queries)}
    judged = [(query_id[a], doc_id[b]) for a, b in judged_pairs]
    if not judged:
        raise ConfigError(f"{pairs.name}: no pair scores {threshold} or more; lower the threshold")
    (root / BEIR_QRELS).mkdir(parents=True, exist_ok=True)
    # Through the one table writer: the files read back by read_beir's own rules.
    write_table(root / f"{BEIR_CORPUS}.jsonl", ["_id", "title", "text"],
                ([doc_id[s], "", s] for s in corpus), "BEIR corpus")  # fmt: skip
    write_table(root / f"{BEIR_QUERIES}.jsonl", ["_id", "text"],
                ([query_id[s], s] for s in queries), "BEIR queries")  # fmt: skip
    write_table(root / BEIR_QRELS / f"{split}.tsv", list(BEIR_QRELS_COLUMNS),
                ([q, d, "1"] for q, d in judged), "BEIR qrels")  # fmt: skip
    log.info("%s: %d queries, %d documents, %d judgements", root, len(queries), len(corpus),
             len(judged))  # fmt: skip
    return root
