"""The model layer's names that need no torch: the pooler names and the inference precisions.

Their home is here, not in :mod:`.pooling` or :mod:`.inference`, so that reading a config
(``model.pooler``) and building the command line's choice lists (``--pooler``, ``--precision``)
never wait for torch; both modules re-export them.
"""

from __future__ import annotations

import typing
from typing import Literal

PoolerName = Literal[
    "cls", "cls_before_pooler", "avg", "avg_top2", "avg_first_last", "prompt", "last",
    "weighted_mean",
]  # fmt: skip
POOLERS: tuple[str, ...] = typing.get_args(PoolerName)

#: ``encode(precision=...)``: the backbone's compute precision at inference
PRECISIONS = ("fp32", "bf16")

#: Sentences per encoder call where a command or a search setting does not say (``--batch-size``)
BATCH_SIZE = 128
