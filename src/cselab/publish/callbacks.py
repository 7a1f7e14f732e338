"""What leaves a training run, as training callbacks: the model card of every saved folder and
the upload of ``best/`` to the Hub (``train.push_to_hub``); and the card of a merged folder
(``cselab merge``).

:func:`cselab.app.train.build_trainer` adds them to every run; the trainer itself knows
nothing of cards or the Hub (it tells its callbacks when it writes a model folder and when it
ends).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..config import Config, load_config
from ..config.plan import RunPlan
from ..data.source import TrainingData
from ..io.readers import read_json
from ..io.runfolder import RunFolder
from ..objectives import Objective
from ..training.callbacks import Callback, SavedModel
from .card import write_model_card
from .folder_plan import run_plan_of
from .push import push_folder

log = logging.getLogger(__name__)


class ModelCardCallback(Callback):
    """Writes the model card (``README.md``) into every model folder the trainer saves.

    Args:
        config: the run's config.
        data: what the run trains on (file, kind, rows, SHA-256), from the data layer.
        plan: the run's resolved facts (:class:`~cselab.config.plan.RunPlan`), if known.
        objective: the run's built objective (its papers, tags and words), if known; else each
            card builds it again from the config.
    """

    name = "model card"

    def __init__(
        self,
        config: Config,
        data: TrainingData,
        plan: RunPlan | None = None,
        objective: Objective | None = None,
    ) -> None:
        self.config = config
        self.data = data
        self.plan = plan
        self.objective = objective

    def on_model_save(self, model: SavedModel) -> None:
        write_model_card(
            model.folder,
            self.config,
            data=self.data,
            results=model.results,
            metrics_csv=model.metrics,
            metrics_before=model.rows_before,
            selection_score=model.selection_score,
            step=model.step,
            model_id=model.model_id,
            plan=self.plan,
            objective=self.objective,
        )


def write_merged_card(folder: str | Path, model_id: str, source: str | Path) -> Path | None:
    """The model card of a folder ``cselab merge`` writes (``model_id``: where it will be) from
    the adapter folder ``source``: its run config (``cselab_config.yaml``, copied along) and,
    when ``source`` is a run's ``best/`` or ``last/``, the run's plan, ``results.json`` and
    dev-score curve, so the card says what ``train.save_merged``'s says. ``None`` when the
    adapters came without a config (a folder saved from Python): nothing to describe the
    training with."""
    config_file = Path(folder) / RunFolder.MODEL_CONFIG
    if not config_file.is_file():
        # named by where the folder will be, never the working copy it is written in
        log.info("%s: no %s beside the adapters, so no model card", model_id, config_file.name)
        return None
    config, source = load_config(config_file), Path(source)
    plan = run_plan_of(source, config)  # None unless source is this run's model folder
    run = RunFolder(source.resolve().parent)
    results = read_json(run.results) if plan is not None else None
    step = None
    if results is not None and source.name in (RunFolder.BEST, RunFolder.LAST):
        step = int(results["best_step" if source.name == RunFolder.BEST else "steps"])
    return write_model_card(
        folder, config, model_id=model_id, plan=plan, results=results, step=step,
        metrics_csv=run.metrics if plan is not None and run.metrics.is_file() else None,
    )  # fmt: skip


class PushCallback(Callback):
    """Uploads ``folder`` (the run's ``best/``) to the Hub repo ``repo_id`` when training ends."""

    name = "push to hub"

    def __init__(self, folder: str | Path, repo_id: str, deferred: bool = False) -> None:
        self.folder = Path(folder)
        self.repo_id = repo_id
        #: with ``deferred``, :meth:`on_end` only marks the run finished and :meth:`push`
        #: uploads, called by ``cselab.app.train.train`` once the process group is gone (an upload
        #: can outlast any collective timeout, and no rank should wait in one meanwhile)
        self.deferred = deferred
        self.finished = False

    def on_end(self, results: Mapping[str, Any]) -> None:
        self.finished = True
        if not self.deferred:
            self.push()

    def push(self) -> None:
        """Upload ``folder`` to ``repo_id``."""
        push_folder(self.folder, self.repo_id)
