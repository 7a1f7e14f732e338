"""Model cards: the ``README.md`` in the Hugging Face format written into every saved model folder.

The card has YAML front matter (:mod:`.hub_metadata`: ``library_name``, ``pipeline_tag``, tags,
``base_model``, the base model's ``license`` when its own card is on disk, and a ``model-index``
with the model-selection score and any evaluation results), then prose: what the model is, the
objective in words with its parameters (each part of the built objective describes itself:
:func:`cselab.objectives.describe_objective`), the training data (file, sentence or pair count,
SHA-256: what the run's data layer read, :class:`~cselab.data.source.TrainingData`), the
hyperparameters, the dev-score curve, hardware and time (:mod:`.hardware`), usage snippets for
sentence-transformers, ``transformers`` and cselab (:mod:`.usage`), and BibTeX for every paper the
objective implements (:func:`cselab.objectives.objective_papers`). The dev score is named as model
selection computed it (``eval.dev`` and ``eval.dev_metric``: STS-B dev Spearman by default, or
your own dev file).

The front matter is built and read with ``huggingface_hub``'s :class:`~huggingface_hub.ModelCard`,
so it is the Hub's own format. :func:`update_model_card` adds ``cselab evaluate`` results to an
existing card (the section between :data:`EVAL_START` and :data:`EVAL_END`).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..config import Config, load_config
from ..config.plan import RunPlan
from ..core.datakind import DataKind
from ..core.metrics import STSB_DEV
from ..data.config import is_pairs_source
from ..data.pairs import read_mining_record
from ..data.source import TrainingData, TrainingSource
from ..evaluation.report import markdown, markdown_table
from ..io.files import file_digest, write_text_atomic
from ..io.readers import dump_yaml, read_json
from ..io.runfolder import RunFolder
from ..model.config import ModelConfig
from ..model.hub import cache_root, resolve_train_file
from ..model.lora import adapter_base, is_adapter_folder
from ..model.prompt import model_papers
from ..model.st_folder import ADAPTER_LAYERS_NOT_REPRODUCED, CSELAB_FILE
from ..objectives import (
    Objective,
    build_objective,
    describe_objective,
    objective_papers,
    objective_tags,
)
from ..objectives.mntp import MODEL_USE
from ..training.metrics import read_metrics as read_metrics_table
from .folder_plan import card_plan, run_plan_of
from .hardware import hardware_section
from .hub_metadata import (
    CARD_FILE,
    base_model_name,
    dev_score,
    eval_results,
    evaluation_results,
    front_matter,
    merge_eval_results,
)
from .usage import prompt_usage, usage_snippets

CONFIG_FILE = RunFolder.MODEL_CONFIG  # written next to the weights by Trainer.save_model
EVAL_START = "<!-- cselab:evaluation:start -->"
EVAL_END = "<!-- cselab:evaluation:end -->"
#: The line every usage snippet starts with; :func:`set_model_id` rewrites it (e.g. on push).
MODEL_ID_LINE = re.compile(r'^model_id = "(?P<id>[^"\n]*)"$', re.MULTILINE)
#: At most this many rows in the dev-score table (the best and the last row are always kept).
CURVE_ROWS = 20

__all__ = [
    "CARD_FILE",
    "CONFIG_FILE",
    "EVAL_END",
    "EVAL_START",
    "code_blocks",
    "dev_curve",
    "read_metrics",
    "set_model_id",
    "update_model_card",
    "write_model_card",
]


# ---------------------------------------------------------------------------------- the inputs
def read_metrics(path: str | Path | None, before: int | None = None) -> list[dict[str, float]]:
    """The rows of a run's ``metrics.csv`` (:func:`cselab.training.metrics.read_metrics`, the
    file's one reader); ``[]`` if there is no file yet. ``before``: the file is being appended
    to (a ``best/`` written during training): only the rows of earlier steps, a last line in
    flight left out silently."""
    if path is None or not Path(path).is_file():
        return []
    if before is None:
        return read_metrics_table(path).rows
    return [r for r in read_metrics_table(path, live=True).rows if r["step"] < before]


def dev_curve(
    rows: Sequence[Mapping[str, float]], name: str = STSB_DEV
) -> list[tuple[int, float | None, float]]:
    """``(step, training loss, dev score)`` of every row with a dev score in column ``name``
    (loss is ``None`` at step 0), thinned to :data:`CURVE_ROWS` rows keeping the first, best and
    last."""
    points = [
        (int(r["step"]), r.get("loss"), r[name])
        for r in rows
        if name in r and math.isfinite(r[name])
    ]
    if len(points) <= CURVE_ROWS:
        return points
    best = max(range(len(points)), key=lambda i: points[i][2])
    keep = {0, best, len(points) - 1}
    stride = (len(points) - 1) / (CURVE_ROWS - 1)
    keep |= {round(i * stride) for i in range(CURVE_ROWS)}
    while len(keep) > CURVE_ROWS:  # rounding may add a few; drop those nearest the middle
        keep.discard(sorted(keep - {0, best, len(points) - 1})[len(keep) // 2])
    return [points[i] for i in sorted(keep)]


_DIGESTS: dict[tuple[str, int, int], str] = {}


def file_sha256(path: Path) -> str:
    """:func:`cselab.io.files.file_digest`, cached per (path, size, mtime): a card written without
    the run's data (``update_model_card``) may be written for several folders."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = file_digest(path)
    return _DIGESTS[key]


