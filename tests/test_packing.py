"""Packed rows (``cselab.model.packing``): a decoder's training forward on rows holding several
sentences equals the padded forward of ``transformers`` (the reference: the same model on the
padded batch), for causal and bidirectional decoders, every pooler that reads the last layer,
a prompt left out of the pooling, right and left padding; and its layout puts every token back
where it was."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

import cselab.model.packing as packing
from backbone_models import make_tiny
from cselab.model.sentence_encoder import SentenceEncoder

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = [
    "alpha beta gamma delta", "beta", "gamma delta alpha beta gamma delta epsilon",
    "delta alpha", "epsilon epsilon beta", "alpha",
]  # fmt: skip


def _mask(lengths: list[int], width: int, left: bool) -> np.ndarray:
    mask = np.zeros((len(lengths), width), dtype=np.int64)
    for i, n in enumerate(lengths):
        if left:
            mask[i, width - n :] = 1
        else:
            mask[i, :n] = 1
    return mask


@pytest.mark.parametrize("left", [False, True])
def test_the_layout_puts_every_token_back_where_it_was(left: bool) -> None:
    rng = np.random.default_rng(0)
    width = 16
    lengths = [int(x) for x in rng.integers(1, width + 1, 40)] + [width, 1, 0]
    mask = _mask(lengths, width, left)
    ids = rng.integers(5, 100, mask.shape) * mask  # pad id 0
    layout = packing.row_layout(mask)
    flat = np.concatenate([ids.reshape(-1), [0]])
    packed = flat[layout.source].reshape(layout.rows, width)
    # each sentence's tokens in order, positions from 0, in one segment of one row
    for i, n in enumerate(lengths):
        real = ids[i][mask[i] == 1]
        where = np.argwhere(layout.segments == i + 1)
        assert len(where) == n
        if n:
            assert len(set(where[:, 0])) == 1
            row, cols = where[0, 0], where[:, 1]
            assert np.array_equal(packed[row, cols], real)
            assert np.array_equal(layout.positions[row, cols], np.arange(n))
    # and back: every real padded position reads its own token
    back = packed.reshape(-1)[layout.back].reshape(mask.shape)
    assert np.array_equal(back * mask, ids)
    # first fit: no two rows could be one (each sentence of a later row did not fit an
    # earlier one), so at most one row is half empty; and no row is empty
    fills = np.sort((layout.segments > 0).sum(1))
    assert layout.rows >= int(np.ceil(sum(lengths) / width)) and fills[0] > 0
    assert fills[0] + fills[1] > width


def _encoders(folder: Path, pooler: str, bidirectional: bool) -> SentenceEncoder:
    enc = SentenceEncoder.from_pretrained(
        str(folder), pooler=pooler, dropout=0.0, bidirectional=bidirectional
    )
    return enc.double().train()


def _forward_and_grads(
    enc: SentenceEncoder, batch: dict[str, torch.Tensor], packed: bool
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    enc.pack_rows = "cpu" if packed else "no"
    enc.zero_grad(set_to_none=True)
    out = enc(**batch)
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    (out * weights).sum().backward()
    return out.detach(), [p.grad.clone() for p in enc.parameters() if p.grad is not None]


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen3"])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("pooler", ["avg", "last", "weighted_mean"])
def test_packed_rows_equal_the_padded_forward(
    tmp_path: Path, family: str, bidirectional: bool, pooler: str
) -> None:
    """Vectors and gradients of the packed forward against the padded one, float64."""
    enc = _encoders(
        make_tiny(family, tmp_path / family, dtype=torch.float64), pooler, bidirectional
    )
    assert enc.pack_rows
    batch = dict(enc.tokenize(TEXTS * 2, 16))
    calls = []
    real = packing.packed_last_hidden

    def counted(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return real(*args, **kwargs)

    packing.packed_last_hidden = counted  # type: ignore[assignment]
    try:
        out, grads = _forward_and_grads(enc, batch, packed=True)
    finally:
        packing.packed_last_hidden = real
    assert calls == [1]  # the packed forward ran
    ref, ref_grads = _forward_and_grads(enc, batch, packed=False)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12 * ref.abs().max().item())
    assert len(grads) == len(ref_grads) > 0
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10 * b.abs().max().item() + 1e-300)


def test_left_padding_and_a_prompt_left_out_pack_the_same(tmp_path: Path) -> None:
    """A left-padded batch (its positions shifted: rotary attention depends on relative
    positions only) and a pool mask leaving the first tokens out give the padded vectors, to
    the float32 roundoff of the rotary angles."""
    enc = _encoders(make_tiny("llama", tmp_path / "llama", dtype=torch.float64), "avg", False)
    enc.tokenizer.padding_side = "left"
    batch = dict(enc.tokenize(TEXTS, 16))
    mask = batch["attention_mask"]
    assert (mask[:, 0] == 0).any()  # left-padded
    pool = mask.clone()
    first = mask.argmax(1)
    pool[torch.arange(len(pool)), first] = 0  # the BOS as a prompt, left out
    batch["pool_mask"] = pool
    out, _ = _forward_and_grads(enc, batch, packed=True)
    ref, _ = _forward_and_grads(enc, batch, packed=False)
    # transformers computes the rotary angles in float32 whatever the weights: at other
    # absolute positions their roundoff (positions below 16 x 6e-8) differs, the relative
    # angles do not (a wrong mask or position is off by order one)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-5 * ref.abs().max().item())


def test_rows_are_packed_only_where_they_apply(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``model.pack_rows`` against ``fast_path``; training only (inference batches are sorted
    by length: little padding), SDPA decoders of the table only, rows within the sliding
    window."""
    llama = str(make_tiny("llama", tmp_path / "llama"))

    def packs(folder: str, **kwargs: object) -> str:
        return SentenceEncoder.from_pretrained(folder, **kwargs).pack_rows

    # model.pack_rows: null on the CPU with fast_path, true anywhere (a GPU too), false never
    assert packs(llama) == "cpu" and packs(llama, fast_path=False) == "no"
    assert packs(llama, pack_rows=True) == packs(llama, pack_rows=True, fast_path=False)
    assert packs(llama, pack_rows=True) == "anywhere" and packs(llama, pack_rows=False) == "no"
    with caplog.at_level(logging.WARNING, logger="cselab"):
        assert packs(str(make_tiny("gemma2", tmp_path / "g2")), pack_rows=True) == "no"
    assert "trains on padded rows: packed rows are for the SDPA decoders of" in caplog.text
    assert packs(str(make_tiny("bert", tmp_path / "bert")), pack_rows=True) == "no"
    modernbert = str(make_tiny("modernbert", tmp_path / "modernbert"))
    assert packs(modernbert) == "no" and packs(modernbert, pack_rows=True) == "no"
    windowed = make_tiny("mistral", tmp_path / "mistral", sliding_window=4)
    enc = SentenceEncoder.from_pretrained(str(windowed))
    assert enc.pack_rows == "cpu"
    assert not packing.fits(enc.backbone, 8) and packing.fits(enc.backbone, 4)
    calls = []
    real = packing.packed_last_hidden
    packing.packed_last_hidden = lambda *a, **k: calls.append(1) or real(*a, **k)  # type: ignore[assignment]
    try:
        batch = dict(enc.tokenize(TEXTS, 16))
        enc.eval()(**batch)
        enc.train()(**batch)  # wider than the window of 4: padded
        assert calls == []
    finally:
        packing.packed_last_hidden = real


