"""The token store: per column, a flat ``int32`` ids array and ``int64`` row offsets as ``.npy``
files, read in memory or memory-mapped (``ids[offsets[i]:offsets[i+1]]`` is row ``i``).

A store folder holds one or several named columns (``text`` for a sentence corpus;
:func:`pair_columns` for pairs and triplets), so training needs memory for its batches, not for
the data. Both stores (:class:`TokenizedCorpus`, :class:`~cselab.data.pairs.TokenizedPairs`)
hand a step its rows through one interface, :class:`TokenStore`'s ``step_inputs``.
"""

from __future__ import annotations

import io
import itertools
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TypeVar

import numpy as np

from .inputs import StepInputs
from .order import collate

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Version of the on-disk token store; part of the cache key, so a new layout never reads an old one.
STORE_FORMAT = 1
#: The column name of a plain sentence corpus in a token store.
TEXT_COLUMN = "text"


class TokenStore(Protocol):
    """What the trainer reads of a token store: its size and the inputs of a step's rows."""

    def __len__(self) -> int: ...

    def step_inputs(self, indices: Sequence[int], pad_id: int) -> StepInputs:
        """The step inputs of rows ``indices``, each column padded with ``pad_id`` to its
        longest row."""
        ...


def pair_columns(negatives: int) -> list[str]:
    """The column names of pairs with ``negatives`` hard negatives each, in row order:
    ``anchor``, ``positive``, ``negative.0`` ... ``negative.<negatives-1>``."""
    return ["anchor", "positive", *(f"negative.{k}" for k in range(negatives))]


# --------------------------------------------------------------------------------------------
# The token store: per column, a flat ids array and row offsets, as .npy files


def _npy_header(dtype: np.dtype, n: int) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf,
        {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (n,)},
    )
    return buf.getvalue()


class _NpyAppender:
    """A 1-D ``.npy`` file written by appending, its length filled in when closed.

    numpy pads ``.npy`` headers so that the shape can grow to 21 digits in place, so the header
    written for length 0 has the same size as the final one and the data never moves. Written in
    place, not by rename: the file lives in a token-cache entry's temporary folder, which
    :mod:`cselab.data.cache` publishes whole by rename once every file is closed (``fsync``
    first), so no reader ever sees it half written.
    """

    def __init__(self, path: Path, dtype: type) -> None:
        self.dtype = np.dtype(dtype)
        self.n = 0
        self.fh: BinaryIO = path.open("wb")
        self.header_len = len(_npy_header(self.dtype, 0))
        self.fh.write(_npy_header(self.dtype, 0))

    def append(self, values: np.ndarray) -> None:
        self.fh.write(np.ascontiguousarray(values, dtype=self.dtype).tobytes())
        self.n += len(values)

    def close(self) -> None:
        header = _npy_header(self.dtype, self.n)
        if len(header) != self.header_len:  # cannot happen with numpy's growth padding
            raise RuntimeError("npy header size changed while appending")
        self.fh.seek(0)
        self.fh.write(header)
        self.fh.flush()
        os.fsync(self.fh.fileno())  # the data is on disk before the folder is published
        self.fh.close()


class ColumnWriter:
    """Streams token-id rows of one column into ``<column>.ids.npy`` and ``<column>.offsets.npy``."""

    def __init__(self, folder: Path, column: str = TEXT_COLUMN) -> None:
        self.ids = _NpyAppender(folder / f"{column}.ids.npy", np.int32)
        self.offsets = _NpyAppender(folder / f"{column}.offsets.npy", np.int64)
        self.offsets.append(np.zeros(1, dtype=np.int64))
        self.total = 0

    def append(self, rows: Sequence[Sequence[int]]) -> None:
        lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
        count = int(lengths.sum())
        flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int32, count=count)
        self.ids.append(flat)
        self.offsets.append(self.total + np.cumsum(lengths))
        self.total += count

    def close(self) -> None:
        self.ids.close()
        self.offsets.close()


def _chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def _encode(texts: list[str], tokenizer: Any, max_seq_len: int) -> list[list[int]]:
    return tokenizer(
        texts,
        truncation=True,
        max_length=max_seq_len,
        padding=False,
        return_attention_mask=False,
        return_token_type_ids=False,
    )["input_ids"]


