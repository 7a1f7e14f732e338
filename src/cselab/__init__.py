"""cselab: unsupervised contrastive learning of sentence embeddings.

The public face, a small set of names (each imported from its home on first use, so
``import cselab`` loads no torch):

* :func:`load` opens a model folder or Hub model as an encoder; :func:`train` runs a config;
  :func:`evaluate` runs evaluation tasks on an encoder (everything ``cselab evaluate`` runs);
* :class:`Index` is the search index; :func:`mine` mines hard negatives for pairs; their
  settings objects :class:`IndexSettings` and :class:`MineSettings`, and
  :class:`PairColumns` (which columns of a pairs file hold the anchor and the positive);
* the config types: :class:`Config` with its sections (:class:`ModelConfig`,
  :class:`DataConfig`, :class:`ObjectiveConfig`, :class:`TrainConfig`, :class:`EvalConfig`)
  and :func:`load_config` (YAML plus ``section.key=value`` overrides);
* :class:`Callback`, the hooks of a training run.

Deeper names stay where they live (``cselab.evaluation.tasks``, ``cselab.objectives``, ...);
``docs/api.md`` lists these and where to go next.
"""

from __future__ import annotations

from .core.lazy import lazy_exports
from .core.version import __version__


def load(path: str, pooler: str | None = None, **kwargs):
    """Open a cselab output folder, a sentence-transformers folder or an HF model as an encoder.

    Keyword arguments go to :func:`cselab.model.loader.load`, e.g. ``device="cuda:0"`` or
    ``fast_path=False`` (the backbone exactly as ``transformers`` loads it, without cselab's
    CPU fast path).
    """
    from .model.encoder import load as _load

    return _load(path, pooler=pooler, **kwargs)


def train(config, callbacks=None):
    """Train with a :class:`cselab.config.Config` (or a path to a YAML file); returns results.

    ``callbacks``: optional :class:`cselab.training.callbacks.Callback` objects (see that module).
    The run's log (steps, evaluations, saves) goes to stderr unless logging is configured
    (:func:`cselab.core.logs.stderr_log_unless_configured`).
    """
    from .app.train import train as _train
    from .core.logs import stderr_log_unless_configured

    with stderr_log_unless_configured():
        return _train(config, callbacks or ())


#: the other public names and their homes (imported on first use)
_HOMES = {
    "Index": ".search.index",
    "IndexSettings": ".search.settings",
    "MineSettings": ".search.mine",
    "PairColumns": ".data.config",
    "evaluate": ".evaluation.api",
    "mine": ".search.mine:mine_hard_negatives",
    "Callback": ".training.callbacks",
    "Config": ".config",
    "ModelConfig": ".config",
    "DataConfig": ".config",
    "ObjectiveConfig": ".config",
    "TrainConfig": ".config",
    "EvalConfig": ".config",
    "load_config": ".config",
}
__getattr__, __dir__ = lazy_exports(__name__, globals(), _HOMES)

__all__ = [
    "Callback",
    "Config",
    "DataConfig",
    "EvalConfig",
    "Index",
    "IndexSettings",
    "MineSettings",
    "ModelConfig",
    "PairColumns",
    "ObjectiveConfig",
    "TrainConfig",
    "__version__",
    "evaluate",
    "load",
    "load_config",
    "mine",
    "train",
]
