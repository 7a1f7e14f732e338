"""cselab: unsupervised contrastive learning of sentence embeddings."""

from __future__ import annotations

from .core.version import __version__


def load(path: str, pooler: str | None = None, **kwargs):
    """Open a cselab output folder, a sentence-transformers folder or an HF model as an encoder.

    Keyword arguments go to :func:`cselab.model.loader.load`, e.g. ``device="cuda"`` or
    ``fast_path=False`` (the backbone exactly as ``transformers`` loads it, without cselab's
    CPU fast path).
    """
    from .model.encoder import load as _load

    return _load(path, pooler=pooler, **kwargs)


def train(config, callbacks=None):
    """Train with a :class:`cselab.config.Config` (or a path to a YAML file); returns results.

    ``callbacks``: optional :class:`cselab.training.callbacks.Callback` objects (see that module).
    """
    from .training.run import train as _train

    return _train(config, callbacks or ())


def __getattr__(name: str):  # noqa: ANN202 - lazy: `cselab.Index` without importing numpy early
    if name == "Index":
        from .search.index import Index

        return Index
    raise AttributeError(f"module 'cselab' has no attribute {name!r}")


__all__ = ["Index", "__version__", "load", "train"]
