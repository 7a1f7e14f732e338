"""The training path on a CUDA GPU: the trainer at the default precision, GradCache, a resume
and fp16 loss scaling. Marked ``gpu``: skipped without CUDA, run by default where there is one
(``bench/gpu_check.py`` runs ``pytest -m gpu`` first). The CPU runs the same code in the other
test files; here only what differs on a GPU is checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import adamw_weight_tolerance
from cselab.app.train import build_trainer
from cselab.training import checkpoint as ckpt
from test_trainer import assert_same_weights, tiny_config

pytestmark = pytest.mark.gpu

#: The tests of GradCache, resume and fp16 here are of the eager step (whatever
#: ``train.compile: null`` resolves to, ``cselab.app.plan.GRAPHS_BY_DEFAULT``); the step in CUDA
#: graphs has its own tests below.
EAGER = "--train.compile=false"
GRAPHS = ("--train.compile=true", "--train.compile_mode=reduce-overhead")


def test_auto_precision_on_the_gpu_is_bf16_or_tf32(tiny_bert: Path, tmp_path: Path) -> None:
    trainer = build_trainer(tiny_config(tiny_bert, tmp_path, "--train.max_steps=4", EAGER))
    assert trainer.device.type == "cuda"
    results = trainer.train()
    expected = "bf16" if torch.cuda.is_bf16_supported(including_emulation=False) else "fp32"
    assert results["precision"] == expected
    if expected == "fp32":
        assert torch.backends.cuda.matmul.allow_tf32
    assert results["device"].startswith("cuda")


def test_gradcache_on_the_gpu_equals_the_plain_step(tiny_bert64: Path, tmp_path: Path) -> None:
    """Caching changes nothing on CUDA either: the same weights as the plain step after three
    AdamW steps. Dropout is off because the plain step draws one dropout mask for the whole
    batch and GradCache one per chunk: different (equally valid) masks, so the runs would differ
    by far more than roundoff (the replay of the CUDA dropout stream is the next test). The
    model is float64, where the roundoff bound of the CPU test holds on any GPU (in fp32 no
    tolerance separates the reordered sums from a bug, see ``adamw_weight_tolerance``)."""
    from safetensors.torch import load_file

    args = ("--train.precision=fp32", "--train.max_steps=3", "--model.dropout=0.0", EAGER)
    build_trainer(tiny_config(tiny_bert64, tmp_path / "a", *args)).train()
    build_trainer(
        tiny_config(tiny_bert64, tmp_path / "b", *args, "--train.cache_chunk_size=3")
    ).train()
    # 3 steps at lr 1e-3; gradient sums over 8 sentences x <= 16 tokens x 32 features
    tol = adamw_weight_tolerance(torch.float64, 3, 1e-3, 8 * 16 * 32)
    a = load_file(str(tmp_path / "a/out/last/model.safetensors"))
    b = load_file(str(tmp_path / "b/out/last/model.safetensors"))
    for k in a:
        assert a[k].dtype == torch.float64
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=tol, msg=k)


def test_gradcache_on_the_gpu_replays_the_cuda_dropout_stream(tiny_bert: Path) -> None:
    """Dropout on (hidden and attention, 0.1): GradCache's gradients equal one graph over the
    same chunked encoding (the same CUDA dropout masks), its replay reproduces every chunk
    exactly, and the CUDA stream continues as after a single pass (float64: roundoff only)."""
    from cselab.training.gradcache import cached_forward_backward
    from cselab.training.task import Batch
    from scaleout_helpers import SENTENCES, max_abs, max_diff, objective, param_grads, tiny_encoder
    from test_gradcache import chunked_full_graph, task

    enc, obj = tiny_encoder(tiny_bert, dropout=0.1).double().cuda(), objective("everything")
    batch = {k: v.cuda() for k, v in enc.tokenize(SENTENCES[:7]).items()}
    torch.cuda.manual_seed(11)
    enc.zero_grad(set_to_none=True)
    chunked_full_graph(enc, obj, batch, 3)
    reference, after = param_grads(enc), torch.cuda.get_rng_state()
    torch.cuda.manual_seed(11)
    enc.zero_grad(set_to_none=True)
    cached_forward_backward(task(enc, obj), Batch(0, batch), 3, verify=True, verify_atol=0.0)
    assert max_diff(param_grads(enc), reference) <= 1e-10 * max_abs(reference)
    assert torch.equal(torch.cuda.get_rng_state(), after)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_resume_on_the_gpu_is_bit_exact(
    tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, precision: str
) -> None:
    """Stop after step 7 (checkpoint at 6), resume: the CUDA RNG, the scaler (fp16) and the
    background-written checkpoint give the uninterrupted run's weights exactly."""
    from cselab.training.trainer import Trainer

    args = (f"--train.precision={precision}", "--train.save_steps=3", "--model.dropout=0.1", EAGER)
    build_trainer(tiny_config(tiny_bert, tmp_path / "ref", *args)).train()
    original = Trainer.train_step

    def stop(self: Trainer, batch: Any) -> Any:
        terms = original(self, batch)
        if self.step == 6:
            raise KeyboardInterrupt
        return terms

    monkeypatch.setattr(Trainer, "train_step", stop)
    with pytest.raises(KeyboardInterrupt):
        build_trainer(tiny_config(tiny_bert, tmp_path / "cut", *args)).train()
    monkeypatch.undo()
    _, meta = ckpt.load_checkpoint(tmp_path / "cut/out/checkpoint")
    assert meta["step"] == 6 and meta["extra"]["precision"] == precision
    build_trainer(tiny_config(tiny_bert, tmp_path / "cut", *args, "--train.resume=true")).train()
    assert_same_weights(tmp_path / "ref/out/last", tmp_path / "cut/out/last")


