"""How a search index is built: :class:`IndexSettings`, the one home of every build setting and
its default, shared by :meth:`Index.build <cselab.search.index.Index.build>`, hard-negative
mining (:mod:`.mine`), retrieval evaluation's FAISS search (:func:`.ann.vector_search`) and the
command lines that call them (``cselab index build``, ``cselab mine``, ``cselab evaluate
--retrieval``), which read their defaults from here. No torch.

Errors name a setting by its keyword (``backend``, ``chunk_size``): a
:class:`~cselab.core.errors.SettingError`, which a command line shows with its own flag
(:func:`cselab.cli.options.setting_words`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..core.devices import AUTO
from ..core.errors import IndexSettingError, SettingError, check_count
from ..model.choices import BATCH_SIZE, POOLERS
from .layout import BUILD_BACKENDS, DEFAULT_CHUNK, SEARCH_BACKENDS

#: HNSW's settings where none is given: links per node, build depth and search depth (FAISS's own
#: search depth, 16, loses recall at k=10)
HNSW_DEFAULTS = {"m": 32, "ef_construction": 80, "ef_search": 64}


def ann_params(backend: str, n: int, **given: int | None) -> dict[str, int]:
    """Settings of a FAISS index over ``n`` vectors: those given, defaults for the rest.

    ``hnsw``: ``m`` 32 links per node, ``ef_construction`` 80, ``ef_search`` 64 (FAISS's own
    16 loses recall at k=10). ``ivf``: ``nlist`` about sqrt(N) cells and ``nprobe`` nlist/64
    (at least 8) cells visited per query.
    """
    if backend == "hnsw":
        defaults = HNSW_DEFAULTS
    elif backend == "ivf":
        nlist = given.get("nlist") or max(1, min(n, round(math.sqrt(n))))
        defaults = {"nlist": nlist, "nprobe": min(nlist, max(8, nlist // 64))}
    else:
        return {}
    return {key: int(given.get(key) or value) for key, value in defaults.items()}


@dataclass(frozen=True)
class IndexSettings:
    """The settings of building an index (every default is here, once).

    Attributes:
        backend: ``exact`` (no extra index: a matrix product over the memory-mapped vectors),
            ``hnsw`` or ``ivf`` (also a FAISS index; Malkov & Yashunin 2018, Jégou et al. 2011);
            a search also takes ``flat`` (FAISS, exact; mining and retrieval evaluation).
        chunk_size: how many lines are encoded at a time; ``None``: the default of the caller
            (:meth:`chunk`): a build records progress every :data:`DEFAULT_CHUNK` (8192) lines
            (an interrupted build resumes at the first chunk not recorded); mining encodes and
            searches :data:`~cselab.search.mine.MINE_CHUNK` (4096) anchors at a time.
        batch_size: sentences per encoder call.
        hnsw_m: HNSW links per node (``None``: 32).
        ef_construction: HNSW build depth (``None``: 80).
        nlist: IVF cells (``None``: about sqrt(N)).
        dim: store the first ``dim`` coordinates of each vector, re-normalised (a model trained
            with ``objective.matryoshka.dims``); queries are encoded at the same prefix.
        pooler: read a model opened by name with this pooler instead of its saved one.
        device: where a model opened by name runs (``auto``, the default: the GPU where there
            is one, else the CPU; ``None``: the CPU).
        compile_inference: a model opened by name encodes through a compiled graph
            (:meth:`SentenceEncoder.compile_inference
            <cselab.model.encoder.SentenceEncoder.compile_inference>`).
    """

    backend: str = "exact"
    chunk_size: int | None = None
    batch_size: int = BATCH_SIZE
    hnsw_m: int | None = None
    ef_construction: int | None = None
    nlist: int | None = None
    dim: int | None = None
    pooler: str | None = None
    device: str | None = AUTO
    compile_inference: bool = False

    def validate(
        self,
        backends: tuple[str, ...] = BUILD_BACKENDS,
        error: type[SettingError] = IndexSettingError,
    ) -> None:
        """Refuse a setting out of range, naming it (one line); ``backends``: the ones the
        caller can use (a build: :data:`BUILD_BACKENDS`; a search also ``flat``).

        Raises:
            IndexSettingError: the first setting that is refused (``error``: the caller's type).
        """
        if self.backend not in backends:
            raise error("backend", self.backend, "{setting} is unknown; choose one of {known}",
                        known=", ".join(backends))  # fmt: skip
        for name in ("chunk_size", "batch_size", "hnsw_m", "ef_construction", "nlist", "dim"):
            value = getattr(self, name)
            if value is not None:
                check_count(name, value, error)
        if self.pooler is not None and self.pooler not in POOLERS:
            raise error("pooler", self.pooler, "{setting} is unknown; choose one of {known}",
                        known=", ".join(POOLERS))  # fmt: skip

    def chunk(self, default: int = DEFAULT_CHUNK) -> int:
        """``chunk_size``, or the caller's ``default`` where it is not given (the one rule for
        every caller: a build's :data:`DEFAULT_CHUNK`, mining's ``MINE_CHUNK``)."""
        return int(self.chunk_size) if self.chunk_size is not None else default

    def ann_params(self, n: int) -> dict[str, int]:
        """The FAISS settings of this backend over ``n`` vectors (:func:`ann_params`: those set
        here, its defaults for the rest; ``{}`` for ``exact`` and ``flat``)."""
        return ann_params(
            self.backend, n, m=self.hnsw_m, ef_construction=self.ef_construction, nlist=self.nlist
        )

    def load(self, model: str) -> Any:
        """The encoder of a model folder or name, opened with these settings (pooler, device,
        compiled graph) by :func:`cselab.model.encoder.load`."""
        from ..model.encoder import load

        return load(
            str(model),
            pooler=self.pooler,
            device=self.device,
            compile_inference=self.compile_inference,
        )


__all__ = ["DEFAULT_CHUNK", "HNSW_DEFAULTS", "SEARCH_BACKENDS", "IndexSettings", "ann_params"]
