"""The ``data`` section of a run config: which file to train on, read how."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..io.tables import TABLE_SUFFIXES

DataFormat = Literal["auto", "sentences", "pairs", "sick"]


#: The hard-negative column read when ``data.columns.negative`` is null (and written by
#: ``cselab mine``'s triplets, so that training reads them as they are).
DEFAULT_NEGATIVE_COLUMN = "negative"
#: the columns ``data.prompts`` may name: a pairs file's roles, or a sentence corpus's one
PAIR_PROMPT_COLUMNS = ("anchor", "positive", "negative")
SENTENCE_PROMPT_COLUMN = "text"


def pair_prompts(values: dict[str, Any] | None, default: Any) -> tuple[Any, Any, Any]:
    """``values`` of ``data.prompts`` (prompts, or their token counts) for a pairs file's
    anchor, positive and every hard negative (:data:`PAIR_PROMPT_COLUMNS`), ``default`` for a
    role not named."""
    values = values or {}
    anchor, positive, negative = (values.get(role, default) for role in PAIR_PROMPT_COLUMNS)
    return anchor, positive, negative


@dataclass
class PairColumns:
    """Which columns of a pairs file hold the anchor, the positive and the hard negatives.

    Attributes:
        anchor: the anchor sentence (SimCSE's premise, ``sent0`` in ``nli_for_simcse.csv``).
        positive: its positive (``sent1``).
        negative: the hard-negative columns (``[hard_neg]``); ``null`` uses a column named
            ``negative`` if the file has one and none otherwise; ``[]`` uses none.
    """

    anchor: str = "anchor"
    positive: str = "positive"
    negative: list[str] | None = None


@dataclass
class DataConfig:
    """The training corpus.

    Attributes:
        train_file: a text file with one sentence per line, or ``wiki1m`` (SimCSE's corpus,
            downloaded once into the cache); or pairs (:mod:`cselab.pairs`): a ``.csv``,
            ``.tsv`` (``.tab``), ``.jsonl`` or ``.parquet`` file, a saved ``datasets`` folder, or
            ``nli_for_simcse.csv`` (SimCSE's SNLI+MNLI triplets, downloaded once).
        format: ``auto`` (pairs for the file endings above and folders, else sentences),
            ``sentences``, ``pairs``, or ``sick`` (SICK's release file as triplets: the
            offline demo, :func:`cselab.pairs.sick_triplets`).
        columns: the anchor, positive and hard-negative columns of a pairs file.
        encoding_errors: ``strict`` (invalid UTF-8 is an error naming file and line) or
            ``replace`` (bad bytes become U+FFFD), for a sentence corpus; a pairs table is
            always read strictly, as evaluation and mining read it.
        cache_dir: where tokenised corpora are cached (default: user cache); a
            ``data/wiki1m_for_simcse.txt`` there (from earlier versions) is used for ``wiki1m``.
        prompts: text put before each sentence of a column when it is tokenised (the token
            cache is keyed by it): ``{anchor: "query: ", positive: "passage: ", negative:
            "passage: "}`` for pairs (``negative``: every hard-negative column), ``{text:
            "..."}`` for a sentence corpus (both dropout views). ``docs/prompts.md``.
    """

    train_file: str = "wiki1m"
    format: DataFormat = "auto"
    columns: PairColumns = field(default_factory=PairColumns)
    encoding_errors: Literal["strict", "replace"] = "strict"
    cache_dir: str | None = None
    prompts: dict[str, str] = field(default_factory=dict)

    def check_prompts(self, pairs: bool) -> dict[str, str]:
        """``prompts`` checked against the data's kind: a column that the data has not, or a
        text that is not a string, is a :class:`~cselab.core.errors.ConfigError` naming the key."""
        from ..core.prompts import check_prompts

        allowed = PAIR_PROMPT_COLUMNS if pairs else (SENTENCE_PROMPT_COLUMN,)
        hint = " in pairs data" if pairs else " in a sentence corpus"
        self.prompts = check_prompts(self.prompts, "data.prompts", allowed, hint)
        return self.prompts


def is_pairs_source(train_file: str | Path, data_format: DataFormat = "auto") -> bool:
    """Whether ``train_file`` is read as pairs (by ``data.format``, else by its ending, or a
    folder: a saved ``datasets`` dataset).

    The one rule. It looks at the disk (a folder is pairs), so it is asked where the data is
    opened (:class:`cselab.data.source.TrainingSource`, which hands the resulting
    :class:`~cselab.core.datakind.DataKind` on) and once by ``Config.validate`` for its early
    checks, never by a property of the config.
    """
    if data_format != "auto":
        return data_format != "sentences"
    p = Path(train_file).expanduser()
    # every table the readers read is pairs (anything else is one sentence a line)
    return p.suffix.lower() in TABLE_SUFFIXES or p.is_dir()