def test_fp16_overflow_on_the_gpu_skips_the_step(tiny_bert: Path, tmp_path: Path) -> None:
    trainer = build_trainer(tiny_config(tiny_bert, tmp_path, "--train.precision=fp16", EAGER))
    trainer.optim.scaler = torch.amp.GradScaler("cuda", init_scale=2.0**127)
    before = {k: v.clone() for k, v in trainer.encoder.state_dict().items()}
    trainer.forward_backward(trainer.batch_for(0))
    trainer.optimizer_step()
    assert trainer.optim.skipped_steps == 1 and trainer.optim.scheduler.last_epoch == 0
    assert all(torch.equal(before[k], v) for k, v in trainer.encoder.state_dict().items())


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_a_single_process_on_cuda_1_keeps_cuda_1s_rng(tiny_bert: Path, tmp_path: Path) -> None:
    trainer = build_trainer(
        tiny_config(tiny_bert, tmp_path, "--train.device=cuda:1", "--train.max_steps=2", EAGER)
    )
    trainer.train()
    tensors, _ = ckpt.load_checkpoint(tmp_path / "out/checkpoint")
    torch.cuda.manual_seed_all(0)  # both devices' streams differ from the run's now
    assert torch.equal(tensors["rng.0.cuda"], torch.cuda.get_rng_state(1)) is False
    trainer.run.resume()
    assert torch.equal(tensors["rng.0.cuda"], torch.cuda.get_rng_state(1))


def _loss_and_grads(trainer: Any, i: int) -> tuple[float, torch.Tensor]:
    """Step ``i``'s loss and gradients (zeroed first; no update)."""
    from cselab.objectives import total_loss

    trainer.optim.optimizer.zero_grad(set_to_none=True)
    loss = total_loss(trainer.forward_backward(trainer.batch_for(i))).item()
    return loss, torch.cat(
        [p.grad.flatten() for p in trainer.encoder.parameters() if p.grad is not None]
    )


def _graph_trainer(config: Any) -> Any:
    """A trainer whose encoder is compiled afresh (no earlier test's graphs or recompile
    count carried over)."""
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    return build_trainer(config)


def _assert_graphs_replayed() -> None:
    """Inductor captured the encoder in CUDA graphs (it skips them silently otherwise, and the
    comparison would be of eager with eager)."""
    from torch._dynamo.utils import counters

    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
    assert counters["stats"]["unique_graphs"] > 0, dict(counters["stats"])  # it compiled


#: How far (``‖Δ‖ / ‖ref‖``) the step in CUDA graphs may be from the eager one, by the dtype
#: the model computes in. BERT with [CLS] pooling and dropout off has two identical views, so
#: its gradient is a small difference of near-equal terms: in fp32 an H200 measured 3.9e-4
#: (4.9e-4 under GradCache) from Inductor's reordered sums, 3-4e3 times fp32's 1.2e-7 and the
#: size of a small real bug; in float64 the same amplification leaves ~1e-12 (Inductor on the
#: CPU, on the padded SDPA path a GPU compiles: 7e-13 to 2e-12, GradCache included;
#: ``tests/test_compiled_step.py``), far under 1e-9. The Llama decoder computes its RMSNorm and rotary
#: embedding in float32 whatever its weights (transformers casts them), so float64 weights do
#: not lower its roundoff (1.3e-7 on the CPU in float64); its mean pooling is well conditioned
#: and it is checked in fp32, at 1e-4 (passed on an H200). A stale graph input, an overwritten
#: output or a wrong mask is off by order one.
GRAPH_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4}


