"""The packed attention as a custom operator, and the packed training forward as one graph.

``cselab::packed_attention`` is checked by ``torch.library.opcheck`` (schema, fake
implementation, registered autograd); the memory it keeps for the backward is counted with
``SavedTensorMeter``; the tiny BERT's training forward is traced by ``torch._dynamo.explain``
(no graph break) and compiled with AOTAutograd (``aot_eager``: the same graphs Inductor would
get, without code generation), which must give the eager values and gradients and compile once
for batches of every shape.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from saved_tensors import SavedTensorMeter
from torch._dynamo.utils import counters

from conftest import encoder_sum_terms, float_tolerance
from cselab.model.attention import PackInfo, _attention_op, packed_attention
from cselab.model.encoder import SentenceEncoder, compile_encoder

LENGTHS = [5, 2, 1, 4]
B, L, H, D = len(LENGTHS), 5, 2, 4


def _pack() -> PackInfo:
    mask = torch.zeros(B, L, dtype=torch.long)
    for b, n in enumerate(LENGTHS):
        mask[b, :n] = 1
    return PackInfo.from_mask(mask)


def _qkv(dtype=torch.float64) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    t = sum(LENGTHS)
    return [torch.randn(1, H, t, D, generator=g, dtype=dtype, requires_grad=True) for _ in "qkv"]


@pytest.mark.parametrize("dropout_p", [0.0, 0.25])
def test_the_operator_passes_opcheck(dropout_p):
    """Schema, fake implementation (shapes and dtypes), autograd registration."""
    pack = _pack()
    seed = torch.tensor(1234, dtype=torch.int64)
    args = (*_qkv(), pack.index, pack.pad_index, pack.key_bias, seed, dropout_p, 0.5)
    torch.library.opcheck(_attention_op, args)


def test_the_backward_keeps_a_bool_mask_not_float_copies():
    """Saved for the backward: the grid, the probabilities and a bool mask; nothing of the
    size of the probabilities in any float dtype besides the probabilities themselves."""
    pack = _pack()
    q, k, v = _qkv(torch.float32)
    cells = H * B * L * L
    with SavedTensorMeter() as meter:
        out = packed_attention(q, k, v, pack, 0.25)
        saved = meter.current_bytes
    grid = 3 * H * B * L * D * 4
    small = (pack.index.numel() + pack.pad_index.numel()) * 8 + pack.key_bias.numel() * 4
    assert saved == grid + cells * (4 + 1) + small  # float32 P + bool keep: 5 bytes a cell
    out.sum().backward()  # and the backward runs from them
    assert q.grad is not None and torch.isfinite(q.grad).all()


def _tiny_encoder(path, pooler: str, dropout: float | None = None) -> SentenceEncoder:
    enc = SentenceEncoder.from_pretrained(str(path), pooler=pooler, dropout=dropout)
    enc.train()
    return enc


#: the words of every test sentence here
WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "a",
    "mat",
    "while",
    "it",
    "rained",
    "over",
    "the",
    "old",
    "town",
]


def _batches(enc: SentenceEncoder) -> list[dict[str, torch.Tensor]]:
    sizes = [(3, 4), (5, 9), (2, 2), (7, 6)]  # (sentences, longest) differ from batch to batch
    return [enc.tokenize([" ".join(WORDS[: max(1, w - i)]) for i in range(n)]) for n, w in sizes]


@pytest.mark.parametrize(("pooler", "dropout"), [("cls", None), ("avg", 0.0)])
def test_the_training_forward_has_no_graph_break(tiny_bert, pooler, dropout):
    """[CLS] with dropout (SimCSE's training forward), mean pooling without (the off view)."""
    enc = _tiny_encoder(tiny_bert, pooler, dropout)
    batch = _batches(enc)[1]

    def step(ids, mask):  # SimCSE: two dropout views of one batch, a loss on both
        return (enc(ids, mask) * enc(ids, mask)).sum()

    torch._dynamo.reset()
    torch._dynamo.config.capture_dynamic_output_shape_ops = True  # as compile_encoder sets it
    explained = torch._dynamo.explain(step)(batch["input_ids"], batch["attention_mask"])
    assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]
    assert explained.graph_count == 1
    names = {str(n.target) for g in explained.graphs for n in g.graph.nodes}
    assert "cselab.packed_attention.default" in names  # traced into, not around


def test_compiled_training_matches_eager_and_compiles_once(tiny_bert64):
    """No dropout, float64: the compiled forward and backward give the eager values and
    gradients; four batches of different shapes share one graph."""
    enc = _tiny_encoder(tiny_bert64, "cls", dropout=0.0).double()
    assert enc.unpad_training
    torch._dynamo.reset()
    counters.clear()
    compiled = compile_encoder(enc, backend="aot_eager")
    terms = encoder_sum_terms(enc.backbone.config, 16) * 7 * 16
    for batch in _batches(enc):
        results = []
        for forward in (enc, compiled):
            enc.zero_grad()
            z = forward(batch["input_ids"], batch["attention_mask"])
            (z * torch.linspace(-1, 1, z.shape[-1], dtype=z.dtype)).sum().backward()
            grads = [p.grad.clone() for p in enc.parameters() if p.grad is not None]
            results.append((z.detach(), grads))
        (z_eager, g_eager), (z_comp, g_comp) = results
        tol = float_tolerance(torch.float64, terms, 10.0)
        torch.testing.assert_close(z_comp, z_eager, rtol=0, atol=tol)
        assert len(g_comp) == len(g_eager) > 0
        for a, b in zip(g_comp, g_eager, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=tol)
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["graph_break"]


