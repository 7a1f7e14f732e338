"""cselab.model.dropout: the cheaper CPU dropout has nn.Dropout's distribution and semantics."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from cselab.model import dropout as D


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.9])
def test_drop_rate_is_p(p):
    torch.manual_seed(0)
    n = 4_000_000
    dropped = (~D.keep_mask((n,), p)).double().mean().item()
    sd = math.sqrt(p * (1 - p) / n)
    assert abs(dropped - p) < 5 * sd


def test_threshold_is_exact(monkeypatch):
    """An element is dropped exactly when its 32 random bits are below round(p * 2**32)."""
    p = 0.1
    cut = round(p * 2**32) - 2**31
    values = torch.arange(cut - 3, cut + 3, dtype=torch.int32)
    monkeypatch.setattr(
        D, "random_int32", lambda shape, generator=None, seed=None: values.view(shape)
    )
    keep = D.keep_mask((6,), p)
    assert keep.tolist() == [False, False, False, True, True, True]


def test_bits_are_uniform_over_int32():
    torch.manual_seed(1)
    bits = D.random_int32((2_000_000,)).long()
    assert bits.min() < -(2**31) + 2**24 and bits.max() > 2**31 - 2**24
    counts = torch.bincount(((bits + 2**31) >> 28), minlength=16).double()  # 16 equal bins
    expected = bits.numel() / 16
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 50  # 15 degrees of freedom: p < 1e-5 above 50


def test_masks_follow_torch_generator_state():
    """Seeding and RNG snapshots (resume, GradCache replays) reproduce the masks exactly."""
    torch.manual_seed(3)
    a = D.keep_mask((1000,), 0.3)
    state = torch.get_rng_state()
    b = D.keep_mask((1000,), 0.3)
    torch.set_rng_state(state)
    assert torch.equal(D.keep_mask((1000,), 0.3), b)
    torch.manual_seed(3)
    assert torch.equal(D.keep_mask((1000,), 0.3), a)
    assert not torch.equal(a, b)
    gen = torch.Generator().manual_seed(5)
    c = D.keep_mask((1000,), 0.3, generator=gen)
    assert torch.equal(c, D.keep_mask((1000,), 0.3, generator=torch.Generator().manual_seed(5)))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_dropout_values_and_gradient(dtype):
    torch.manual_seed(0)
    x = torch.randn(300, 40, dtype=torch.float64).to(dtype).requires_grad_()
    y = D.dropout(x, 0.25)
    kept = y != 0
    scale = torch.tensor(1 / 0.75, dtype=dtype)  # nn.Dropout scales in the activation's dtype
    assert torch.equal(y[kept], x.detach()[kept] * scale)
    assert 0.2 < 1 - kept.double().mean().item() < 0.3
    (g,) = torch.autograd.grad(y, x, torch.ones_like(y))
    assert torch.equal(g, kept.to(dtype) * scale)


def test_neutral_settings():
    x = torch.randn(50, 7)
    assert torch.equal(D.dropout(x, 0.0), x)
    assert torch.equal(D.dropout(x, 0.4, training=False), x)
    assert torch.equal(D.dropout(x, 1.0), torch.zeros_like(x))


def test_swap_keeps_p_mode_and_eval_identity():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.2), nn.Sequential(nn.Dropout(0.4)))
    model.eval()
    assert D.use_fast_dropout(model) == 2
    assert [type(m) for m in model.modules() if isinstance(m, nn.Dropout)] == [D.Dropout] * 2
    assert [m.p for m in model.modules() if isinstance(m, nn.Dropout)] == [0.2, 0.4]
    assert not model[1].training
    x = torch.randn(3, 4)
    assert torch.equal(model(x), model[0](x))
    assert D.use_fast_dropout(model) == 0  # already swapped


def test_encoder_backbone_uses_fast_dropout(tiny_bert):
    from cselab.model.encoder import SentenceEncoder

    enc = SentenceEncoder.from_pretrained(str(tiny_bert), dropout=0.3)
    drops = [m for m in enc.backbone.modules() if isinstance(m, nn.Dropout)]
    assert drops and all(type(m) is D.Dropout and m.p == 0.3 for m in drops)
