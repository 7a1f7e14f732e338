"""The model card's Hub metadata: the YAML front matter (``library_name``, tags, ``base_model``,
``license``) and the ``model-index`` of evaluation results, through ``huggingface_hub``'s
:class:`~huggingface_hub.ModelCardData` and :class:`~huggingface_hub.EvalResult`.

The model-selection score is named as model selection computed it (:func:`dev_score`: ``eval.dev``
and ``eval.dev_metric``); ``cselab evaluate`` results become one result per task
(:func:`evaluation_results`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from ..config.devset import NO_DEV, DevSet, dev_metric_for
from ..config.plan import RunPlan
from ..core.metrics import RETRIEVAL_NAMES, STSB, retrieval_metric
from ..evaluation.custom import KIND, dev_score_name
from ..evaluation.names import senteval_hub_dataset
from ..evaluation.report import headline
from ..model.config import ModelConfig

#: The file name of a model card on the Hub (and in a model folder).
CARD_FILE = "README.md"
#: Tags of every cselab model; the objective's own follow (``objective_tags``).
LIBRARY_TAGS = ("sentence-transformers", "sentence-similarity", "feature-extraction", "cselab")


class DevScore(NamedTuple):
    """How a card names the run's model-selection score (``eval.dev``, ``eval.dev_metric``)."""

    #: its ``metrics.csv`` column: the name model selection logs it under
    #: (:func:`~cselab.evaluation.custom.dev_score_name`)
    name: str
    #: the dev set in words: ``STS-B dev``, or ``dev set `<file>``` for your own pairs
    dataset: str
    #: the correlation: ``Spearman`` or ``Pearson``
    metric: str
    #: the dataset's type and name in the Hub's ``model-index``
    hub_type: str
    hub_name: str
    #: the ``model-index`` task (STS pairs: sentence similarity; a BEIR folder: retrieval)
    task_type: str = "sentence-similarity"
    task_name: str = "Semantic Textual Similarity"
    #: the ``model-index`` metric type (MTEB's spelling for retrieval: ``ndcg_at_10``)
    metric_type: str = ""


def dev_score(plan: RunPlan) -> DevScore:
    """The run's model-selection score, named as model selection names it: the run plan's
    :class:`~cselab.config.devset.DevSet` (resolved once, where the run started, or where a
    card without its run found its facts: :func:`~.folder_plan.card_plan`)."""
    dev = plan.dev
    if dev is None:  # eval.dev none: named as a file would be (the card shows no score then)
        metric = dev_metric_for(NO_DEV, None)
        dev = DevSet("sts-file", NO_DEV, None, metric, dev_score_name(NO_DEV, metric), NO_DEV)
    name, metric = dev.score_name, dev.metric
    if dev.kind == STSB:  # as cselab evaluate's STS-B dev result: --update-card replaces it
        return DevScore(
            name, "STS-B dev", metric.capitalize(), *senteval_hub_dataset("STSBenchmark")
        )
    file = Path(dev.path).name
    measure = retrieval_metric(metric)
    if measure is not None:  # a BEIR folder: a retrieval measure at a cut-off
        what, k = measure
        shown = f"{RETRIEVAL_NAMES[what]}@{k}"
        return DevScore(
            name, f"retrieval dev set `{file}`", shown, "retrieval", f"{file} (own retrieval set)",
            "retrieval", "Retrieval", f"{what}_at_{k}",
        )  # fmt: skip
    return DevScore(name, f"dev set `{file}`", metric.capitalize(), KIND, f"{file} (own pairs)")


def base_model_name(name_or_path: str) -> str:
    """The base model as a card names it: a Hub name as given, a local folder by its absolute
    path (a relative one, ``runs/mntp/merged``, says nothing where the card is read)."""
    local = Path(name_or_path).expanduser()
    return str(local.resolve()) if local.is_dir() else name_or_path


def base_model_license(name_or_path: str) -> str | None:
    """The ``license`` of the base model's own card, when that card is on disk (no network).

    Looks in a local folder, the packaged offline copy, then the Hugging Face cache.
    """
    from ..model.hub import packaged_model_path

    candidates: list[Path] = []
    local = Path(name_or_path).expanduser()
    if local.is_dir():
        candidates.append(local / CARD_FILE)
    packaged = packaged_model_path(name_or_path)
    if packaged is not None:
        candidates.append(packaged / CARD_FILE)
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name_or_path, CARD_FILE)
        if isinstance(cached, str):
            candidates.append(Path(cached))
    except Exception:  # not a valid repo id (e.g. a path): nothing cached under it
        pass
    for card in candidates:
        if card.is_file():
            from huggingface_hub import ModelCard

            value = ModelCard.load(card).data.to_dict().get("license")
            if value:
                return str(value)
    return None


def front_matter(
    name: str,
    model: ModelConfig,
    objective_tags: Sequence[str],
    eval_results: Sequence[Any],
) -> Any:
    """The card's ``ModelCardData``: library, pipeline, tags, base model, license, results."""
    from huggingface_hub import ModelCardData

    base = model.name_or_path
    # The prompt pooler has no sentence-transformers module: the Hub's "use in
    # sentence-transformers" snippet would give other vectors, so such a card names transformers
    # (its text gives the transformers recipe).
    st_reads_it = model.pooler != "prompt"
    library_tags = [t for t in LIBRARY_TAGS if st_reads_it or t != "sentence-transformers"]
    return ModelCardData(
        library_name="sentence-transformers" if st_reads_it else "transformers",
        pipeline_tag="sentence-similarity",
        tags=[*library_tags, *objective_tags],
        base_model=base if not Path(base).is_dir() else None,  # a local folder is no Hub id
        license=base_model_license(base),
        model_name=name,
        eval_results=list(eval_results) or None,
    )


def eval_results(
    score: float | None, dev: DevScore, evaluation: Mapping[str, Any] | None
) -> list[Any]:
    """The dev score ``score`` of ``dev``, then the ``cselab evaluate`` results."""
    from huggingface_hub import EvalResult

    results = []
    if score is not None and math.isfinite(score):
        results.append(
            EvalResult(
                task_type=dev.task_type,
                task_name=dev.task_name,
                dataset_type=dev.hub_type,
                dataset_name=dev.hub_name,
                dataset_split="validation",
                metric_type=dev.metric_type or f"{dev.metric.lower()}_cosine",
                metric_name=f"{dev.metric} (cosine) x 100",
                metric_value=round(float(score), 2),
            )
        )
    results += evaluation_results(evaluation)
    return results


def evaluation_results(evaluation: Mapping[str, Any] | None) -> list[Any]:
    """``cselab evaluate`` output as Hub ``EvalResult``s: each task kind's of the registry
    (STS Spearman and transfer accuracy x 100, a result per retrieval measure, ...)."""
    from huggingface_hub import EvalResult

    from ..evaluation.registry import TASK_KINDS

    if not evaluation:
        return []
    table = headline(evaluation)
    return [
        EvalResult(**result)
        for kind in TASK_KINDS.values()
        for result in kind.hub_results(evaluation, table)
    ]


def merge_eval_results(old: Sequence[Any], new: Sequence[Any]) -> list[Any]:
    """``old`` with every result of ``new`` replacing the one for the same dataset/split/metric."""

    def key(r: Any) -> tuple:
        return (r.dataset_type, r.dataset_split, r.metric_type)

    fresh = {key(r) for r in new}
    return [r for r in old if key(r) not in fresh] + list(new)
