"""The fraction of the CPU's matrix-product rate that a MiniLM training step reaches.

Prints the mean tokens per sentence of the shared wiki lines (at ``max_seq_len`` 32), the matrix
product FLOPs of one cselab training step (64 sentences x 2 views, MiniLM-L6, the last layer on
the [CLS] rows only, backward = 2 x forward) and the rate of one ``linear`` of the step's shape in
fp32 and bf16. Divide the FLOPs by a measured step time (``docs/results/train_benchmark.md``)
to get the fraction quoted in ``docs/results/train_benchmark_notes.md``.

    python bench/matmul_rate.py
"""

from __future__ import annotations

import time

import harness
import numpy as np
import torch
import torch.nn.functional as F

HIDDEN, INTERMEDIATE, LAYERS, ROWS = 384, 1536, 6, 128  # MiniLM-L6; 64 sentences x 2 views


def main() -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(harness.minilm_path())
    lines = harness.wiki_lines()
    mean = float(np.mean([len(x) for x in tok(lines, truncation=True, max_length=32)["input_ids"]]))
    tokens = ROWS * mean
    per_token = 4 * HIDDEN**2 + 2 * HIDDEN * INTERMEDIATE  # multiply-adds per token and layer
    keys_values = 2 * HIDDEN**2  # the last layer's keys and values need every token
    forward = 2 * (
        (LAYERS - 1) * tokens * per_token + tokens * keys_values + ROWS * (per_token - keys_values)
    )
    print(f"mean tokens per sentence {mean:.2f}; tokens per step {tokens:.0f}")
    print(f"matrix-product FLOPs per training step: {3 * forward / 1e9:.1f} GFLOP")
    x, w = torch.randn(int(tokens), HIDDEN), torch.randn(INTERMEDIATE, HIDDEN)
    for dtype in (torch.float32, torch.bfloat16):
        a, b = x.to(dtype), w.to(dtype)
        for _ in range(3):
            F.linear(a, b)
        n, t0 = 50, time.perf_counter()
        for _ in range(n):
            F.linear(a, b)
        rate = 2 * a.shape[0] * HIDDEN * INTERMEDIATE / ((time.perf_counter() - t0) / n)
        print(
            f"{dtype}: linear ({a.shape[0]}x{HIDDEN})x({HIDDEN}x{INTERMEDIATE}) {rate / 1e12:.3f} TFLOP/s"
        )


if __name__ == "__main__":
    main()
