"""Self-attention over packed sentences with a hand-written backward: the CPU training hot path.

The unpadded training forward (:mod:`cselab.model.unpad`) runs every token-wise layer on the
``T`` real tokens of a batch; attention is the one place where the tokens of a sentence meet. With
training dropout on, PyTorch's CPU ``scaled_dot_product_attention`` takes its composite "math"
path, which autograd differentiates op by op: it converts the boolean key mask to ``-inf`` with
``where``/``isneginf``/``all`` in every layer, upcasts half-precision inputs, draws the dropout
mask with ``bernoulli_`` (see :mod:`cselab.model.dropout`), keeps several ``(B, H, L, L)``
intermediates and copies non-contiguous layouts on the way. In a profile of a MiniLM training
step at batch 64 on a 2-core Xeon that bookkeeping took more time than the attention products.

:func:`packed_attention` computes exactly the same function (softmax(QKᵀ·scale + mask) with
dropout on the probabilities, times V) in a handful of large operations, as the custom operator
``cselab::packed_attention`` with its backward ``cselab::packed_attention_backward``:

* forward: the packed ``(T, H, d)`` queries (times the scale), keys and values are copied into
  one ``(3, H, B·L, d)`` grid with zeros at padding (the padded layout, heads first, so each
  head's sentences are one batched matrix product); the scores are one ``bmm`` plus, in place,
  the additive key mask (built once per batch, shared by all layers); then the softmax, the
  dropout mask (:func:`cselab.model.dropout.keep_mask`, a ``bool`` per probability), one ``bmm``
  with V and one gather of the real rows back to ``(T, H, d)``.
* backward: the textbook gradients of those steps (``dV = P̃ᵀ dO``, ``dP̃ = dO Vᵀ``,
  ``dS = P ⊙ (dP − rowsum(dP ⊙ P))``, ``dQ = dS K · scale``, ``dK = dSᵀ Q · scale``), each
  gathered back to the packed rows. It reads the grid, ``P`` and the ``bool`` mask: 5 bytes per
  probability in float32 where the dropped probabilities and a float multiplier made it 12.

Being a registered operator with a fake (shape) implementation and a registered backward, it is
traced by ``torch.compile`` as one node of the model's graph (:func:`cselab.model.unpad.compile_encoder`;
``tests/test_compile.py``), and eager calls run the very same operator.

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

from .dropout import draw_seed, keep_mask


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


def _to_grid(rows: Tensor, index: Tensor, pad_index: Tensor, cells: int) -> Tensor:
    """``(n, H, T, d)`` packed rows → ``(n, H, cells, d)`` grid (``cells = B·L``), zeros at padding.

    Every element is written once: the real rows copied, the padding rows filled with zeros.
    """
    n, heads, _, head_dim = rows.shape
    grid = rows.new_empty((n, heads, cells, head_dim))
    grid.index_fill_(2, pad_index, 0.0)
    return grid.index_copy_(2, index, rows)


def _grid_shape(key_bias: Tensor) -> tuple[int, int]:
    """``(B, L)`` of the padded batch, from the ``(1, B, 1, L)`` key mask."""
    return key_bias.shape[1], key_bias.shape[3]


# The kernel is a custom operator (``cselab::packed_attention`` and its backward), so that
# ``torch.compile`` traces a model through it as one graph: Dynamo sees the operator's shapes
# (its fake implementation) and AOTAutograd its registered backward, where a plain
# ``autograd.Function`` with Python-side state broke the graph in every layer. Eager calls go
# through the same operator: one implementation. Its inputs are tensors, floats and the
# dropout seed as a tensor (a new seed is a new input, not a recompile); it is a pure function
# of them, which is what a custom operator must be.


@torch.library.custom_op("cselab::packed_attention", mutates_args=())
def _attention_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    index: Tensor,
    pad_index: Tensor,
    key_bias: Tensor,
    seed: Tensor,
    dropout_p: float,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The forward: ``(out, grid, probs, keep)``; the last three are what the backward reads.

    ``grid`` is ``(3, H, B·L, d)`` (scale·Q, K, V, zeros at padding), ``probs`` the softmax
    ``(H·B, L, L)`` before dropout and ``keep`` the dropout mask as ``bool`` (empty without
    dropout): 5 bytes per attention probability are kept for the backward, not the 12 of the
    probabilities, the dropped probabilities and a float multiplier. The dropped probabilities
    are recomputed from the first two where they are needed, and the factor ``1 / (1 - p)`` is
    applied to the ``(·, L, d)`` products rather than to the ``(·, L, L)`` probabilities.
    """
    with torch.autocast(q.device.type, enabled=False):  # the products in compute_dtype
        heads, head_dim = q.shape[1], q.shape[3]
        batch, width = _grid_shape(key_bias)
        hb = heads * batch
        qkv = torch.cat((q, k, v)).to(compute_dtype(q.dtype))  # a new tensor in every dtype
        qkv[0].mul_(scale)  # the grid holds scale·Q: the scores need no extra pass
        grid = _to_grid(qkv, index, pad_index, batch * width)  # (3, H, B·L, d)
        qg, kg, vg = (g.view(hb, width, head_dim) for g in grid)
        scores = torch.bmm(qg, kg.transpose(1, 2))
        scores.view(heads, batch, width, width).add_(key_bias)
        probs = scores.softmax(-1)
        del scores
        if dropout_p > 0.0:  # P̃ = P ⊙ keep / (1 - p)
            keep = keep_mask(probs.shape, dropout_p, probs.device, seed=seed)
            out = torch.bmm(probs * keep, vg).mul_(1.0 / (1.0 - dropout_p))
        else:
            keep = probs.new_empty(0, dtype=torch.bool)
            out = torch.bmm(probs, vg)
        # (1, T, H, d), contiguous: the layout the caller reshapes to (1, T, H·d)
        rows = out.view(heads, batch * width, head_dim).transpose(0, 1).index_select(0, index)
        return rows.to(q.dtype).unsqueeze(0), grid, probs, keep


