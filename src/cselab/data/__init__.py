"""The training data: the readers' output turned into token stores, a seeded batch order and a
rank's slice of each batch.

* :mod:`.corpus` streams one sentence per line; :mod:`.pairs` reads pairs and triplets;
* :mod:`.store` holds token ids as memory-mapped columns (sentences, or pairs' anchors, positives
  and negatives); :mod:`.cache` finds a tokenised file again by its content;
* :mod:`.order` is the batch order, the rank's slice and the padding of a batch;
* :mod:`.inputs` is a step's inputs, typed (:class:`~cselab.data.inputs.StepInputs`), as both
  stores hand them out;
* :mod:`.source` opens a run's training file once and decides its kind
  (:class:`~cselab.core.datakind.DataKind`, handed to everything above);
* :mod:`.config` is the ``data`` section of a run config.

This layer knows nothing of models' insides: only a tokenizer.
"""

from __future__ import annotations

from ..core.lazy import lazy_exports

#: each public name and its home module, imported on first use (no torch at ``import`` time)
_HOMES = {
    "DataKind": "..core.datakind",
    "CorpusError": "..core.errors",
    "file_digest": "..io.files",
    "write_json_atomic": "..io.files",
    "tokenize_corpus": ".cache",
    "tokenize_pairs": ".cache",
    "CorpusStats": ".corpus",
    "SentenceStream": ".corpus",
    "iter_sentences": ".corpus",
    "read_corpus": ".corpus",
    "MaskedCopy": ".inputs",
    "StepInputs": ".inputs",
    "BatchOrder": ".order",
    "bucket_width": ".order",
    "pad_to_width": ".order",
    "collate": ".order",
    "shard": ".order",
    "shard_bounds": ".order",
    "TrainingData": ".source",
    "TrainingSource": ".source",
    "STORE_FORMAT": ".store",
    "TEXT_COLUMN": ".store",
    "ColumnWriter": ".store",
    "TokenStore": ".store",
    "TokenizedCorpus": ".store",
    "encode_chunks": ".store",
    "pair_columns": ".store",
}
__getattr__, __dir__ = lazy_exports(__name__, globals(), _HOMES)


__all__ = [
    "STORE_FORMAT",
    "TEXT_COLUMN",
    "BatchOrder",
    "ColumnWriter",
    "CorpusError",
    "CorpusStats",
    "DataKind",
    "MaskedCopy",
    "SentenceStream",
    "StepInputs",
    "TokenStore",
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
