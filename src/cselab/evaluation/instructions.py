"""Task instructions as data: which prompt each evaluation task's texts are read after.

``cselab evaluate --instructions llm2vec`` uses LLM2Vec's table (BehnamGhader et al. 2024; the
package file ``instruction_tables/llm2vec.yaml``, whose header names its sources), or a YAML file of the
same layout: ``instructions: {task name: instruction}``, ``query_only_types: [task types whose
documents get no instruction]`` and ``source``. An instruction is put before a text as
LLM2Vec puts it: the instruction stripped, then one space (:func:`instruction_prompt`).

* MTEB (:func:`mteb_prompts`): the prompts by MTEB's own keys, ``<task>-query`` for the
  query-only task types (Retrieval, Reranking: the documents keep the model's ``document``
  prompt, if any) and ``<task>`` for the others (every text);
* cselab's STS tasks (:func:`sts_prompt`): the table's instruction for STS-B.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import ConfigError
from ..core.prompts import check_prompts
from ..io.readers import read_yaml

#: the instruction tables shipped with cselab: name -> file in this package
BUILTIN = {"llm2vec": Path(__file__).with_name("instruction_tables") / "llm2vec.yaml"}


@dataclass(frozen=True)
class Instructions:
    """A task-instruction table.

    Attributes:
        instructions: task name -> instruction.
        query_only_types: MTEB task types whose documents get no instruction.
        source: where the table comes from.
    """

    instructions: Mapping[str, str]
    query_only_types: tuple[str, ...]
    source: str


def instruction_prompt(instruction: str) -> str:
    """The prompt text of an instruction: stripped, then one space (LLM2Vec's
    ``_convert_to_str``)."""
    return instruction.strip() + " "


def load_instructions(name: str) -> Instructions:
    """The table ``name`` (one of :data:`BUILTIN`) or the YAML file at path ``name``; a bad
    file is one line naming it and the key."""
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
    types = data.get("query_only_types") or []
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise ConfigError(f"{path}: query_only_types must be a list of MTEB task types")
    return Instructions(table, tuple(types), str(data.get("source") or path))


def mteb_prompts(table: Instructions, task_types: Mapping[str, str]) -> dict[str, str]:
    """The prompts of ``table`` by MTEB's keys for the tasks of ``task_types`` (task name ->
    MTEB task type): ``<task>-query`` for the query-only types, ``<task>`` otherwise."""
    out: dict[str, str] = {}
    for task, kind in task_types.items():
        if task in table.instructions:
            key = f"{task}-query" if kind in table.query_only_types else task
            out[key] = instruction_prompt(table.instructions[task])
    return out


def sts_prompt(table: Instructions) -> str | None:
    """The prompt of cselab's STS tasks (STS12-16, STS-B, SICK-R): the table's STS-B
    instruction, or ``None`` if it has none."""
    text = table.instructions.get("STSBenchmark")
    return instruction_prompt(text) if text is not None else None
