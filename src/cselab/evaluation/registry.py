"""The registry of evaluation task kinds, and the task lists built from it.

:data:`TASK_KINDS` lists every kind of task :func:`cselab.evaluation.evaluate` runs (a
:class:`~cselab.evaluation.tasks.TaskKind`); the names ``--tasks`` knows
(:func:`cselab.evaluation.api.parse_tasks`), the task lists of the CLI, sweeps and the library
(:func:`senteval_tasks`), the report's tables, the model card's parts and the Hub metadata are
read from it, in its order. A new kind is one line here.
"""

from __future__ import annotations

from collections.abc import Sequence

from .clustering import ClusteringTask
from .datasets import ScoredPairs
from .tasks import (
    AlignUniformTask,
    EvalTask,
    MTEBTask,
    RetrievalTask,
    STSFileTask,
    STSTask,
    TaskKind,
    TransferTask,
)

#: Every kind of task ``evaluate`` runs, by its ``kind``, in the order the requested tasks run
#: (and their entries appear in ``results``) and their tables are shown. ``cselab evaluate
#: --mteb`` keeps its own route (MTEB's progress, tables and result folder); the library runs
#: the same tasks as an :class:`~cselab.evaluation.tasks.MTEBTask`.
TASK_KINDS: dict[str, type[TaskKind]] = {
    t.kind: t
    for t in (
        STSTask, AlignUniformTask, STSFileTask, TransferTask, ClusteringTask, RetrievalTask,
        MTEBTask,
    )
}  # fmt: skip


def senteval_tasks(names: Sequence[str], files: Sequence[ScoredPairs] = ()) -> list[EvalTask]:
    """The tasks of task names (as :func:`~cselab.evaluation.api.parse_tasks` gives them) and
    STS files, in the order of :data:`TASK_KINDS`: STS, alignment/uniformity, the files,
    transfer."""
    return [task for kind in TASK_KINDS.values() for task in kind.requested(names, files)]
