"""What a run reports: loss windows checked for divergence, ``metrics.csv``, console progress
and ``results.json`` (TensorBoard and the other loggers are callbacks:
:mod:`cselab.training.callbacks`).

``results.json`` and every rewrite of ``metrics.csv`` are atomic (a temporary file renamed over
the old one); a row is appended whole or not at all. A failed write (disk full) is one
:class:`~cselab.core.errors.WriteError` naming the file, and the file keeps what it held."""

from __future__ import annotations

import csv
import io
import logging
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ..core.errors import TrainingDiverged  # noqa: F401 - re-exported
from ..io.files import append_text, write_json_atomic, write_text_atomic
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
        self.start = time.perf_counter()

    def add(self, step: int, terms: dict[str, torch.Tensor]) -> None:
        self.steps.append(step)
        self.terms.append({k: v.detach() for k, v in terms.items()})

    def __len__(self) -> int:
        return len(self.steps)

    def flush(self, on_divergence: str) -> dict[str, float]:
        """Means of each term over the window (the window is emptied).

        Under DDP each rank's per-anchor terms cover its own anchors: the mean over ranks is the
        global-batch loss (batch-level terms are equal on every rank), and every rank sees a
        non-finite value if any rank does, so all ranks stop together. Raises
        :class:`TrainingDiverged` naming the first non-finite step and term, followed by
        ``on_divergence`` (what was kept, how to resume).
        """
        names = list(self.terms[0])
        values = torch.stack([torch.stack([t[n].float() for n in names]) for t in self.terms])
        values = average_over_ranks(values).cpu()
        bad = ~torch.isfinite(values)
        if bad.any():
            row, col = (int(i) for i in bad.nonzero()[0])
            raise TrainingDiverged(
                f"loss term '{names[col]}' is {values[row, col].item()} at step "
                f"{self.steps[row]}; {on_divergence}"
            )
        means = dict(zip(names, values.mean(0).tolist(), strict=True))
        self.steps, self.terms = [], []
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
            with self.path.open(newline="", encoding="utf-8") as fh:
                reader = csv.DictReader(fh)
                self.fields = list(reader.fieldnames or [])
                rows = [r for r in reader if int(r["step"]) <= resume_step]
            self._rewrite(rows)
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
            with self.path.open(newline="", encoding="utf-8") as fh:
                old_rows = list(csv.DictReader(fh))
            self.fields += new
            self._rewrite(old_rows)
        append_text(self.path, self._csv([row], header=False), "metrics log")


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