def data_of_config(
    config: Config, rows: int | None = None, plan: RunPlan | None = None
) -> TrainingData:
    """What a card says about the training data when no run handed it over (a card written
    from a saved ``cselab_config.yaml``): the file and its kind from the run's ``plan`` (what
    the run decided when it opened the file), its SHA-256 if it is on disk, and ``rows`` if
    known. Without a plan (a folder moved away from its run folder) the data layer opens the
    file where the run found it (never downloaded) and decides; a file no longer there is
    described by its name, its hard negatives not counted.
    """
    data = config.data
    if plan is not None:
        path, kind = Path(plan.train_file), plan.kind
    else:
        cache = Path(data.cache_dir) if data.cache_dir else cache_root()
        path = resolve_train_file(data.train_file, str(cache / "data"), download=False)
        if path.exists():
            kind = TrainingSource(path, data).kind
        else:
            kind = DataKind(pairs=is_pairs_source(path, data.format))
    sha = file_sha256(path) if path.is_file() else None
    return TrainingData(path, kind, rows, sha)


def _fmt(x: float | None, digits: int = 2) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


#: Each part of the evaluation section starts with one of these (``{key}``: ``senteval``, or
#: ``retrieval:<collection>``), so a later ``--update-card`` replaces its own part only.
PART_MARK = "<!-- cselab:evaluation:part {key} -->"
_PART_RE = re.compile(r"<!-- cselab:evaluation:part (\S+) -->\n")


def evaluation_parts(evaluation: Mapping[str, Any] | None) -> dict[str, str]:
    """The markdown of ``cselab evaluate`` results: the headline tables (``senteval``), then each
    task kind's markdown of its entries (``retrieval:<name>``) headed by its option ``--<kind>``."""
    from ..evaluation.registry import TASK_KINDS

    if not evaluation:
        return {}
    parts = {}
    senteval = markdown(evaluation)
    if senteval.strip():
        prompt = evaluation.get("prompt")
        read = f", every sentence after the prompt `{prompt}`" if prompt else ""
        parts["senteval"] = (
            f"`cselab evaluate` (SentEval protocol, mode `{evaluation.get('mode', 'test')}`"
            f"{read}):\n\n{senteval}"
        )
    for kind in TASK_KINDS.values():
        for key, text in kind.entry_markdown(evaluation).items():
            parts[key] = f"`cselab evaluate --{kind.kind}`: {text}"
    return parts


def evaluation_section(
    evaluation: Mapping[str, Any] | None, previous: Mapping[str, str] | None = None
) -> str:
    """The markdown of ``cselab evaluate`` results between the evaluation markers: the parts
    of ``previous`` (an earlier section's, :func:`read_evaluation_parts`) with those of
    ``evaluation`` replacing or added to them."""
    parts = {**(previous or {}), **evaluation_parts(evaluation)}
    if not parts:
        body = (
            "Not evaluated yet. `cselab evaluate MODEL --tasks all -o results.json "
            "--update-card` fills this section (and `--retrieval FOLDER` adds search results)."
        )
    else:
        body = "\n\n".join(
            f"{PART_MARK.format(key=key)}\n{text.strip()}" for key, text in parts.items()
        )
    return f"{EVAL_START}\n## Evaluation\n\n{body}\n{EVAL_END}"


def read_evaluation_parts(section: str) -> dict[str, str]:
    """The parts of an evaluation section written by :func:`evaluation_section` (a section
    written before parts existed is one ``senteval`` part, unless it says "Not evaluated")."""
    body = section.split("## Evaluation", 1)[-1].strip()
    pieces = _PART_RE.split(body)
    if len(pieces) == 1:
        return {} if not body or body.startswith("Not evaluated yet") else {"senteval": body}
    return {key: text.strip() for key, text in zip(pieces[1::2], pieces[2::2], strict=True)}


