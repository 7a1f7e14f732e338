"""MTEB (``mteb`` 2.x) for cselab models: a thin wrapper around ``mteb.evaluate``.

MTEB talks to models through its encoder protocol: ``encode(DataLoader, task_metadata=...,
hf_split=..., hf_subset=..., prompt_type=...)`` plus ``mteb_model_meta``. :class:`MTEBEncoder`
answers it with a cselab :class:`~cselab.model.encoder.SentenceEncoder`, so MTEB sees exactly the
vectors ``cselab evaluate`` sees: the saved pooler (``cls``'s MLP head, ``avg_top2`` ...) or the
one asked for, which a plain sentence-transformers load of the folder could not honour. The
pooler is recorded in the model metadata's ``experiment_kwargs``, so MTEB's result cache keeps
runs with different poolers apart.

Python route::

    >>> from cselab.evaluation.mteb import run_mteb
    >>> out = run_mteb("runs/simcse/best", ["STS12", "SciFact"])  # doctest: +SKIP
    >>> out["scores"]["STS12"]  # main score (x 100) per split   # doctest: +SKIP

:class:`SentEvalSTSBenchmark` is an MTEB STS task that reads STS-B from the SentEval folder
(cselab's parser): MTEB's own ``STSBenchmark`` downloads ``mteb/stsbenchmark-sts``, which is not
always possible. Both score cosine against the gold 0-5 score with Spearman.

Prompts (``docs/prompts.md``) reach the model as MTEB asks for them: the encoder's
``model_prompts`` are the model's saved prompts (``query``, ``document``) and, with
``instructions`` (``--instructions llm2vec``, :mod:`cselab.evaluation.instructions`), each
task's instruction under MTEB's keys (``SentEvalSTSBenchmark`` reads ``STSBenchmark``'s); MTEB's
``get_prompt`` picks one per task and prompt type (task-and-type, task, type-of-task, then
``query``/``document``), and the model reads the texts after it (its pooler leaving the prompt
out where the model says so). The results record both (``instructions``, ``model_prompts``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

try:
    import mteb
    from datasets import Dataset, DatasetDict
    from mteb.abstasks.sts import AbsTaskSTS
    from mteb.abstasks.task_metadata import TaskMetadata
    from mteb.models.abs_encoder import AbsEncoder, get_prompt
    from mteb.models.model_meta import ModelMeta, ScoringFunction
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError("MTEB evaluation needs mteb 2.x: pip install 'cselab[mteb]'") from err

from ..core.schema import ConfigError
from ..io.files import write_text_atomic
from ..model.choices import BATCH_SIZE
from . import datasets
from .embed import saved_prompts, with_prompt

log = logging.getLogger(__name__)


class MTEBEncoder(AbsEncoder):
    """A cselab encoder behind MTEB's encoder protocol (cosine similarity, text only).

    Args:
        encoder: a :class:`~cselab.model.encoder.SentenceEncoder` (or anything with
            ``encode(list[str], batch_size=...)``, ``pooler.kind`` and ``dim``).
        name: the model name MTEB records (``organization/model`` form; a folder path is turned
            into ``cselab/<folder>``).
        revision: recorded with the results (default ``local``).
        prompts: prompts by MTEB's keys (``STS12``, ``SciFact-query``, ``query``) besides the
            model's saved ones, which they override.
    """

    def __init__(
        self,
        encoder: Any,
        name: str | None = None,
        revision: str | None = None,
        prompts: dict[str, str] | None = None,
    ):
        self.model = encoder
        self.model_prompts = {**saved_prompts(encoder), **(prompts or {})}
        source = name or str(getattr(encoder, "source", None) or "model")
        pooler = getattr(getattr(encoder, "pooler", None), "kind", None)
        self.mteb_model_meta = ModelMeta.create_empty(
            overwrites={
                "name": _mteb_name(source),
                "revision": revision or "local",
                "embed_dim": int(getattr(encoder, "dim", 0)) or None,
                # model_copy skips the validators: pass the enum, not its string
                "similarity_fn_name": ScoringFunction.COSINE,  # cselab's STS scores are cosines
                "framework": ["PyTorch"],
                "modalities": ["text"],
                "experiment_kwargs": _experiment(pooler, prompts),
            }
        )

    def encode(
        self,
        inputs: Any,
        *,
        task_metadata: Any,
        hf_split: str,
        hf_subset: str,
        prompt_type: Any = None,
        **kwargs: Any,
    ) -> np.ndarray:
        """Every text of MTEB's DataLoader, encoded in one call (cselab sorts by length), after
        the prompt MTEB picks for the task and ``prompt_type`` (none: the model's default)."""
        texts = [text for batch in inputs for text in batch["text"]]
        batch_size = int(kwargs.get("batch_size") or BATCH_SIZE)
        prompt = get_prompt(self.model_prompts, task_metadata, prompt_type)
        if prompt is None:
            return self.model.encode(texts, batch_size=batch_size)
        return with_prompt(self.model, prompt).encode(texts, batch_size=batch_size)


def _experiment(pooler: str | None, prompts: dict[str, str] | None) -> dict[str, Any] | None:
    """What sets this run apart in MTEB's result cache: the pooler and the prompts given."""
    out: dict[str, Any] = {"pooler": pooler} if pooler else {}
    if prompts:
        out["prompts"] = dict(sorted(prompts.items()))
    return out or None


def _mteb_name(source: str) -> str:
    """MTEB wants ``organization/model``; a local folder becomes ``cselab/<folder name>``."""
    path = Path(source)
    if os.path.isabs(source) or path.exists() or "/" not in source:
        parts = [p for p in path.resolve().parts[-2:] if p not in ("/", "")]
        return "cselab/" + "_".join(parts or ["model"])
    return source


class SentEvalSTSBenchmark(AbsTaskSTS):
    """STS-B (Cer et al. 2017) from SentEval's files, as an MTEB STS task (no download).

    The same pairs ``cselab evaluate --tasks STSBenchmark`` reads (tokenised, lowercased by
    SentEval), on ``split`` ``dev`` or ``test``; gold scores 0-5 as MTEB's ``STSBenchmark``.
    """

    min_score = 0
    max_score = 5
    metadata = TaskMetadata(
        name="SentEvalSTSBenchmark",
        description="STS Benchmark pairs read from a local SentEval data/downstream folder.",
        reference="https://ixa2.si.ehu.eus/stswiki/index.php/STSbenchmark",
        dataset={"path": "local/senteval-stsbenchmark", "revision": "senteval"},
        type="STS",
        category="t2t",
        modalities=["text"],
        eval_splits=["dev", "test"],
        eval_langs=["eng-Latn"],
        main_score="cosine_spearman",
        date=("2017-01-01", "2017-08-01"),
        domains=["Blog", "News", "Written"],
        task_subtypes=[],
        license="not specified",
        annotations_creators="human-annotated",
        dialect=[],
        sample_creation="found",
        bibtex_citation="",
    )

    def __init__(
        self,
        split: str = "dev",
        data_dir: str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ) -> None:
        if split not in ("dev", "test"):
            raise ValueError(f"STS-B split must be dev or test, not {split!r}")
        super().__init__(**kwargs)
        # One split per task object: MTEB runs every split in metadata.eval_splits.
        self.metadata = self.metadata.model_copy(update={"eval_splits": [split]})
        self.split = split
        self.data_dir = data_dir

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
        if self.data_loaded:
            return
        pairs = datasets.load_stsb(self.split, datasets.resolve_data_dir(self.data_dir))
        self.dataset = DatasetDict(
            {
                self.split: Dataset.from_dict(
                    {
                        "sentence1": list(pairs.sent1),
                        "sentence2": list(pairs.sent2),
                        "score": [float(s) for s in pairs.scores],
                    }
                )
            }
        )
        self.data_loaded = True


def resolve_tasks(
    spec: str | Iterable[Any],
    data_dir: str | os.PathLike[str] | None = None,
    split: str | None = None,
) -> list[Any]:
    """``"STS12,SciFact"`` or a list of names and task objects -> MTEB task objects.

    ``SentEvalSTSBenchmark`` reads ``data_dir`` (the SentEval folder). ``split`` keeps only that
    evaluation split of each task named (``None``: the task's own splits; ``dev`` for
    ``SentEvalSTSBenchmark``); a task that does not evaluate that split is a
    :class:`ConfigError` naming its splits. Task objects are taken as they are.
    """
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    names = [i.strip() for i in items if isinstance(i, str) and i.strip()]
    objects = [i for i in items if not isinstance(i, str)]
    tasks: list[Any] = []
    for name in names:
        if name == SentEvalSTSBenchmark.metadata.name:
            task = SentEvalSTSBenchmark
        else:
            try:
                task = mteb.get_task(name)
            except KeyError as err:
                raise ConfigError(f"unknown MTEB task {name!r}: {err.args[0]}") from None
        splits = list(task.metadata.eval_splits)
        if split is not None and split not in splits:
            raise ConfigError(
                f"MTEB task {name} has no split {split!r} to evaluate (its splits: "
                f"{', '.join(splits)})"
            )
        if task is SentEvalSTSBenchmark:
            tasks.append(SentEvalSTSBenchmark(split or "dev", data_dir))
        else:
            tasks.append(task.filter_eval_splits([split]) if split is not None else task)
    tasks += objects
    if not tasks:
        raise ConfigError("no MTEB task given")
    return tasks


def run_mteb(
    model: Any,
    tasks: str | Sequence[Any],
    *,
    pooler: str | None = None,
    batch_size: int = BATCH_SIZE,
    output_folder: str | os.PathLike[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    overwrite: bool = True,
    device: str | None = None,
    show_progress: bool = False,
    split: str | None = None,
    instructions: str | None = None,
) -> dict:
    """Run MTEB tasks on a cselab model; returns ``{"model", "pooler", "instructions",
    "model_prompts", "scores", "results"}``.

    Args:
        model: a model folder or name (opened with :func:`cselab.load`, ``pooler`` honoured) or a
            loaded :class:`~cselab.model.encoder.SentenceEncoder`.
        tasks: comma-separated MTEB task names, or names / task objects.
        data_dir: the SentEval folder, for ``SentEvalSTSBenchmark`` named as a string.
        split: evaluate only this split of the tasks named (see :func:`resolve_tasks`).
        output_folder: MTEB's result cache folder (its usual layout); ``None`` keeps no cache.
        overwrite: run the tasks even when results are cached there.
        instructions: a task-instruction table (``llm2vec`` or a YAML file,
            :func:`~cselab.evaluation.instructions.load_instructions`) whose instructions the
            tasks' texts are read after, besides the model's saved prompts.

    ``instructions`` is the table given (``None``: none), ``model_prompts`` the prompts the
    model was given by MTEB's keys (its saved ones and the table's); ``scores`` maps each task
    to ``{split: {subset: main score x 100}}``; ``results`` holds MTEB's full per-task result
    objects as dicts. A task the table has no instruction for is one warning line (it reads the
    model's own prompts); ``SentEvalSTSBenchmark`` reads the table's ``STSBenchmark``.
    """
    task_objects = resolve_tasks(tasks, data_dir, split)
    prompts = None  # the table is read before the model is loaded: a bad one is told at once
    if instructions:
        from .instructions import load_instructions, missing, mteb_prompts

        table = load_instructions(instructions)
        types = {t.metadata.name: t.metadata.type for t in task_objects}
        prompts = mteb_prompts(table, types)
        if uncovered := missing(table, types):
            log.warning(
                "%s: no instruction for %s; read with the model's own prompts",
                table.path, ", ".join(uncovered),
            )  # fmt: skip
    if isinstance(model, str | os.PathLike):
        from ..model.encoder import load

        encoder = load(str(model), pooler=pooler, device=device)
    else:
        encoder = model
    wrapped = MTEBEncoder(encoder, prompts=prompts)
    cache = mteb.ResultCache(cache_path=str(output_folder)) if output_folder else None
    try:
        result = mteb.evaluate(
            wrapped,
            task_objects,
            encode_kwargs={"batch_size": batch_size, "show_progress_bar": show_progress},
            cache=cache,
            overwrite_strategy="always" if overwrite else "only-missing",
            show_progress_bar=show_progress,
        )
    except OSError as err:  # MTEB downloads each task's data from the Hub
        names = ", ".join(t.metadata.name for t in task_objects)
        raise datasets.MissingDataError(
            f"MTEB could not load the data of {names} ({type(err).__name__}: {err}); MTEB "
            "downloads its datasets from the Hugging Face Hub (set HF_ENDPOINT for a mirror)"
        ) from None
    scores: dict[str, dict[str, dict[str, float]]] = {}
    full: dict[str, Any] = {}
    for task_result in result.task_results:
        scores[task_result.task_name] = {
            split: {entry["hf_subset"]: 100.0 * float(entry["main_score"]) for entry in entries}
            for split, entries in task_result.scores.items()
        }
        full[task_result.task_name] = task_result.to_dict()
    return {
        "model": str(getattr(encoder, "source", None) or model),
        "pooler": getattr(getattr(encoder, "pooler", None), "kind", None),
        "instructions": str(instructions) if instructions else None,
        "model_prompts": dict(sorted(wrapped.model_prompts.items())),
        "scores": scores,
        "results": full,
    }


def markdown(out: dict) -> str:
    """One row per task, split and subset: the task's main score x 100."""
    lines = ["| task | split | subset | main score |", "| --- | --- | --- | ---: |"]
    for task, splits in out["scores"].items():
        for split, subsets in splits.items():
            for subset, value in subsets.items():
                lines.append(f"| {task} | {split} | {subset} | {value:.2f} |")
    return "\n".join(lines)


def run_cli(args: argparse.Namespace) -> int:
    """``cselab evaluate MODEL --mteb TASKS [--split SPLIT] [-o results.json]``."""
    out = run_mteb(
        args.model,
        args.mteb,
        pooler=args.pooler,
        batch_size=args.batch_size,
        output_folder=args.mteb_cache,
        data_dir=args.data_dir,
        device=getattr(args, "device", None),
        show_progress=not getattr(args, "quiet", False),
        split=getattr(args, "split", None),
        instructions=getattr(args, "instructions", None),
    )
    print(markdown(out))
    if args.output:
        text = json.dumps(out, indent=2, default=str)
        write_text_atomic(args.output, text, "evaluation results")
        print(f"\nresults: {args.output}")
    return 0
