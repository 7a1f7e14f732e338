"""Similarity search over a corpus: an index folder of memory-mapped vectors, searched exactly
or with FAISS (:mod:`.index`)."""

from .index import Hit, Index

__all__ = ["Hit", "Index"]
