"""Training pairs and triplets: reading them with named columns and tokenising them for a step.

Supervised SimCSE (Gao et al. 2021, Sec. 4) trains on ``(anchor, positive)`` pairs, optionally
with one or several given hard negatives per pair (SNLI+MNLI: premise, entailment hypothesis,
contradiction hypothesis). This module reads such data from

* ``.csv`` / ``.tsv`` files with a header row, ``.jsonl`` files (one JSON object a line);
* ``.parquet`` files and folders written by ``datasets.Dataset.save_to_disk`` (through the
  ``datasets`` library, ``pip install cselab[data]``);
* SICK's release format (``data.format: sick``, :func:`sick_triplets`), the offline demo.

The column names are configurable (:class:`PairColumns`); a missing column, or an empty value,
is a :class:`~cselab.data.CorpusError` naming the file, the line (or row) and the column; so is
invalid UTF-8 or malformed CSV, naming the file and line.

Every column is tokenised once and held **in memory** (:class:`TokenizedPairs`, one
:class:`~cselab.data.TokenizedCorpus` per column); unlike sentence corpora there is no on-disk
token cache yet (NLI's 275k triplets tokenise in seconds).

A step's inputs (:meth:`TokenizedPairs.inputs`) are the anchors under the plain token keys
(``input_ids``, ``attention_mask``: a pair batch is a sentence batch plus columns) and the other
columns under prefixed keys: ``positive.input_ids`` ``(B, L)`` and ``negative.input_ids``
``(B, K, L)``. Every tensor has the batch on dim 0, so a batch's rows (GradCache chunks, a
rank's slice) are slices of every key alike.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..core.errors import CorpusError
from ..io.files import file_digest
from ..io.runfolder import RunFolder
from .config import PAIR_SUFFIXES, DataFormat, PairColumns, is_pairs_source  # noqa: F401
from .order import collate
from .store import TokenizedCorpus

#: Prefixes of the positive and negative columns' token tensors in a step's inputs.
POSITIVE_PREFIX = "positive."
NEGATIVE_PREFIX = "negative."


@dataclass
class PairRecords:
    """The text of every row: ``anchors[i]``, ``positives[i]`` and ``negatives[k][i]``."""

    path: str
    anchors: list[str] = field(default_factory=list)
    positives: list[str] = field(default_factory=list)
    negatives: list[list[str]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.anchors)


# ------------------------------------------------------------------------------------ reading


@contextlib.contextmanager
def _malformed_text(path: Path, reader: Any = None) -> Iterator[None]:
    """Turn what reading the text file ``path`` raises on bad content into one
    :class:`~cselab.data.CorpusError` naming the file and line: invalid UTF-8, and a
    ``csv.Error`` of ``reader`` (a ``csv`` reader or ``DictReader``)."""
    try:
        yield
    except UnicodeDecodeError:
        # The decoder reads ahead in blocks, so the reader's position is not the bad line: find
        # the first bad byte in the file's bytes (only on this error path).
        data = path.read_bytes()
        try:
            data.decode("utf-8-sig")
        except UnicodeDecodeError as err:
            line = data[: err.start].count(b"\n") + 1
            raise CorpusError(
                f"{path}:{line}: invalid UTF-8 (byte 0x{data[err.start]:02x}); save the file as "
                "UTF-8"
            ) from None
        raise
    except csv.Error as err:
        # A DictReader updates its own line_num only after a good row: ask the csv reader.
        line = f":{getattr(reader, 'reader', reader).line_num}" if reader is not None else ""
        raise CorpusError(f"{path}{line}: malformed CSV ({err})") from None


def _delimited_rows(path: Path, delimiter: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(where, row)`` of a CSV/TSV file with a header; ``where`` is ``path:line``."""
    with path.open(encoding="utf-8-sig", newline="") as fh:
        reader = csv.DictReader(fh, delimiter=delimiter)
        with _malformed_text(path, reader):
            header = reader.fieldnames or []
            yield f"{path}:1", {"__header__": header}
            for row in reader:
                if None in row:  # more fields than the header names
                    raise CorpusError(
                        f"{path}:{reader.line_num}: {len(header) + len(row[None])} fields, the "
                        f"header names {len(header)}"
                    )
                yield f"{path}:{reader.line_num}", row


