"""SentEval-faithful evaluation: STS12-16, STS-B, SICK-R, 7 transfer tasks, alignment/uniformity.

>>> from cselab.evaluation import evaluate
>>> out = evaluate(encoder, tasks="sts", mode="test")          # doctest: +SKIP
>>> out["headline"]["sts"]["Avg"]                              # doctest: +SKIP

See ``docs/evaluation.md`` for what is reproduced from SentEval / SimCSE and where from.
"""

from __future__ import annotations

from .api import ALIGN_UNIFORM, MODES, TASK_GROUPS, evaluate, parse_tasks
from .datasets import DataFormatError, MissingDataError, resolve_data_dir
from .embed import EmbeddingCache, Encoder
from .sts import stsb_dev_spearman

__all__ = [
    "ALIGN_UNIFORM",
    "MODES",
    "TASK_GROUPS",
    "DataFormatError",
    "EmbeddingCache",
    "Encoder",
    "MissingDataError",
    "evaluate",
    "parse_tasks",
    "resolve_data_dir",
    "stsb_dev_spearman",
]
