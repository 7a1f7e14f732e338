"""The names of the dev metrics model selection and ``cselab evaluate`` know: correlations of STS
pairs and retrieval measures at a cut-off (``ndcg@10``). Here because the config (which checks
``eval.dev_metric``) and the evaluation (which computes them) both need them; no torch."""

from __future__ import annotations

from typing import Literal

#: ``eval.dev`` for STS-B dev (SimCSE's model selection), and the kind of that dev set (the one
#: spelling of the name: the config, model selection, the card and the plots import it)
STSB = "stsb"
#: The name of STS-B dev's Spearman score in ``metrics.csv``, ``results.json`` and the callbacks
#: (:func:`dev_score_name`; SimCSE's ``eval_stsb_spearman``)
STSB_DEV = "stsb_dev"
#: What a dev set is: STS-B dev, an STS-format file (``evaluation.names.STS_FILE_KIND``) or a
#: BEIR folder (``evaluation.names.RETRIEVAL_KIND``)
DevKind = Literal["stsb", "sts-file", "retrieval"]

#: The correlations an STS-format ``eval.dev`` is scored by.
STS_DEV_METRICS = ("spearman", "pearson")
#: The retrieval measures (``name@K``) a BEIR ``eval.dev`` is scored by
#: (:mod:`cselab.evaluation.retrieval` defines them).
RETRIEVAL_MEASURES = ("ndcg", "mrr", "recall", "map")
#: Each retrieval measure as tables and the Hub's ``model-index`` spell it (``nDCG@10``)
RETRIEVAL_NAMES = {"ndcg": "nDCG", "mrr": "MRR", "recall": "Recall", "map": "MAP"}
#: The cut-offs ``K`` model selection accepts (a closed set: each ``dev_<name>@<K>`` is a
#: ``metrics.csv`` column that the callbacks and plots must know as an evaluation column).
DEV_CUTOFFS = (1, 3, 5, 10, 20, 50, 100, 1000)


def retrieval_metric(name: str) -> tuple[str, int] | None:
    """``"ndcg@10"`` -> ``("ndcg", 10)`` (any K >= 1); ``None`` for a name of another form."""
    measure, at, cutoff = str(name).lower().partition("@")
    if not at or measure not in RETRIEVAL_MEASURES or not cutoff.isdigit() or int(cutoff) < 1:
        return None
    return measure, int(cutoff)


def dev_score_name(dev: str, metric: str = "spearman") -> str:
    """The name of the ``eval.dev`` score in ``metrics.csv``, ``results.json`` and the callbacks:
    ``stsb_dev`` (STS-B, Spearman, as before), ``stsb_dev_pearson``, ``dev_spearman`` /
    ``dev_pearson`` for a file, and ``dev_ndcg@10`` (the metric's name) for a BEIR folder."""
    if dev.lower() == STSB:
        return STSB_DEV if metric == "spearman" else f"{STSB_DEV}_{metric}"
    return f"dev_{metric}"
