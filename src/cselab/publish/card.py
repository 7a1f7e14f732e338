"""Model cards: the ``README.md`` in the Hugging Face format written into every saved model folder.

The card has YAML front matter (``library_name``, ``pipeline_tag``, tags, ``base_model``, the base
model's ``license`` when its own card is on disk, and a ``model-index`` with the model-selection
score and any evaluation results), then prose: what the model is, the objective in words with its
parameters (unsupervised or supervised SimCSE and the parts added), the training data (file,
sentence or pair count, SHA-256), the hyperparameters, the dev-score curve, hardware and time,
usage snippets for sentence-transformers, ``transformers`` and cselab, and BibTeX for SimCSE and
every paper whose objective was used. The dev score is named as model selection computed it
(``eval.dev`` and ``eval.dev_metric``: STS-B dev Spearman by default, or your own dev file).

The front matter is built and read with ``huggingface_hub``'s :class:`~huggingface_hub.ModelCard`,
so it is the Hub's own format. :func:`update_model_card` adds ``cselab evaluate`` results to an
existing card (the section between :data:`EVAL_START` and :data:`EVAL_END`).
"""

from __future__ import annotations

import csv
import json
import math
import os
import platform
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from ..config import Config
from ..core.schema import from_dict
from ..evaluation.custom import KIND, dev_score_name
from ..evaluation.report import STS_COLUMNS, TRANSFER_COLUMNS, headline, markdown, markdown_table
from ..io.files import file_digest, write_text_atomic
from ..io.runfolder import RunFolder
from ..model.pooling import inference_pooler_name
from ..objectives.config import ObjectiveConfig

CARD_FILE = "README.md"
CONFIG_FILE = RunFolder.MODEL_CONFIG  # written next to the weights by Trainer.save_model
EVAL_START = "<!-- cselab:evaluation:start -->"
EVAL_END = "<!-- cselab:evaluation:end -->"
#: The line every usage snippet starts with; :func:`set_model_id` rewrites it (e.g. on push).
MODEL_ID_LINE = re.compile(r'^model_id = "(?P<id>[^"\n]*)"$', re.MULTILINE)
#: At most this many rows in the dev-score table (the best and the last row are always kept).
CURVE_ROWS = 20

# BibTeX written from the papers' title pages (authors, title, venue, year).
BIBTEX = {
    "simcse": """@inproceedings{gao2021simcse,
  title     = {{SimCSE}: Simple Contrastive Learning of Sentence Embeddings},
  author    = {Gao, Tianyu and Yao, Xingcheng and Chen, Danqi},
  booktitle = {Proceedings of the 2021 Conference on Empirical Methods in Natural Language Processing (EMNLP)},
  year      = {2021}
}""",
    "focal": """@inproceedings{hou2023focal,
  title     = {Improving Contrastive Learning of Sentence Embeddings with Focal-{InfoNCE}},
  author    = {Hou, Pengyue and Li, Xingyu},
  booktitle = {Findings of the Association for Computational Linguistics: EMNLP 2023},
  year      = {2023}
}""",
    "gaussian": """@inproceedings{wu2022smoothed,
  title     = {Smoothed Contrastive Learning for Unsupervised Sentence Embedding},
  author    = {Wu, Xing and Gao, Chaochen and Zang, Liangjun and Han, Jizhong and Wang, Zhongyuan and Hu, Songlin},
  booktitle = {Proceedings of the 29th International Conference on Computational Linguistics (COLING)},
  year      = {2022}
}""",
    "imsimcse": """@article{xu2023imsimcse,
  title   = {{ImSimCSE}: Improving Contrastive Learning for Sentence Embeddings from Two Perspectives},
  author  = {Xu, Jiahao and Shao, Wei and Chen, Lihui and Liu, Lemao},
  journal = {arXiv preprint},
  year    = {2023}
}""",
    "mixcse": """@inproceedings{zhang2022mixcse,
  title     = {Unsupervised Sentence Representation via Contrastive Learning with Mixing Negatives},
  author    = {Zhang, Yanzhao and Zhang, Richong and Mensah, Samuel and Liu, Xudong and Mao, Yongyi},
  booktitle = {Proceedings of the AAAI Conference on Artificial Intelligence},
  year      = {2022}
}""",
    "barlow": """@inproceedings{zbontar2021barlow,
  title     = {Barlow Twins: Self-Supervised Learning via Redundancy Reduction},
  author    = {Zbontar, Jure and Jing, Li and Misra, Ishan and LeCun, Yann and Deny, St{\\'e}phane},
  booktitle = {Proceedings of the 38th International Conference on Machine Learning (ICML)},
  year      = {2021}
}""",
}


