"""ESimCSE (Wu et al., COLING 2022): word repetition for the positive, a momentum queue of negatives.

The paper changes unsupervised SimCSE in two independent places, and cselab has one part for
each (each switched on by its own config section, each composing with every other part):

1. **Word repetition** (Sec. 3.1; ``objective.word_repetition``). The positive of sentence ``i``
   is the sentence with a few tokens written twice, so the two sides of a positive pair differ in
   length. It happens on token ids, before the encoder, so it is not an embedding-level part:
   :class:`WordRepetition` is an :class:`~cselab.objectives.base.InputPart` whose ``prepare``
   hook writes the repeated tokens as the batch's ``positives`` on the host, once per step
   (:mod:`cselab.data.repetition`, where the draw is documented), and the training layer encodes
   ``z2`` from them.
2. **Momentum contrast** (Sec. 3.2; ``objective.momentum_queue``). A queue of the last ``Q``
   sentences encoded by a momentum encoder (an exponential moving average of the encoder's
   weights, dropout off, no gradient) adds ``Q`` negative columns to every anchor's denominator::

       l_i = -log( e^{s(h_i, h_i⁺)/τ} / ( Σ_j e^{s(h_i, h_j⁺)/τ} + Σ_{m=1..Q} e^{s(h_i, q_m)/τ} ) )

   (the paper's Eq. 3 with ``h⁺`` the repeated view and ``q_m`` the queue). The queue is
   objective state (:class:`MomentumQueue`); the momentum encoder is model state owned by the
   training layer (:mod:`cselab.training.momentum`), which produces the ``momentum`` view.

What the authors' code does (``caskcsg/sentemb``, ``ESimCSE/esimcse/models.py`` ``cl_forward``
and ``trainers.py`` ``compute_loss``), and cselab follows:

* the queue is compared with the **anchor** view (the unrepeated sentence's dropout view ``z1``),
  and holds momentum encodings of the **unrepeated** sentences;
* at a step the queue holds earlier batches only (the step's batch enters after its loss); it
  starts empty and grows batch by batch up to ``Q`` (the authors' ``neg_size``), the oldest rows
  leaving first;
* the momentum encoder is a copy of the backbone (``BertModel``) made when the model is built; it
  is updated as ``θ_m ← m·θ_m + (1-m)·θ`` with the weights the step's forward pass used (i.e.
  those after the previous optimiser step: cselab updates right after each optimiser step, which
  gives the same weights), and its output goes through the **live** pooler (the MLP head is not
  copied), in eval mode (dropout off);
* the queue entries carry no gradient, have no mask and weight 1 (plain SimCSE columns).

Where cselab differs: under data parallelism the authors queue each GPU's own rows (so the
queues differ between GPUs while the anchors are gathered); cselab gathers the momentum rows of
the global batch, so every rank holds the same global queue and the objective does not depend
on the number of ranks (tested). The authors also empty the queue at each epoch's start (their
runs train one epoch); cselab keeps it across epochs.

With ``queue_size = 0`` the queue adds no column, and with ``dup_rate = 0`` ``z2`` is the same
tokens: both reduce to plain InfoNCE (tested).
"""

from __future__ import annotations

import random
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from ..core.datakind import SENTENCES, DataKind
from ..data.inputs import StepInputs
from ..data.repetition import MAX_REPEATED, repeat_tokens
from .assembly import Assembly
from .base import (
    VIEW_MOMENTUM,
    InputPart,
    MomentumSettings,
    NegativeBlock,
    NegativeSource,
    Pair,
    upcast,
)
from .context import ObjectiveContext, PrepareContext
from .papers import Paper
from .sections.esimcse import MomentumQueueConfig, WordRepetitionConfig
from .spaces import DROPOUT_SPACE, NegativeSpace

ESIMCSE = Paper(
    key="wu2022esimcse",
    name="ESimCSE",
    summary="a positive with repeated words (so the pair differs in length) and a momentum "
    "queue of earlier sentences as extra negatives",
    bibtex="""@inproceedings{wu2022esimcse,
  title     = {{ESimCSE}: Enhanced Sample Building Method for Contrastive Learning of Unsupervised Sentence Embedding},
  author    = {Wu, Xing and Gao, Chaochen and Zang, Liangjun and Han, Jizhong and Wang, Zhongyuan and Hu, Songlin},
  booktitle = {Proceedings of the 29th International Conference on Computational Linguistics (COLING)},
  year      = {2022}
}""",
    tag="esimcse",
    method=("word-repetition", "momentum-contrast"),
)


def repetition_seed(step_seed: int, row: int) -> int:
    """Seed of the word-repetition draw of global row ``row`` at the step of ``step_seed``: a
    row's draw depends on neither the number of ranks nor GradCache's chunks, and a resumed run
    draws what an uninterrupted one would."""
    return (step_seed * 1_000_003 + row * 104_729 + 0xD0B) % (2**63 - 1)


