"""Training logs: a CSV of every logged row and console progress (TensorBoard and other loggers
are callbacks: :mod:`cselab.callbacks`)."""

from __future__ import annotations

import csv
import logging
import sys
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("cselab")


class MetricsLog:
    """Append rows to ``metrics.csv`` (columns fixed by the first row).

    On resume, rows logged after the checkpoint's step (by the interrupted run) are dropped so
    the file reads as if the run had never stopped.
    """

    def __init__(self, folder: Path, enabled: bool = True, resume_step: int | None = None) -> None:
        self.path = folder / "metrics.csv"
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

    def _rewrite(self, rows: list[dict[str, Any]]) -> None:
        with self.path.open("w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=self.fields or ["step"])
            writer.writeheader()
            writer.writerows(rows)

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
        with self.path.open("a", newline="", encoding="utf-8") as fh:
            csv.DictWriter(fh, fieldnames=self.fields).writerow(row)

    def close(self) -> None:
        """Nothing to release (kept for the trainer's call)."""


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
