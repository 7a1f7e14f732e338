"""Training pairs and triplets: reading them with named columns and tokenising them for a step.

Supervised SimCSE (Gao et al. 2021, Sec. 4) trains on ``(anchor, positive)`` pairs, optionally
with one or several given hard negatives per pair (SNLI+MNLI: premise, entailment hypothesis,
contradiction hypothesis). This module reads such data from

* ``.csv`` / ``.tsv`` files with a header row, ``.jsonl`` files (one JSON object a line);
* ``.parquet`` files and folders written by ``datasets.Dataset.save_to_disk`` (``pip install
  cselab[data]``);
* SICK's release format (``data.format: sick``, :func:`sick_triplets`), the offline demo.

The files are read by :mod:`cselab.io.readers` (one rule per format, the same rows as an own
dev set or ``cselab evaluate --sts-file`` reads from the same file). The column names are
configurable (:class:`PairColumns`); a missing column, or an empty or non-text value, is a
:class:`~cselab.data.CorpusError` naming the file, the line (or row) and the column; so is
invalid UTF-8 or malformed CSV, naming the file and line.

Every column is tokenised once into the token store, like a sentence corpus, and found again
by the file's content (:func:`cselab.data.cache.tokenize_pairs`); :class:`TokenizedPairs`
memory-maps one :class:`~cselab.data.TokenizedCorpus` per column.

A step's inputs (:meth:`TokenizedPairs.step_inputs`) are a
:class:`~cselab.data.inputs.StepInputs`: the anchors, the positives ``(B, L)`` and the hard
negatives ``(B, K, L)``, every tensor with the batch on dim 0, so a batch's rows (GradCache
chunks, a rank's slice) are slices of every column alike.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import CorpusError
from ..io.files import file_digest
from ..io.readers import open_table, read_json, read_sick, read_yaml, reraise_as
from ..io.runfolder import RunFolder
from .config import (  # noqa: F401
    DEFAULT_NEGATIVE_COLUMN,
    DataFormat,
    PairColumns,
    is_pairs_source,
    pair_prompts,
)
from .inputs import StepInputs
from .order import collate
from .store import TokenizedCorpus, pair_columns, write_columns

#: Version of the rows the readers give for given bytes; part of the token cache's key, so a
#: changed reading rule (quoting, a column rule) never reuses token ids of the old rows.
ROWS_VERSION = 1


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


#: What a missing-column error suggests for training data.
COLUMNS_HINT = "set data.columns to name the file's columns"

#: Beside a file ``cselab mine`` wrote (``triplets.tsv`` -> ``triplets.tsv.mining.json``): how
#: its negatives were mined (model, filters, counts), which the model card of a run trained on
#: the file reports.
MINING_RECORD_SUFFIX = ".mining.json"


def mining_record_path(path: str | Path) -> Path:
    """Where ``cselab mine`` records how the negatives of ``path`` were mined."""
    return Path(str(path) + MINING_RECORD_SUFFIX)


def read_mining_record(path: str | Path) -> dict[str, Any] | None:
    """The mining record of ``path`` (:func:`mining_record_path`), or ``None`` when there is
    none or it cannot be read (it describes the file; the file itself is what trains)."""
    try:
        return read_json(mining_record_path(path))
    except (OSError, ValueError):  # read_json's DataFormatError is a ValueError
        return None


def read_pairs(path: str | Path, columns: PairColumns | None = None) -> PairRecords:
    """Read the anchor, positive and hard-negative columns of every row of ``path``, a table
    read by :func:`cselab.io.readers.open_table` (its rules for TSV, CSV, JSONL, parquet and
    saved datasets; a ``DatasetDict`` gives its ``train`` split).

    Raises:
        CorpusError: the file is missing, a named column is absent (naming the file and the
            columns it has), a value is empty or not text (naming the file, line or row, and
            column), or the file breaks its format's rule (naming the file and line).
    """
    records = PairRecords(str(Path(path).expanduser()))
    for anchor, positive, *negatives in iter_pairs(path, columns):
        if not records.anchors:
            records.negatives = [[] for _ in negatives]
        records.anchors.append(anchor)
        records.positives.append(positive)
        for texts, text in zip(records.negatives, negatives, strict=True):
            texts.append(text)
    return records


def iter_pairs(
    path: str | Path, columns: PairColumns | None = None, *, what: str = "training file"
) -> Iterator[tuple[str, ...]]:
    """The rows of :func:`read_pairs` one at a time, ``(anchor, positive, *negatives)``, with
    the same checks and errors, holding one row in memory (the token store's input); ``what``
    names the file's role where it is not found (``pairs file`` for ``cselab mine``)."""
    columns = columns or PairColumns()
    p = Path(path).expanduser()
    if not p.exists():
        raise CorpusError(f"{p}: {what} not found")
    count = 0
    with reraise_as(CorpusError):
        table = open_table(p, prefer_split="train")
        negatives = _negative_columns(columns, table.columns)
        table.require((columns.anchor, columns.positive, *negatives), COLUMNS_HINT)
        for row in table:
            count += 1
            yield (
                row.text(columns.anchor),
                row.text(columns.positive),
                *(row.text(name) for name in negatives),
            )
    if not count:
        raise CorpusError(f"{p}: no rows")


def _negative_columns(columns: PairColumns, header: Sequence[str]) -> list[str]:
    if columns.negative is not None:
        return list(columns.negative)
    return [DEFAULT_NEGATIVE_COLUMN] if DEFAULT_NEGATIVE_COLUMN in header else []


def sick_triplets(path: str | Path) -> PairRecords:
    """SICK's release format (read by :func:`cselab.io.readers.read_sick`, as the SICK-R
    evaluation reads it) as ``(anchor, positive, hard negative)`` triplets.

    Every ENTAILMENT pair ``(A, B)`` whose ``A`` occurs in a CONTRADICTION pair gives the triplet
    ``(A, B, C)``, ``C`` the sentence ``A`` contradicts (the first such pair in file order); if
    only ``B`` occurs in one, the pair is used the other way round, ``(B, A, C)`` (SICK's
    entailment labels are directional, but a positive pair for similarity is symmetric). Pairs
    whose sentences contradict nothing are left out. SICK's train split gives 506 triplets.
    """
    p = Path(path).expanduser()
    with reraise_as(CorpusError):
        rows = read_sick(p)
    if rows and rows[0].entailment is None:
        raise CorpusError(f"{p}: not a SICK file (no column 'entailment_judgment' in the header)")
    contradicts: dict[str, str] = {}
    for r in rows:
        if r.entailment == "CONTRADICTION":
            contradicts.setdefault(r.sentence_a, r.sentence_b)
            contradicts.setdefault(r.sentence_b, r.sentence_a)
    records = PairRecords(str(p), negatives=[[]])
    for r in rows:
        if r.entailment != "ENTAILMENT":
            continue
        a, b = r.sentence_a, r.sentence_b
        if b in contradicts and a not in contradicts:
            a, b = b, a
        if a in contradicts:
            records.anchors.append(a)
            records.positives.append(b)
            records.negatives[0].append(contradicts[a])
    if not records.anchors:
        raise CorpusError(f"{p}: no ENTAILMENT pair whose sentence occurs in a CONTRADICTION pair")
    return records


def pair_negatives(
    path: str | Path, data_format: DataFormat = "auto", columns: PairColumns | None = None
) -> int:
    """The number of hard-negative columns of a pairs source, from its header alone (the
    anchor and positive columns checked too): SICK's triplets have one."""
    if data_format == "sick":
        return 1
    columns = columns or PairColumns()
    p = Path(path).expanduser()
    if not p.exists():
        raise CorpusError(f"{p}: training file not found")
    with reraise_as(CorpusError):
        table = open_table(p, prefer_split="train")
        negatives = _negative_columns(columns, table.columns)
        table.require((columns.anchor, columns.positive, *negatives), COLUMNS_HINT)
    return len(negatives)


def load_pairs(
    path: str | Path, data_format: DataFormat = "auto", columns: PairColumns | None = None
) -> PairRecords:
    """Read ``path`` as pairs: SICK's format for ``data.format: sick``, else :func:`read_pairs`."""
    return sick_triplets(path) if data_format == "sick" else read_pairs(path, columns)


def stream_pairs(
    path: str | Path,
    data_format: DataFormat = "auto",
    columns: PairColumns | None = None,
    *,
    what: str = "training file",
) -> Iterator[tuple[str, ...]]:
    """The rows of :func:`load_pairs` one at a time, ``(anchor, positive, *negatives)``
    (SICK's file is small and read whole); ``what`` as :func:`iter_pairs` takes it."""
    if data_format == "sick":
        records = sick_triplets(path)
        return zip(records.anchors, records.positives, *records.negatives, strict=True)
    return iter_pairs(path, columns, what=what)


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
    path = Path(folder) / RunFolder.MODEL_CONFIG
    if not path.is_file():
        return []
    config = read_yaml(path) or {}
    return evaluation_notes(config.get("data") or {})


# --------------------------------------------------------------------------------- tokenising


class TokenizedPairs:
    """Token ids of every column (one :class:`~cselab.data.TokenizedCorpus` each): memory-mapped
    from a token store (:meth:`open`, what training uses) or in memory (:meth:`build`).

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
        """Tokenise every column in memory, truncating to ``max_seq_len``."""

        def tok(texts: list[str]) -> TokenizedCorpus:
            return TokenizedCorpus.build(texts, tokenizer, max_seq_len)

        return cls(
            tok(records.anchors), tok(records.positives), [tok(c) for c in records.negatives]
        )

    @staticmethod
    def write(
        folder: Path,
        rows: Iterable[Sequence[str]],
        tokenizer: Any,
        max_seq_len: int,
        chunk: int = 8192,
        progress: Any = None,
    ) -> tuple[int, int]:
        """Tokenise a stream of ``(anchor, positive, *negatives)`` rows into the columns of the
        token store ``folder`` (:func:`~cselab.data.store.pair_columns`), ``chunk`` rows at a
        time; returns the number of rows and of hard negatives per row."""
        it = iter(rows)
        first = next(it, None)
        if first is None:
            raise ValueError("no rows to tokenise")
        negatives = len(first) - 2
        n = write_columns(
            folder,
            pair_columns(negatives),
            itertools.chain([first], it),
            tokenizer,
            max_seq_len,
            chunk,
            progress,
        )
        return n, negatives

    @classmethod
    def open(cls, folder: str | Path, negatives: int) -> TokenizedPairs:
        """Memory-map the columns of the token store ``folder`` (:meth:`write`)."""
        anchor, positive, *rest = (
            TokenizedCorpus.open(folder, name) for name in pair_columns(negatives)
        )
        return cls(anchor, positive, rest)

    def __len__(self) -> int:
        return len(self.anchors)

    def exclude_prompts(self, lengths: dict[str, int]) -> None:
        """Leave each column's prompt (``lengths``: tokens per role, ``anchor``, ``positive``,
        ``negative``; a role not named has none) out of the pooling of every column."""
        anchor, positive, negative = pair_prompts(lengths, 0)
        self.anchors.prompt_length, self.positives.prompt_length = anchor, positive
        for column in self.negatives:
            column.prompt_length = negative

    @property
    def num_negatives(self) -> int:
        """``K``, the hard negatives of every pair."""
        return len(self.negatives)

    @property
    def nbytes(self) -> int:
        """Size of every column's ids and offsets (on disk when memory-mapped)."""
        return sum(c.nbytes for c in (self.anchors, self.positives, *self.negatives))

    def step_inputs(self, indices: Sequence[int], pad_id: int) -> StepInputs:
        """The step inputs of rows ``indices`` (:class:`~cselab.data.store.TokenStore`): the
        anchors, the positives and, with ``K > 0``, the hard negatives ``(B, K, L)``."""
        anchors = collate(self.anchors.rows(indices), pad_id, self.anchors.prompt_length)
        positives = collate(self.positives.rows(indices), pad_id, self.positives.prompt_length)
        negatives = None
        if self.negatives:
            # (B, K, L): the K negatives of a row stay on its row, so slicing rows slices them.
            k = len(self.negatives)
            flat = [row for i in range(len(indices)) for row in self._negative_rows(indices, i)]
            negatives = {
                key: value.reshape(len(indices), k, -1)
                for key, value in collate(flat, pad_id, self.negatives[0].prompt_length).items()
            }
        return StepInputs(anchors, positives, negatives)

    def _negative_rows(self, indices: Sequence[int], i: int) -> list[np.ndarray]:
        return [column.rows([indices[i]])[0] for column in self.negatives]
