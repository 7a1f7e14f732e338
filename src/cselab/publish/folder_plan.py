"""Which run plan describes a saved model folder: the plan of its own run, never another's.

A model folder (``best/``, ``last/``, ``merged/``) written by ``cselab train`` sits in its run
folder beside the run's ``plan.json`` (:class:`~cselab.config.plan.RunPlan`), which a card
written later (``cselab evaluate --update-card``) reads for the data kind and the dev set. A
folder may be moved or copied next to another run's plan, and a plan may come from another
cselab version: :func:`run_plan_of` takes the parent's plan only when it is the folder's run's
(its training file and ``objective`` section are those of the folder's ``cselab_config.yaml``),
and otherwise none, so the card describes the data from the folder's config.

:func:`card_plan` is the one place a card's facts are resolved: the run's plan, or for a folder
away from its run a plan of what the folder itself records (its pooler and LoRA targets in
``cselab.json``) and what its saved config asked (the dev set resolved here, once); the card
reads only the plan for them.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ..config import Config
from ..config.devset import resolve_dev_set
from ..config.plan import RunPlan, as_lora_targets
from ..core.datakind import DataKind
from ..core.errors import UserError
from ..io.readers import read_json
from ..io.runfolder import RunFolder
from ..model.hub import DOWNLOADS
from ..model.st_folder import CSELAB_FILE

log = logging.getLogger("cselab")


def trained_on(plan: RunPlan, train_file: str) -> bool:
    """Whether ``plan`` is of a run on ``train_file`` (a config's ``data.train_file``): the
    plan's absolute path is that path; for a relative one (resolved in the run's working
    directory, unknown here) it ends with it; for a download name (:data:`DOWNLOADS`) it is
    the file of that name."""
    planned = Path(plan.train_file)
    given = Path(os.path.normpath(Path(train_file).expanduser()))
    if given.is_absolute():
        return given == planned
    tail = tuple(part for part in given.parts if part != "..")  # normpath left only leading ones
    if planned.parts[-len(tail) :] == tail:
        return True
    return train_file in DOWNLOADS and planned.name == DOWNLOADS[train_file]


def run_plan_of(folder: Path, config: Config) -> RunPlan | None:
    """The plan of the run that saved the model folder ``folder`` (``best/``, ``last/``,
    ``merged/`` of a run folder): its parent's ``plan.json`` when that is the plan of this
    model's run, with ``config``'s (the folder's ``cselab_config.yaml``) training file
    (:func:`trained_on`) and ``objective`` section. ``None`` when there is none, or it is
    another run's (a model folder placed beside it) or cannot be read (another cselab
    version's layout): then the card describes the data from ``config``, and a plan that was
    there but not used is named in one warning."""
    path = RunFolder(folder.resolve().parent).plan
    try:
        plan = RunPlan.load(path.parent)
    except (UserError, OSError) as err:
        log.warning("%s is not used for the card of %s (%s)", path, folder, err)
        return None
    if plan is None:
        return None
    if not trained_on(plan, config.data.train_file) or plan.objective != config.objective:
        log.warning(
            "%s is not used for the card of %s: it is the plan of another run (trained on "
            "%s, not on this model's data.train_file %s, or with another objective section)",
            path, folder, plan.train_file, config.data.train_file,
        )  # fmt: skip
        return None
    return plan


def card_plan(
    folder: Path, config: Config, train_file: Path, kind: DataKind, plan: RunPlan | None = None
) -> RunPlan:
    """The facts a card of the model folder ``folder`` states: ``plan`` (the run's, handed
    over or :func:`run_plan_of`'s), completed from the folder's ``cselab.json`` where it left
    the pooler or the LoRA targets to the load (a plan of an older cselab), with the attention
    that file records; without one, the
    plan of what ``folder`` records and its saved ``config`` asked (``train_file`` and
    ``kind`` as the card's data section found them; device and precision as asked, which the
    run's ``results.json``, when there is one, overrides in the card)."""
    meta = read_json(folder / CSELAB_FILE) or {}
    lora = meta.get("lora") or {}
    if plan is None:
        ec, tc = config.eval, config.train
        plan = RunPlan(
            train_file=str(train_file), kind=kind,
            dev=resolve_dev_set(ec.dev, ec.dev_metric, ec.dev_columns), device=tc.device,
            precision=tc.precision, world_size=1, pooler=config.model.pooler, width=None,
            matryoshka_dims=tuple(config.objective.matryoshka.dims or ()),
            objective=config.objective,
        )  # fmt: skip
    pooler = plan.pooler or meta.get("pooler")
    if pooler is None:
        raise ValueError(f"{folder}: write_model_card needs the resolved model.pooler")
    targets = plan.lora_targets or as_lora_targets(lora.get("target_modules"))
    # the attention as the folder's load recorded it (a folder cselab saved: its cselab.json)
    bidirectional = bool(meta.get("bidirectional", False)) if meta else plan.bidirectional
    return plan.replace(pooler=pooler, lora_targets=targets, bidirectional=bidirectional)


__all__ = ["card_plan", "run_plan_of", "trained_on"]
