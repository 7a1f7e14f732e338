"""Task instructions as data: which prompt each evaluation task's texts are read after.

``cselab evaluate --instructions llm2vec`` uses LLM2Vec's table (BehnamGhader et al. 2024; the
package file ``instruction_tables/llm2vec.yaml``, whose header names its sources), or a YAML file of the
same layout: ``instructions: {task name: instruction}``, ``query_only_types: [task types whose
documents get no instruction]`` and ``source``. An instruction is put before a text as
LLM2Vec puts it: the instruction stripped, then one space (:func:`instruction_prompt`).

The table names tasks as MTEB does; cselab's own spellings of the same tasks are read under
MTEB's (:data:`TABLE_NAMES`: ``SentEvalSTSBenchmark`` and ``STSBenchmark``, ``SICKRelatedness``
and ``SICK-R``).

* MTEB (:func:`mteb_prompts`): the prompts by MTEB's own keys, ``<task>-query`` for the
  query-only task types (Retrieval, Reranking: the documents keep the model's ``document``
  prompt, if any) and ``<task>`` for the others (every text);
* cselab's STS tasks (:func:`sts_prompt`): each task's instruction (a user's STS file reads
  STS-B's), which must be one text for all the tasks evaluated together: they share one
  encoding of each sentence.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import ConfigError
from ..core.prompts import check_prompts
from ..io.readers import read_yaml
from .names import STS_FILE_KIND

#: the instruction tables shipped with cselab: name -> file in this package
BUILTIN = {"llm2vec": Path(__file__).with_name("instruction_tables") / "llm2vec.yaml"}

#: cselab's names of tasks a table knows by MTEB's name (the MTEB task that reads STS-B from
#: SentEval's files, and SentEval's SICK-R)
TABLE_NAMES = {"SentEvalSTSBenchmark": "STSBenchmark", "SICKRelatedness": "SICK-R"}
#: the table task whose instruction a cselab task without one of its own reads: alignment and
#: uniformity are measured on STS-B dev, a user's STS file is scored like STS-B
STSB_READERS = {"AlignUniform": "STSBenchmark", STS_FILE_KIND: "STSBenchmark"}


@dataclass(frozen=True)
class Instructions:
    """A task-instruction table.

    Attributes:
        instructions: task name -> instruction.
        query_only_types: MTEB task types whose documents get no instruction.
        source: where the table comes from.
        path: the file read (what an error names).
    """

    instructions: Mapping[str, str]
    query_only_types: tuple[str, ...]
    source: str
    path: str = ""


def table_name(task: str) -> str:
    """The name ``task`` (cselab's or MTEB's) has in a table: MTEB's (:data:`TABLE_NAMES`)."""
    return TABLE_NAMES.get(task, task)


def instruction_prompt(instruction: str) -> str:
    """The prompt text of an instruction: stripped, then one space (LLM2Vec's
    ``_convert_to_str``)."""
    return instruction.strip() + " "


def load_instructions(name: str) -> Instructions:
    """The table ``name`` (one of :data:`BUILTIN`) or the YAML file at path ``name``; a bad
    file (an empty or blank instruction included) is one line naming it and the key."""
    path = BUILTIN.get(name, Path(name))
    if name not in BUILTIN and not path.is_file():
        raise ConfigError(
            f"instructions {name!r}: neither a table of cselab's ({', '.join(BUILTIN)}) nor a "
            "YAML file"
        )
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with an 'instructions' key")
    table = check_prompts(data.get("instructions"), f"{path}: instructions")
    for task, text in table.items():
        if not text.strip():
            raise ConfigError(
                f"{path}: instructions.{task}: empty; give the instruction, or leave {task} out"
            )
    types = data.get("query_only_types") or []
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise ConfigError(f"{path}: query_only_types must be a list of MTEB task types")
    return Instructions(table, tuple(types), str(data.get("source") or path), str(path))


def mteb_prompts(table: Instructions, task_types: Mapping[str, str]) -> dict[str, str]:
    """The prompts of ``table`` by MTEB's keys for the tasks of ``task_types`` (task name ->
    MTEB task type): ``<task>-query`` for the query-only types, ``<task>`` otherwise; a task is
    looked up under its :func:`table_name`. The tasks with no instruction are left out
    (:func:`missing`)."""
    out: dict[str, str] = {}
    for task, kind in task_types.items():
        text = table.instructions.get(table_name(task))
        if text is not None:
            key = f"{task}-query" if kind in table.query_only_types else task
            out[key] = instruction_prompt(text)
    return out


def missing(table: Instructions, tasks: Iterable[str]) -> list[str]:
    """The tasks of ``tasks`` that ``table`` has no instruction for (by :func:`table_name`)."""
    return [t for t in tasks if table_name(t) not in table.instructions]


def sts_prompt(table: Instructions, tasks: Iterable[str] = ("STSBenchmark",)) -> str:
    """The one prompt of cselab's STS tasks ``tasks`` (STS12-16, STSBenchmark,
    SICKRelatedness, AlignUniform; :data:`~cselab.evaluation.names.STS_FILE_KIND` for a user's
    STS file) evaluated together: each
    one's instruction (:data:`STSB_READERS` say whose the last two read), which must be the same
    text for all of them, since they share one encoding of each sentence.

    Raises:
        ConfigError: a task has no instruction in the table, or two have different ones (one
            line naming the table file and the tasks).
    """
    read: dict[str, str] = {}
    for task in dict.fromkeys(tasks):
        name = table_name(STSB_READERS.get(task, task))
        if name not in table.instructions:
            reader = "an STS file" if task == STS_FILE_KIND else task
            whose = f" ({reader} reads {name}'s)" if task in STSB_READERS else ""
            raise ConfigError(
                f"{table.path}: no instruction for {name}{whose}; add one, or leave the task out"
            )
        read[name] = table.instructions[name]
    if not read:
        raise ValueError("sts_prompt: no STS task given")
    if len(set(read.values())) > 1:
        shown = ", ".join(f"{name}: {text!r}" for name, text in read.items())
        raise ConfigError(
            f"{table.path}: the STS tasks evaluated together read one prompt, but their "
            f"instructions differ ({shown}); evaluate them one at a time, or through MTEB (each task its own)"
        )
    return instruction_prompt(next(iter(read.values())))