# ------------------------------------------------------------------------------- the objective
def objective_papers(cfg: ObjectiveConfig) -> list[str]:
    """Keys of :data:`BIBTEX` for the papers whose objectives ``cfg`` uses (SimCSE first)."""
    keys = ["simcse"]
    if cfg.focal.enabled:
        keys.append("focal")
    if cfg.gaussian.enabled:
        keys.append("gaussian")
    if cfg.off_dropout.enabled or cfg.dcl.enabled or cfg.barlow_twins.enabled or cfg.noise.enabled:
        keys.append("imsimcse")
    if cfg.barlow_twins.enabled:
        keys.append("barlow")
    if cfg.mixcse.enabled:
        keys.append("mixcse")
    return keys


def objective_tags(cfg: ObjectiveConfig) -> list[str]:
    """Hub tags naming the objective's parts."""
    names = {
        "focal": "focal-infonce",
        "gaussian": "gs-infonce",
        "off_dropout": "off-dropout",
        "dcl": "dcl",
        "barlow_twins": "barlow-twins",
        "mixcse": "mixcse",
        "noise": "embedding-noise",
    }
    tags = ["simcse"]
    for key, tag in names.items():
        if getattr(cfg, key).enabled:
            tags.append(tag)
    if cfg.off_dropout.enabled and cfg.dcl.enabled:
        tags.append("imsimcse")
    return tags


def describe_objective(cfg: ObjectiveConfig, pairs: bool = False) -> list[str]:
    """The objective in words, one markdown bullet per part, with its parameters; ``pairs``:
    trained on given pairs (supervised SimCSE), else on raw sentences (unsupervised)."""
    sym = "averaged over both directions" if cfg.symmetric_loss else "with the first view as anchor"
    if pairs:
        first = (
            f"- **InfoNCE** over given (anchor, positive) pairs (supervised SimCSE, Gao et al. "
            f"2021, Eq. 5): anchors and positives are encoded with dropout; the other positives "
            f"of the batch and every given hard negative are negatives, with log-weight "
            f"{cfg.hard_negative_weight:g} on an anchor's own hard negatives; temperature "
            f"τ = {cfg.temperature:g}, {sym}."
        )
    else:
        first = (
            f"- **InfoNCE** over in-batch negatives (unsupervised SimCSE, Gao et al. 2021, Eq. 1): "
            f"each sentence is encoded twice with different dropout masks and the two views form "
            f"the positive pair; temperature τ = {cfg.temperature:g}, {sym}."
        )
    lines = [first]
    f, g, o, d = cfg.focal, cfg.gaussian, cfg.off_dropout, cfg.dcl
    b, x, n = cfg.barlow_twins, cfg.mixcse, cfg.noise
    if f.enabled:
        lines.append(
            f"- **Focal-InfoNCE** (Hou & Li 2023, Eq. 2): positives score s², negatives s(s + m), "
            f"which up-weights hard negatives; hardness m = {f.hardness:g}."
        )
    if g.enabled:
        count = f"M = {g.num}" if g.num is not None else f"M = {g.batch_multiple:g} × batch size"
        lines.append(
            f"- **GS-InfoNCE** (Wu et al. 2022, Eq. 5): Gaussian noise vectors N(μ = {g.mean:g}, "
            f"σ = {g.std:g}) as extra negatives, {count}, weight λ = {g.weight:g}."
        )
    if o.enabled:
        variant = (
            f"negatives weighted by m = {o.tradeoff:g} (Eq. 3)"
            if o.variant == "paper"
            else f"the authors' code variant: positive logit scaled by {o.tradeoff:g}"
        )
        lines.append(
            "- **Off-dropout negatives** (ImSimCSE, Xu et al. 2023, Eq. 3): negatives are scored "
            f"between representations computed with dropout switched off; {variant}."
        )
    if d.enabled:
        lines.append(
            "- **Dimension-wise contrastive learning** (ImSimCSE, Xu et al. 2023, Eq. 5): InfoNCE "
            f"across embedding dimensions, weight λ = {d.weight:g}, τ_DCL = {d.temperature:g} "
            f"({d.formulation} formulation)."
        )
    if b.enabled:
        lines.append(
            "- **BarlowTwins term** (Zbontar et al. 2021; ImSimCSE Eq. 4): weight "
            f"{b.weight:g}, off-diagonal λ_BT = {b.off_diagonal:g}, padding M = {b.padding}, "
            f"centred = {str(b.center).lower()}."
        )
    if x.enabled:
        lines.append(
            "- **MixCSE** (Zhang et al. 2022): mixed hard negatives "
            f"normalize(λh'ᵢ + (1 - λ)h'ⱼ) with λ = {x.mix_ratio:g}, partner = {x.partner}, "
            f"columns = {x.columns}, directions = {x.directions}, stop-gradient = "
            f"{str(x.stop_gradient).lower()}."
        )
    if n.enabled:
        lines.append(
            f"- **Embedding noise** (ImSimCSE Table 1 ablation): N(0, {n.variance:g}) added to "
            f"the embeddings on the {n.side} side."
        )
    return lines


