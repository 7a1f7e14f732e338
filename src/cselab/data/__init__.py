"""The training data: the readers' output turned into token stores, a seeded batch order and a
rank's slice of each batch.

* :mod:`.corpus` streams one sentence per line; :mod:`.pairs` reads pairs and triplets;
* :mod:`.store` holds token ids as memory-mapped columns (sentences, or pairs' anchors, positives
  and negatives); :mod:`.cache` finds a tokenised file again by its content;
* :mod:`.order` is the batch order, the rank's slice and the padding of a batch;
* :mod:`.source` opens a run's training file once and decides its kind
  (:class:`~cselab.core.datakind.DataKind`, handed to everything above);
* :mod:`.config` is the ``data`` section of a run config.

This layer knows nothing of models' insides: only a tokenizer.
"""

from ..core.datakind import DataKind
from ..core.errors import CorpusError
from ..io.files import file_digest, write_json_atomic
from .cache import tokenize_corpus, tokenize_pairs
from .corpus import CorpusStats, SentenceStream, iter_sentences, read_corpus
from .order import BatchOrder, bucket_width, collate, pad_to_width, shard, shard_bounds
from .source import TrainingData, TrainingSource
from .store import (
    STORE_FORMAT,
    TEXT_COLUMN,
    ColumnWriter,
    TokenizedCorpus,
    encode_chunks,
    pair_columns,
)

__all__ = [
    "STORE_FORMAT",
    "TEXT_COLUMN",
    "BatchOrder",
    "ColumnWriter",
    "CorpusError",
    "CorpusStats",
    "DataKind",
    "SentenceStream",
    "TokenizedCorpus",
    "TrainingData",
    "TrainingSource",
    "bucket_width",
    "collate",
    "pad_to_width",
    "encode_chunks",
    "file_digest",
    "iter_sentences",
    "pair_columns",
    "read_corpus",
    "shard",
    "shard_bounds",
    "tokenize_corpus",
    "tokenize_pairs",
    "write_json_atomic",
]