@_attention_op.register_fake
def _(q, k, v, index, pad_index, key_bias, seed, dropout_p, scale):  # noqa: ANN001, ANN202
    heads, head_dim = q.shape[1], q.shape[3]
    batch, width = _grid_shape(key_bias)
    work = compute_dtype(q.dtype)
    out = q.new_empty((1, index.shape[0], heads, head_dim))
    grid = q.new_empty((3, heads, batch * width, head_dim), dtype=work)
    probs = q.new_empty((heads * batch, width, width), dtype=work)
    keep_shape = probs.shape if dropout_p > 0.0 else (0,)
    return out, grid, probs, q.new_empty(keep_shape, dtype=torch.bool)


@torch.library.custom_op("cselab::packed_attention_backward", mutates_args=())
def _attention_backward_op(
    grad_out: Tensor,
    grid: Tensor,
    probs: Tensor,
    keep: Tensor,
    index: Tensor,
    pad_index: Tensor,
    key_bias: Tensor,
    dropout_p: float,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(dQ, dK, dV)``, each ``(1, H, T, d)`` in the dtype of ``grad_out``.

    The textbook gradients: ``dV = P̃ᵀ dO``, ``dP̃ = dO Vᵀ``, ``dP = dP̃ ⊙ keep / (1 - p)``,
    ``dS = P ⊙ (dP − rowsum(dP ⊙ P))``, ``dQ = dS K · scale``, ``dK = dSᵀ Q · scale``; ``P̃`` is
    recomputed from ``P`` and ``keep``, and ``1 / (1 - p)`` (``dS`` is linear in ``dP``) is
    applied to the three ``(H, T, d)`` results.
    """
    with torch.autocast(grad_out.device.type, enabled=False):
        batch, width = _grid_shape(key_bias)
        heads, head_dim = grid.shape[1], grid.shape[3]
        hb = heads * batch
        qg, kg, vg = (g.view(hb, width, head_dim) for g in grid)
        # dO on the grid: (1, T, H, d) -> (H·B, L, d), zero at padding
        d_out = _to_grid(grad_out.transpose(1, 2).to(grid.dtype), index, pad_index, batch * width)
        d_out = d_out[0].view(hb, width, head_dim)
        dropout = dropout_p > 0.0
        dv = torch.bmm((probs * keep if dropout else probs).transpose(1, 2), d_out)  # P̃ᵀ dO
        d_probs = torch.bmm(d_out, vg.transpose(1, 2))  # dP̃ = dO Vᵀ
        if dropout:
            d_probs.mul_(keep)
        d_scores = torch._softmax_backward_data(d_probs, probs, -1, probs.dtype)
        del d_probs
        dk = torch.bmm(d_scores.transpose(1, 2), qg)  # dK = dSᵀ (scale·Q)
        dq = torch.bmm(d_scores, kg)  # dQ = dS K · scale (the scale after the gather)
        inv = 1.0 / (1.0 - dropout_p)

        def packed(g: Tensor, factor: float) -> Tensor:  # (H·B, L, d) grid -> (1, H, T, d) rows
            rows = g.view(heads, batch * width, head_dim).index_select(1, index).unsqueeze(0)
            return (rows.mul_(factor) if factor != 1.0 else rows).to(grad_out.dtype)

        return packed(dq, scale * inv), packed(dk, inv), packed(dv, inv)


@_attention_backward_op.register_fake
def _(grad_out, grid, probs, keep, index, pad_index, key_bias, dropout_p, scale):  # noqa: ANN001, ANN202
    shape = (1, grid.shape[1], index.shape[0], grid.shape[3])
    return tuple(grad_out.new_empty(shape) for _ in range(3))


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
    _q, _k, _v, index, pad_index, key_bias, _seed, dropout_p, scale = inputs
    _out, grid, probs, keep = output
    ctx.save_for_backward(grid, probs, keep, index, pad_index, key_bias)
    ctx.dropout_p, ctx.scale = dropout_p, scale


def _backward(ctx: Any, grad_out: Tensor, *_unused: Tensor) -> tuple[Tensor | None, ...]:
    grid, probs, keep, index, pad_index, key_bias = ctx.saved_tensors
    dq, dk, dv = _attention_backward_op(
        grad_out.contiguous(), grid, probs, keep, index, pad_index, key_bias,
        ctx.dropout_p, ctx.scale,
    )  # fmt: skip
    return dq, dk, dv, None, None, None, None, None, None


_attention_op.register_autograd(_backward, setup_context=_setup_context)


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
    gradients and must compute exactly what its replay with gradients computes (in a compiled
    graph, ``no_grad``: see :func:`_inference`).
    """
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if dropout_p == 0.0 and _inference():
        return _inference_attention(q, k, v, pack, scale)
    # the seed is one draw from torch's generator, as the mask of cselab's Dropout: seeding,
    # RNG snapshots and GradCache's replays see the same masks
    seed = draw_seed() if dropout_p > 0.0 else _NO_SEED
    out, *_saved = _attention_op(
        q, k, v, pack.index, pack.pad_index, pack.key_bias, seed, float(dropout_p), scale
    )
    return out


_NO_SEED = torch.zeros((), dtype=torch.int64)


def _inference() -> bool:
    """Whether no backward can follow: inference mode in eager; no grad in a compiled graph
    (Dynamo cannot read inference mode, and a compiled encoder's GradCache passes both run
    with gradients on)."""
    if torch.compiler.is_compiling():
        return not torch.is_grad_enabled()
    return torch.is_inference_mode_enabled()


def _inference_attention(q: Tensor, k: Tensor, v: Tensor, pack: PackInfo, scale: float) -> Tensor:
    """The forward of :func:`packed_attention` without dropout, through the fused SDPA kernel.

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
    # (1, T, H, d), row-major as pack.index
    return out.transpose(1, 2).reshape(batch * width, heads, head_dim)[pack.index].unsqueeze(0)
