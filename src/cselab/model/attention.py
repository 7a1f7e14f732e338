"""Self-attention over packed sentences with a hand-written backward: the CPU training hot path.

The unpadded training forward (:mod:`cselab.model.unpad`) runs every token-wise layer on the
``T`` real tokens of a batch; attention is the one place where the tokens of a sentence meet. With
training dropout on, PyTorch's CPU ``scaled_dot_product_attention`` takes its composite "math"
path, which autograd differentiates op by op: it converts the boolean key mask to ``-inf`` with
``where``/``isneginf``/``all`` in every layer, upcasts half-precision inputs, draws the dropout
mask with ``bernoulli_`` (see :mod:`cselab.model.dropout`), keeps several ``(B, H, L, L)``
intermediates and copies non-contiguous layouts on the way. In a profile of a MiniLM training
step at batch 64 on a 2-core Xeon that bookkeeping took more time than the attention products.

:class:`PackedAttention` computes exactly the same function (softmax(QKᵀ·scale + mask) with
dropout on the probabilities, times V) in a handful of large operations:

* forward: the packed ``(T, H, d)`` queries (times the scale), keys and values are copied into
  one ``(3, H, B·L, d)`` grid with zeros at padding (the padded layout, heads first, so each
  head's sentences are one batched matrix product); the scores are one ``bmm`` plus, in place,
  the additive key mask (built once per batch, shared by all layers); then the softmax, the
  dropout multiplier (:func:`cselab.model.dropout.dropout_multiplier`), one ``bmm`` with V and
  one gather of the real rows back to ``(T, H, d)``.
* backward: the textbook gradients of those steps (``dV = P̃ᵀ dO``, ``dP̃ = dO Vᵀ``,
  ``dS = P ⊙ (dP − rowsum(dP ⊙ P))``, ``dQ = dS K · scale``, ``dK = dSᵀ Q · scale``), each
  gathered back to the packed rows.

Half-precision inputs are computed in float32, as PyTorch's math path does on the CPU, and the
result is cast back; float32 and float64 inputs are computed in their own dtype. Under
``torch.inference_mode`` without dropout the grid goes to the fused SDPA kernel instead (see
:func:`packed_attention`). ``tests/test_attention.py`` checks outputs and all three gradients
against ``scaled_dot_product_attention`` on the padded batch (float64), the dropout against its
definition, and the whole unpadded model against the padded one (``tests/test_unpad.py``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .dropout import dropout_multiplier


class PackInfo(NamedTuple):
    """Where the packed tokens sit in the padded batch.

    Attributes:
        index: ``(T,)`` flat positions of the real tokens in the ``(B * L)`` padded grid, row-major.
        batch: ``B``.
        width: ``L``.
        pad_index: ``(B * L - T,)`` flat positions of the padding.
        keep: ``(B, L)`` bool, ``True`` at real tokens.
        key_bias: ``(1, B, 1, L)`` float32, ``0`` at real keys and ``-inf`` at padding (the
            additive key mask), built once per batch for all layers.
    """

    index: Tensor
    batch: int
    width: int
    pad_index: Tensor
    keep: Tensor
    key_bias: Tensor

    @classmethod
    def from_mask(cls, attention_mask: Tensor) -> PackInfo:
        """From a ``(B, L)`` 0/1 attention mask."""
        batch, width = attention_mask.shape
        keep = attention_mask.bool()
        bias = torch.zeros(1, batch, 1, width, device=attention_mask.device)
        bias.masked_fill_(~keep[None, :, None, :], float("-inf"))
        flat = keep.reshape(-1)
        index = flat.nonzero().squeeze(1)
        pad_index = (~flat).nonzero().squeeze(1)
        return cls(index, batch, width, pad_index, keep, bias)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half precisions (as the CPU math path), else the input's own dtype."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _to_grid(rows: Tensor, pack: PackInfo) -> Tensor:
    """``(n, H, T, d)`` packed rows → ``(n, H, B·L, d)`` grid, zeros at padding.

    Every element is written once: the real rows copied, the padding rows filled with zeros.
    """
    n, heads, _, head_dim = rows.shape
    grid = rows.new_empty((n, heads, pack.batch * pack.width, head_dim))
    grid.index_fill_(2, pack.pad_index, 0.0)
    return grid.index_copy_(2, pack.index, rows)


class PackedAttention(torch.autograd.Function):
    """Attention per sentence over packed ``(1, H, T, d)`` inputs; see the module docstring."""

    @staticmethod
    def forward(
        ctx: Any, q: Tensor, k: Tensor, v: Tensor, pack: PackInfo, dropout_p: float, scale: float
    ) -> Tensor:
        heads, head_dim = q.shape[1], q.shape[3]
        batch, width = pack.batch, pack.width
        hb = heads * batch
        qkv = torch.cat((q, k, v)).to(compute_dtype(q.dtype))  # a new tensor in every dtype
        qkv[0].mul_(scale)  # the grid holds scale·Q: the scores need no extra pass
        grid = _to_grid(qkv, pack)  # (3, H, B·L, d)
        qg, kg, vg = (g.view(hb, width, head_dim) for g in grid)
        scores = torch.bmm(qg, kg.transpose(1, 2))
        scores.view(heads, batch, width, width).add_(pack.key_bias)
        probs = scores.softmax(-1)
        multiplier = None
        dropped = probs
        if dropout_p > 0.0:  # P̃ = P ⊙ M, M ∈ {0, 1/(1-p)}
            multiplier = dropout_multiplier(probs.shape, dropout_p, probs.dtype, probs.device)
            dropped = probs * multiplier
        out = torch.bmm(dropped, vg).view(heads, batch * width, head_dim)
        ctx.save_for_backward(grid, probs, dropped, multiplier)
        ctx.pack, ctx.meta = pack, (scale, q.dtype)
        # (T, H, d), contiguous: the layout the caller reshapes to (1, T, H·d)
        return out.transpose(0, 1).index_select(0, pack.index).to(q.dtype).unsqueeze(0)

    @staticmethod
    @once_differentiable  # the saved grid and probabilities carry no graph of their own
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        grid, probs, dropped, multiplier = ctx.saved_tensors
        pack: PackInfo = ctx.pack
        scale, dtype = ctx.meta
        batch, width = pack.batch, pack.width
        heads, head_dim = grid.shape[1], grid.shape[3]
        hb = heads * batch
        qg, kg, vg = (g.view(hb, width, head_dim) for g in grid)
        # dO on the grid: (1, T, H, d) -> (H, B·L, d), zero at padding
        d_out = _to_grid(grad_out.transpose(1, 2).to(grid.dtype), pack)
        d_out = d_out[0].view(hb, width, head_dim)
        dv = torch.bmm(dropped.transpose(1, 2), d_out)  # dV = P̃ᵀ dO
        d_probs = torch.bmm(d_out, vg.transpose(1, 2))  # dP̃ = dO Vᵀ
        if multiplier is not None:
            d_probs.mul_(multiplier)  # dP = dP̃ ⊙ M
        d_scores = torch._softmax_backward_data(d_probs, probs, -1, probs.dtype)
        dk = torch.bmm(d_scores.transpose(1, 2), qg)  # dK = dSᵀ (scale·Q)
        dq = torch.bmm(d_scores, kg)  # dQ = dS K · scale (the scale after the gather)

        def packed(g: Tensor) -> Tensor:  # (H·B, L, d) grid -> (1, H, T, d) real rows
            return g.view(heads, batch * width, head_dim).index_select(1, pack.index).unsqueeze(0)

        dq_rows = packed(dq).mul_(scale)
        return dq_rows.to(dtype), packed(dk).to(dtype), packed(dv).to(dtype), None, None, None


@torch.compiler.disable  # a hand-written kernel: compiled models call it between graphs
def packed_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    pack: PackInfo,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> Tensor:
    """Attention of each sentence's packed queries over its own keys.

    Args:
        q, k, v: ``(1, H, T, d)`` packed queries, keys and values (any float dtype).
        pack: where the ``T`` tokens sit in the padded ``(B, L)`` batch.
        dropout_p: dropout on the attention probabilities (0 in evaluation).
        scale: the score scale; default ``d ** -0.5``.

    Returns:
        ``(1, T, H, d)`` in the dtype of ``q``.

    Under ``torch.inference_mode`` without dropout (``encode``, evaluation) the padded grid goes
    to PyTorch's fused ``scaled_dot_product_attention`` instead, in the inputs' own dtype: with
    nothing to save for a backward the fused kernel is the faster one, and it is what the padded
    model runs. Inference mode, not merely ``no_grad``: GradCache's first pass runs without
    gradients and must compute exactly what its replay with gradients computes.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if dropout_p == 0.0 and torch.is_inference_mode_enabled():
        return _inference_attention(q, k, v, pack, scale)
    with torch.autocast(q.device.type, enabled=False):
        return PackedAttention.apply(q, k, v, pack, float(dropout_p), scale)


