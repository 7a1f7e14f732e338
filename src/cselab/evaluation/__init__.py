"""SentEval-faithful evaluation: STS12-16, STS-B, SICK-R, 7 transfer tasks, alignment/uniformity.

>>> from cselab.evaluation import evaluate
>>> out = evaluate(encoder, tasks="sts", mode="test")          # doctest: +SKIP
>>> out["headline"]["sts"]["Avg"]                              # doctest: +SKIP

See ``docs/evaluation.md`` for what is reproduced from SentEval / SimCSE and where from.
"""

from ..core.lazy import lazy_exports

#: each public name and its home module, imported on first use (no torch at ``import`` time)
_HOMES = {
    "ALIGN_UNIFORM": ".api",
    "MODES": ".api",
    "TASK_GROUPS": ".api",
    "evaluate": ".api",
    "parse_tasks": ".api",
    "DataFormatError": ".datasets",
    "MissingDataError": ".datasets",
    "resolve_data_dir": ".datasets",
    "EmbeddingCache": ".embed",
    "Encoder": ".embed",
    "stsb_dev_spearman": ".sts",
}
__getattr__, __dir__ = lazy_exports(__name__, globals(), _HOMES)


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
