"""The unpadded (packed) training forward computes what the padded forward computes.

The comparisons run the float64 tiny BERT: packed and padded forwards sum the same products in
different orders, so they agree within :func:`conftest.float_tolerance` of the longest sums.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import BertConfig

from conftest import encoder_sum_terms, float_tolerance
from cselab.model import unpad
from cselab.model.encoder import SentenceEncoder, dropout_disabled
from cselab.training.views import compute_views

# The tiny BERT's (2 layers, hidden 32, intermediate 64) forward on 9 tokens; its gradients also
# sum over the batch's 6 x 9 token rows.
FORWARD_TERMS = encoder_sum_terms(
    BertConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2), 9
)
GRAD_TERMS = FORWARD_TERMS * 6 * 9


def _close(got: torch.Tensor, want: torch.Tensor, terms: int, msg: str = "") -> None:
    tol = float_tolerance(want.dtype, terms, max(1.0, want.abs().max().item()))
    torch.testing.assert_close(got, want, rtol=0, atol=tol, msg=msg or None)


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 20000, (6, 9), generator=g)
    ids[:, 0] = 101
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    mask[3, 2:] = 0
    mask[4, 8:] = 0
    return ids * mask, mask


@pytest.mark.parametrize("full_batch", [False, True])
@pytest.mark.parametrize("pooler", ["cls", "cls_before_pooler", "avg"])
def test_unpadded_forward_and_gradients_match_padded(tiny_bert64, pooler, full_batch):
    enc = SentenceEncoder.from_pretrained(str(tiny_bert64), pooler=pooler, dropout=0.0).double()
    assert enc.unpad_training
    assert enc.backbone.config._attn_implementation == unpad.ATTENTION_NAME
    enc.train()
    ids, mask = _batch()
    if full_batch:  # no padding at all: the packed path still runs, and agrees
        mask = torch.ones_like(mask)
    results = []
    for flag in (False, True):
        enc.unpad_training = flag
        enc.zero_grad()
        z = enc(ids, mask)
        (z * torch.linspace(-1, 1, z.shape[-1], dtype=z.dtype)).sum().backward()
        grads = {n: p.grad.clone() for n, p in enc.named_parameters() if p.grad is not None}
        results.append((z.detach(), grads))
    (z_pad, g_pad), (z_unpad, g_unpad) = results
    assert z_pad.dtype == torch.float64
    _close(z_unpad, z_pad, FORWARD_TERMS)
    assert g_pad.keys() == g_unpad.keys()
    for name in g_pad:
        _close(g_unpad[name], g_pad[name], GRAD_TERMS, msg=name)


def test_off_dropout_view_on_the_unpadded_path(tiny_bert64, monkeypatch):
    """CPU training feeds padded batches without ``token_type_ids``, so the ImSimCSE off view
    runs the unpadded forward: it must be deterministic there and equal the padded
    dropout-free forward (MLP head included)."""
    enc = SentenceEncoder.from_pretrained(
        str(tiny_bert64), pooler="cls", mlp_only_train=True, dropout=0.3
    ).double()
    enc.train()
    ids, mask = _batch()
    calls: list[int] = []
    real = unpad.unpadded_last_hidden

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(unpad, "unpadded_last_hidden", counted)
    batch = {"input_ids": ids, "attention_mask": mask}
    a = compute_views(enc, batch, ["z1", "z2", "off"])
    b = compute_views(enc, batch, ["z1", "z2", "off"])
    assert len(calls) == 4  # the dropout pair and the off view, twice: all unpadded
    torch.testing.assert_close(a["off"], b["off"], rtol=0, atol=0)
    assert not torch.allclose(a["z1"], a["z2"])  # dropout 0.3 is on for the pair
    enc.unpad_training = False
    with dropout_disabled(enc.backbone):
        padded = enc(ids, mask)
    assert len(calls) == 4
    _close(a["off"], padded, FORWARD_TERMS)


def test_unpadded_last_hidden_matches_at_real_tokens(tiny_bert64):
    enc = SentenceEncoder.from_pretrained(str(tiny_bert64), pooler="avg")
    enc.eval()
    ids, mask = _batch(1)
    with torch.no_grad():
        padded = enc.backbone(input_ids=ids, attention_mask=mask).last_hidden_state
        packed = unpad.unpadded_last_hidden(enc.backbone, ids, mask)
    keep = mask.bool()
    _close(packed[keep], padded[keep], FORWARD_TERMS)
    assert torch.all(packed[~keep] == 0)


def test_unsupported_setups_use_the_padded_forward(tiny_bert, monkeypatch):
    calls = []
    real = unpad.unpadded_last_hidden
    monkeypatch.setattr(
        unpad, "unpadded_last_hidden", lambda *a, **k: calls.append(a) or real(*a, **k)
    )
    enc = SentenceEncoder.from_pretrained(str(tiny_bert), pooler="cls")
    ids, mask = _batch()
    enc.train()
    enc(ids, mask, token_type_ids=mask)  # two segments: the packed forward passes zeros
    every_layer = SentenceEncoder.from_pretrained(str(tiny_bert), pooler="avg_first_last")
    every_layer.train()
    every_layer(ids, mask)  # the pooler reads every layer's states
    enc.eval()
    enc.unpad_inference = False
    enc(ids, mask)
    assert calls == []
    enc.unpad_inference = True
    enc(ids, mask, token_type_ids=torch.zeros_like(mask))  # one segment: packed
    enc.train()
    enc(ids, torch.ones_like(mask))  # no padding: packed all the same (one path, one kernel)
    assert len(calls) == 2
    eager = SentenceEncoder.from_pretrained(str(tiny_bert), attn_implementation="eager")
    assert not eager.unpad_training and not eager.unpad_inference


@pytest.mark.parametrize("pooler", ["cls", "cls_before_pooler", "avg"])
def test_unpadded_inference_matches_padded(tiny_bert64, pooler):
    """``encode`` runs the packed forward on the CPU; its vectors are the padded forward's."""
    enc = SentenceEncoder.from_pretrained(str(tiny_bert64), pooler=pooler).double()
    assert enc.unpad_inference
    sentences = ["a b c d e f g", "a", "the cat sat on the mat", "x y", "one two three four"]
    packed = enc.encode(sentences, batch_size=3)
    enc.unpad_inference = False
    padded = enc.encode(sentences, batch_size=3)
    # encode() returns float32: the two float64 forwards agree far below its rounding
    np.testing.assert_allclose(packed, padded, rtol=0, atol=4 * np.finfo(np.float32).eps)


