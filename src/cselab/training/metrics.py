"""What a run reports: loss windows checked for divergence, ``metrics.csv`` (its writer and its
one reader), console progress and ``results.json`` (TensorBoard and the other loggers are
callbacks: :mod:`cselab.training.callbacks`).

``metrics.csv`` is read in one place, :func:`read_metrics`: by a resumed run, the model card
(:mod:`cselab.publish.card`) and ``cselab plot`` (:mod:`cselab.insight.plots`). torch is imported
only where a loss window needs it, so that reading a run's logs does not load it.

``results.json`` and every rewrite of ``metrics.csv`` are atomic (a temporary file renamed over
the old one); a row is appended whole or not at all. A failed write (disk full) is one
:class:`~cselab.core.errors.WriteError` naming the file, and the file keeps what it held.
"""

from __future__ import annotations

import csv
import errno
import io
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import (
    DataFormatError,
    TrainingDiverged,  # noqa: F401 - re-exported
)

if TYPE_CHECKING:
    import torch
from ..io.files import append_text, write_json_atomic, write_text_atomic
from ..io.readers import read_text
from ..io.runfolder import RunFolder
from .distributed import average_over_ranks

log = logging.getLogger("cselab")


class LossWindow:
    """The loss terms of the steps since the last log row, kept on the device.

    :meth:`flush` is the training loop's only host sync: it checks every term of every step in
    the window for NaN/inf and returns the window's mean of each term.
    """

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.terms: list[dict[str, torch.Tensor]] = []
        #: ``(real, padded)`` tokens of the window's batches (host counts; ``Batch.tokens``)
        self.tokens = (0, 0)
        self.start = time.perf_counter()

    def add(
        self, step: int, terms: dict[str, torch.Tensor], tokens: tuple[int, int] | None = None
    ) -> None:
        self.steps.append(step)
        self.terms.append({k: v.detach() for k, v in terms.items()})
        if tokens is not None:
            self.tokens = (self.tokens[0] + tokens[0], self.tokens[1] + tokens[1])

    def __len__(self) -> int:
        return len(self.steps)

    def flush(self, on_divergence: str | Callable[[], str]) -> dict[str, float]:
        """Means of each term over the window (the window is emptied).

        Under DDP each rank's per-anchor terms cover its own anchors: the mean over ranks is the
        global-batch loss (batch-level terms are equal on every rank), and every rank sees a
        non-finite value if any rank does, so all ranks stop together. Raises
        :class:`TrainingDiverged` naming the first non-finite step and term, followed by
        ``on_divergence`` (what was kept, how to resume; a callable is asked only then).
        """
        import torch

        names = list(self.terms[0])
        values = torch.stack([torch.stack([t[n].float() for n in names]) for t in self.terms])
        values = average_over_ranks(values).cpu()
        bad = ~torch.isfinite(values)
        if bad.any():
            row, col = (int(i) for i in bad.nonzero()[0])
            note = on_divergence() if callable(on_divergence) else on_divergence
            raise TrainingDiverged(
                f"loss term '{names[col]}' is {values[row, col].item()} at step "
                f"{self.steps[row]}; {note}"
            )
        means = dict(zip(names, values.mean(0).tolist(), strict=True))
        self.steps, self.terms, self.tokens = [], [], (0, 0)
        self.start = time.perf_counter()
        return means


def write_results(folder: Path, results: dict[str, Any]) -> None:
    """``results.json``: the run's summary (best step and score, time, throughput, device)."""
    write_json_atomic(RunFolder(folder).results, results, indent=2, what="run results")


