"""Model selection: a dev score every ``train.eval_steps`` steps, and the best model kept.

SimCSE selects the checkpoint with the best STS-B dev Spearman (``load_best_model_at_end``); so does
cselab by default (:func:`make_dev_evaluator`). :class:`ModelSelection` remembers the score before
training, the best score and its step, saves ``best/`` whenever the score improves, and travels in
the checkpoint so that a resumed run keeps all three.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..config import EvalConfig
from ..config.devset import STSB, DevSet
from ..core.metrics import dev_score_name
from ..evaluation.custom import DevEvaluator
from ..model.choices import BATCH_SIZE
from ..model.encoder import SentenceEncoder
from .distributed import barrier

log = logging.getLogger("cselab")

#: an evaluator of model selection: ``encoder -> score or {name: score, ...}``, with its
#: ``name`` and ``source`` (the resolved dev set's)
Evaluator = DevEvaluator


def make_dev_evaluator(ec: EvalConfig, eval_steps: int, dev: DevSet | None) -> Evaluator | None:
    """The score of the run's dev set ``dev`` ×100 (cosine, no training) for model selection,
    or ``None`` (no evaluation: ``eval.enabled`` off, ``eval.dev: none`` or
    ``train.eval_steps`` 0). ``dev`` is the run plan's, resolved once
    (:func:`~cselab.config.devset.resolve_dev_set`; ``None`` for none).

    A dev file is read and validated here whatever the cadence (also with ``train.eval_steps``
    0), so a bad or missing one fails before training starts, never silently.
    """
    if not ec.enabled or dev is None:
        return None
    evaluator = DevEvaluator(dev, ec.data_dir)  # encoded as the plan says: encode_with
    return evaluator if eval_steps else None


class ModelSelection:
    """Tracks the dev score; saves the best model through ``save_best``.

    Args:
        evaluator: ``encoder -> score`` (higher is better), or ``encoder -> {name: score, ...}``
            with more numbers of the same encoding (STS-B dev: ``align``, ``uniform``); run on
            rank 0 only; ``None``: no selection (the last model is the best one known).
        save_best: writes the current model as ``best/`` (rank 0).
        is_main: whether this process is rank 0.
    """

    def __init__(
        self,
        evaluator: Evaluator | Callable[[SentenceEncoder], Any] | None,
        save_best: Callable[[], Path],
        is_main: bool = True,
    ) -> None:
        self.evaluator = evaluator
        self.save_best = save_best
        self.is_main = is_main
        self.initial_score: float | None = None
        self.best_score = -math.inf
        self.best_step = -1
        #: every evaluation's numbers, ``{"step": s, name: score, ...}`` (results.json)
        self.history: list[dict[str, float]] = []

    @property
    def evaluator(self) -> DevEvaluator | None:
        """The dev score; a plain ``encoder -> score`` function set here is wrapped
        (:meth:`~cselab.evaluation.custom.DevEvaluator.from_function`)."""
        return self._evaluator

    @evaluator.setter
    def evaluator(self, value: Callable[[SentenceEncoder], Any] | None) -> None:
        if value is not None and not isinstance(value, DevEvaluator):
            value = DevEvaluator.from_function(value)
        self._evaluator = value

    @property
    def enabled(self) -> bool:
        return self.evaluator is not None

    @property
    def name(self) -> str:
        """The score's name in ``metrics.csv`` and ``results.json`` (``stsb_dev``, ``dev_spearman``,
        ...; see :func:`cselab.evaluation.custom.dev_evaluator`)."""
        return self.evaluator.name if self.evaluator is not None else dev_score_name(STSB)

    @property
    def source(self) -> str | None:
        return self.evaluator.source if self.evaluator is not None else None

    def evaluate(self, encoder: SentenceEncoder, step: int) -> dict[str, float]:
        """Collective: score the model (rank 0), keep it if it is the best so far; returns the
        evaluation's numbers (the score under :attr:`name`), empty on the other ranks."""
        if self.evaluator is None or not self.is_main:
            barrier()
            return {}
        out = self.evaluator(encoder)
        numbers = {k: float(v) for k, v in out.items()} if isinstance(out, Mapping) else {}
        numbers[self.name] = score = float(out[self.name] if isinstance(out, Mapping) else out)
        self.history.append({"step": step, **numbers})
        if step == 0:
            self.initial_score = score
        if score > self.best_score:
            before = self.best_score, self.best_step
            self.best_score, self.best_step = score, step  # save_best's card reads them
            try:
                self.save_best()
            except BaseException:  # an earlier write's failure: this step was never saved
                self.best_score, self.best_step = before
                raise
        barrier()
        return numbers

    def at_dimensions(
        self, encoder: SentenceEncoder, dims: Sequence[int], batch_size: int = BATCH_SIZE
    ) -> list[dict[str, float]]:
        """The dev score of ``encoder`` at each Matryoshka prefix dimension (Kusupati et al.
        2022), widest first, and at the full width: ``[{"dim": d, name: score}, ...]``, each
        the evaluator on the re-normalised prefix
        (:func:`~cselab.evaluation.embed.at_dimension`). The dev texts are encoded once, at the
        full width (:class:`~cselab.evaluation.embed.EmbeddingCache`), and each dimension scores
        a prefix of those vectors; each score is logged as it comes. Rank 0 only; ``[]`` without
        an evaluator. Nothing here changes the selection."""
        if self.evaluator is None or not self.is_main:
            return []
        from ..evaluation.embed import EmbeddingCache, at_dimension

        cache = EmbeddingCache(encoder, batch_size)
        widths = sorted({*dims, encoder.dim}, reverse=True)
        log.info(
            "scoring the selected model on %s at dimensions %s (the texts encoded once)",
            self.name, ", ".join(map(str, widths)),
        )  # fmt: skip
        rows = []
        for i, dim in enumerate(widths, 1):
            t0 = time.perf_counter()
            view = cache.embed if dim == encoder.dim else at_dimension(cache.embed, dim)
            out = self.evaluator(view)  # type: ignore[arg-type]
            score = float(out[self.name] if isinstance(out, Mapping) else out)
            rows.append({"dim": dim, self.name: score})
            log.info(
                "dimension %d (%d/%d): %s=%.2f (%.1f s)",
                dim, i, len(widths), self.name, score, time.perf_counter() - t0,
            )  # fmt: skip
        return rows

    def state_dict(self) -> dict[str, Any]:
        return {
            "initial_score": self.initial_score,
            "best_score": self.best_score if math.isfinite(self.best_score) else None,
            "best_step": self.best_step,
            "history": self.history,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.initial_score = state.get("initial_score")
        best = state.get("best_score")
        self.best_score = best if best is not None else -math.inf
        self.best_step = int(state.get("best_step", -1))
        self.history = list(state.get("history", []))