def _assert_same_steps(a: Any, b: Any, steps: int, dtype: torch.dtype) -> None:
    """Each step's loss and gradients of ``a`` equal ``b``'s within ``dtype``'s
    :data:`GRAPH_TOLERANCE`, from the same weights of ``dtype`` (no update between: AdamW would
    turn roundoff into differences of its learning rate), on a new batch each step."""
    tol = GRAPH_TOLERANCE[dtype]
    for trainer in (a, b):
        trainer.encoder.train()
    for i in range(steps):
        (loss_a, grad_a), (loss_b, grad_b) = _loss_and_grads(a, i), _loss_and_grads(b, i)
        assert grad_a.dtype == grad_b.dtype == dtype  # the bound is that dtype's
        rel = ((grad_a - grad_b).norm() / grad_b.norm()).item()
        # printed for the GPU check's log (pytest -rA keeps a passing test's output): the margin
        print(f"step {i}: loss {loss_a:.17g} vs {loss_b:.17g}; gradient |d|/|ref| {rel:.3g}")
        assert abs(loss_a - loss_b) <= tol * abs(loss_b), (i, loss_a, loss_b)
        assert rel <= tol, (i, rel)


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_the_step_in_cuda_graphs_equals_the_eager_one(
    tiny_bert64: Path, tmp_path: Path, family: str
) -> None:
    """``train.compile_mode=reduce-overhead`` on CUDA (what ``train.compile: null`` is to
    become): the encoder
    compiled with CUDA graphs (``reduce-overhead``, widths bucketed to 16). Each of five steps
    (the first ones warm up and record, the later ones replay the graphs on new batches) gives
    the eager step's loss and gradients (dropout off; BERT in float64, the decoder in fp32
    without TF32: :data:`GRAPH_TOLERANCE`); a run then trains to its end."""
    from backbone_models import make_tiny_decoder

    # float64 where it lowers the roundoff (GRAPH_TOLERANCE); the decoder in fp32
    model, dtype = (
        (tiny_bert64, torch.float64)
        if family == "bert"
        else (make_tiny_decoder(tmp_path / "llama"), torch.float32)
    )
    pooler = () if family == "bert" else ("--model.pooler=avg",)  # a decoder's padding side
    args = ("--train.precision=fp32", "--train.max_steps=5", "--model.dropout=0.0", *pooler)
    graphs = _graph_trainer(tiny_config(model, tmp_path / "a", *args, *GRAPHS))
    eager = build_trainer(tiny_config(model, tmp_path / "b", *args, EAGER))
    assert graphs.plan.compile_mode == "reduce-overhead" and eager.plan.compile_mode is None
    assert graphs.batches.width_multiple == 16 and eager.batches.width_multiple is None
    assert not torch.backends.cuda.matmul.allow_tf32
    _assert_same_steps(graphs, eager, 5, dtype)
    _assert_graphs_replayed()
    results = build_trainer(tiny_config(model, tmp_path / "c", *args, *GRAPHS)).train()
    assert results["steps"] == 5 and results["compile_mode"] == "reduce-overhead"


def test_gradcache_through_cuda_graphs_equals_the_plain_step(
    tiny_bert64: Path, tmp_path: Path
) -> None:
    """GradCache's chunk passes through the CUDA-graph encoder (chunks of 3, 3 and 2 rows: a
    graph per chunk shape; the detached first-pass vectors kept while later chunks replay) give
    the eager uncached step's loss and gradients, step after step (float64 weights, dropout
    off; see :data:`GRAPH_TOLERANCE`)."""
    args = ("--train.precision=fp32", "--model.dropout=0.0")
    plain = build_trainer(tiny_config(tiny_bert64, tmp_path / "a", *args, EAGER))
    cached = _graph_trainer(
        tiny_config(tiny_bert64, tmp_path / "b", *args, *GRAPHS, "--train.cache_chunk_size=3")
    )
    assert cached.plan.compile_mode == "reduce-overhead" and cached.task.graphs
    _assert_same_steps(cached, plain, 5, torch.float64)
    _assert_graphs_replayed()


def test_gradcache_through_cuda_graphs_replays_the_dropout_masks(
    tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dropout on (0.1) under GradCache through the CUDA-graph encoder: each chunk's second pass
    restores the first pass's random state and must draw the same masks inside the replayed
    graphs (``CSELAB_GRADCACHE_VERIFY`` compares every re-encoded chunk with its cached vectors
    and raises ``ReplayMismatch`` otherwise), step after step."""
    from cselab.training.gradcache import VERIFY_ENV

    monkeypatch.setenv(VERIFY_ENV, "1")
    args = ("--model.dropout=0.1", "--train.max_steps=5", "--train.cache_chunk_size=3", *GRAPHS)
    trainer = _graph_trainer(tiny_config(tiny_bert, tmp_path, *args))
    assert trainer.task.graphs
    assert trainer.train()["steps"] == 5
    _assert_graphs_replayed()
