"""The evaluation layer's names that need no torch: the modes, the transfer tasks and the kinds
of result entries.

The command line builds its choice lists from here, so ``cselab --help`` never waits for torch;
the modules that run and report the tasks import them from here (one spelling each).
"""

from __future__ import annotations

#: ``evaluate(mode=...)``: SentEval's test protocol, the dev splits, or a quick test
MODES = ("test", "dev", "fasttest")

#: SentEval's transfer tasks as SimCSE's tables show them: ``(task name, column label)``
TRANSFER_COLUMNS = (
    ("MR", "MR"),
    ("CR", "CR"),
    ("SUBJ", "SUBJ"),
    ("MPQA", "MPQA"),
    ("SST2", "SST-2"),
    ("TREC", "TREC"),
    ("MRPC", "MRPC"),
)
TRANSFER_TASKS = tuple(name for name, _ in TRANSFER_COLUMNS)

#: Retrieval's cut-off ``k`` (nDCG@k, MRR@k) where none is given (``cselab evaluate --k``)
RETRIEVAL_K = 10
#: What a missing-column error of a user's STS file suggests (``cselab evaluate`` shows its
#: ``--sts-columns`` for ``columns=``)
STS_COLUMNS_HINT = (
    "name the columns with eval.dev_columns, evaluate(sts_columns=...) or read_sts_file(columns=...)"
    " (SENTENCE1, SENTENCE2, SCORE)"
)
#: What ``--tasks``/``tasks=`` naming a kind run on the user's own data suggests instead
#: (``cselab evaluate`` shows its option that gives the data)
STS_FILE_HINT = "pass the file as sts_files=[PATH]"
CLUSTERING_HINT = "pass ClusteringTask(read_labelled_file(PATH)) in tasks"
RETRIEVAL_HINT = "pass a RetrievalTask of the BEIR folder in tasks"
#: ``"kind"`` of a result entry for a user's STS file (the report gives such entries a table)
STS_FILE_KIND = "sts-file"
#: ``"kind"`` of a result entry for a retrieval evaluation on a BEIR folder
RETRIEVAL_KIND = "retrieval"


def senteval_hub_dataset(task: str) -> tuple[str, str]:
    """A SentEval task's dataset in a card's ``model-index``: ``(type, name)``. One spelling for
    the dev score of model selection and ``cselab evaluate``'s results, so that
    ``--update-card`` replaces the STS-B dev entry training wrote instead of adding a second."""
    return task.lower(), f"{task} (SentEval)"


#: the result key of alignment and uniformity (Wang & Isola 2020) on STS-B dev
ALIGN_UNIFORM = "AlignUniform"