def encode_chunks(
    sentences: Iterable[str], tokenizer: Any, max_seq_len: int, chunk: int = 8192
) -> Iterator[list[list[int]]]:
    """Token ids of ``sentences``, one batched fast-tokenizer call per ``chunk`` sentences."""
    for batch in _chunks(sentences, chunk):
        yield _encode(batch, tokenizer, max_seq_len)


def write_columns(
    folder: Path,
    columns: Sequence[str],
    rows: Iterable[Sequence[str]],
    tokenizer: Any,
    max_seq_len: int,
    chunk: int = 8192,
    progress: Any = None,
) -> int:
    """Tokenise ``rows`` (one text per column, in the order of ``columns``) into the columns of
    the store ``folder``, ``chunk`` rows at a time (memory: one chunk); returns the row count.

    ``progress`` (a tqdm bar) is advanced by the rows written.
    """
    writers = [ColumnWriter(folder, name) for name in columns]
    n = 0
    for batch in _chunks(rows, chunk):
        for k, writer in enumerate(writers):
            writer.append(_encode([row[k] for row in batch], tokenizer, max_seq_len))
        n += len(batch)
        if progress is not None:
            progress.update(len(batch))
    for writer in writers:
        writer.close()
    return n


class TokenizedCorpus:
    """Token ids of every sentence, stored flat: ``ids[offsets[i]:offsets[i+1]]``.

    The arrays may be in memory or memory-mapped (:meth:`open`); only the rows a batch asks for
    are read.
    """

    def __init__(self, ids: np.ndarray, offsets: np.ndarray) -> None:
        self.ids = ids
        self.offsets = offsets
        #: the tokens of a prompt at the start of every row, left out of the pooling
        #: (``model.pool_prompt: false``; :func:`~.order.collate` adds the ``pool_mask``);
        #: ``None``: every token pooled
        self.prompt_length: int | None = None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def rows(self, indices: Sequence[int]) -> list[np.ndarray]:
        return [self.ids[self.offsets[i] : self.offsets[i + 1]] for i in indices]

    def step_inputs(self, indices: Sequence[int], pad_id: int) -> StepInputs:
        """A sentence step: rows ``indices`` as the anchors (:class:`TokenStore`)."""
        return StepInputs(collate(self.rows(indices), pad_id, self.prompt_length))

    @property
    def nbytes(self) -> int:
        """Size of the ids and offsets arrays (on disk when memory-mapped)."""
        return int(self.ids.nbytes + self.offsets.nbytes)

    @classmethod
    def build(
        cls,
        sentences: Iterable[str],
        tokenizer: Any,
        max_seq_len: int,
        chunk: int = 8192,
        out_dir: Path | None = None,
    ) -> TokenizedCorpus:
        """Tokenise in chunks with the fast tokenizer, truncating to ``max_seq_len``.

        ``sentences`` may be a stream. With ``out_dir`` the ids are appended to ``.npy`` files
        there as they are produced (memory: one chunk) and the result is memory-mapped;
        otherwise the arrays are built in memory.
        """
        if out_dir is not None:
            writer = ColumnWriter(Path(out_dir))
            for rows in encode_chunks(sentences, tokenizer, max_seq_len, chunk):
                writer.append(rows)
            writer.close()
            return cls.open(out_dir)
        pieces: list[np.ndarray] = []
        lengths: list[np.ndarray] = []
        for rows in encode_chunks(sentences, tokenizer, max_seq_len, chunk):
            lens = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
            pieces.append(
                np.fromiter(itertools.chain.from_iterable(rows), np.int32, int(lens.sum()))
            )
            lengths.append(lens)
        offsets = np.zeros(sum(len(x) for x in lengths) + 1, dtype=np.int64)
        if lengths:
            np.cumsum(np.concatenate(lengths), out=offsets[1:])
        ids = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)
        return cls(ids, offsets)

    @classmethod
    def open(cls, folder: str | Path, column: str = TEXT_COLUMN) -> TokenizedCorpus:
        """Memory-map one column of a token store folder (nothing is read until used)."""
        folder = Path(folder)
        ids = np.load(folder / f"{column}.ids.npy", mmap_mode="r")
        offsets = np.load(folder / f"{column}.offsets.npy", mmap_mode="r")
        return cls(ids, offsets)
