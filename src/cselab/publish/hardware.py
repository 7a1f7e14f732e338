"""The hardware a run trained on, in words, and the card's table of hardware and time."""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..core.devices import is_gpu_type
from ..evaluation.report import markdown_table


def hardware_description(device: str) -> str:
    """The accelerator's name for GPUs, else the CPU model."""
    if is_gpu_type(device.split(":")[0]):
        from ..model.devices import gpu_name  # torch, only for a run that trained on a GPU

        if name := gpu_name(device):
            return f"{name} ({device})"
    model = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model} ({os.cpu_count()} logical CPUs)"


#: A throughput is shown for runs that trained at least this long and this many steps: the
#: first steps (allocation, warm-up) dominate a shorter run, whose rate says nothing of a real one.
MIN_MEASURED_SECONDS = 10.0
MIN_MEASURED_STEPS = 20


def throughput(results: Mapping[str, Any], unit: str = "sentences") -> str:
    """The training rate of ``results`` in ``unit`` per second, or why it is not given."""
    rate, seconds, steps = (results.get(k) for k in ("sentences_per_s", "train_time_s", "steps"))
    if not rate:
        return "–"
    if (seconds or 0) < MIN_MEASURED_SECONDS or (steps or 0) < MIN_MEASURED_STEPS:
        return f"– ({steps} steps in {seconds or 0:.1f} s: too short to measure a rate)"
    return f"{rate:,.0f} {unit}/s" if rate >= 100 else f"{rate:.3g} {unit}/s"


def hardware_section(
    results: Mapping[str, Any] | None, device: str, precision: str, unit: str = "sentences"
) -> str:
    """Hardware, processes, precision and times of a finished run (``results.json``); ``device``
    and ``precision`` (the config's) stand in for what ``results`` does not say; ``unit``: what a
    batch row is (sentences, or pairs)."""
    if not results:
        return "Training was still running when this folder was saved (the final card adds times)."
    rows = [
        ("hardware", hardware_description(str(results.get("device", device)))),
        ("processes", results.get("world_size", 1)),
        ("precision", results.get("precision", precision)),
        ("wall time", f"{results['wall_time_s']:,.1f} s" if results.get("wall_time_s") else "–"),
        ("training time", f"{results['train_time_s']:,.1f} s" if results.get("train_time_s") else "–"),
        ("throughput", throughput(results, unit)),
    ]  # fmt: skip
    return markdown_table(["", ""], rows)