def _data_section(config: Config, data: TrainingData) -> str:
    """The training file, its size (sentences, or pairs for pairs data) and SHA-256."""
    name = config.data.train_file
    rows = [("file", f"`{data.path.name}`" + (" (SimCSE's `wiki1m`)" if name == "wiki1m" else ""))]
    rows.append((data.kind.unit, f"{data.rows:,}" if data.rows is not None else "–"))
    if data.kind.pairs:
        rows.append(("columns", _pair_columns(config, data)))
    if data.kind.hard_negatives and (mined := mining_words(data.path)):
        rows.append(("hard negatives", mined))
    rows.append(("SHA-256", f"`{data.sha256}`" if data.sha256 else "– (file not on disk)"))
    return markdown_table(["", ""], rows)


def mining_words(path: Path) -> str | None:
    """How ``cselab mine`` mined the negatives of ``path``, in words (its mining record), or
    ``None`` when the file has no record."""
    record = read_mining_record(path)
    if record is None:
        return None
    st = record.get("settings") or {}
    window = f"ranks {st.get('range_min', 0)}-{st.get('range_max')}"
    filters = [f"{name} {st[key]}" for key, name in (
        ("max_score", "cosine at most"), ("absolute_margin", "absolute margin"),
        ("relative_margin", "relative margin")) if st.get(key) is not None]  # fmt: skip
    model = f"`{record['model']}`" if record.get("model") else "a model given in Python"
    return (
        f"mined by `cselab mine` with {model} ({record.get('backend', 'exact')} search): "
        f"{st.get('num_negatives')} per anchor from {window} of the anchor's neighbours among "
        f"{record.get('corpus')} texts, {st.get('sampling', 'top')} sampling"
        + (f", {', '.join(filters)}" if filters else "")
        + f"; {record.get('written')} rows from {record.get('pairs')} pairs"
    )


def intended_use(data: TrainingData, plan: RunPlan) -> str:
    """The card's intended use: semantic search for a model selected on a retrieval set or
    trained on hard negatives, else sentence similarity (``plan``: the run's, its dev set)."""
    dev = dev_score(plan)
    search = dev.task_type == "retrieval" or data.kind.hard_negatives
    if plan.objective.mntp.enabled:  # a step towards an encoder, not one yet
        return MODEL_USE
    if search:
        why = (
            f"selected on {dev.metric} of {dev.dataset}"
            if dev.task_type == "retrieval"
            else "trained on pairs with hard negatives"
        )
        return (
            f"Semantic search ({why}): encode the queries and the documents with this model and "
            "rank the documents by cosine similarity, e.g. with `cselab index build` and "
            "`cselab search`. Its scores on retrieval collections are under Evaluation once "
            "`cselab evaluate MODEL --retrieval FOLDER --update-card` has run. It also gives "
            "sentence-similarity scores; it was not trained for classification."
        )
    return (
        "Sentence similarity and clustering: compare two sentences' vectors by cosine "
        "similarity. For search, evaluate it on your collection first "
        "(`cselab evaluate MODEL --retrieval FOLDER`)."
    )


def _pair_columns(config: Config, data: TrainingData) -> str:
    """Which columns of a pairs file were the anchor, the positive and the hard negatives."""
    if config.data.format == "sick":
        return "SICK's release format: (entailed pair, contradicting sentence) triplets"
    c = config.data.columns
    text = f"anchor `{c.anchor}`, positive `{c.positive}`"
    if not data.kind.hard_negatives:
        return text + ", no hard negatives"
    names = c.negative if c.negative is not None else ["negative"]
    listed = ", ".join(f"`{n}`" for n in names)
    return text + f", hard negative{'s' if len(names) > 1 else ''} {listed}"