class MetricsLog:
    """Append rows to ``metrics.csv`` (columns fixed by the first row).

    On resume, rows logged after the checkpoint's step (by the interrupted run) are dropped so
    the file reads as if the run had never stopped.
    """

    def __init__(self, folder: Path, enabled: bool = True, resume_step: int | None = None) -> None:
        self.path = RunFolder(folder).metrics
        self.enabled = enabled
        self.fields: list[str] | None = None
        if not enabled:
            return
        if resume_step is not None and self.path.is_file():
            table = read_metrics(self.path)
            self.fields = table.columns
            self._rewrite([r for r in table.rows if r["step"] <= resume_step])
        elif self.path.exists():
            self.path.unlink()

    def _csv(self, rows: list[dict[str, Any]], header: bool) -> str:
        buf = io.StringIO(newline="")
        writer = csv.DictWriter(buf, fieldnames=self.fields or ["step"])
        if header:
            writer.writeheader()
        writer.writerows(rows)
        return buf.getvalue()

    def _rewrite(self, rows: list[dict[str, Any]]) -> None:
        write_text_atomic(self.path, self._csv(rows, header=True), "metrics log")

    def write(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if self.fields is None:
            self.fields = list(row)
            self._rewrite([])
        new = [k for k in row if k not in self.fields]
        if new:  # a column appears later (e.g. the dev score): widen the file once
            old_rows = read_metrics(self.path).rows
            self.fields += new
            self._rewrite(old_rows)
        append_text(self.path, self._csv([row], header=False), "metrics log")


@dataclass
class MetricsTable:
    """``metrics.csv`` as read by :func:`read_metrics`.

    Attributes:
        path: the file.
        columns: the header's column names, in file order.
        rows: one dict per row: ``step`` as an ``int``, every non-blank cell as the number it
            holds (an ``int`` when written as one, else a ``float``), in column order.
    """

    path: Path
    columns: list[str]
    rows: list[dict[str, float]] = field(default_factory=list)


def _number(text: str) -> float:
    """The number a cell holds; an integer stays an ``int``, so that a resumed run rewrites
    every row exactly as it was written (``str(float(text))`` of what ``str()`` wrote)."""
    try:
        return int(text)
    except ValueError:
        return float(text)


def read_metrics(path: str | os.PathLike[str], *, live: bool = False) -> MetricsTable:
    """Read a run's ``metrics.csv`` (as :class:`MetricsLog` writes it).

    Every row the writer finished is returned. A last line without its line end was cut while
    it was being appended (the run was killed, the disk filled): it may hold a cut number, so it
    is left out with a warning (``live``: the run is appending to the file while it is read,
    by another thread's model card, so such a line is an append in flight, left out silently).
    Anything else that is not the writer's format raises
    :class:`~cselab.core.errors.DataFormatError` naming the file and line: bytes that are not
    UTF-8, a header without ``step`` or with a blank or repeated name, a row with more or fewer
    cells than the header, a step that is not an integer, a cell that is not a number.
    A missing file raises :class:`FileNotFoundError`.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(errno.ENOENT, "no metrics.csv", str(p))
    text = read_text(p, what="metrics log")  # the one reader: invalid UTF-8 names the line
    text = text.removeprefix("\ufeff")  # a byte-order mark left by an editor
    reader = csv.reader(io.StringIO(text, newline=""))
    records: list[tuple[int, list[str]]] = []
    try:
        for fields in reader:
            if fields:  # blank lines carry nothing
                records.append((reader.line_num, fields))
    except csv.Error as err:
        raise DataFormatError(p, max(reader.line_num, 1), f"not a CSV table ({err})") from None
    if not records:
        raise DataFormatError(p, None, "empty file: no header row")
    (_, columns), *body = records
    if body and not text.endswith(("\n", "\r")):
        line, _ = body.pop()
        (log.debug if live else log.warning)(
            "%s:%d: the last line has no line end (cut while the run was writing it); left out",
            p, line,
        )  # fmt: skip
    for i, name in enumerate(columns):
        if not name.strip():
            raise DataFormatError(p, 1, f"column {i + 1} of the header has no name")
        if name in columns[:i]:
            raise DataFormatError(p, 1, f"column {name!r} appears twice in the header")
    if "step" not in columns:
        raise DataFormatError(p, 1, "no 'step' column in the header (is it a cselab metrics.csv?)")
    table = MetricsTable(p, list(columns))
    for line, fields in body:
        if len(fields) != len(columns):
            raise DataFormatError(
                p, line, f"{len(fields)} cell(s), but the header names {len(columns)} columns"
            )
        row: dict[str, float] = {}
        for name, cell in zip(columns, fields, strict=True):
            if name == "step":
                try:
                    row[name] = int(cell)
                except ValueError:
                    raise DataFormatError(p, line, f"step {cell!r} is not an integer") from None
            elif cell.strip():
                try:
                    row[name] = _number(cell)
                except ValueError:
                    raise DataFormatError(
                        p, line, f"column {name!r} has non-number {cell!r}"
                    ) from None
        table.rows.append(row)
    return table


class Progress:
    """A tqdm bar with ETA on a terminal; plain log lines otherwise."""

    def __init__(self, total: int, initial: int, enabled: bool = True) -> None:
        self.total = total
        self.enabled = enabled
        self.start = time.perf_counter()
        self.initial = initial
        self.bar = None
        if enabled and sys.stderr.isatty():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)

    def update(self, step: int, info: dict[str, Any]) -> None:
        if not self.enabled:
            return
        text = " ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in info.items()
        )
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            self.bar.set_postfix_str(text, refresh=False)
            return
        done = step - self.initial
        elapsed = time.perf_counter() - self.start
        eta = elapsed / max(done, 1) * (self.total - step)
        log.info("step %d/%d %s eta %dm%02ds", step, self.total, text, eta // 60, eta % 60)

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text)
        else:
            log.info(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