def _jsonl_rows(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    with path.open(encoding="utf-8-sig") as fh, _malformed_text(path):
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise CorpusError(f"{path}:{line_no}: invalid JSON ({err.msg})") from None
            if not isinstance(row, dict):
                raise CorpusError(f"{path}:{line_no}: expected a JSON object, got {row!r:.60}")
            yield f"{path}:{line_no}", row


def _dataset_rows(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    try:
        import datasets
    except ImportError:  # an optional extra: say which
        raise CorpusError(
            f"{path}: reading parquet files and saved datasets needs the `datasets` library "
            "(pip install 'cselab[data]')"
        ) from None
    if path.is_dir():
        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            if "train" not in ds:
                raise CorpusError(f"{path}: a DatasetDict without a 'train' split ({list(ds)})")
            ds = ds["train"]
    else:
        ds = datasets.load_dataset("parquet", data_files=str(path), split="train")
    yield str(path), {"__header__": list(ds.column_names)}
    for i, row in enumerate(ds, start=1):
        yield f"{path}: row {i}", row


def _rows(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    suffix = path.suffix.lower()
    if path.is_dir() or suffix == ".parquet":
        return _dataset_rows(path)
    if suffix == ".jsonl":
        return _jsonl_rows(path)
    return _delimited_rows(path, "\t" if suffix == ".tsv" else ",")


def _text(row: dict[str, Any], column: str, where: str) -> str:
    if column not in row:
        raise CorpusError(f"{where}: no column '{column}' in this row")
    value = row[column]
    if value is None or not isinstance(value, str) or not value.strip():
        raise CorpusError(f"{where}: column '{column}' is empty")
    return value


def read_pairs(path: str | Path, columns: PairColumns | None = None) -> PairRecords:
    """Read the anchor, positive and hard-negative columns of every row of ``path``.

    Raises:
        CorpusError: the file is missing, a named column is absent (naming the file and the
            columns it has), a value is empty (naming the file, line or row, and column), or the
            text is not UTF-8 or not well-formed CSV (naming the file and line).
    """
    columns = columns or PairColumns()
    p = Path(path).expanduser()
    if not p.exists():
        raise CorpusError(f"{p}: training file not found")
    rows = _rows(p)
    records = PairRecords(str(p))
    header: list[str] | None = None
    negatives: list[str] = []
    first = True
    for where, row in rows:
        if "__header__" in row and first:
            header = list(row["__header__"])
            first = False
            continue
        if first:  # JSONL: the first object's keys stand for the header
            header = list(row)
            first = False
        if not records.anchors:  # resolve the columns once, against the header
            negatives = _negative_columns(columns, header or [])
            for name in (columns.anchor, columns.positive, *negatives):
                if name not in (header or []):
                    raise CorpusError(
                        f"{p}: no column '{name}' (the file has columns {header}); set "
                        f"data.columns to name the file's columns"
                    )
            records.negatives = [[] for _ in negatives]
        records.anchors.append(_text(row, columns.anchor, where))
        records.positives.append(_text(row, columns.positive, where))
        for k, name in enumerate(negatives):
            records.negatives[k].append(_text(row, name, where))
    if not records.anchors:
        raise CorpusError(f"{p}: no rows")
    return records


def _negative_columns(columns: PairColumns, header: Sequence[str]) -> list[str]:
    if columns.negative is not None:
        return list(columns.negative)
    return ["negative"] if "negative" in header else []


def sick_triplets(path: str | Path) -> PairRecords:
    """SICK's release format (tab-separated, header ``pair_ID sentence_A sentence_B
    relatedness_score entailment_judgment``) as ``(anchor, positive, hard negative)`` triplets.

    Every ENTAILMENT pair ``(A, B)`` whose ``A`` occurs in a CONTRADICTION pair gives the triplet
    ``(A, B, C)``, ``C`` the sentence ``A`` contradicts (the first such pair in file order); if
    only ``B`` occurs in one, the pair is used the other way round, ``(B, A, C)`` (SICK's
    entailment labels are directional, but a positive pair for similarity is symmetric). Pairs
    whose sentences contradict nothing are left out. SICK's train split gives 506 triplets.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise CorpusError(f"{p}: SICK file not found")
    need = ("sentence_A", "sentence_B", "entailment_judgment")
    with p.open(encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)
        with _malformed_text(p, reader):
            missing = [c for c in need if c not in (reader.fieldnames or [])]
            if missing:
                raise CorpusError(f"{p}: not a SICK file (no column {missing[0]!r} in the header)")
            rows = [(reader.line_num, r) for r in reader]
    contradicts: dict[str, str] = {}
    for _, r in rows:
        if r["entailment_judgment"] == "CONTRADICTION":
            contradicts.setdefault(r["sentence_A"], r["sentence_B"])
            contradicts.setdefault(r["sentence_B"], r["sentence_A"])
    records = PairRecords(str(p), negatives=[[]])
    for _, r in rows:
        if r["entailment_judgment"] != "ENTAILMENT":
            continue
        a, b = r["sentence_A"], r["sentence_B"]
        if b in contradicts and a not in contradicts:
            a, b = b, a
        if a in contradicts:
            records.anchors.append(a)
            records.positives.append(b)
            records.negatives[0].append(contradicts[a])
    if not records.anchors:
        raise CorpusError(f"{p}: no ENTAILMENT pair whose sentence occurs in a CONTRADICTION pair")
    return records


def load_pairs(
    path: str | Path, data_format: DataFormat = "auto", columns: PairColumns | None = None
) -> PairRecords:
    """Read ``path`` as pairs: SICK's format for ``data.format: sick``, else :func:`read_pairs`."""
    return sick_triplets(path) if data_format == "sick" else read_pairs(path, columns)


def source_digest(path: str | Path) -> str:
    """SHA-256 naming the training data in checkpoints: the file's bytes, or for a saved
    ``datasets`` folder, every file's relative path and bytes."""
    p = Path(path).expanduser()
    if not p.is_dir():
        return file_digest(p)
    h = hashlib.sha256()
    for f in sorted(q for q in p.rglob("*") if q.is_file()):
        h.update(f"{f.relative_to(p).as_posix()}\0{file_digest(f)}\n".encode())
    return h.hexdigest()


SICK_NOTE = (
    "SICK-R is not an unseen test set for this model: it was trained on SICK ({file}), so its "
    "SICK-R score measures in-domain fit, not transfer"
)


def evaluation_notes(data: Any) -> list[str]:
    """Notes an STS table of a model trained on ``data`` (a run config's ``data`` section, as
    a :class:`~cselab.config.DataConfig` or a dict) must carry: SICK-R is not unseen when the
    training data is SICK (``data.format: sick``, or a training file named like SICK's)."""
    get = (
        data.get
        if isinstance(data, dict)
        else lambda key, default=None: getattr(data, key, default)
    )
    train_file = str(get("train_file", "") or "")
    if get("format") == "sick" or "sick" in Path(train_file).name.lower():
        return [SICK_NOTE.format(file=train_file)]
    return []


def model_folder_notes(folder: str | Path) -> list[str]:
    """:func:`evaluation_notes` of a model folder saved by cselab (its ``cselab_config.yaml``);
    ``[]`` for any other model."""
    import yaml

    path = Path(folder) / RunFolder.MODEL_CONFIG
    if not path.is_file():
        return []
    config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return evaluation_notes(config.get("data") or {})


# --------------------------------------------------------------------------------- tokenising


class TokenizedPairs:
    """Token ids of every column (one :class:`~cselab.data.TokenizedCorpus` each), in memory.

    Attributes:
        anchors, positives: the two columns of every pair.
        negatives: ``K`` columns of hard negatives (``K = 0``: pairs only).
    """

    def __init__(
        self,
        anchors: TokenizedCorpus,
        positives: TokenizedCorpus,
        negatives: Sequence[TokenizedCorpus] = (),
    ) -> None:
        self.anchors = anchors
        self.positives = positives
        self.negatives = list(negatives)

    @classmethod
    def build(cls, records: PairRecords, tokenizer: Any, max_seq_len: int) -> TokenizedPairs:
        """Tokenise every column, truncating to ``max_seq_len``."""

        def tok(texts: list[str]) -> TokenizedCorpus:
            return TokenizedCorpus.build(texts, tokenizer, max_seq_len)

        return cls(
            tok(records.anchors), tok(records.positives), [tok(c) for c in records.negatives]
        )

    def __len__(self) -> int:
        return len(self.anchors)

    @property
    def num_negatives(self) -> int:
        """``K``, the hard negatives of every pair."""
        return len(self.negatives)

    def inputs(self, indices: Sequence[int], pad_id: int) -> dict[str, Tensor]:
        """The step inputs of rows ``indices`` (see the module docstring for the keys)."""
        out = collate(self.anchors.rows(indices), pad_id)
        for key, value in collate(self.positives.rows(indices), pad_id).items():
            out[POSITIVE_PREFIX + key] = value
        if self.negatives:
            # (B, K, L): the K negatives of a row stay on its row, so slicing rows slices them.
            k = len(self.negatives)
            flat = [row for i in range(len(indices)) for row in self._negative_rows(indices, i)]
            for key, value in collate(flat, pad_id).items():
                out[NEGATIVE_PREFIX + key] = value.reshape(len(indices), k, -1)
        return out

    def _negative_rows(self, indices: Sequence[int], i: int) -> list[np.ndarray]:
        return [column.rows([indices[i]])[0] for column in self.negatives]


def split_inputs(inputs: dict[str, Tensor]) -> tuple[dict[str, Tensor], ...]:
    """``(anchors, positives, negatives)`` token dicts of a pair batch's inputs; the negatives'
    tensors stay ``(B, K, L)`` and are empty when the batch has none."""
    anchors = {k: v for k, v in inputs.items() if "." not in k}
    positives = {
        k.removeprefix(POSITIVE_PREFIX): v
        for k, v in inputs.items()
        if k.startswith(POSITIVE_PREFIX)
    }
    negatives = {
        k.removeprefix(NEGATIVE_PREFIX): v
        for k, v in inputs.items()
        if k.startswith(NEGATIVE_PREFIX)
    }
    return anchors, positives, negatives


def is_pair_batch(inputs: dict[str, Tensor]) -> bool:
    """Whether a step's inputs carry a positive column (else: a sentence batch)."""
    return POSITIVE_PREFIX + "input_ids" in inputs


def stack_rows(parts: Sequence[dict[str, Tensor]]) -> dict[str, Tensor]:
    """Concatenate token dicts ``(n_i, L_i)`` along the rows, right-padding to the widest
    (pad cells are masked; their token id is irrelevant to the pooled vector)."""
    width = max(p["input_ids"].shape[1] for p in parts)
    out: dict[str, Tensor] = {}
    for key in parts[0]:
        padded = [torch.nn.functional.pad(p[key], (0, width - p[key].shape[1])) for p in parts]
        out[key] = torch.cat(padded, dim=0)
    return out