def _hyperparameters(config: Config, plan: RunPlan, results: Mapping[str, Any] | None) -> str:
    """The settings of the run (the config's) and what it resolved (the plan's: the pooler,
    the LoRA targets the load chose, the precision)."""
    m, t, pooler = config.model, config.train, plan.pooler
    targets = ", ".join(plan.lora_targets or ()) or "peft's default"
    rows = [
        ("base model", f"`{base_model_name(m.name_or_path)}`"),
        ("pooler", f"`{pooler}`" + (" (MLP head in training only)" if pooler in ("cls", "prompt") and m.mlp_only_train else "")),
        *([("prompt", f"`{m.prompt.template}` / `{m.prompt.template2 or m.prompt.template}`, denoising in training {m.prompt.denoise}, at inference {m.prompt.denoise_inference}")] if pooler == "prompt" else []),
        ("max_seq_len", m.max_seq_len),
        ("dropout", m.dropout if m.dropout is not None else "the base model's"),
        *([("LoRA", f"r {m.lora.r}, alpha {m.lora.scale_alpha:g}, dropout {m.lora.dropout:g}, modules {targets}")] if m.lora.enabled else []),
        ("batch size", t.batch_size),
        ("learning rate", f"{t.lr:g} (AdamW, weight decay {t.weight_decay:g})"),
        ("schedule", f"linear, warm-up {t.warmup_steps or t.warmup_ratio:g}" + (" steps" if t.warmup_steps else " of the steps")),
        ("epochs / max steps", f"{t.epochs} / {t.max_steps if t.max_steps else '–'}"),
        ("steps run", (results or {}).get("steps", "–")),
        ("gradient clipping", t.grad_clip),
        ("precision", (results or {}).get("precision") or plan.precision),
        ("seed", t.seed),
        ("GradCache chunk", t.cache_chunk_size or "off"),
    ]  # fmt: skip
    objective = dump_yaml({"objective": plan.to_dict()["objective"]}, sort_keys=False)
    return (
        markdown_table(["", ""], rows)
        + "\n\n<details><summary>the objective section of the config</summary>\n\n"
        + f"```yaml\n{objective}```\n\n</details>"
    )


def _dimensions_section(results: Mapping[str, Any] | None, dev: Any) -> str:
    """The selected model's dev score at each Matryoshka dimension (``results.json``'s
    ``dev_at_dims``, written at the end of a run with ``objective.matryoshka.dims``); empty
    without it."""
    rows = (results or {}).get("dev_at_dims") or []
    if not rows:
        return ""
    best_step = results.get("best_step", "–")  # type: ignore[union-attr]
    table = markdown_table(
        ["dimension", f"{dev.dataset} {dev.metric} ×100"],
        [(r["dim"], _fmt(r.get(dev.name))) for r in rows],
    )
    return (
        "## Matryoshka dimensions\n\n"
        f"The selected model (`best/`, step {best_step}) at each dimension it was trained for: "
        "the first d coordinates, re-normalised (`model.encode(sentences, dim=d)`, "
        "`cselab encode --dim d`, `cselab index build --dim d`).\n\n" + table + "\n\n"
    )


def _citations(
    model: ModelConfig, plan: RunPlan, objective: Objective | None = None
) -> tuple[list[str], list[str], str]:
    """The Hub tags, the description and the BibTeX of the papers of the objective (the run's,
    or asked of the objective built for the plan's data) and of the trained ``model`` section
    (its pooler's paper, :func:`~cselab.model.prompt.model_papers`)."""
    if objective is None:  # a card without its run: the objective built again from the plan
        objective = build_objective(plan.objective, plan.kind)
    pooler = model_papers(model)
    bib = "\n\n".join(p.bibtex for p in (*objective_papers(objective), *pooler))
    tags = objective_tags(objective) + [p.tag for p in pooler if p.tag]
    lines = describe_objective(objective, plan.kind)
    lines += [f"- Pooler `{model.pooler}`, {p.name}: {p.summary}." for p in pooler]
    return tags, lines, bib


