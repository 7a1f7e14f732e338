"""Training callbacks, and the experiment loggers of ``train.report_to`` built on them.

A :class:`Callback` is told what the trainer did, with the numbers it logged:

- ``on_step(step, metrics)``: every logged row (each ``train.log_steps`` steps, and at evaluation
  and save steps): ``lr``, ``loss``, each loss term, ``sentences_per_s``, ``epoch``;
- ``on_evaluate(step, metrics)``: each evaluation, including step 0 before training: the dev
  score under its name (``stsb_dev``, ``stsb_dev_pearson``, ``dev_spearman``, ``dev_pearson``:
  :func:`cselab.evaluation.custom.dev_score_name`), and ``align``/``uniform`` when the evaluator
  reports them;
- ``on_save(step, path)``: a resumable checkpoint was written to ``path``;
- ``on_model_save(model)``: a model folder (``best/``, ``last/``) is being written; add files
  to ``model.folder`` (the model card: :class:`cselab.publish.callbacks.ModelCardCallback`). At
  the end of training it is called once more for ``best/`` and ``last/`` with the run's results;
- ``on_end(results)``: training finished; ``results`` is what ``results.json`` holds (the Hub
  upload of ``train.push_to_hub`` is :class:`cselab.publish.callbacks.PushCallback`). A resume
  of a run that had finished trains nothing and calls no callback.

Callbacks run on the main process only. The loggers (TensorBoard, Weights & Biases, MLflow) are
callbacks whose failures do not stop training: the first error of a logger is logged once as a
warning naming it, and that logger is switched off for the rest of the run. A user callback's
error propagates (it may be meant to stop training).

Example::

    class PrintDev(Callback):
        def on_evaluate(self, step, metrics):
            print(step, metrics["stsb_dev"])

    cselab.train("config.yaml", callbacks=[PrintDev()])
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..evaluation.custom import EVAL_COLUMNS
from ..io.runfolder import RunFolder

log = logging.getLogger("cselab")


def split_row(row: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A metrics row as ``(training metrics, evaluation metrics)`` (``step`` in neither)."""
    train = {k: v for k, v in row.items() if k != "step" and k not in EVAL_COLUMNS}
    return train, {k: row[k] for k in EVAL_COLUMNS if k in row}


@dataclass(frozen=True)
class SavedModel:
    """A model folder the trainer writes, as :meth:`Callback.on_model_save` is told of it.

    Attributes:
        folder: where to add files: the folder being written (published when the hooks
            return), or at the end of training the published ``best/`` or ``last/``.
        step: the training step of the model.
        metrics: the run's ``metrics.csv`` (the dev scores so far).
        selection_score: the model-selection score of the model when it was just found the
            best; ``None``: look it up at ``step`` in ``metrics``.
        model_id: the folder's final path while training; ``None`` at the end (the card then
            names the Hub repo of ``train.push_to_hub`` when there is one).
        results: ``results.json`` at the end of training, else ``None``.
        rows_before: a ``best/`` written while training goes on: ``metrics`` is read only up
            to the rows of earlier steps, which the run had finished writing when the model was
            copied (its own row is written after its evaluation, and later rows while the
            folder is written); ``None``: every row.
    """

    folder: Path
    step: int
    metrics: Path
    selection_score: float | None = None
    model_id: str | None = None
    results: Mapping[str, Any] | None = None
    rows_before: int | None = None


class Callback:
    """Base class: override the hooks you need (each does nothing by default)."""

    #: how warnings name this callback
    name: str = "callback"
    #: errors are warned about once and the callback switched off (loggers), not raised
    soft_fail: bool = False

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
        """A training row was logged at ``step``."""

    def on_evaluate(self, step: int, metrics: Mapping[str, float]) -> None:
        """The model was evaluated at ``step`` (0: before training)."""

    def on_save(self, step: int, path: Path) -> None:
        """A resumable checkpoint of ``step`` was written to ``path``."""

    def on_model_save(self, model: SavedModel) -> None:
        """A model folder is being written (or, at the end, completed with the results): files
        added to ``model.path`` are published with it. For ``best/`` during training this runs
        on the checkpoint writer's thread, while the next steps train (the step waits only for
        a host copy of the model), so a callback that shares state with the other hooks must
        guard it; at the end, and for every other folder, it runs on the training thread."""

    def on_finish(self, step: int) -> Mapping[str, Any] | None:
        """The loop ended at ``step`` and ``best/`` and ``last/`` are written (rank 0, before
        ``results.json``): return entries to add to the results (e.g. scores of the selected
        model), or ``None``."""
        return None

    def on_end(self, results: Mapping[str, Any]) -> None:
        """Training finished with ``results`` (the content of ``results.json``)."""


class CallbackList:
    """Calls each hook on every callback in order; loggers that fail are warned about once."""

    def __init__(self, callbacks: Iterable[Callback] = ()) -> None:
        self.callbacks = list(callbacks)
        self.failed: set[int] = set()

    def _call(self, hook: str, *args: Any) -> None:
        for i, cb in enumerate(self.callbacks):
            if i in self.failed:
                continue
            try:
                getattr(cb, hook)(*args)
            except Exception as err:
                if not cb.soft_fail:
                    raise
                self.failed.add(i)
                log.warning(
                    "logger '%s' failed in %s (%s: %s); it is switched off for the rest of this run",
                    cb.name, hook, type(err).__name__, err,
                )  # fmt: skip

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
        self._call("on_step", step, metrics)

    def on_evaluate(self, step: int, metrics: Mapping[str, float]) -> None:
        self._call("on_evaluate", step, metrics)

    def on_save(self, step: int, path: Path) -> None:
        self._call("on_save", step, path)

    def on_model_save(self, model: SavedModel) -> None:
        self._call("on_model_save", model)

    def on_finish(self, step: int) -> dict[str, Any]:
        """Every callback's entries of the results, in order (see :meth:`Callback.on_finish`)."""
        extra: dict[str, Any] = {}
        for cb in self.callbacks:
            extra.update(cb.on_finish(step) or {})
        return extra

    def on_end(self, results: Mapping[str, Any]) -> None:
        self._call("on_end", results)