# ---------------------------------------------------------------------------------- the inputs
def read_metrics(path: str | Path | None) -> list[dict[str, float]]:
    """Rows of ``metrics.csv`` as floats (empty cells dropped); ``[]`` if there is no file."""
    if path is None or not Path(path).is_file():
        return []
    rows = []
    with Path(path).open(newline="", encoding="utf-8") as fh:
        for raw in csv.DictReader(fh):
            row = {}
            for key, value in raw.items():
                try:
                    row[key] = float(value)
                except (TypeError, ValueError):
                    continue
            rows.append(row)
    return rows


def dev_curve(
    rows: Sequence[Mapping[str, float]], name: str = "stsb_dev"
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
    """:func:`cselab.data.file_digest`, cached per (path, size, mtime): ``best/`` is saved many
    times a run."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = file_digest(path)
    return _DIGESTS[key]


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


def dev_score(config: Config) -> DevScore:
    """The run's model-selection score, named from its config as model selection names it."""
    dev, metric = config.eval.dev, config.eval.dev_metric
    name = dev_score_name(dev, metric)
    if dev.lower() == "stsb":
        return DevScore(name, "STS-B dev", metric.capitalize(), "stsb", "STS Benchmark (SentEval)")
    file = Path(dev).name
    return DevScore(name, f"dev set `{file}`", metric.capitalize(), KIND, f"{file} (own pairs)")


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


def hardware_description(device: str) -> str:
    """The accelerator's name for CUDA devices, else the CPU model."""
    if device.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            index = torch.device(device).index or 0
            return f"{torch.cuda.get_device_name(index)} ({device})"
    model = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model} ({os.cpu_count()} logical CPUs)"


# ------------------------------------------------------------------------------- front matter
def _eval_results(
    score: float | None, dev: DevScore, evaluation: Mapping[str, Any] | None
) -> list[Any]:
    """The dev score ``score`` of ``dev``, then the ``cselab evaluate`` results."""
    from huggingface_hub import EvalResult

    results = []
    if score is not None and math.isfinite(score):
        results.append(
            EvalResult(
                task_type="sentence-similarity",
                task_name="Semantic Textual Similarity",
                dataset_type=dev.hub_type,
                dataset_name=dev.hub_name,
                dataset_split="validation",
                metric_type=f"{dev.metric.lower()}_cosine",
                metric_name=f"{dev.metric} (cosine) x 100",
                metric_value=round(float(score), 2),
            )
        )
    results += evaluation_results(evaluation)
    return results


def evaluation_results(evaluation: Mapping[str, Any] | None) -> list[Any]:
    """``cselab evaluate`` output as Hub ``EvalResult``s (STS Spearman and transfer accuracy ×100)."""
    from huggingface_hub import EvalResult

    if not evaluation:
        return []
    mode = evaluation.get("mode", "test")
    split = "validation" if mode == "dev" else "test"
    results = []
    table = headline(evaluation)
    groups = (
        (STS_COLUMNS, "sts", "sentence-similarity", "Semantic Textual Similarity",
         "spearman_cosine", "Spearman (cosine) x 100"),
        (TRANSFER_COLUMNS, "transfer", "text-classification",
         "SentEval transfer (logistic regression)", "accuracy", "Accuracy x 100"),
    )  # fmt: skip
    for columns, group, task_type, task_name, metric, metric_name in groups:
        for task, label in columns:
            value = table.get(group, {}).get(label)
            if value is None:
                continue
            results.append(
                EvalResult(
                    task_type=task_type,
                    task_name=task_name,
                    dataset_type=task.lower(),
                    dataset_name=f"{task} (SentEval)",
                    dataset_split=split,
                    metric_type=metric,
                    metric_name=metric_name,
                    metric_value=value,
                )
            )
    return results


