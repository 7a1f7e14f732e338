"""The compiled training step (``train.compile``: the trainer's forward wrapped by
``compile_encoder``) gives the eager step's loss and gradients on tiny BERT, ModernBERT and
Llama: float64, dropout off, so the two differ by roundoff only. Dynamo and AOTAutograd run as
in a real compile; the code generator is ``aot_eager`` (Inductor's own code generation takes
minutes per model on a small CPU: the ``slow`` variant runs it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import cselab.app.train as app_train
from backbone_models import make_tiny
from conftest import encoder_sum_terms, float_tolerance
from cselab.app.train import build_trainer
from test_trainer import tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")

#: each case's options; ``bert-padded``: BERT without the CPU's packed forward, the padded SDPA
#: path a GPU compiles (and the one ``tests/test_gpu.py``'s float64 bound is about)
FAMILIES = {
    "bert": [], "bert-padded": ["--model.fast_path=false"], "modernbert": [],
    "llama": ["--model.pooler=avg"],
}  # fmt: skip


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("compiled-step")
    built = {f: make_tiny(f, root / f, dtype=torch.float64) for f in FAMILIES if "-" not in f}
    return {f: built[f.split("-")[0]] for f in FAMILIES}


def step(model: Path, out: Path, family: str, *extra: str) -> tuple[torch.Tensor, list]:
    """One training step's loss and the parameters' gradients."""
    args = ("--model.dropout=0.0", "--train.device=cpu", *FAMILIES[family], *extra)
    trainer = build_trainer(tiny_config(model, out, *args))
    # the compiled run's task encodes through torch.compile's wrapper, the eager one does not
    assert hasattr(trainer.task.encoder, "_orig_mod") == ("--train.compile=true" in extra)
    trainer.encoder.train()
    terms = trainer.forward_backward(trainer.batch_for(0))
    loss = sum(v.detach() for v in terms.values()) if isinstance(terms, dict) else terms
    grads = [p.grad.clone() for p in trainer.encoder.parameters() if p.grad is not None]
    return torch.as_tensor(loss), grads


def check(models: dict[str, Path], tmp_path: Path, family: str) -> None:
    model = models[family]
    eager_loss, eager = step(model, tmp_path / "eager", family)
    torch._dynamo.reset()
    compiled_loss, compiled = step(model, tmp_path / "compiled", family, "--train.compile=true")
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(model))
    tol = float_tolerance(torch.float64, encoder_sum_terms(config, 16) * 8 * 16, 10.0)
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=0, atol=tol)
    assert len(compiled) == len(eager) > 0
    for a, b in zip(compiled, eager, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=tol)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_compiled_step_equals_the_eager_step(
    models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, family: str
) -> None:
    real = app_train.compile_encoder
    monkeypatch.setattr(
        app_train, "compile_encoder", lambda enc, **opts: real(enc, backend="aot_eager", **opts)
    )
    check(models, tmp_path, family)


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_inductor_compiled_step_equals_the_eager_step(
    models: dict[str, Path], tmp_path: Path, family: str
) -> None:
    check(models, tmp_path, family)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_gradcache_through_the_fixed_shape_compiled_step_equals_the_eager_step(
    models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, family: str
) -> None:
    """``train.compile_mode=reduce-overhead`` (what a GPU runs in CUDA graphs: widths padded to
    16, one graph per shape) under GradCache, on BERT, ModernBERT and Llama
    (chunks of 3, 3 and 2 rows, both passes through the compiled encoder) gives the eager
    uncached step's loss and gradients. The CPU has no CUDA graphs: the code generator is
    ``aot_eager``, the shapes and the step's sequence are the GPU's."""
    real = app_train.compile_encoder

    def fixed(enc: torch.nn.Module, **opts: object) -> torch.nn.Module:
        assert opts.pop("mode") == "reduce-overhead" and opts["dynamic"] is False
        return real(enc, backend="aot_eager", **opts)

    monkeypatch.setattr(app_train, "compile_encoder", fixed)
    eager_loss, eager = step(models[family], tmp_path / "eager", family)
    torch._dynamo.reset()
    graphs = ("--train.compile=true", "--train.compile_mode=reduce-overhead")
    loss, cached = step(models[family], tmp_path / "cached", family, *graphs,
                        "--train.cache_chunk_size=3")  # fmt: skip
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(models[family]))
    tol = float_tolerance(torch.float64, encoder_sum_terms(config, 16) * 8 * 16, 10.0)
    torch.testing.assert_close(loss, eager_loss, rtol=0, atol=tol)
    assert len(cached) == len(eager) > 0
    for a, b in zip(cached, eager, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=tol)


@pytest.mark.parametrize("graphs", [True, False])
def test_a_step_through_cuda_graphs_begins_a_generation_of_their_memory(
    tiny_bert: Path, monkeypatch: pytest.MonkeyPatch, graphs: bool
) -> None:
    """A task whose encoder replays CUDA graphs (``reduce-overhead`` on a GPU) marks each
    step's start once, before the step's first encoder call, GradCache's chunks included (so
    no encoder call of the step overwrites another's outputs); an eager task never does (the
    mark imports Inductor)."""
    from types import SimpleNamespace

    from cselab.training.step import forward_backward
    from cselab.training.task import Batch, Task
    from scaleout_helpers import SENTENCES, objective, tiny_encoder

    events: list[str] = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: events.append("mark"))
    enc = tiny_encoder(tiny_bert, dropout=0.0)
    enc.register_forward_pre_hook(lambda *_: events.append("encode"))
    task = Task(enc, objective("everything"), graphs=graphs)
    batch = Batch(0, enc.tokenize(SENTENCES[:6]))
    optim = SimpleNamespace(scale=lambda loss: loss)
    for chunk in (0, 2):  # the plain step, then GradCache's chunks of 2
        events.clear()
        forward_backward(task, optim, batch, chunk=chunk)  # type: ignore[arg-type]
        assert events.count("encode") >= (1 if chunk == 0 else 6), events
        assert events.count("mark") == (1 if graphs else 0), events
        assert not graphs or events[0] == "mark", events
