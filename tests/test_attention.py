"""cselab.model.attention: the packed attention and its hand-written backward.

References: PyTorch's ``scaled_dot_product_attention`` on the padded batch (float64), and a slow
per-sentence, per-head loop written from the definition softmax(QKᵀ·s + mask) ⊙ M · V for the
dropout case. Both sides sum at most ``L`` or ``d`` products, so float64 agreement is to ~1e-15.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import float_tolerance
from cselab.model.attention import PackInfo, packed_attention
from cselab.model.dropout import dropout_multiplier

LENGTHS = [7, 3, 1, 5, 6]  # one full-width sentence, one of a single token
B, L, H, D = len(LENGTHS), 7, 3, 4
ATOL = 1e-12


def _mask() -> torch.Tensor:
    mask = torch.zeros(B, L, dtype=torch.long)
    for b, n in enumerate(LENGTHS):
        mask[b, :n] = 1
    return mask


def _qkv(dtype=torch.float64, seed=0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    t = sum(LENGTHS)
    return tuple(
        torch.randn(1, H, t, D, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
        for _ in range(3)
    )


def _padded(x: torch.Tensor, pack: PackInfo) -> torch.Tensor:
    rows = x[0].transpose(0, 1)  # (T, H, d)
    grid = rows.new_zeros(B * L, H, D).index_copy(0, pack.index, rows)
    return grid.view(B, L, H, D).transpose(1, 2)


def _sdpa_reference(q, k, v, pack, scale):
    mask = _mask().bool()[:, None, None, :]
    out = F.scaled_dot_product_attention(
        _padded(q, pack), _padded(k, pack), _padded(v, pack), attn_mask=mask, scale=scale
    )
    return out.transpose(1, 2).reshape(B * L, H, D)[pack.index].unsqueeze(0)


def _assert_same_gradients(out, ref, inputs) -> None:
    """The gradients of ``out`` and ``ref`` w.r.t. ``inputs`` for one random upstream gradient."""
    g = torch.randn_like(out)
    got, want = torch.autograd.grad(out, inputs, g), torch.autograd.grad(ref, inputs, g)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=ATOL)


def test_pack_info():
    pack = PackInfo.from_mask(_mask())
    assert pack.index.tolist() == [b * L + i for b, n in enumerate(LENGTHS) for i in range(n)]
    assert sorted(pack.index.tolist() + pack.pad_index.tolist()) == list(range(B * L))
    assert pack.key_bias.shape == (1, B, 1, L)
    assert torch.isinf(pack.key_bias).sum().item() == B * L - sum(LENGTHS)
    assert pack.keep.reshape(-1).nonzero().squeeze(1).tolist() == pack.index.tolist()


@pytest.mark.parametrize("scale", [None, 0.37])
def test_matches_sdpa_on_the_padded_batch(scale):
    q, k, v = _qkv()
    pack = PackInfo.from_mask(_mask())
    out = packed_attention(q, k, v, pack, 0.0, scale)
    ref = _sdpa_reference(q, k, v, pack, D**-0.5 if scale is None else scale)
    assert out.shape == (1, sum(LENGTHS), H, D) and out.is_contiguous()
    torch.testing.assert_close(out, ref, rtol=0, atol=ATOL)
    _assert_same_gradients(out, ref, (q, k, v))


def test_gradcheck():
    q, k, v = _qkv()
    pack = PackInfo.from_mask(_mask())
    assert torch.autograd.gradcheck(lambda *t: packed_attention(*t, pack, 0.0, 0.5), (q, k, v))


def _slow_dropout_reference(q, k, v, multiplier, scale):
    """Per sentence and head, from the definition (the multiplier is M = keep / (1 - p))."""
    m = multiplier.view(H, B, L, L)
    rows, start = [], 0
    for b, n in enumerate(LENGTHS):
        heads = []
        for h in range(H):
            qs, ks, vs = (x[0, h, start : start + n] for x in (q, k, v))
            p = torch.softmax(qs @ ks.T * scale, dim=-1)
            heads.append((p * m[h, b, :n, :n]) @ vs)  # (n, d)
        rows.append(torch.stack(heads, dim=1))  # (n, H, d)
        start += n
    return torch.cat(rows).unsqueeze(0)


def test_dropout_matches_the_definition():
    q, k, v = _qkv(seed=1)
    pack = PackInfo.from_mask(_mask())
    torch.manual_seed(7)
    out = packed_attention(q, k, v, pack, 0.3, 0.5)
    torch.manual_seed(7)
    multiplier = dropout_multiplier((H * B, L, L), 0.3, torch.float64)
    assert 0 < (multiplier == 0).sum() < multiplier.numel()
    ref = _slow_dropout_reference(q, k, v, multiplier, 0.5)
    torch.testing.assert_close(out, ref, rtol=0, atol=ATOL)
    _assert_same_gradients(out, ref, (q, k, v))


def test_dropout_is_drawn_per_call():
    q, k, v = _qkv()
    pack = PackInfo.from_mask(_mask())
    torch.manual_seed(0)
    a = packed_attention(q, k, v, pack, 0.3)
    b = packed_attention(q, k, v, pack, 0.3)
    assert not torch.equal(a, b)
    torch.manual_seed(0)
    assert torch.equal(packed_attention(q, k, v, pack, 0.3), a)


def test_bf16_inputs_are_computed_in_float32():
    """bf16 in, bf16 out, the products in float32: the error is bf16 rounding of in/outputs."""
    q, k, v = _qkv()
    pack = PackInfo.from_mask(_mask())
    ref = _sdpa_reference(q, k, v, pack, D**-0.5)
    qb, kb, vb = (x.detach().bfloat16().requires_grad_() for x in (q, k, v))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = packed_attention(qb, kb, vb, pack)
    assert out.dtype == torch.bfloat16
    # inputs rounded to bf16 (rel. 2**-9) move the output by a few units of that, plus one
    # rounding of the output itself
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=8 * 2**-9 * ref.abs().max().item())
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    out.backward(g.bfloat16())
    assert qb.grad.dtype == kb.grad.dtype == vb.grad.dtype == torch.bfloat16
    want = torch.autograd.grad(ref, (q, k, v), g)
    for got, ref_grad in zip((qb.grad, kb.grad, vb.grad), want, strict=True):
        bound = 16 * 2**-9 * ref_grad.abs().max().item()  # bf16 inputs, upstream grad, output
        torch.testing.assert_close(got.double(), ref_grad, rtol=0, atol=bound)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_inference_path_matches_the_training_kernel(dtype):
    """Inference mode, no dropout: the fused-SDPA inference path computes the same attention."""
    q, k, v = (x.detach().to(dtype) for x in _qkv())
    pack = PackInfo.from_mask(_mask())
    with torch.inference_mode():
        fast = packed_attention(q, k, v, pack)
    trained = packed_attention(*(x.requires_grad_() for x in (q, k, v)), pack)
    assert trained.requires_grad  # the kernel with a backward ran
    # scores sum d products of inputs ~N(0, 1) (magnitude up to ~16), outputs sum L terms: both
    # paths round differently within the recursive-summation bound
    atol = float_tolerance(dtype, D * L, 16.0)
    torch.testing.assert_close(fast, trained.detach(), rtol=0, atol=atol)
    ref = _sdpa_reference(q.double(), k.double(), v.double(), pack, D**-0.5)
    torch.testing.assert_close(fast.double(), ref, rtol=0, atol=atol)


def test_encode_takes_the_inference_path_and_training_does_not(tiny_bert, monkeypatch):
    from cselab.model import attention
    from cselab.model.encoder import SentenceEncoder

    calls = []
    real = attention._inference_attention
    monkeypatch.setattr(attention, "_inference_attention", lambda *a: calls.append(1) or real(*a))
    enc = SentenceEncoder.from_pretrained(str(tiny_bert), pooler="avg")
    enc.encode(["a b c", "a"])
    assert len(calls) == enc.backbone.config.num_hidden_layers
    enc.train()
    with torch.no_grad():  # GradCache's first pass: the training kernel, as its replay
        enc(**enc.tokenize(["a b c", "a"]))
    assert len(calls) == enc.backbone.config.num_hidden_layers
