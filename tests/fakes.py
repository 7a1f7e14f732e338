"""Stand-ins for models in tests: deterministic encoders that need no weights."""

from __future__ import annotations

import zlib

import numpy as np


class HashingEncoder:
    """Deterministic bag-of-words baseline: the sum of one random vector per lowercased token.

    Tokens are hashed with CRC-32 (stable across processes, unlike ``hash``) into ``buckets``
    Gaussian vectors. No model, no torch: for tests, smoke runs and a floor to compare against.
    """

    def __init__(self, dim: int = 64, buckets: int = 1 << 15, seed: int = 0) -> None:
        self.dim = dim
        self.buckets = buckets
        self.table = np.random.RandomState(seed).standard_normal((buckets, dim)).astype(np.float32)
        self.calls = 0

    def encode(self, sentences: list[str], batch_size: int = 128) -> np.ndarray:
        self.calls += 1
        out = np.zeros((len(sentences), self.dim), dtype=np.float32)
        for i, sentence in enumerate(sentences):
            rows = [zlib.crc32(t.encode("utf-8")) % self.buckets for t in sentence.lower().split()]
            if rows:
                out[i] = self.table[rows].sum(axis=0)
        return out
