"""The cells of a results table: two-decimal numbers, SimCSE's "Avg" column, and the markdown
table every report, model card and benchmark of cselab writes.

Below the task kinds (:mod:`cselab.evaluation.tasks`), which build their headline rows and
markdown from these, and below :mod:`cselab.evaluation.report`, which assembles them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any


def r2(x: float | None) -> float | None:
    """``x`` rounded to two decimals; ``None`` for a missing or NaN value."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    return round(float(x), 2)


def with_avg(row: dict[str, float | None]) -> dict[str, float | None]:
    """``row`` with its "Avg": the mean of the two-decimal numbers (as SimCSE computes it), or
    ``None`` unless every column is present."""
    values = list(row.values())
    avg = None if any(v is None for v in values) else round(sum(values) / len(values), 2)
    return {**row, "Avg": avg}


def cell(value: float | None) -> str:
    """A table cell: two decimals, ``–`` for a missing value."""
    return "–" if value is None else f"{value:.2f}"


def markdown_table(header: Sequence[Any], rows: Iterable[Sequence[Any]], align: str = "") -> str:
    """A markdown table (every markdown table cselab writes: reports, model cards, benchmarks);
    cells are ``str()``-ed, an empty one is written ``| |``. ``align`` has a letter per column:
    ``r`` right-aligns it (numbers), any other letter leaves it to the renderer."""

    def line(cells: Sequence[Any]) -> str:
        return "|" + "|".join(f" {c} " if str(c) else " " for c in cells) + "|"

    rule = "".join("---:|" if a == "r" else "---|" for a in align.ljust(len(header)))
    return "\n".join([line(header), "|" + rule, *(line(r) for r in rows)])