# ------------------------------------------------------------------------------------- the API
def write_model_card(
    folder: str | Path,
    config: Config,
    *,
    data: TrainingData | None = None,
    results: Mapping[str, Any] | None = None,
    metrics_csv: str | Path | None = None,
    selection_score: float | None = None,
    step: int | None = None,
    metrics_before: int | None = None,
    evaluation: Mapping[str, Any] | None = None,
    model_id: str | None = None,
    plan: RunPlan | None = None,
    objective: Objective | None = None,
) -> Path:
    """Write ``folder/README.md``: a Hugging Face model card for the model saved there.

    Args:
        folder: a saved model folder (``best/``, ``last/``).
        config: the run's resolved config.
        data: what the run trained on (file, kind, rows, SHA-256), as its data layer read it;
            ``None``: described from the config (:func:`data_of_config`, no row count).
        results: the run's ``results.json`` (adds steps, hardware and times).
        metrics_csv: the run's ``metrics.csv`` (the dev-score curve).
        selection_score: this model's model-selection score ×100, the one
            :func:`~.hub_metadata.dev_score` names (STS-B dev Spearman unless
            ``eval.dev``/``eval.dev_metric`` say otherwise; the keyword keeps its first name);
            ``None``: read at ``step`` from ``metrics_csv``.
        step: the training step of this model (for the text and the look-up above).
        metrics_before: a card written while training appends to ``metrics_csv``: only the
            rows of steps before this one are read, and the curve ends at ``step`` with
            ``selection_score`` (its loss is logged after the copy).
        evaluation: ``cselab evaluate`` output to include (tables and ``model-index``).
        model_id: the name the usage snippets load; default ``config.train.push_to_hub`` when set,
            else the folder's absolute path (:func:`set_model_id` rewrites it on push).
        plan: the run's resolved facts (:class:`~cselab.config.plan.RunPlan`); ``None``: the
            plan saved in the folder's run folder, if any (for ``data: None``).
        objective: the run's built objective, asked for its papers, tags and words; ``None``:
            built (and validated) again from ``config`` for the data's kind.

    Returns:
        The path of the card.
    """
    from huggingface_hub import ModelCard

    out = Path(folder)
    plan = plan or run_plan_of(out, config)
    # a card written from the run folder later: the rows results.json kept
    data = data or data_of_config(config, (results or {}).get("train_rows"), plan)
    # the facts the card states are the plan's (model.pooler: null as the load resolved it)
    plan = card_plan(out, config, data.path, data.kind, plan)
    # the model as trained: its pooler and attention as the folder records them (card_plan)
    model = dataclasses.replace(config.model, pooler=plan.pooler, bidirectional=plan.bidirectional)
    rows = read_metrics(metrics_csv, metrics_before)
    dev = dev_score(plan)
    if selection_score is None and step is not None:
        selection_score = next(
            (r[dev.name] for r in rows if int(r["step"]) == step and dev.name in r), None
        )
    if metrics_before is not None and step is not None and selection_score is not None:
        rows.append({"step": step, dev.name: selection_score})  # its row is not written yet
    model_id = model_id or config.train.push_to_hub or str(out.resolve())
    # A local path names the run and the folder ("run-best"); a Hub id is the name.
    as_path = Path(model_id)
    name = f"{as_path.parent.name}-{as_path.name}" if as_path.is_absolute() else model_id
    tags, described, bib = _citations(model, plan, objective)
    card_data = front_matter(name, model, tags, eval_results(selection_score, dev, evaluation))
    curve = dev_curve(rows, dev.name)
    curve_md = (
        markdown_table(
            ["step", "training loss", f"{dev.dataset} {dev.metric} ×100"],
            [(s, _fmt(loss, 4), _fmt(d)) for s, loss, d in curve],
        )  # fmt: skip
        if curve
        else "No dev scores were logged (no model selection: `train.eval_steps: 0`, an MNTP run's default, or evaluation disabled)."
    )
    at = f" at step {step}" if step is not None else ""
    # a GPU run's dev set is encoded under the step's autocast (RunPlan.eval_precision)
    encoded = "" if plan.eval_precision == "fp32" else f", encoded in {plan.eval_precision}"
    score = (
        f" Its {dev.dataset} {dev.metric} (cosine, ×100{encoded}) is **{selection_score:.2f}**."
        if selection_score is not None and math.isfinite(selection_score)
        else ""
    )
    dev_title = dev.dataset[0].upper() + dev.dataset[1:]
    how = (
        "by supervised contrastive learning on given sentence pairs"
        if data.kind.pairs
        else "by masked next-token prediction (LLM2Vec's MNTP) on raw sentences"
        if plan.objective.mntp.enabled
        else "by unsupervised contrastive learning on raw sentences"
    )
    text = f"""
# {name}

A sentence encoder trained with cselab from
`{base_model_name(config.model.name_or_path)}`{at}, {how}. It maps a
sentence to a {{dim}}-dimensional vector; compare vectors with cosine similarity.{score}

## Intended use

{intended_use(data, plan)}

## Objective

{chr(10).join(described)}

## Usage

{_adapters_note(out)}{usage_snippets(model_id, model, _adapters_base(out))}{prompt_usage(model_id, model, _prompt_counts(out))}

## Training data

{_data_section(config, data)}

## Hyperparameters

{_hyperparameters(config, plan, results)}

## {dev_title} during training

{curve_md}

{_dimensions_section(results, dev)}## Hardware and time

{hardware_section(results, plan.device, plan.precision, data.kind.unit)}

{evaluation_section(evaluation)}

## Citation

```bibtex
{bib}
```
"""
    text = text.replace("{dim}", str(_width(out)))
    card = ModelCard(f"---\n{card_data.to_yaml()}\n---\n{text}")
    path = out / CARD_FILE
    write_text_atomic(path, str(card), "model card")
    return path