class WordRepetition(InputPart):
    """ESimCSE's word repetition (Sec. 3.1): ``z2`` is encoded from the sentence with some tokens
    repeated at rate ``dup_rate``; :meth:`prepare` makes that copy on the host with
    :func:`cselab.data.repetition.repeat_tokens` (nothing happens at the embedding level).

    Args:
        dup_rate: the repetition rate in ``[0, 1)`` (the authors' BERT-base: 0.32).
    """

    papers = (ESIMCSE,)
    tags = ("word-repetition",)

    def __init__(self, dup_rate: float = WordRepetitionConfig.dup_rate) -> None:
        super().__init__()
        self.dup_rate = float(dup_rate)

    def prepare(self, inputs: StepInputs, ctx: PrepareContext) -> StepInputs:
        """A sentence batch's word-repeated positives, drawn per global row from the step's
        seed (pairs, or a batch that has its positives already, pass unchanged)."""
        if self.dup_rate <= 0 or ctx.kind.pairs or inputs.positives is not None:
            return inputs
        rngs = [
            random.Random(repetition_seed(ctx.step_seed, ctx.offset + i))
            for i in range(len(inputs))
        ]
        return inputs.replace(positives=repeat_tokens(inputs.anchors, self.dup_rate, rngs))

    def added_tokens(self) -> tuple[int, str]:
        """A repeated row is not cut again: up to ``MAX_REPEATED - 1`` tokens longer."""
        return (MAX_REPEATED - 1, "word repetition") if self.dup_rate > 0 else (0, "")

    def describe(self, kind: DataKind = SENTENCES) -> str:
        return (
            "**Word repetition** (ESimCSE, Wu et al. 2022, Sec. 3.1): the positive is the "
            "sentence with a few subword tokens written twice, at most "
            f"min(10, int({self.dup_rate:g}·L)) - 1 of its L tokens, drawn anew each step."
        )

    def extra_repr(self) -> str:
        return f"dup_rate={self.dup_rate}"


class MomentumQueue(NegativeSource):
    """The last ``queue_size`` momentum-encoded sentences as negatives (ESimCSE Sec. 3.2, Eq. 3).

    Column ``m`` of anchor ``i`` is ``s(a_i, q_m)`` with ``a_i`` the anchor of the objective's
    negative space (``z1``; ``z^off`` with off-dropout negatives) and ``q_m`` a normalised queue
    entry, weight 1, no mask, no gradient. :meth:`on_step_end` appends the step's ``momentum``
    view of the **global** batch (gathered, so every rank queues the same rows) and drops the
    oldest beyond ``queue_size``. The queue is part of the run state (:meth:`run_state`).

    Args:
        queue_size: ``Q``, the most rows kept (the authors' ``neg_size``, 160).
        momentum: the momentum encoder's EMA coefficient (0.995); used by the training layer.
        space: the negative space whose anchor view the queue is compared with.

    Example::

        >>> q = MomentumQueue(4, 0.995)
        >>> q.load_run_state({"entries": torch.randn(3, 8)})
        >>> pair = Pair(torch.randn(2, 8), torch.randn(2, 8), {"z1": torch.randn(2, 8)})
        >>> q(pair, ObjectiveContext()).sims.shape
        torch.Size([2, 3])
    """

    papers = (ESIMCSE,)
    tags = ("momentum-contrast",)

    def __init__(
        self,
        queue_size: int = MomentumQueueConfig.queue_size,
        momentum: float = MomentumQueueConfig.momentum,
        space: NegativeSpace = DROPOUT_SPACE,
        init: str = MomentumQueueConfig.init,
    ) -> None:
        super().__init__()
        self.queue_size = int(queue_size)
        self.momentum = float(momentum)
        self.init = init
        self.view_settings = {VIEW_MOMENTUM: MomentumSettings(self.momentum, init)}
        self.space = space
        self.required_views = space.required_views | {VIEW_MOMENTUM}
        self.entries: Tensor | None = None  # (n, D), n <= queue_size, oldest first

    def forward(self, pair: Pair, ctx: ObjectiveContext) -> NegativeBlock:
        anchor = self.space.anchor_of(pair)
        if self.entries is None or self.entries.shape[0] == 0:
            return NegativeBlock(anchor.new_zeros(anchor.shape[0], 0))
        # Under Matryoshka (objectives/matryoshka.py) the anchor is a prefix: the entries are cut
        # to the same prefix, as every other view of the step is.
        entries = self.entries[..., : anchor.shape[-1]]
        queue = F.normalize(entries.to(device=anchor.device, dtype=anchor.dtype), dim=-1)
        return NegativeBlock(anchor @ queue.T)

    def on_step_end(self, views: Mapping[str, Tensor], ctx: ObjectiveContext) -> None:
        if self.queue_size == 0:
            return
        with torch.no_grad():
            rows = upcast(ctx.gather(views[VIEW_MOMENTUM].detach()))
            if self.entries is not None:
                rows = torch.cat([self.entries.to(rows.device, rows.dtype), rows])
            self.entries = rows[-self.queue_size :].clone()

    def run_state(self) -> dict[str, Tensor]:
        return {} if self.entries is None else {"entries": self.entries}

    def load_run_state(self, state: Mapping[str, Tensor]) -> None:
        entries = state.get("entries")
        self.entries = None if entries is None else entries.clone()

    def describe(self, kind: DataKind = SENTENCES) -> str:
        return (
            f"**Momentum contrast** (ESimCSE, Wu et al. 2022, Sec. 3.2): the last {self.queue_size} "
            "sentences, encoded without dropout by a momentum encoder (EMA of the encoder's "
            f"weights, momentum {self.momentum:g}"
            + (
                ", started from random weights as in the authors' code"
                if self.init == "random"
                else ""
            )
            + "), are extra negatives of every anchor."
        )

    def extra_repr(self) -> str:
        return (
            f"queue_size={self.queue_size}, momentum={self.momentum}, "
            f"init={self.init}, space={self.space.name}"
        )


def build_queue(section: MomentumQueueConfig, parts: Assembly) -> None:
    """``objective.momentum_queue``: the queued block, unless the queue keeps nothing."""
    if section.enabled and section.queue_size > 0:
        parts.negatives.append(
            MomentumQueue(
                section.queue_size, section.momentum, space=parts.space, init=section.init
            )
        )


def build_repetition(section: WordRepetitionConfig, parts: Assembly) -> None:
    """``objective.word_repetition``: the repeated positive, unless it repeats nothing."""
    if section.enabled and section.dup_rate > 0:
        parts.inputs.append(WordRepetition(section.dup_rate))
