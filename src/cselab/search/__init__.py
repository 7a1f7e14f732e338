"""Similarity search over a corpus: an index folder of memory-mapped vectors, searched exactly
or with FAISS (:mod:`.index`), and hard-negative mining over it (:mod:`.mine`)."""

from .index import Hit, Index

__all__ = ["Hit", "Index"]