def _merge_eval_results(old: Sequence[Any], new: Sequence[Any]) -> list[Any]:
    """``old`` with every result of ``new`` replacing the one for the same dataset/split/metric."""

    def key(r: Any) -> tuple:
        return (r.dataset_type, r.dataset_split, r.metric_type)

    fresh = {key(r) for r in new}
    return [r for r in old if key(r) not in fresh] + list(new)


# --------------------------------------------------------------------------------------- prose
def _usage(model_id: str, config: Config) -> str:
    """Snippets that run as written (tested by executing them against a saved model)."""
    kind = inference_pooler_name(config.model.pooler, config.model.mlp_only_train)
    st = f'''```python
model_id = "{model_id}"
from sentence_transformers import SentenceTransformer

model = SentenceTransformer(model_id)
sentences = ["A man is playing a guitar.", "Someone is playing music.", "A cat sleeps."]
embeddings = model.encode(sentences)
print(embeddings.shape, model.similarity(embeddings, embeddings))
```'''
    if kind in ("cls", "cls_before_pooler"):
        pool = "vectors = out.last_hidden_state[:, 0]  # the [CLS] token"
        if kind == "cls":
            pool += (
                "\n# the MLP head trained with the model: tanh(W h + b)\n"
                "from pathlib import Path\n"
                "from huggingface_hub import snapshot_download\n"
                "from safetensors.torch import load_file\n\n"
                "folder = model_id if Path(model_id).is_dir() else snapshot_download(model_id)\n"
                'head = load_file(f"{folder}/2_Dense/model.safetensors")\n'
                'vectors = torch.tanh(vectors @ head["linear.weight"].T + head["linear.bias"])'
            )
    else:
        layers = {
            "avg": "out.last_hidden_state",
            "avg_top2": "(out.hidden_states[-1] + out.hidden_states[-2]) / 2",
            "avg_first_last": "(out.hidden_states[1] + out.hidden_states[-1]) / 2",
        }[kind]
        pool = (
            f"hidden = {layers}\n"
            'mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)\n'
            "vectors = (hidden * mask).sum(1) / mask.sum(1)  # mean over real tokens"
        )
    hidden = ", output_hidden_states=True" if kind in ("avg_top2", "avg_first_last") else ""
    hf = f'''```python
model_id = "{model_id}"
import torch
from transformers import AutoModel, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained(model_id)
model = AutoModel.from_pretrained(model_id).eval()
sentences = ["A man is playing a guitar.", "Someone is playing music.", "A cat sleeps."]
batch = tokenizer(sentences, padding=True, truncation=True, return_tensors="pt")
with torch.no_grad():
    out = model(**batch{hidden})
{pool}
cosine = torch.nn.functional.normalize(vectors, dim=-1) @ torch.nn.functional.normalize(vectors, dim=-1).T
print(vectors.shape, cosine)
```'''
    cs = f'''```python
model_id = "{model_id}"
import cselab

model = cselab.load(model_id)
vectors = model.encode(["A man is playing a guitar.", "Someone is playing music."])
print(vectors.shape)
```'''
    return (
        f"With sentence-transformers (pooling `{kind}`, as trained):\n\n{st}\n\n"
        f"With `transformers` only:\n\n{hf}\n\n"
        f"With cselab:\n\n{cs}"
    )


def _fmt(x: float | None, digits: int = 2) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def evaluation_section(evaluation: Mapping[str, Any] | None) -> str:
    """The markdown of ``cselab evaluate`` results between the evaluation markers."""
    if not evaluation:
        body = (
            "Not evaluated yet. `cselab evaluate MODEL --tasks all -o results.json "
            "--update-card` fills this section."
        )
    else:
        body = (
            f"`cselab evaluate` (SentEval protocol, mode `{evaluation.get('mode', 'test')}`):\n\n"
            + markdown(evaluation)
        )
    return f"{EVAL_START}\n## Evaluation\n\n{body}\n{EVAL_END}"