def _numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in metrics.items()
        if k != "step" and isinstance(v, int | float) and not isinstance(v, bool)
    }


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"train": {"lr": 3e-5}}`` -> ``{"train.lr": 3e-5}`` (for loggers' flat parameters)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


class Logger(Callback):
    """A callback that sends scalars somewhere; started lazily on its first hook, so that
    building a trainer does not create an experiment run."""

    soft_fail = True

    def __init__(self, output_dir: str | os.PathLike[str], config: Mapping[str, Any]) -> None:
        self.output_dir = Path(output_dir)
        self.config = dict(config)
        self._started = False

    def start(self) -> None:
        """Open the run (imports the library: a missing package fails here, by name)."""

    def log_scalars(self, step: int, values: dict[str, float]) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        """Flush and close."""

    def _ensure_started(self) -> None:
        if not self._started:
            self._started = True
            try:
                self.start()
            except ImportError as err:
                raise ImportError(
                    f"{err.name or self.name} is not installed (pip install 'cselab[{self.name}]')"
                ) from err

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
        self._ensure_started()
        self.log_scalars(step, _numbers(metrics))

    def on_evaluate(self, step: int, metrics: Mapping[str, float]) -> None:
        self._ensure_started()
        self.log_scalars(step, _numbers(metrics))

    def on_end(self, results: Mapping[str, Any]) -> None:
        if self._started:
            self.finish()


class TensorBoardLogger(Logger):
    """Scalars under ``output_dir/tensorboard`` (``torch.utils.tensorboard``)."""

    name = "tensorboard"

    def start(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(RunFolder(self.output_dir).tensorboard))

    def log_scalars(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def finish(self) -> None:
        self.writer.close()


class WandbLogger(Logger):
    """A Weights & Biases run (project ``$WANDB_PROJECT`` or ``cselab``, named after the output
    folder, files under it; ``WANDB_MODE=offline`` works without an account)."""

    name = "wandb"

    def start(self) -> None:
        import wandb

        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "cselab"),
            name=self.output_dir.name,
            dir=str(self.output_dir),
            config=self.config,
            reinit=True,
        )

    def log_scalars(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def finish(self) -> None:
        self.run.finish()


class MLflowLogger(Logger):
    """An MLflow run in ``$MLFLOW_TRACKING_URI`` or else a local file store,
    ``output_dir/mlruns`` (experiment ``$MLFLOW_EXPERIMENT_NAME`` or ``cselab``; view it with
    ``mlflow ui --backend-store-uri output_dir/mlruns``)."""

    name = "mlflow"

    def start(self) -> None:
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            uri = (self.output_dir / "mlruns").resolve().as_uri()
            # MLflow >= 3.? refuses the file store (in "maintenance mode") unless this is set; it
            # is the store that needs no server or database, which is what this default is for
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "cselab")
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = (
            experiment.experiment_id if experiment else self.client.create_experiment(name)
        )
        self.run_id = self.client.create_run(
            experiment_id, run_name=self.output_dir.name
        ).info.run_id
        # MLflow caps parameter values at a few thousand characters; config values are short
        for key, value in flatten(self.config).items():
            self.client.log_param(self.run_id, key, str(value))

    def log_scalars(self, step: int, values: dict[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(mlflow_name(k), v, now, step) for k, v in values.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def finish(self) -> None:
        self.client.set_terminated(self.run_id)


def mlflow_name(key: str) -> str:
    """``key`` as MLflow accepts a metric name (letters, digits and ``_ - . / :`` and spaces):
    the retrieval dev scores carry ``@`` (``dev_ndcg@10`` is logged as ``dev_ndcg_at_10``)."""
    return re.sub(r"[^\w./\- :]", "_", key.replace("@", "_at_"))


#: ``train.report_to`` names -> loggers (the names are :data:`cselab.config.ReportTo`).
LOGGERS: dict[str, type[Logger]] = {
    "tensorboard": TensorBoardLogger,
    "wandb": WandbLogger,
    "mlflow": MLflowLogger,
}


#: The loggers of ``train.report_to: null`` (the default), where their package is installed:
#: the ones that need no account or server.
DEFAULT_LOGGERS = ("tensorboard",)


def installed_loggers() -> list[str]:
    """The :data:`DEFAULT_LOGGERS` whose package can be imported (a plain install has none)."""
    import importlib.util

    return [name for name in DEFAULT_LOGGERS if importlib.util.find_spec(name) is not None]


def report_callbacks(
    report_to: Sequence[str] | None, output_dir: str | os.PathLike[str], config: Mapping[str, Any]
) -> list[Callback]:
    """The loggers named in ``train.report_to``, in that order (each at most once); ``None``:
    those of :func:`installed_loggers`, so that a plain install logs without a warning."""
    names = installed_loggers() if report_to is None else report_to
    return [LOGGERS[n](output_dir, config) for n in dict.fromkeys(names)]
