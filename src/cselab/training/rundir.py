"""The output folder of a run: never replace a run by accident, never resume a different one.

Before anything is written, and with the folder's lock held (:meth:`RunFolder.lock
<cselab.io.runfolder.RunFolder.lock>`, taken by :func:`cselab.app.train.train`, so no other
process can start a run there between the check and the run), :func:`prepare_output_dir` looks
at ``train.output_dir``:

* it holds a previous run and neither ``train.resume`` nor ``train.overwrite`` is set: refused,
  naming the folder and both ways out. A folder holds a run only once training started
  (:func:`trained`): what a start that never took a step left behind (its ``config.yaml`` and
  ``plan.json``, the step-0 evaluation in ``metrics.csv`` and ``best/``, the logger's folder)
  is removed, so the corrected command simply runs;
* ``train.overwrite``: the previous run's files are removed (nothing of the old run is kept);
* ``train.resume`` in a folder that holds a run but no checkpoint: refused (starting over
  would replace the run that was to be continued);
* ``train.resume`` and a checkpoint exists: the checkpoint's config is compared with this one.
  A difference in a key that changes the run (the model, the data file and its content, the
  objective, the batch, the learning rate and schedule, the seed, the precision, ...) is refused,
  naming each key with both values; keys that only change bookkeeping (:data:`RESUMABLE_KEYS`:
  evaluation and save cadence, logging, paths, device) are allowed and reported. A checkpoint
  that cannot be read, or is not a cselab checkpoint of this format, is refused, naming it
  (:func:`~cselab.training.checkpoint.read_metadata`).

A resume whose checkpoint is at the run's last step in a folder that holds ``results.json`` is
of a run that already finished (a retry loop, a scheduler that reruns a job that had ended):
:func:`finished_results` gives the first run's results, and :func:`cselab.app.train.train`
returns them before the model is loaded (a trainer built by hand, after), without writing
anything (``results.json`` with its times, ``config.yaml``, ``plan.json``, the models
and their cards stay byte for byte). A run stopped after its last checkpoint but before its
``results.json`` is not finished: its resume writes the end of the run. A finished run cannot be
made longer by a resume: ``train.max_steps`` and ``train.epochs`` are not :data:`RESUMABLE_KEYS`
(the learning-rate schedule spans the run's steps, so every step would change).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ..core.errors import DataFormatError, UserError
from ..core.schema import ConfigError, drop_removed
from ..io.readers import read_json
from ..io.runfolder import RunFolder
from .checkpoint import read_metadata
from .metrics import read_metrics

log = logging.getLogger("cselab")

#: Keys that may differ between an interrupted run and its resumption: they change what is
#: logged, evaluated or where files go, never the weights of a step. Any other key (including
#: keys added later) must match.
RESUMABLE_KEYS = frozenset(
    {
        "data.cache_dir",
        "train.output_dir",
        "train.eval_steps",
        "train.save_steps",
        "train.save_minutes",
        "train.dist_timeout_s",
        "train.log_steps",
        "train.resume",
        "train.overwrite",
        "train.device",
        "train.compile",
        "train.compile_mode",
        "train.cache_chunk_size",  # GradCache gives the full batch's gradients
        "train.report_to",
        "train.push_to_hub",
        "train.save_merged",  # what is written at the end, not how the run trains
        "eval.data_dir",
        "eval.batch_size",
        "eval.enabled",
    }
)

#: Resumable keys that say how a run is started, not what it trains: a resume differs in them
#: by its nature (``train.resume`` on, ``train.overwrite`` off), so they are never reported
STARTING_KEYS = frozenset({"train.resume", "train.overwrite"})

#: keys whose "resolve it" value (``null``, ``auto``) the run resolves, each with that value: on
#: resume it takes the checkpoint's config value before the run resolves anything
#: (:func:`adopt_resolved_on_load`), so a default that differs from what the run trained with
#: never replaces it: ``model.pooler=last`` on a decoder whose default is ``avg``, or
#: ``train.precision: fp32``, the default of runs saved before ``auto`` became it
RESOLVED_ON_LOAD: dict[str, Any] = {
    "model.pooler": None,
    "model.bidirectional": None,
    "train.precision": "auto",
    # none named: the model is saved with data.prompts' (cselab.app.train.saved_prompts)
    "model.prompts": {},
    "model.default_prompt_name": None,
}

#: Not a config key: the SHA-256 of the training file, compared with the config.
DATA_DIGEST_KEY = "data.train_file (content sha256)"


#: What a run writes before its first training step: the config and its plan, the step-0
#: evaluation (its metrics row and the untrained model kept as ``best/``) and the loggers' files.
BEFORE_FIRST_STEP = frozenset(
    {RunFolder.CONFIG, RunFolder.PLAN, RunFolder.METRICS, RunFolder.BEST, RunFolder.TENSORBOARD}
)


def trained(run: RunFolder, found: list[str]) -> bool:
    """Whether the run files ``found`` in ``run`` are those of a run that took a training step:
    a checkpoint, ``last/`` or ``results.json``, or a ``metrics.csv`` row past step 0. Anything
    that cannot be told (``best/`` without ``metrics.csv``, an unreadable ``metrics.csv``)
    counts as a run, so nothing of one is ever removed unasked."""
    if set(found) - BEFORE_FIRST_STEP:
        return True
    if RunFolder.METRICS not in found:
        return RunFolder.BEST in found
    try:
        rows = read_metrics(run.metrics).rows
    except (UserError, OSError):
        return True
    return any(row["step"] > 0 for row in rows)


def started_here(run: RunFolder) -> bool:
    """Whether a cselab run started in ``run``: every start writes its ``plan.json`` (a
    :class:`~cselab.config.plan.RunPlan`) with ``config.yaml`` before anything else, so files
    without one (a user's ``config.yaml`` or ``tensorboard/`` in the folder) are no run's, and
    a start's own removal never takes them."""
    from ..config.plan import RunPlan

    try:
        return RunPlan.load(run.path) is not None
    except (UserError, OSError):
        return False


def _remove(folder: Path, names: list[str]) -> None:
    for name in names:
        path = folder / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def prepare_output_dir(
    folder: Path,
    config: Mapping[str, Any],
    data_digest: Callable[[], str | None],
    resume: bool,
    overwrite: bool,
) -> None:
    """Check ``folder`` before a run starts (see the module doc); raises :class:`ConfigError`.
    ``data_digest()`` (the training file's SHA-256) is computed only when a run is resumed."""
    run = RunFolder(folder)
    found = run.previous_run()
    checkpoint = run.checkpoint_file
    if resume and checkpoint.is_file():
        extra = read_metadata(checkpoint)["extra"]
        saved = {**extra["config"], DATA_DIGEST_KEY: extra.get("data_digest")}
        current = {**config, DATA_DIGEST_KEY: data_digest()}
        for change in check_resumable(saved, current, checkpoint):
            log.info("resuming with a changed setting: %s", change)
        return
    if not found:
        return
    ran = trained(run, found)
    if not ran and started_here(run):
        _remove(folder, found)
        log.info(
            "%s: removed what a start that ran no training step left (%s)", folder, ", ".join(found)
        )
        return
    if not ran and not overwrite:  # files of a run's names that no run wrote: the user's
        raise ConfigError(
            f"train.output_dir={folder} holds {', '.join(found)}, which a run writes but no "
            "cselab run wrote there (no readable plan.json of one); choose another train.output_dir, or replace "
            "them with --train.overwrite=true"
        )
    if resume:  # starting over would replace the run a resume was asked to continue
        raise ConfigError(
            f"train.resume: {folder} holds a run ({', '.join(found)}) but no checkpoint "
            f"({checkpoint}) to continue it from; replace the run with --train.overwrite=true "
            "(without --train.resume), or start a new one in another train.output_dir"
        )
    if not overwrite:
        raise ConfigError(
            f"train.output_dir={folder} already holds a run ({', '.join(found)}); continue it "
            "with --train.resume=true, or replace it with --train.overwrite=true"
        )
    _remove(folder, found)
    log.info("train.overwrite: removed the previous run in %s (%s)", folder, ", ".join(found))


def finished_results(
    folder: Path, step: int | None = None, total_steps: int | None = None
) -> dict[str, Any] | None:
    """The results of the finished run in ``folder`` that a resume at ``step`` of a run of
    ``total_steps`` steps would only repeat (see the module doc): its ``results.json``, or
    ``None`` when there are steps left or the run never wrote it. Without ``step``, the step
    of the folder's checkpoint; without ``total_steps``, the steps ``results.json`` names (it
    is written once, at the run's end): so :func:`cselab.app.train.train` knows before the
    model is loaded. An unreadable ``results.json`` raises
    :class:`~cselab.core.errors.UserError` naming it and saying how to write the end again."""
    run = RunFolder(folder)
    if step is None:
        if not run.checkpoint_file.is_file():
            return None
        step = int(read_metadata(run.checkpoint_file)["step"])
    if total_steps is not None and step < total_steps:
        return None
    try:
        results = read_json(run.results)
    except DataFormatError as err:
        raise UserError(f"{err}; remove it and resume again to write the run's end") from None
    if results is None or step < int(results.get("steps", step + 1)):
        return None
    return results


def say_finished(folder: Path, step: int, push_to_hub: str | None, save_merged: bool) -> None:
    """Log that the run in ``folder`` had finished at ``step``, in one line, and the command
    for each end a finished run does not run again (``push_to_hub``'s upload, ``save_merged``'s
    merge when ``merged/`` is missing)."""
    log.info("%s: run already finished at step %d; nothing to do", folder, step)
    run, wanted = RunFolder(folder), []
    if push_to_hub:
        wanted.append(f"cselab push {run.path / RunFolder.BEST} {push_to_hub}")
    if save_merged and not run.merged.exists():
        wanted.append(f"cselab merge {run.path} -o {run.merged}")
    for command in wanted:
        log.warning("a finished run does not run its end again; for that: %s", command)


def adopt_resolved_on_load(config: Any, folder: Path) -> dict[str, Any]:
    """On resume: set each :data:`RESOLVED_ON_LOAD` key that holds its "resolve it" value in
    ``config`` (a :class:`~cselab.config.Config`, changed in place) to the value in ``folder``'s
    checkpoint, what the interrupted run trained with; returns the keys set. Nothing without a
    checkpoint.
    An explicit value is left as it is (a different one is refused by :func:`check_resumable`).
    Raises :class:`ConfigError` naming a checkpoint that cannot be read."""
    checkpoint = RunFolder(folder).checkpoint_file
    if not checkpoint.is_file():
        return {}
    saved = saved_settings(read_metadata(checkpoint)["extra"]["config"])
    adopted = {}
    for key, unresolved in RESOLVED_ON_LOAD.items():
        *path, name = key.split(".")
        section = config
        for part in path:
            section = getattr(section, part)
        if getattr(section, name) == unresolved and saved.get(key, unresolved) != unresolved:
            setattr(section, name, saved[key])
            adopted[key] = saved[key]
            log.info("train.resume: %s is %r, as in the checkpoint's run", key, saved[key])
    return adopted


def _flatten(data: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in data.items():
        full = f"{prefix}.{key}" if prefix else key
        if isinstance(value, Mapping):
            yield from _flatten(value, full)
        else:
            yield full, value


def saved_settings(data: Mapping[str, Any]) -> dict[str, Any]:
    """A saved config (``config.yaml``, a checkpoint's) flattened to ``key -> value`` as this
    cselab compares it: the keys a section has dropped, at their last default, left out
    (:func:`~cselab.core.schema.drop_removed`), so a run saved by an earlier version resumes
    and pools with today's."""
    from ..config import Config

    return dict(_flatten(drop_removed(Config, dict(data))))


def check_resumable(
    saved: Mapping[str, Any], current: Mapping[str, Any], checkpoint: Path
) -> list[str]:
    """Compare the checkpoint's config with this run's (flattened ``key -> value`` plus
    :data:`DATA_DIGEST_KEY`; a :data:`RESOLVED_ON_LOAD` key's "resolve it" value is the
    checkpoint's value, as :func:`adopt_resolved_on_load` makes it before the run resolves it).
    Raises :class:`ConfigError` naming every run-changing key that differs; returns
    ``key: old -> new`` for the allowed differences."""
    old, new = saved_settings(saved), dict(_flatten(current))
    for key, unresolved in RESOLVED_ON_LOAD.items():  # "resolve it": as the checkpoint's run
        if new.get(key) == unresolved and key in old:
            new[key] = old[key]
    differing = sorted(
        k for k in (old.keys() | new.keys()) - STARTING_KEYS if old.get(k) != new.get(k)
    )
    fatal = [k for k in differing if k not in RESUMABLE_KEYS]
    describe = [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in differing]
    if fatal:
        details = "; ".join(d for k, d in zip(differing, describe, strict=True) if k in fatal)
        raise ConfigError(
            f"cannot resume {checkpoint}: it was trained with a different run configuration "
            f"({details}); use the original values, or start a new run in another "
            "train.output_dir (or with --train.overwrite=true)"
        )
    return describe