def _data_section(config: Config, sentences: int | None) -> str:
    """The training file, its size (sentences, or pairs for pairs data) and SHA-256."""
    from huggingface_hub import try_to_load_from_cache

    from ..model.hub import DOWNLOADS, SIMCSE_DATA_REPO, cache_root

    name = config.data.train_file
    if name in DOWNLOADS and not Path(name).expanduser().exists():
        # Where resolve_train_file finds it (an earlier version's copy, else the shared Hugging
        # Face cache); a card never downloads the corpus.
        cache = Path(config.data.cache_dir) if config.data.cache_dir else cache_root()
        path = cache / "data" / DOWNLOADS[name]
        if not path.is_file():
            hit = try_to_load_from_cache(SIMCSE_DATA_REPO, DOWNLOADS[name], repo_type="dataset")
            path = Path(hit) if isinstance(hit, str) else path
    else:
        path = Path(name).expanduser()
    rows = [("file", f"`{path.name}`" + (" (SimCSE's `wiki1m`)" if name == "wiki1m" else ""))]
    count = "pairs" if config.data.pairs else "sentences"
    rows.append((count, f"{sentences:,}" if sentences is not None else "–"))
    rows.append(("SHA-256", f"`{file_sha256(path)}`" if path.is_file() else "– (file not on disk)"))
    return markdown_table(["", ""], rows)


def _hyperparameters(config: Config, results: Mapping[str, Any] | None) -> str:
    m, t = config.model, config.train
    rows = [
        ("base model", f"`{m.name_or_path}`"),
        ("pooler", f"`{m.pooler}`" + (" (MLP head in training only)" if m.pooler == "cls" and m.mlp_only_train else "")),
        ("max_seq_len", m.max_seq_len),
        ("dropout", m.dropout if m.dropout is not None else "the base model's"),
        ("batch size", t.batch_size),
        ("learning rate", f"{t.lr:g} (AdamW, weight decay {t.weight_decay:g})"),
        ("schedule", f"linear, warm-up {t.warmup_steps or t.warmup_ratio:g}" + (" steps" if t.warmup_steps else " of the steps")),
        ("epochs / max steps", f"{t.epochs} / {t.max_steps if t.max_steps else '–'}"),
        ("steps run", (results or {}).get("steps", "–")),
        ("gradient clipping", t.grad_clip),
        ("precision", t.precision),
        ("seed", t.seed),
        ("GradCache chunk", t.cache_chunk_size or "off"),
    ]  # fmt: skip
    objective = yaml.safe_dump({"objective": config.to_dict()["objective"]}, sort_keys=False)
    return (
        markdown_table(["", ""], rows)
        + "\n\n<details><summary>the objective section of the config</summary>\n\n"
        + f"```yaml\n{objective}```\n\n</details>"
    )


def _hardware_section(config: Config, results: Mapping[str, Any] | None) -> str:
    if not results:
        return "Training was still running when this folder was saved (the final card adds times)."
    device = str(results.get("device", config.train.device))
    rows = [
        ("hardware", hardware_description(device)),
        ("processes", results.get("world_size", 1)),
        ("precision", results.get("precision", config.train.precision)),
        ("wall time", f"{results['wall_time_s']:,.1f} s" if results.get("wall_time_s") else "–"),
        ("training time", f"{results['train_time_s']:,.1f} s" if results.get("train_time_s") else "–"),
        ("throughput", f"{results['sentences_per_s']:.0f} sentences/s" if results.get("sentences_per_s") else "–"),
    ]  # fmt: skip
    return markdown_table(["", ""], rows)


