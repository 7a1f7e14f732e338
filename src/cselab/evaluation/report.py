"""Tables, JSON and CSV for evaluation results.

The headline tables are the task kinds' (:data:`~cselab.evaluation.registry.TASK_KINDS`, each
its row and title): they follow SimCSE's ``evaluation.py``: STS12-16 use the ``all`` Spearman,
STS-B and SICK-R the Spearman of the evaluated split, all x 100 with two decimals; transfer
tasks report test accuracy (``devacc`` in ``dev`` mode). "Avg" is the mean of the two-decimal
numbers (as SimCSE computes it), given only when every column of the table is present.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..io.files import write_text_atomic
from .datasets import STS_YEARS, DataFormatError
from .registry import TASK_KINDS
from .table import cell, markdown_table  # markdown_table: reports and cards import it from here


def headline(out: Mapping[str, Any]) -> dict[str, dict[str, float | None]]:
    """``{"sts": {"STS12": 68.7, ..., "Avg": ...}, "transfer": {...}}``: the table of each task
    kind of :data:`~cselab.evaluation.registry.TASK_KINDS` present in ``out["results"]``."""
    results, dev = out["results"], out.get("mode") == "dev"
    table: dict[str, dict[str, float | None]] = {}
    for kind in TASK_KINDS.values():
        if kind.headline and (row := kind.headline_row(results, dev)) is not None:
            table[kind.headline] = row
    return table


# --------------------------------------------------------------------------------------------
# markdown


def model_name(out: Mapping[str, Any], fallback: str = "model") -> str:
    """The row name of a run: its model and, when overridden, its pooler."""
    name = out.get("model") or fallback
    pooler = out.get("pooler")
    return f"{name} ({pooler})" if pooler else str(name)


def markdown(out: Mapping[str, Any]) -> str:
    """The headline tables of one run (and alignment/uniformity when computed), then its
    ``notes`` (e.g. that SICK-R is not unseen for a model trained on SICK)."""
    notes = "".join(f"\n\nNote: {note}." for note in out.get("notes", []))
    return compare([out]) + notes


def compare(outs: Sequence[Mapping[str, Any]], names: Sequence[str] | None = None) -> str:
    """One markdown table per headline table (the benchmarks' first, then the user's own
    data's) with a row per run, then what each task kind adds (alignment, MRPC's F1)."""
    names = list(names) if names else [model_name(o, f"run {i + 1}") for i, o in enumerate(outs)]
    heads = [o.get("headline") or headline(o) for o in outs]
    # the SentEval tables' mode: a retrieval-only file's "mode" is its BEIR split
    mode = "/".join(sorted({o.get("mode", "test") for o, h in zip(outs, heads, strict=True) if h}))
    mode = mode or "test"
    parts: list[str] = []
    for kind in sorted(TASK_KINDS.values(), key=lambda k: k.own_data):
        present = [h.get(kind.headline) for h in heads] if kind.headline else []
        if not any(present):
            continue
        columns = list(dict.fromkeys(col for row in present for col in row or {}))
        rows = [
            [name, *[cell((row or {}).get(c)) for c in columns]]
            for name, row in zip(names, present, strict=True)
        ]
        parts.append(f"**{kind.title(mode)}**\n\n" + markdown_table(["Model", *columns], rows))
    for kind in TASK_KINDS.values():
        parts += kind.extra_markdown(names, outs)
    return "\n\n".join(parts)


def evaluation_markdown(out: Mapping[str, Any]) -> str:
    """What ``cselab evaluate`` prints: the headline tables (per ``--dims`` dimension too), then
    the markdown each task kind shows of its own entries (a table per retrieval collection)."""
    parts = [markdown(out)]
    for dim, at in out.get("dims", {}).items():
        parts.append(f"**Dimension {dim}**\n\n" + compare([{**out, **at}]))
    parts += [text for kind in TASK_KINDS.values() for text in kind.entry_markdown(out).values()]
    return "\n\n".join(p for p in parts if p)


def add_model_notes(out: dict[str, Any], model: str | os.PathLike[str]) -> None:
    """Add to ``out`` the ``notes`` of a cselab model folder's training data (SICK-R is not
    unseen for a model trained on SICK); a table without SICK-R (a sweep cell evaluated on
    STS-B or on its own files) carries none."""
    from ..data.pairs import model_folder_notes

    if "SICKRelatedness" in out["results"] and (notes := model_folder_notes(model)):
        out["notes"] = notes


# --------------------------------------------------------------------------------------------
# JSON / CSV


def _clean(obj):
    """NaN/inf -> None and numpy scalars/arrays -> Python, so the file is strict JSON."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "tolist"):
        return _clean(obj.tolist())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def save_json(out: dict, path: str | os.PathLike[str]) -> None:
    """Write evaluation results as strict JSON, atomically (a failed write keeps the old file)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(_clean(out), indent=2, allow_nan=False) + "\n"
    write_text_atomic(path, text, "evaluation results")


def load_json(path: str | os.PathLike[str]) -> dict:
    """A results file of ``cselab evaluate -o``; anything else is a :class:`DataFormatError`."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataFormatError(path, None, "results file not found") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataFormatError(path, None, f"not a JSON results file ({err})") from None
    if not isinstance(data, dict) or "results" not in data:
        raise DataFormatError(path, None, "not a cselab evaluation results file (no 'results' key)")
    return data


def rows(out: dict) -> list[dict[str, object]]:
    """Every number of a run, one row each: model, mode, task, subset, metric, value."""
    model, mode = model_name(out), out.get("mode", "")
    table: list[dict[str, object]] = []

    def add(task: str, subset: str, metric: str, value: object) -> None:
        table.append(
            {
                "model": model,
                "mode": mode,
                "task": task,
                "subset": subset,
                "metric": metric,
                "value": value,
            }
        )

    for task, res in out["results"].items():
        if task in STS_YEARS:
            for subset, r in res["subsets"].items():
                for m in ("pearson", "spearman", "n"):
                    add(task, subset, m, r[m])
            for agg in ("all", "mean", "wmean"):
                for m in ("pearson", "spearman"):
                    add(task, agg, m, res[agg][m])
            add(task, "all", "n", res["all"]["n"])
        elif "spearman" in res:
            for m in ("pearson", "spearman", "n"):
                add(task, res.get("split", ""), m, res[m])
        elif "acc" in res:
            for m in ("devacc", "acc", "f1"):
                if m in res:
                    add(task, "", m, res[m])
        else:
            for m, v in res.items():
                add(task, "", m, v)
    return table


def to_csv(outs: dict | Sequence[dict], path: str | os.PathLike[str] | None = None) -> str:
    """Long-format CSV of one or several runs; written to ``path`` when given."""
    outs = [outs] if isinstance(outs, dict) else list(outs)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=["model", "mode", "task", "subset", "metric", "value"])
    writer.writeheader()
    for out in outs:
        writer.writerows(_clean(rows(out)))
    text = buf.getvalue()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, text, "evaluation table")
    return text