@pytest.mark.slow
def test_compiled_training_draws_dropout(tiny_bert):
    """With dropout on, the compiled forward gives two different views of the same batch."""
    enc = _tiny_encoder(tiny_bert, "cls", dropout=0.3)
    torch._dynamo.reset()
    compiled = compile_encoder(enc, backend="aot_eager")
    batch = _batches(enc)[1]
    a = compiled(batch["input_ids"], batch["attention_mask"])
    b = compiled(batch["input_ids"], batch["attention_mask"])
    assert not torch.allclose(a, b)
    (a * b).sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in enc.parameters() if p.grad is not None)


@pytest.mark.slow  # Inductor compiles the tiny BERT: ~1-2 min on a 2-core machine
def test_bench_compile_smoke():
    """``bench/bench_compile.py --smoke``: one graph, fewer operators than eager, a time each."""
    import bench_compile

    result = bench_compile.main(["--smoke", "--threads", "1"])
    assert (result["graphs"], result["graph_breaks"]) == (1, 0)
    assert 0 < result["ops_per_step"]["compiled"] < result["ops_per_step"]["eager"]
    assert result["saved_for_backward_mib"] > 0
    assert all(t > 0 for t in result["s_per_step"].values())


def _sentences() -> list[str]:
    """Sentences of 1 to 13 words: length-sorted batches of 3 get three different widths."""
    return [" ".join(WORDS[: 1 + (7 * i) % len(WORDS)]) for i in range(9)]


@pytest.mark.parametrize("pooler", ["avg", "cls_before_pooler"])
def test_compiled_inference_matches_eager_and_compiles_once(tiny_bert64, pooler):
    """``compile_inference``: ``encode`` through one graph (no break, one compile for batches of
    three widths), vectors equal to eager's; the graph adds nothing to the weights."""
    enc = SentenceEncoder.from_pretrained(str(tiny_bert64), pooler=pooler).double().eval()
    assert enc.unpad_inference
    keys = list(enc.state_dict())
    sentences = _sentences()
    eager = enc.encode(sentences, batch_size=3)
    torch._dynamo.reset()
    counters.clear()
    compiled = enc.compile_inference(backend="aot_eager").encode(sentences, batch_size=3)
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["graph_break"]
    # float64 forwards, float32 vectors: one float32 rounding step apart (atol: components
    # near zero, where the float64 difference is larger than their float32 step)
    np.testing.assert_allclose(compiled, eager, rtol=2.0**-22, atol=1e-12)
    assert list(enc.state_dict()) == keys
    assert enc.compile_inference(False).inference_compile is None
    np.testing.assert_array_equal(enc.encode(sentences, batch_size=3), eager)  # eager again


def test_the_compile_flag_reaches_every_encoding_command(tiny_bert, tmp_path, monkeypatch):
    """``--compile`` on encode, evaluate, index build and mine reaches the ``load`` each
    command opens its model with (as ``compile_inference=True``; without it, ``False``), and
    ``load`` turns the compiled graph on."""
    import cselab.model.encoder
    from cselab.cli import main
    from cselab.model.encoder import load

    class Loaded(Exception):  # stops each command once its model would load
        pass

    seen: list[bool] = []

    def fake_load(path, pooler=None, device=None, *, compile_inference=False, **kwargs):
        seen.append(compile_inference)
        raise Loaded

    monkeypatch.setattr(cselab.model.encoder, "load", fake_load)
    (tmp_path / "in.txt").write_text("a cat\nthe dog\n", encoding="utf-8")
    (tmp_path / "pairs.tsv").write_text(
        "anchor\tpositive\na cat\ta small cat\nthe dog\ta big dog\nrain\tit rains\n",
        encoding="utf-8",
    )
    (tmp_path / "sts.tsv").write_text(
        "sentence1\tsentence2\tscore\n" + "".join(f"s{i}\tt{i}\t{i}\n" for i in range(6)),
        encoding="utf-8",
    )
    model = str(tiny_bert)
    commands = [
        ["encode", model, "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "v")],
        ["evaluate", model, "--sts-file", str(tmp_path / "sts.tsv")],
        ["index", "build", str(tmp_path / "in.txt"), "--model", model, "-o", str(tmp_path / "i")],
        ["mine", str(tmp_path / "pairs.tsv"), "--model", model, "-o", str(tmp_path / "t.tsv")],
    ]
    for argv in commands:
        for flag in (["--compile"], []):
            with pytest.raises(Loaded):
                main([*argv, *flag])
            assert seen.pop() is bool(flag), argv
    monkeypatch.undo()
    assert load(str(tiny_bert), compile_inference=True).inference_compile == {}
    assert load(str(tiny_bert)).inference_compile is None
