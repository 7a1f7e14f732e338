"""Dropout whose mask is cheap to draw on the CPU: the same distribution as ``nn.Dropout``.

SimCSE's positive pair *is* two dropout masks, so dropout runs on every activation of every
training step: 13 hidden-state dropouts and 6 attention-probability dropouts per forward of a
6-layer BERT. On the CPU, ``F.dropout`` draws its mask with ``Tensor.bernoulli_(p)``, which costs
about 5 ns per element (7.5 ms for the ``128 x 12 x 32 x 32`` attention probabilities of one
MiniLM layer at batch 64; measured on a 2-core Xeon), keeps the mask in the activation's dtype
and divides it in place: in a ``torch.profiler`` run of a MiniLM training step before this module
existed, ``bernoulli_`` alone was 10% of the step in fp32 and 16% in bf16.

Here the mask comes from 32 random bits per element, compared with ``round(p * 2**32)``: an
element is dropped with probability ``round(p * 2**32) / 2**32``, which is ``p`` to within
``2**-33``. The bits come from NumPy's PCG64DXSM (``random_raw``, about 0.4 ns per element, against
1.7 ns for ``Tensor.random_`` on ``int32`` with torch's Mersenne Twister), seeded for each mask by
one 63-bit draw from the default CPU generator (or the one given). Every mask is therefore a
function of torch's generator state, so seeding, :class:`~cselab.training.rng.RNGState`
snapshots, GradCache's replays and resumed runs see exactly what they saw with ``nn.Dropout``;
only the particular masks differ from ``nn.Dropout``'s for the same seed. The kept elements are
scaled by ``1 / (1 - p)`` (rounded to the activation's dtype) as in ``nn.Dropout``: dropout is one
product with a multiplier that is ``0`` or ``1 / (1 - p)``, and so is its backward.

On other devices ``F.dropout`` is used (GPUs have a fused dropout kernel), and so it is inside
``torch.compile``, whose Inductor backend fuses dropout into the neighbouring operations.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

_BITS = 2**32  # the mask compares 32 uniform bits per element


def draw_seed(generator: torch.Generator | None = None) -> Tensor:
    """One 63-bit draw from ``generator`` (default: torch's CPU generator): a mask's seed.

    A tensor, drawn out of place, so that ``torch.compile`` traces it into the graph (a new
    value is a new input, not a recompile).
    """
    return torch.randint(0, 2**63 - 1, (), dtype=torch.int64, generator=generator)


def random_int32(
    shape: tuple[int, ...] | torch.Size,
    generator: torch.Generator | None = None,
    seed: Tensor | int | None = None,
) -> Tensor:
    """Uniform ``int32`` values on ``[-2**31, 2**31)`` of ``shape`` (CPU), seeded from ``generator``
    (or from ``seed``, a value of :func:`draw_seed`)."""
    seed = int(draw_seed(generator) if seed is None else seed)
    n = math.prod(shape)
    raw = np.random.PCG64DXSM(seed).random_raw((n + 1) // 2)  # uint64: two elements each
    return torch.from_numpy(raw.view(np.int32)[:n]).view(shape)


def keep_mask(
    shape: tuple[int, ...] | torch.Size,
    p: float,
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
    seed: Tensor | int | None = None,
) -> Tensor:
    """A ``bool`` tensor of ``shape``; each element is ``False`` (dropped) with probability ``p``."""
    drop_below = round(p * _BITS) - 2**31  # P(bits < drop_below) = round(p * 2**32) / 2**32
    return random_int32(shape, generator, seed).to(device) >= drop_below


def dropout_multiplier(
    shape: tuple[int, ...] | torch.Size,
    p: float,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
) -> Tensor:
    """``keep_mask(...) / (1 - p)`` in ``dtype``: ``0`` or ``1 / (1 - p)`` per element.

    Dropout is then one product, ``x * M``, and its backward another, ``grad * M``.
    """
    keep = keep_mask(shape, p, device, generator)
    return torch.where(
        keep, torch.tensor(1.0 / (1.0 - p), dtype=dtype), torch.tensor(0.0, dtype=dtype)
    )


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """``F.dropout(x, p, training)`` with the cheaper mask on the CPU (see the module docstring)."""
    if p in (0.0, 1.0) or not training or x.device.type != "cpu" or torch.compiler.is_compiling():
        return F.dropout(x, p, training)  # Inductor generates its own dropout
    # autograd keeps the multiplier (not x) for the backward, grad * M: nothing else to save
    return x * dropout_multiplier(x.shape, p, x.dtype, x.device)


class Dropout(nn.Dropout):
    """``nn.Dropout`` with :func:`dropout`'s cheaper mask; a drop-in subclass (same ``p``)."""

    def forward(self, x: Tensor) -> Tensor:
        if self.inplace:  # in-place dropout has no saved mask to reuse; keep torch's
            return super().forward(x)
        return dropout(x, self.p, self.training)


def use_fast_dropout(module: nn.Module) -> int:
    """Replace every plain ``nn.Dropout`` inside ``module`` by :class:`Dropout`; returns the count.

    Only modules whose type is exactly ``nn.Dropout`` are swapped (subclasses may do more than
    drop); ``p``, ``inplace`` and the train/eval mode carry over. This changes ``module`` for
    good: cselab does it only to backbones it loads itself with the fast path on
    (``SentenceEncoder.from_pretrained(..., fast_path=True)``), never to a model a user hands it.
    """
    swapped = 0
    for parent in module.modules():
        for name, child in list(parent.named_children()):
            if type(child) is nn.Dropout:
                fast = Dropout(child.p, child.inplace)
                fast.train(child.training)
                setattr(parent, name, fast)
                swapped += 1
    return swapped


@contextlib.contextmanager
def dropout_disabled(module: nn.Module) -> Iterator[None]:
    """Switch every dropout in ``module`` off, then restore each submodule's exact mode.

    Sets ``training=False`` on *every* submodule rather than only on ``nn.Dropout`` instances:
    in transformers 5 attention dropout is chosen from the attention module's own ``training``
    flag (``dropout=0.0 if not self.training else p``), so switching only ``nn.Dropout`` modules
    would leave attention dropout on. Used for ImSimCSE's off-dropout view.
    """
    states = [(m, m.training) for m in module.modules()]
    try:
        for m, _ in states:
            m.training = False
        yield
    finally:
        for m, mode in states:
            m.training = mode
