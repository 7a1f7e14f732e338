"""The approximate search of an index: FAISS (``flat``, HNSW, IVF) built over its vectors, and
:func:`vector_search`, the top-k search evaluation is handed (:mod:`.index`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.errors import IndexSettingError, SearchIndexError
from ..model.similarity import (  # exact_topk: the one exact search
    TopK,
    exact_topk,
)
from .layout import SEARCH_BACKENDS
from .settings import HNSW_DEFAULTS, IndexSettings, ann_params  # noqa: F401 - re-exported


# ------------------------------------------------------------------------------------- faiss
def _faiss() -> Any:
    try:
        import faiss
    except ImportError:
        raise SearchIndexError(
            "this backend needs FAISS: pip install 'cselab[faiss]' (faiss-cpu)"
        ) from None
    return faiss


def check_backend(backend: str) -> None:
    """Refuse a FAISS backend (``flat``, ``hnsw``, ``ivf``) when FAISS is not installed, before
    anything is encoded for it (:class:`SearchIndexError` naming the extra)."""
    if backend != "exact":
        _faiss()


def _ann_file(backend: str) -> str:
    return f"faiss-{backend}.index"


def build_faiss(vectors: np.ndarray, backend: str, params: dict[str, int], seed: int = 0) -> Any:
    """A FAISS inner-product index over ``vectors``: ``flat``, ``hnsw`` or ``ivf``.

    ``ivf`` trains its k-means cells on at most ``64 * nlist`` rows drawn with ``seed`` (FAISS
    asks for at least 39 per cell; more only slows the training on a large corpus).
    """
    faiss = _faiss()
    dim = int(vectors.shape[1])
    if backend == "flat":
        index = faiss.IndexFlatIP(dim)
    elif backend == "hnsw":
        index = faiss.IndexHNSWFlat(dim, params["m"], faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = params["ef_construction"]
    elif backend == "ivf":
        nlist = params["nlist"]
        if nlist > len(vectors):
            raise IndexSettingError(
                "nlist",
                nlist,
                "ivf: {setting} is more than the {n} vectors; pass a smaller one",
                n=len(vectors),
            )
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
        rng = np.random.default_rng(seed)
        rows = np.sort(rng.choice(len(vectors), min(len(vectors), 64 * nlist), replace=False))
        index.train(np.ascontiguousarray(vectors[rows], dtype=np.float32))
    else:
        raise SearchIndexError(f"unknown FAISS backend {backend!r}")
    for start in range(0, len(vectors), 1 << 17):  # add in blocks: the memory map stays a map
        index.add(np.ascontiguousarray(vectors[start : start + (1 << 17)], dtype=np.float32))
    _set_search_params(index, backend, params)
    return index


def _set_search_params(index: Any, backend: str, params: dict[str, int]) -> None:
    if backend == "hnsw" and params.get("ef_search"):
        index.hnsw.efSearch = int(params["ef_search"])
    if backend == "ivf" and params.get("nprobe"):
        index.nprobe = int(params["nprobe"])


def vector_search(settings: IndexSettings | None = None) -> TopK:
    """``(queries, vectors, k) -> (scores, rows)`` over unit vectors held in memory, best first,
    as :meth:`Index.search_vectors` searches an index: ``exact`` (:func:`exact_topk`) or a FAISS
    index built on the vectors of each call (``flat``, ``hnsw``, ``ivf``), by ``settings``'
    backend and FAISS settings (:meth:`IndexSettings.ann_params`; ``None``: the defaults, exact
    search). Retrieval evaluation takes it (``cselab evaluate --retrieval``). A place FAISS
    leaves empty has row ``-1`` and score ``-inf``.
    """
    settings = settings if settings is not None else IndexSettings()
    settings.validate(SEARCH_BACKENDS)
    backend = settings.backend
    if backend == "exact":
        return exact_topk

    def search(queries: np.ndarray, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        params = settings.ann_params(len(vectors))
        index = build_faiss(vectors, backend, params)
        q = np.ascontiguousarray(queries, dtype=np.float32)
        scores, rows = index.search(q, min(k, len(vectors)))
        return np.where(rows < 0, -np.inf, scores).astype(np.float32), rows.astype(np.int64)

    return search
