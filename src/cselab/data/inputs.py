"""A train step's inputs, typed: :class:`StepInputs` (anchors, positives, hard negatives, MNTP's
masked copy), as both token stores hand them out (``store.step_inputs(rows, pad_id)``).

Every column is a token dict (``input_ids``, ``attention_mask``, and ``token_type_ids`` where a
tokenizer makes them) with the batch on dim 0:

* ``anchors`` ``(B, L)``: the sentences of a sentence corpus, or the anchors of pairs;
* ``positives`` ``(B, L')``: the given positives of pairs (supervised SimCSE, Gao et al. 2021,
  Sec. 4), or ESimCSE's word-repeated copy of the anchors (Wu et al. 2022, Sec. 3.1), added by
  the training layer's ``Task.prepare``; ``None`` for SimCSE's two dropout views of one sentence;
* ``negatives`` ``(B, K, L'')``: ``K`` given hard negatives per row, kept on their row, so that
  slicing rows (GradCache's chunks, a rank's share) slices them alike; ``None`` without;
* ``masked`` (:class:`MaskedCopy`): MNTP's masked copy of the anchors (LLM2Vec, BehnamGhader et
  al. 2024, Sec. 2.2), added by ``Task.prepare``; ``None`` otherwise.

What is in a step is said by which fields are set, never by the names of dict keys; the kind of
the data was decided once (:class:`~cselab.core.datakind.DataKind`). The host-side work of a
step is here too: :meth:`StepInputs.pad_to_width` (fixed shapes for a CUDA-graph step) and
:meth:`StepInputs.to` (pinned memory and an asynchronous copy to a GPU).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..core.devices import pins_memory
from .masking import IGNORE, scored_positions
from .order import bucket_width, pad_to_width

#: a column of a step: token tensors by name (``input_ids``, ``attention_mask``, ...)
Tokens = dict[str, Tensor]


@dataclass(frozen=True)
class MaskedCopy:
    """MNTP's masked copy of a batch ``(B, L)`` and the positions it scores.

    Attributes:
        input_ids: the anchors' ids with the chosen tokens replaced
            (:func:`~cselab.data.masking.mask_tokens`).
        labels: the original id of each chosen token, :data:`~cselab.data.masking.IGNORE`
            elsewhere.
        positions, targets: ``(B, K)`` each, the positions whose state predicts a chosen token
            and that token (:func:`~cselab.data.masking.scored_positions`), made on the host.
    """

    input_ids: Tensor
    labels: Tensor
    positions: Tensor
    targets: Tensor

    @classmethod
    def of(cls, input_ids: Tensor, labels: Tensor, attention_mask: Tensor) -> MaskedCopy:
        """The copy of masked ``input_ids`` with ``labels``, its scored positions computed
        here (on the host for the trainer's batches)."""
        positions, targets = scored_positions(labels, attention_mask)
        return cls(input_ids, labels, positions, targets)

    def map(self, fn: Callable[[Tensor], Tensor]) -> MaskedCopy:
        return MaskedCopy(fn(self.input_ids), fn(self.labels), fn(self.positions), fn(self.targets))


@dataclass(frozen=True)
class StepInputs:
    """One step's token columns on this rank (see the module docstring for the fields)."""

    anchors: Tokens
    positives: Tokens | None = None
    negatives: Tokens | None = None
    masked: MaskedCopy | None = None

    def __len__(self) -> int:
        return self.anchors["input_ids"].shape[0]

    @property
    def device(self) -> torch.device:
        return self.anchors["input_ids"].device

    @property
    def num_negatives(self) -> int:
        """``K``, the hard negatives of every row (0 without)."""
        return 0 if self.negatives is None else self.negatives["input_ids"].shape[1]

    def replace(self, **fields: object) -> StepInputs:
        """These inputs with some fields replaced (the others are shared, not copied)."""
        return dataclasses.replace(self, **fields)  # type: ignore[arg-type]

    def map(self, fn: Callable[[Tensor], Tensor]) -> StepInputs:
        """Every tensor of every column passed through ``fn``."""

        def tokens(column: Tokens | None) -> Tokens | None:
            return None if column is None else {k: fn(v) for k, v in column.items()}

        masked = None if self.masked is None else self.masked.map(fn)
        return StepInputs(
            tokens(self.anchors), tokens(self.positives), tokens(self.negatives), masked
        )  # type: ignore[arg-type]

    def rows(self, start: int, end: int) -> StepInputs:
        """Rows ``start:end`` of every column, at the batch's padded widths (a GradCache chunk)."""
        return self.map(lambda t: t[start:end])

    def to(self, device: torch.device) -> StepInputs:
        """A copy on ``device``; to a GPU from pinned host memory, without waiting for the copy
        (the step's kernels are queued behind it on the same stream)."""
        if not pins_memory(device.type):
            return self if self.device == device else self.map(lambda t: t.to(device))
        return self.map(lambda t: pinned(t).to(device, non_blocking=True))

    def pad_to_width(self, multiple: int, pad_id: int) -> StepInputs:
        """Every token column right-padded to a multiple of ``multiple`` tokens
        (:func:`~cselab.data.order.bucket_width`): a few fixed shapes for a compiled CUDA-graph
        step. The padding is masked, so no sentence vector changes; MNTP's scored positions keep
        their shape (their width counts predicted tokens, not positions)."""

        def tokens(column: Tokens | None) -> Tokens | None:
            return None if column is None else pad_to_width(column, multiple, pad_id)

        masked = self.masked
        if masked is not None:
            extra = bucket_width(masked.input_ids.shape[1], multiple) - masked.input_ids.shape[1]
            if extra:
                pad = torch.nn.functional.pad
                masked = dataclasses.replace(
                    masked,
                    input_ids=pad(masked.input_ids, (0, extra), value=pad_id),
                    labels=pad(masked.labels, (0, extra), value=IGNORE),
                )
        return StepInputs(
            tokens(self.anchors), tokens(self.positives), tokens(self.negatives), masked
        )  # type: ignore[arg-type]

    def token_counts(self) -> tuple[int, int]:
        """``(real, padded)``: the tokens of the step's sentence columns (:meth:`columns`; a
        SimCSE view's second pass and MNTP's copy are not counted again) and the positions
        their padded widths hold. Read on the host, before the copy to a GPU (on a device it
        would wait for it)."""
        real = padded = 0
        for column in self.columns():
            mask = column["attention_mask"]
            # numpy's sum: host arithmetic, not a tensor operator that reads a value back
            # (the step's sync counter, tests/test_gpu_path.py, counts those)
            host = mask.numpy() if mask.device.type == "cpu" else mask.cpu().numpy()
            real, padded = real + int(host.sum()), padded + host.size
        return real, padded

    def columns(self) -> Iterator[Tokens]:
        """The sentence columns of one forward pass, in row order: anchors, positives (if
        any), then the ``K`` negatives of every row as ``(B·K, L'')`` (row ``i``'s at
        ``i·K .. i·K+K-1``)."""
        yield self.anchors
        if self.positives is not None:
            yield self.positives
        if self.negatives is not None:
            n = len(self)
            yield {k: v.reshape(n * self.num_negatives, -1) for k, v in self.negatives.items()}


def pinned(tensor: Tensor) -> Tensor:
    """``tensor`` in pinned host memory, the source of an asynchronous copy to a GPU; a tensor
    pinned already or not on the host (a batch on the GPU) is returned as it is (pinning one
    on a GPU fails)."""
    if tensor.device.type != "cpu" or tensor.is_pinned():
        return tensor
    return tensor.pin_memory()


def as_step_inputs(inputs: StepInputs | Mapping[str, Tensor]) -> StepInputs:
    """``inputs`` as :class:`StepInputs`: a plain token dict is a sentence batch (its anchors).

    Raises:
        TypeError: for a dict of the old prefixed layout (``positive.input_ids``,
            ``negative.input_ids``, ...), naming :class:`StepInputs`; its keys would otherwise
            reach the encoder as unknown keyword arguments.
    """
    if isinstance(inputs, StepInputs):
        return inputs
    prefixed = sorted(k for k in inputs if "." in k)
    if prefixed:
        raise TypeError(
            f"a batch of prefixed keys ({', '.join(prefixed)}) is the layout before "
            "cselab.data.inputs.StepInputs: pass StepInputs(anchors=..., positives=..., "
            "negatives=...) (negatives (B, K, L)) instead"
        )
    return StepInputs(inputs if isinstance(inputs, dict) else dict(inputs))


def stack_rows(parts: Sequence[Tokens]) -> Tokens:
    """Concatenate token dicts ``(n_i, L_i)`` along the rows, right-padding to the widest
    (pad cells are masked; their token id is irrelevant to the pooled vector)."""
    width = max(p["input_ids"].shape[1] for p in parts)
    out: Tokens = {}
    for key in parts[0]:
        padded = [torch.nn.functional.pad(p[key], (0, width - p[key].shape[1])) for p in parts]
        out[key] = torch.cat(padded, dim=0)
    return out
