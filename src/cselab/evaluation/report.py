"""Tables, JSON and CSV for evaluation results.

The headline tables follow SimCSE's ``evaluation.py``: STS12-16 use the ``all`` Spearman,
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
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..io.files import write_text_atomic
from .datasets import STS_YEARS, DataFormatError
from .names import STS_FILE_KIND, TRANSFER_COLUMNS

STS_COLUMNS = (
    *((year, year) for year in STS_YEARS),
    ("STSBenchmark", "STS-B"),
    ("SICKRelatedness", "SICK-R"),
)


def _r2(x: float | None) -> float | None:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    return round(float(x), 2)


def _sts_value(task: str, res: dict) -> float | None:
    value = res["all"]["spearman"] if task in STS_YEARS else res["spearman"]
    return _r2(100.0 * value) if value is not None else None


def headline(out: dict) -> dict[str, dict[str, float | None]]:
    """``{"sts": {"STS12": 68.7, ..., "Avg": ...}, "transfer": {...}}`` for the tasks present."""
    results = out["results"]
    dev = out.get("mode") == "dev"
    table: dict[str, dict[str, float | None]] = {}
    sts_cols = [(t, label) for t, label in STS_COLUMNS if not (dev and t in STS_YEARS)]
    if any(t in results for t, _ in sts_cols):
        row = {label: _sts_value(t, results[t]) if t in results else None for t, label in sts_cols}
        table["sts"] = _with_avg(row)
    files = {
        t: _r2(100.0 * r["spearman"]) for t, r in results.items() if r.get("kind") == STS_FILE_KIND
    }
    if files:  # the user's own pair files: no "Avg" (they are not a benchmark's columns)
        table["sts_files"] = files
    if any(t in results for t, _ in TRANSFER_COLUMNS):
        key = "devacc" if dev else "acc"
        row = {
            label: _r2(results[t][key]) if t in results else None for t, label in TRANSFER_COLUMNS
        }
        table["transfer"] = _with_avg(row)
    return table


def _with_avg(row: dict[str, float | None]) -> dict[str, float | None]:
    values = list(row.values())
    avg = None if any(v is None for v in values) else round(sum(values) / len(values), 2)
    return {**row, "Avg": avg}


# --------------------------------------------------------------------------------------------
# markdown


def _cell(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def markdown_table(header: Sequence[Any], rows: Iterable[Sequence[Any]], align: str = "") -> str:
    """A markdown table (every markdown table cselab writes: reports, model cards, benchmarks);
    cells are ``str()``-ed, an empty one is written ``| |``. ``align`` has a letter per column:
    ``r`` right-aligns it (numbers), any other letter leaves it to the renderer."""

    def line(cells: Sequence[Any]) -> str:
        return "|" + "|".join(f" {c} " if str(c) else " " for c in cells) + "|"

    rule = "".join("---:|" if a == "r" else "---|" for a in align.ljust(len(header)))
    return "\n".join([line(header), "|" + rule, *(line(r) for r in rows)])


def model_name(out: dict, fallback: str = "model") -> str:
    """The row name of a run: its model and, when overridden, its pooler."""
    name = out.get("model") or fallback
    pooler = out.get("pooler")
    return f"{name} ({pooler})" if pooler else str(name)


def markdown(out: dict) -> str:
    """The headline tables of one run (and alignment/uniformity when computed), then its
    ``notes`` (e.g. that SICK-R is not unseen for a model trained on SICK)."""
    notes = "".join(f"\n\nNote: {note}." for note in out.get("notes", []))
    return compare([out]) + notes


def compare(outs: Sequence[dict], names: Sequence[str] | None = None) -> str:
    """One markdown table per group (STS, transfer) with a row per run."""
    names = list(names) if names else [model_name(o, f"run {i + 1}") for i, o in enumerate(outs)]
    heads = [o.get("headline") or headline(o) for o in outs]
    modes = sorted({o.get("mode", "test") for o in outs})
    mode = "/".join(modes)
    parts: list[str] = []
    for group, title in (
        ("sts", f"STS: Spearman x 100 ({mode}; STS12-16 'all' setting)"),
        ("transfer", f"Transfer: accuracy % ({mode})"),
        ("sts_files", "Your STS files: Spearman x 100 of cosine vs score"),
    ):
        present = [h.get(group) for h in heads]
        if not any(present):
            continue
        columns: list[str] = []
        for row in present:
            for col in row or {}:
                if col not in columns:
                    columns.append(col)
        rows = [
            [name, *[_cell((row or {}).get(c)) for c in columns]]
            for name, row in zip(names, present, strict=True)
        ]
        parts.append(f"**{title}**\n\n" + markdown_table(["Model", *columns], rows))
    extra = [
        (name, o["results"]["AlignUniform"])
        for name, o in zip(names, outs, strict=True)
        if "AlignUniform" in o.get("results", {})
    ]
    if extra:
        rows = [[n, f"{r['alignment']:.4f}", f"{r['uniformity']:.4f}"] for n, r in extra]
        parts.append(
            "**Alignment / uniformity (STS-B dev, lower is better)**\n\n"
            + markdown_table(["Model", "alignment", "uniformity"], rows)
        )
    mrpc_f1 = [
        (name, o["results"]["MRPC"].get("f1"))
        for name, o in zip(names, outs, strict=True)
        if "MRPC" in o.get("results", {})
    ]
    if mrpc_f1:
        parts.append("MRPC F1: " + ", ".join(f"{n} {_cell(v)}" for n, v in mrpc_f1))
    return "\n\n".join(parts)


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
