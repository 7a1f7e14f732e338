"""Similarity search over a corpus: an index folder of memory-mapped vectors, searched exactly
or with FAISS (:mod:`.index`), and hard-negative mining over it (:mod:`.mine`)."""

from __future__ import annotations

from ..core.lazy import lazy_exports

#: each public name and its home module, imported on first use (no torch at ``import`` time)
_HOMES = {
    "Hit": ".index",
    "Index": ".index",
}
__getattr__, __dir__ = lazy_exports(__name__, globals(), _HOMES)


__all__ = ["Hit", "Index"]
