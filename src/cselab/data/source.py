"""The training data of a run, opened once: its kind decided, pairs read, then tokenised.

:class:`TrainingSource` is the one place that decides what kind of data a run trains on
(:class:`~cselab.core.datakind.DataKind`: sentences, or pairs with ``K`` hard negatives). It reads
a pairs file's header when it is opened, so a wrong column fails before the model loads, and
tokenises on :meth:`TrainingSource.tokenize` (every row checked before any is tokenised). :class:`TrainingData` is what a run says about its data (file,
kind, rows, SHA-256): the checkpoint keeps the digest and the model card shows all of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.datakind import DataKind
from ..core.prompts import check_prompt_fits, count_prompt
from .cache import tokenize_corpus, tokenize_pairs
from .config import SENTENCE_PROMPT_COLUMN, DataConfig, is_pairs_source
from .corpus import CorpusStats
from .pairs import TokenizedPairs, pair_negatives
from .store import TokenizedCorpus


@dataclass(frozen=True)
class TrainingData:
    """What a run trained on.

    Attributes:
        path: the training file (or saved ``datasets`` folder) as read.
        kind: sentences, or pairs with their hard negatives.
        rows: sentences (blank lines skipped) or pairs; ``None`` when not counted.
        sha256: the SHA-256 of the file's bytes (of a folder: :func:`~.pairs.source_digest`);
            ``None`` when the file was not read.
    """

    path: Path
    kind: DataKind
    rows: int | None = None
    sha256: str | None = None


class TrainingSource:
    """The training file of a run, opened: its kind decided and, for pairs, its rows read.

    Args:
        path: the resolved training file (a download name already resolved to its file).
        data: the ``data`` section (format, columns, encoding errors).

    Raises:
        CorpusError: a pairs file that cannot be read (see :func:`~.pairs.read_pairs`).
    """

    def __init__(self, path: str | Path, data: DataConfig) -> None:
        self.path = Path(path)
        self.config = data
        pairs = is_pairs_source(self.path, data.format)
        # A pairs file's columns are checked here, from its header, so a wrong column name fails
        # before the model loads; every row is checked before any is tokenised (tokenize_pairs).
        negatives = pair_negatives(self.path, data.format, data.columns) if pairs else 0
        #: decided here, once; everything else is handed this value
        self.kind = DataKind(pairs=pairs, negatives=negatives)
        self.stats: CorpusStats | None = None  # a sentence corpus's counts, once tokenised
        self.rows: int | None = None

    def tokenize(
        self,
        tokenizer: Any,
        max_seq_len: int,
        cache_dir: str | Path | None = None,
        pool_prompt: bool = True,
        prompt_count: str = "row",
    ) -> tuple[TokenizedCorpus | TokenizedPairs, TrainingData]:
        """The token ids of every row (sentences and pairs alike through the token cache in
        ``cache_dir``), each column's ``data.prompts`` text before its own, and what the run
        says about its data. ``pool_prompt=False`` (``model.pool_prompt``): the batches carry
        a ``pool_mask`` without the prompts' tokens, counted by ``prompt_count`` (the model's,
        :data:`~cselab.core.prompts.PROMPT_COUNTS`)."""
        prompts = self.config.check_prompts(self.kind.pairs)
        for column, text in prompts.items():  # before any row is tokenised
            check_prompt_fits(tokenizer, text, max_seq_len, f"data.prompts.{column}")
        lengths = {k: count_prompt(tokenizer, v, prompt_count) for k, v in prompts.items()}
        if self.kind.pairs:
            c = self.config
            pairs, digest = tokenize_pairs(
                self.path, tokenizer, max_seq_len, c.format, c.columns, cache_dir=cache_dir,
                prompts=prompts,
            )  # fmt: skip
            if prompts and not pool_prompt:
                pairs.exclude_prompts(lengths)
            self.rows = len(pairs)
            return pairs, TrainingData(self.path, self.kind, self.rows, digest)
        corpus, self.stats = tokenize_corpus(
            self.path, tokenizer, max_seq_len, errors=self.config.encoding_errors,
            cache_dir=cache_dir, prompt=prompts.get(SENTENCE_PROMPT_COLUMN),
        )  # fmt: skip
        if prompts and not pool_prompt:
            corpus.prompt_length = lengths[SENTENCE_PROMPT_COLUMN]
        data = TrainingData(self.path, self.kind, self.stats.sentences, self.stats.content_sha256)
        return corpus, data

    def summary(self) -> str:
        """One line for the log: what was read."""
        if self.kind.pairs:
            rows = "not tokenised yet" if self.rows is None else f"{self.rows} rows"
            n = self.kind.negatives
            return f"pairs {self.path}: {rows}, {n} hard negative{'s' if n != 1 else ''} each"
        s = self.stats
        if s is None:
            return f"corpus {self.path}: not tokenised yet"
        return (
            f"corpus {s.path}: {s.sentences} sentences ({s.blank_lines} blank lines skipped, "
            f"{s.replaced_lines} lines with replaced bytes)"
        )