def _adapters_note(folder: Path) -> str:
    """For a folder of LoRA adapters: what loading it needs, and how to merge it."""
    if not is_adapter_folder(folder):
        return ""
    meta = read_json(folder / CSELAB_FILE) or {}
    st = meta.get("sentence_transformers") == ADAPTER_LAYERS_NOT_REPRODUCED
    loads = (
        "**sentence-transformers cannot compute its vectors** (its pooler reads several "
        "layers, which an adapter folder does not return); `transformers` loads it with `peft` "
        "installed"
        if st
        else "sentence-transformers and `transformers` load it with `peft` installed (they "
        "fetch the base model)"
    )
    return (
        f"This folder holds LoRA adapters for `{adapter_base(folder)}`: {loads}, cselab as any "
        "folder. `cselab merge FOLDER -o MERGED` writes a plain model folder with the adapters "
        "folded into the weights, which every library loads.\n\n"
    )


def _prompt_counts(folder: Path) -> dict[str, dict[str, int]] | None:
    """The prompts sentence-transformers counts differently, as the folder's ``cselab.json``
    records them (``prompt_counts``), or ``None``."""
    return (read_json(folder / CSELAB_FILE) or {}).get("prompt_counts")


def _adapters_base(folder: Path) -> str | None:
    """The base model of a folder of LoRA adapters (what its snippets load first), else None."""
    return adapter_base(folder) if is_adapter_folder(folder) else None


def _width(folder: Path) -> str:
    cfg = folder / "config.json"
    if not cfg.is_file() and is_adapter_folder(folder):  # adapters: the base model's width
        cfg = Path(adapter_base(folder)) / "config.json"
    if cfg.is_file():
        return str((read_json(cfg) or {}).get("hidden_size", "D"))
    return "D"


def update_model_card(folder: str | Path, evaluation: Mapping[str, Any]) -> Path:
    """Add ``cselab evaluate`` results to ``folder``'s card (tables and ``model-index``).

    A folder without a card but with ``cselab_config.yaml`` gets a fresh card first; a folder
    with neither is refused (the card would have nothing to say about the model).
    """
    from huggingface_hub import ModelCard

    out = Path(folder)
    path = out / CARD_FILE
    if not path.is_file():
        cfg_file = out / CONFIG_FILE
        if not cfg_file.is_file():
            raise FileNotFoundError(
                f"{out}: no {CARD_FILE} and no {CONFIG_FILE} to write one from; "
                "--update-card works on folders saved by cselab train"
            )
        config = load_config(cfg_file)
        return write_model_card(out, config, evaluation=evaluation)
    card = ModelCard.load(path)
    new = evaluation_results(evaluation)
    if new:
        card.data.eval_results = merge_eval_results(card.data.eval_results or [], new)
        card.data.model_name = card.data.model_name or out.name
    if EVAL_START in card.text and EVAL_END in card.text:
        before, rest = card.text.split(EVAL_START, 1)
        old, after = rest.split(EVAL_END, 1)
        card.text = before + evaluation_section(evaluation, read_evaluation_parts(old)) + after
    else:
        section = evaluation_section(evaluation)
        card.text = card.text.rstrip("\n") + "\n\n" + section + "\n"
    write_text_atomic(path, str(card), "model card")
    return path


def with_model_id(card_text: str, model_id: str) -> str:
    """``card_text`` with its usage snippets loading ``model_id`` (e.g. the Hub repo)."""
    return MODEL_ID_LINE.sub(f'model_id = "{model_id}"', card_text)


def set_model_id(folder: str | Path, model_id: str) -> bool:
    """Point the card's usage snippets at ``model_id`` (e.g. the Hub repo); ``False``: no card."""
    path = Path(folder) / CARD_FILE
    if not path.is_file():
        return False
    text = path.read_text(encoding="utf-8")
    write_text_atomic(path, with_model_id(text, model_id), "model card")
    return True


def code_blocks(card_text: str, language: str = "python") -> list[str]:
    """The fenced code blocks of one language in a card (the usage snippets)."""
    return re.findall(rf"^```{language}\n(.*?)^```$", card_text, flags=re.MULTILINE | re.DOTALL)