@pytest.mark.parametrize("chunk", [0, 3])
def test_a_training_step_on_a_decoder_packs_its_rows_and_equals_the_padded_step(
    tmp_path: Path, chunk: int
) -> None:
    """The trainer's step (SimCSE's doubled batch), plain and through GradCache's chunks of 3
    rows (each chunk packed on its own, in both passes), goes through the packed forward and
    gives the plain padded step's loss and gradients (dropout off, float64)."""
    from cselab.app.train import build_trainer
    from test_trainer import tiny_config

    model = make_tiny("llama", tmp_path / "llama", dtype=torch.float64)

    def step(packed: bool, *extra: str) -> tuple[float, list[torch.Tensor], int, bool]:
        args = ("--model.dropout=0.0", "--model.pooler=avg", f"--model.pack_rows={packed}")
        trainer = build_trainer(tiny_config(model, tmp_path / f"out-{packed}", *args, *extra))
        calls = []
        real = packing.packed_last_hidden
        packing.packed_last_hidden = lambda *a, **k: calls.append(1) or real(*a, **k)  # type: ignore[assignment]
        try:
            trainer.encoder.train()
            terms = trainer.forward_backward(trainer.batch_for(0))
        finally:
            packing.packed_last_hidden = real
        loss = float(sum(v.detach() for v in terms.values()))
        grads = [p.grad.clone() for p in trainer.encoder.parameters() if p.grad is not None]
        return loss, grads, len(calls), trainer.encoder.packed_rows

    extra = (f"--train.cache_chunk_size={chunk}",) if chunk else ()
    loss, grads, calls, packed = step(True, *extra)
    ref, ref_grads, ref_calls, ref_packed = step(False)
    # one pass over the doubled batch, or each chunk's two passes (no grad, then with it)
    assert calls == (1 if not chunk else 2 * -(-8 // chunk)) and ref_calls == 0  # batch 8
    assert packed and not ref_packed  # what results.json reports as packed_rows
    assert abs(loss - ref) <= 1e-12 * abs(ref)
    assert len(grads) == len(ref_grads) > 0
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10 * b.abs().max().item() + 1e-300)


def test_a_decoder_s_forwards_build_no_key_value_cache(tmp_path: Path) -> None:
    """cselab never generates: every forward of a decoder (padded, packed, the LM head's)
    asks for no cache (which would hold each layer's keys and values, and makes
    ``transformers`` warn under checkpointing); an encoder's forward is called as before."""
    from backbone_models import make_tiny_decoder
    from cselab.model import backbones

    enc = SentenceEncoder.from_pretrained(
        str(make_tiny_decoder(tmp_path / "llama")), pooler="avg", lm_head=True
    )
    seen: list[object] = []
    real = enc.backbone.forward

    def forward(*args: object, **kwargs: object) -> object:
        seen.append(kwargs.get("use_cache", "not given"))
        return real(*args, **kwargs)

    enc.backbone.forward = forward  # type: ignore[method-assign]
    batch = dict(enc.tokenize(["a man plays", "the guitar is loud today", "yes"], 16))
    enc.train()(**batch)  # packed rows
    enc.pack_rows = "no"
    enc(**batch)  # padded
    enc.token_logits(batch["input_ids"], batch["attention_mask"], torch.tensor([[0, 1]]))
    assert seen == [False, False, False]
    for family in ("bert", "modernbert"):
        encoder = SentenceEncoder.from_pretrained(str(make_tiny(family, tmp_path / family)))
        assert backbones.no_cache(encoder.backbone) == {}
    # through LoRA's wrapper too (peft's forward takes **kwargs: its base model is asked)
    from cselab.model.config import LoRAConfig

    lora = SentenceEncoder.from_pretrained(
        str(make_tiny("llama", tmp_path / "plain-llama")), lora=LoRAConfig(r=2)
    )
    assert lora.has_adapters and backbones.no_cache(lora.backbone) == {"use_cache": False}


def test_a_mask_with_a_hole_is_refused() -> None:
    """Each row's real tokens must be contiguous: a hole would gather other tokens, silently."""
    with pytest.raises(ValueError, match="contiguous"):
        packing.row_layout(np.array([[1, 0, 1, 0], [1, 1, 0, 0]]))