# ------------------------------------------------------------------------------------- the API
def write_model_card(
    folder: str | Path,
    config: Config,
    *,
    results: Mapping[str, Any] | None = None,
    metrics_csv: str | Path | None = None,
    selection_score: float | None = None,
    step: int | None = None,
    sentences: int | None = None,
    evaluation: Mapping[str, Any] | None = None,
    model_id: str | None = None,
) -> Path:
    """Write ``folder/README.md``: a Hugging Face model card for the model saved there.

    Args:
        folder: a saved model folder (``best/``, ``last/``).
        config: the run's resolved config.
        results: the run's ``results.json`` (adds steps, hardware and times).
        metrics_csv: the run's ``metrics.csv`` (the dev-score curve).
        selection_score: this model's model-selection score ×100, the one :func:`dev_score` names
            (STS-B dev Spearman unless ``eval.dev``/``eval.dev_metric`` say otherwise; the
            keyword keeps its first name); ``None``: read at ``step`` from ``metrics_csv``.
        step: the training step of this model (for the text and the look-up above).
        sentences: the number of training sentences (the corpus as read, blank lines skipped),
            or of pairs for pairs data.
        evaluation: ``cselab evaluate`` output to include (tables and ``model-index``).
        model_id: the name the usage snippets load; default ``config.train.push_to_hub`` when set,
            else the folder's absolute path (:func:`set_model_id` rewrites it on push).

    Returns:
        The path of the card.
    """
    from huggingface_hub import ModelCard, ModelCardData

    out = Path(folder)
    rows = read_metrics(metrics_csv)
    dev = dev_score(config)
    if selection_score is None and step is not None:
        selection_score = next(
            (r[dev.name] for r in rows if int(r["step"]) == step and dev.name in r), None
        )
    model_id = model_id or config.train.push_to_hub or str(out.resolve())
    # A local path names the run and the folder ("run-best"); a Hub id is the name.
    as_path = Path(model_id)
    name = f"{as_path.parent.name}-{as_path.name}" if as_path.is_absolute() else model_id
    cfg = config.objective
    card_data = ModelCardData(
        library_name="sentence-transformers",
        pipeline_tag="sentence-similarity",
        tags=[
            "sentence-transformers",
            "sentence-similarity",
            "feature-extraction",
            "cselab",
            *objective_tags(cfg),
        ],  # fmt: skip
        base_model=config.model.name_or_path
        if not Path(config.model.name_or_path).is_dir()
        else None,
        license=base_model_license(config.model.name_or_path),
        model_name=name,
        eval_results=_eval_results(selection_score, dev, evaluation) or None,
    )
    curve = dev_curve(rows, dev.name)
    curve_md = (
        markdown_table(
            ["step", "training loss", f"{dev.dataset} {dev.metric} ×100"],
            [(s, _fmt(loss, 4), _fmt(d)) for s, loss, d in curve],
        )  # fmt: skip
        if curve
        else "No dev scores were logged (`train.eval_steps: 0` or evaluation disabled)."
    )
    at = f" at step {step}" if step is not None else ""
    score = (
        f" Its {dev.dataset} {dev.metric} (cosine, ×100) is **{selection_score:.2f}**."
        if selection_score is not None and math.isfinite(selection_score)
        else ""
    )
    dev_title = dev.dataset[0].upper() + dev.dataset[1:]
    pairs = config.data.pairs
    how = (
        "by supervised contrastive learning on given sentence pairs"
        if pairs
        else "by unsupervised contrastive learning on raw sentences"
    )
    bib = "\n\n".join(BIBTEX[k] for k in objective_papers(cfg))
    text = f"""
# {name}

A sentence encoder trained with cselab from
`{config.model.name_or_path}`{at}, {how}. It maps a
sentence to a {{dim}}-dimensional vector; compare vectors with cosine similarity.{score}

## Objective

{chr(10).join(describe_objective(cfg, pairs))}

## Usage

{_usage(model_id, config)}

## Training data

{_data_section(config, sentences)}

## Hyperparameters

{_hyperparameters(config, results)}

## {dev_title} during training

{curve_md}

## Hardware and time

{_hardware_section(config, results)}

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


def _width(folder: Path) -> str:
    cfg = folder / "config.json"
    if cfg.is_file():
        return str(json.loads(cfg.read_text(encoding="utf-8")).get("hidden_size", "D"))
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
        config = from_dict(Config, yaml.safe_load(cfg_file.read_text(encoding="utf-8"))).validate()
        return write_model_card(out, config, evaluation=evaluation)
    card = ModelCard.load(path)
    new = evaluation_results(evaluation)
    if new:
        card.data.eval_results = _merge_eval_results(card.data.eval_results or [], new)
        card.data.model_name = card.data.model_name or out.name
    section = evaluation_section(evaluation)
    if EVAL_START in card.text and EVAL_END in card.text:
        before, rest = card.text.split(EVAL_START, 1)
        after = rest.split(EVAL_END, 1)[1]
        card.text = before + section + after
    else:
        card.text = card.text.rstrip("\n") + "\n\n" + section + "\n"
    write_text_atomic(path, str(card), "model card")
    return path


def set_model_id(folder: str | Path, model_id: str) -> bool:
    """Point the card's usage snippets at ``model_id`` (e.g. the Hub repo); ``False``: no card."""
    path = Path(folder) / CARD_FILE
    if not path.is_file():
        return False
    text = path.read_text(encoding="utf-8")
    write_text_atomic(path, MODEL_ID_LINE.sub(f'model_id = "{model_id}"', text), "model card")
    return True


def code_blocks(card_text: str, language: str = "python") -> list[str]:
    """The fenced code blocks of one language in a card (the usage snippets)."""
    return re.findall(rf"^```{language}\n(.*?)^```$", card_text, flags=re.MULTILINE | re.DOTALL)