def _inference_attention(q: Tensor, k: Tensor, v: Tensor, pack: PackInfo, scale: float) -> Tensor:
    """The forward of :class:`PackedAttention` without dropout, through the fused SDPA kernel.

    The grid here is token-major, ``(B·L, 3, H, d)``: filling it moves whole contiguous rows,
    and SDPA reads ``(B, H, L, d)`` strided views of it (its last dimension is contiguous).
    """
    heads, head_dim = q.shape[1], q.shape[3]
    batch, width = pack.batch, pack.width
    rows = torch.stack([t[0].transpose(0, 1) for t in (q, k, v)], dim=1)  # (T, 3, H, d)
    grid = rows.new_empty((batch * width, 3, heads, head_dim))
    grid.index_fill_(0, pack.pad_index, 0.0).index_copy_(0, pack.index, rows)
    grid = grid.view(batch, width, 3, heads, head_dim)
    qg, kg, vg = (grid[:, :, i].transpose(1, 2) for i in range(3))  # (B, H, L, d) views
    mask = pack.key_bias.view(batch, 1, 1, width).to(q.dtype)
    out = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, attn_mask=mask, scale=scale)
    return out.transpose(1, 2)[pack.keep].unsqueeze(0)  # (1, T, H, d), row-major as pack.index
