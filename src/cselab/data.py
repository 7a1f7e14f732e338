"""Training corpus: reading, tokenising once, and a resumable random batch order.

* :func:`read_corpus` reads one sentence per line (UTF-8); blank lines are skipped and counted;
  invalid UTF-8 is an error naming the file and line unless ``errors="replace"``.
* :class:`TokenizedCorpus` holds the token ids of every sentence in one flat ``int32`` array
  (tokenised once, cached on disk in ``.npz`` keyed by the file's content and the tokenizer).
* :class:`BatchOrder` draws a fresh random permutation per epoch (no length bucketing: grouping
  similar lengths would let length leak into which sentences are in-batch negatives),
  ``drop_last``, and can resume from ``(epoch, batch index)``.
* :func:`collate` pads a batch dynamically to its longest row.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .schema import ConfigError

log = logging.getLogger(__name__)


class CorpusError(ValueError):
    """The training corpus is missing, unreadable or too small."""


@dataclass
class CorpusStats:
    path: str
    lines: int
    sentences: int
    blank_lines: int
    replaced_lines: int


def read_corpus(path: str | Path, errors: str = "strict") -> tuple[list[str], CorpusStats]:
    """Read one sentence per line.

    Args:
        path: UTF-8 text file.
        errors: ``strict`` raises :class:`CorpusError` naming file and line on invalid UTF-8;
            ``replace`` substitutes U+FFFD for bad bytes and counts the lines affected.

    Returns:
        The sentences (line endings removed, blank lines skipped) and counts.
    """
    p = Path(path)
    if not p.is_file():
        raise CorpusError(f"{p}: training file not found")
    sentences: list[str] = []
    blank = replaced = 0
    lineno = 0
    with p.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):  # noqa: B007 - lineno used after the loop
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                if errors != "replace":
                    raise CorpusError(
                        f"{p}:{lineno}: invalid UTF-8 at byte {err.start} of the line "
                        f"({raw[max(0, err.start - 10) : err.start + 10]!r}); "
                        f"use --data.encoding_errors=replace to substitute bad bytes"
                    ) from None
                text = raw.decode("utf-8", errors="replace")
                replaced += 1
            text = text.rstrip("\r\n")
            if lineno == 1:
                text = text.removeprefix("\ufeff")
            if not text.strip():
                blank += 1
                continue
            sentences.append(text)
    if not sentences:
        raise CorpusError(f"{p}: no sentences (the file has {lineno} lines, all blank)")
    return sentences, CorpusStats(str(p), lineno, len(sentences), blank, replaced)


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes (names a corpus in caches and checkpoints)."""
    if not path.is_file():
        raise CorpusError(f"{path}: training file not found")
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class TokenizedCorpus:
    """Token ids of every sentence, stored flat: ``ids[offsets[i]:offsets[i+1]]``."""

    def __init__(self, ids: np.ndarray, offsets: np.ndarray) -> None:
        self.ids = ids
        self.offsets = offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def rows(self, indices: Sequence[int]) -> list[np.ndarray]:
        return [self.ids[self.offsets[i] : self.offsets[i + 1]] for i in indices]

    @classmethod
    def build(
        cls, sentences: Sequence[str], tokenizer: Any, max_seq_len: int, chunk: int = 8192
    ) -> TokenizedCorpus:
        """Tokenise in chunks with the fast tokenizer, truncating to ``max_seq_len``."""
        pieces: list[np.ndarray] = []
        lengths: list[int] = []
        for start in range(0, len(sentences), chunk):
            enc = tokenizer(
                list(sentences[start : start + chunk]),
                truncation=True,
                max_length=max_seq_len,
                padding=False,
                return_attention_mask=False,
                return_token_type_ids=False,
            )["input_ids"]
            for row in enc:
                pieces.append(np.asarray(row, dtype=np.int32))
                lengths.append(len(row))
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        ids = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)
        return cls(ids, offsets)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez(tmp, ids=self.ids, offsets=self.offsets)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> TokenizedCorpus:
        with np.load(path, allow_pickle=False) as data:
            return cls(data["ids"], data["offsets"])


def tokenize_corpus(
    path: str | Path,
    tokenizer: Any,
    max_seq_len: int,
    errors: str = "strict",
    cache_dir: str | Path | None = None,
) -> tuple[TokenizedCorpus, CorpusStats]:
    """Read and tokenise ``path`` once; reuse the on-disk cache when file and tokenizer match."""
    p = Path(path)
    if not p.is_file():
        raise CorpusError(f"{p}: training file not found")
    key = json.dumps(
        {
            "file": file_digest(p),
            "tokenizer": getattr(tokenizer, "name_or_path", type(tokenizer).__name__),
            "class": type(tokenizer).__name__,
            "vocab": len(tokenizer),
            "max_seq_len": max_seq_len,
            "errors": errors,
        },
        sort_keys=True,
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    cache_file = Path(cache_dir) / f"tokens-{digest}.npz" if cache_dir else None
    meta_file = cache_file.with_suffix(".json") if cache_file else None
    if cache_file is not None and cache_file.is_file() and meta_file.is_file():
        stats = CorpusStats(**json.loads(meta_file.read_text()))
        log.info("using cached token ids %s", cache_file)
        return TokenizedCorpus.load(cache_file), stats
    sentences, stats = read_corpus(p, errors=errors)
    corpus = TokenizedCorpus.build(sentences, tokenizer, max_seq_len)
    if cache_file is not None:
        corpus.save(cache_file)
        meta_file.write_text(json.dumps(stats.__dict__))
    return corpus, stats


class BatchOrder:
    """Random batches over ``n`` items, one permutation per epoch, ``drop_last``, resumable.

    The permutation of epoch ``e`` depends only on ``(seed, e)``, so a resumed run sees exactly
    the batches an uninterrupted one would. Under data parallelism every rank draws the same
    global batch and takes its own contiguous slice (no overlap between ranks).
    """

    def __init__(self, n: int, batch_size: int, seed: int) -> None:
        if n < batch_size:
            raise CorpusError(f"the corpus has {n} sentences, fewer than one batch of {batch_size}")
        self.n = n
        self.batch_size = batch_size
        self.seed = seed

    @property
    def batches_per_epoch(self) -> int:
        return self.n // self.batch_size

    def epoch_order(self, epoch: int) -> np.ndarray:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.n, generator=g).numpy()

    def batch(self, epoch: int, index: int, order: np.ndarray | None = None) -> np.ndarray:
        order = self.epoch_order(epoch) if order is None else order
        return order[index * self.batch_size : (index + 1) * self.batch_size]


def shard_bounds(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """``(start, end)`` of rank ``rank``'s contiguous, equal slice of a global batch of ``n``.

    The one definition of a rank's rows: the data slice (:func:`shard`) and the objective's
    ``ctx.offset`` both come from it.
    """
    if n % world_size:
        raise ConfigError(f"train.batch_size={n} must be divisible by the {world_size} ranks")
    per = n // world_size
    return rank * per, (rank + 1) * per


def shard(indices: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """This rank's contiguous slice of a global batch."""
    start, end = shard_bounds(len(indices), rank, world_size)
    return indices[start:end]


def collate(rows: Sequence[np.ndarray], pad_id: int) -> dict[str, Tensor]:
    """Pad rows to the longest one: ``input_ids`` and ``attention_mask`` of shape ``(B, L)``."""
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
        mask[i, : len(r)] = 1
    return {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}