def test_encode_in_bf16(tiny_bert):
    enc = SentenceEncoder.from_pretrained(str(tiny_bert), pooler="avg")
    sentences = ["a b c d e f g", "a", "the cat sat on the mat", "x y"]
    fp32 = enc.encode(sentences, normalize=True)
    bf16 = enc.encode(sentences, normalize=True, precision="bf16")
    assert bf16.dtype == np.float32 and bf16.shape == fp32.shape
    assert not np.array_equal(bf16, fp32)  # it did run in bf16
    assert (bf16 * fp32).sum(1).min() > 0.99  # bf16 rounding only
    with pytest.raises(ValueError, match="precision='fp16' is unknown; choose one of fp32, bf16"):
        enc.encode(sentences, precision="fp16")


def test_bf16_autocast_and_saved_config(tiny_bert, tmp_path):
    enc = SentenceEncoder.from_pretrained(str(tiny_bert), pooler="cls")
    enc.train()
    ids, mask = _batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = enc(ids, mask)
    z.float().sum().backward()
    assert torch.isfinite(z.float()).all()
    enc.save(tmp_path / "model")
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert unpad.ATTENTION_NAME not in json.dumps(config)  # loadable anywhere


@pytest.mark.parametrize(("pooler", "last_layer_rows"), [("cls", 6), ("avg", 42)])
def test_cls_poolers_run_the_last_layer_on_first_tokens_only(tiny_bert, pooler, last_layer_rows):
    """The 6 sentences of ``_batch`` have 42 real tokens; a [CLS] pooler needs 6 of them."""
    enc = SentenceEncoder.from_pretrained(str(tiny_bert), pooler=pooler)
    rows = []
    layers = enc.backbone.encoder.layer
    layers[-1].intermediate.register_forward_hook(lambda m, a, out: rows.append(a[0].shape))
    layers[0].intermediate.register_forward_hook(lambda m, a, out: rows.append(a[0].shape))
    enc.train()
    ids, mask = _batch()
    assert int(mask.sum()) == 42
    enc(ids, mask)
    assert [r.numel() // r[-1] for r in rows] == [42, last_layer_rows]


def test_cls_last_layer_applies_dropout_where_the_full_layer_does(tiny_bert64, monkeypatch):
    """With every dropout made deterministic (a constant multiplier), the [CLS]-only last layer
    gives the full forward's [CLS] state and gradients: dropout sits in the same three places."""
    from cselab.model import attention, dropout

    def keep_all(shape, p, device="cpu", generator=None, seed=None):
        return torch.ones(tuple(shape), dtype=torch.bool, device=device)

    # every dropout is then the constant factor 1 / (1 - p): one missing or extra changes values
    monkeypatch.setattr(dropout, "keep_mask", keep_all)
    monkeypatch.setattr(attention, "keep_mask", keep_all)
    enc = SentenceEncoder.from_pretrained(str(tiny_bert64), pooler="cls", dropout=0.3).double()
    enc.train()
    ids, mask = _batch()
    results = []
    for first_only in (False, True):
        enc.zero_grad()
        last = unpad.unpadded_last_hidden(enc.backbone, ids, mask, first_token_only=first_only)
        z = enc.pooler(last, mask)
        (z * torch.linspace(-1, 1, z.shape[-1], dtype=z.dtype)).sum().backward()
        grads = {n: p.grad.clone() for n, p in enc.named_parameters() if p.grad is not None}
        results.append((z.detach(), grads))
    (z_full, g_full), (z_first, g_first) = results
    _close(z_first, z_full, FORWARD_TERMS)
    assert g_full.keys() == g_first.keys()
    for name in g_full:
        _close(g_first[name], g_full[name], GRAD_TERMS, msg=name)


def test_left_padding_gives_the_full_last_layers_first_column(tiny_bert64):
    """Column 0 of a left-padded batch is padding in some rows: zero there, as the full
    forward, and the first token's state in the rows that start at column 0 (no branch on the
    data, so a compiled forward stays one graph)."""
    enc = SentenceEncoder.from_pretrained(str(tiny_bert64), pooler="cls", dropout=0.0).double()
    enc.eval()
    ids, mask = _batch()
    mask = mask.flip(1)  # left padding
    ids = ids.flip(1)
    assert 0 < int(mask[:, 0].sum()) < len(mask)
    with torch.no_grad():
        full = unpad.unpadded_last_hidden(enc.backbone, ids, mask)
        first = unpad.unpadded_last_hidden(enc.backbone, ids, mask, first_token_only=True)
    _close(first[:, 0], full[:, 0], FORWARD_TERMS)
    assert torch.all(first[mask[:, 0] == 0, 0] == 0)
    assert torch.all(first[:, 1:] == 0)
