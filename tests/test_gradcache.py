"""GradCache: cached gradients equal full-graph gradients for every objective, dropout masks are
replayed, the random stream continues as after one pass, and activation memory falls with the
chunk size.

Tolerances: the model and the objectives run in float64 here, so the cached and uncached
gradients differ only by roundoff: ``1e-10 × max|reference gradient|``. Through the trainer
(float32, a few AdamW steps) the weights agree within ``1e-5``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from saved_tensors import SavedTensorMeter

import cselab.training.gradcache as gc
from conftest import adamw_weight_tolerance, write_corpus
from cselab.objectives import ObjectiveContext, total_loss
from cselab.training.gradcache import ReplayMismatch, cached_forward_backward, chunk_bounds
from cselab.training.rng import RNGState
from cselab.training.task import Batch, Task
from cselab.training.views import compute_views
from scaleout_helpers import (
    SENTENCES,
    VARIANTS,
    generator,
    max_abs,
    max_diff,
    objective,
    param_grads,
    rows,
    tiny_encoder,
)

REL = 1e-10
BATCH = 7
CHUNK = 3  # chunks of 3, 3 and 1 rows


pytestmark = pytest.mark.usefixtures("one_thread")


def task(encoder, obj) -> Task:
    """The step's task with a seeded generator (generated negatives are drawn the same way in
    the reference and the cached pass)."""
    return Task(encoder, obj, ObjectiveContext(generator=generator()))


@pytest.fixture(scope="module")
def dropout_encoder(tiny_bert: Path):
    """Hidden and attention dropout 0.1 (the attention dropout runs inside SDPA)."""
    return tiny_encoder(tiny_bert, dropout=0.1).double()


@pytest.fixture(scope="module")
def plain_encoder(tiny_bert: Path):
    return tiny_encoder(tiny_bert, dropout=0.0).double()


def chunked_full_graph(encoder, obj, batch, chunk: int) -> dict[str, torch.Tensor]:
    """Reference: the same chunked encoding (same random stream) but one graph for everything."""
    names = obj.required_views
    parts: dict[str, list[torch.Tensor]] = {}
    for start, end in chunk_bounds(batch["input_ids"].shape[0], chunk):
        for k, v in compute_views(encoder, rows(batch, start, end), names).items():
            parts.setdefault(k, []).append(v)
    views = {k: torch.cat(v) for k, v in parts.items()}
    terms = task(encoder, obj).losses(views, 0)
    total_loss(terms).backward()
    return {k: v.detach() for k, v in terms.items()}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cached_gradients_equal_the_full_graph_with_dropout(dropout_encoder, variant: str) -> None:
    enc, obj = dropout_encoder, objective(variant)
    batch = enc.tokenize(SENTENCES[:BATCH])

    torch.manual_seed(11)
    enc.zero_grad(set_to_none=True)
    ref_terms = chunked_full_graph(enc, obj, batch, CHUNK)
    reference = param_grads(enc)
    ref_rng = torch.get_rng_state()

    torch.manual_seed(11)
    enc.zero_grad(set_to_none=True)
    terms = cached_forward_backward(
        task(enc, obj), Batch(0, batch), CHUNK, verify=True, verify_atol=0.0
    )
    assert terms.keys() == ref_terms.keys()
    for k in terms:
        torch.testing.assert_close(terms[k], ref_terms[k], rtol=REL, atol=0)
    assert max_diff(param_grads(enc), reference) <= REL * max_abs(reference)
    # The random stream continues exactly as after a single pass: the next step's dropout masks
    # are not a replay of this step's.
    assert torch.equal(torch.get_rng_state(), ref_rng)


@pytest.mark.parametrize("variant", ["imsimcse", "everything"])
def test_first_pass_with_a_graph_replays_too(dropout_encoder, variant: str) -> None:
    """``first_pass_graph=True`` (the default on GPUs and for compiled encoders) gives the same
    gradients, and its peak activation memory is still about one chunk's."""
    enc, obj = dropout_encoder, objective(variant)
    batch = enc.tokenize(SENTENCES[:BATCH])
    torch.manual_seed(5)
    enc.zero_grad(set_to_none=True)
    chunked_full_graph(enc, obj, batch, CHUNK)
    reference = param_grads(enc)
    peaks = {}
    for graph in (False, True):
        torch.manual_seed(5)
        enc.zero_grad(set_to_none=True)
        with SavedTensorMeter(enc) as meter:
            cached_forward_backward(task(enc, obj), Batch(0, batch), CHUNK, verify=True,
                                    verify_atol=0.0, first_pass_graph=graph)  # fmt: skip
        peaks[graph] = meter.peak_bytes
        assert max_diff(param_grads(enc), reference) <= REL * max_abs(reference)
    assert peaks[True] <= 1.1 * peaks[False]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cached_gradients_equal_the_uncached_full_batch(plain_encoder, variant: str) -> None:
    """Dropout off: caching changes nothing, whatever the chunking (the trainer's own path)."""
    enc, obj = plain_encoder, objective(variant)
    batch = enc.tokenize(SENTENCES[:BATCH])
    enc.zero_grad(set_to_none=True)
    ref_terms = task(enc, obj)(Batch(0, batch))
    total_loss(ref_terms).backward()
    reference = param_grads(enc)
    for chunk in (1, CHUNK, BATCH):
        enc.zero_grad(set_to_none=True)
        terms = cached_forward_backward(task(enc, obj), Batch(0, batch), chunk)
        for k in terms:
            torch.testing.assert_close(terms[k], ref_terms[k].detach(), rtol=REL, atol=0)
        assert max_diff(param_grads(enc), reference) <= REL * max_abs(reference), chunk


def test_without_replaying_the_random_state_the_positives_change(
    dropout_encoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tests above are sensitive to the replay: without it the masks of the second pass differ
    (verification fails and the gradients are wrong)."""
    enc, obj = dropout_encoder, objective("infonce")
    batch = enc.tokenize(SENTENCES[:BATCH])
    torch.manual_seed(3)
    enc.zero_grad(set_to_none=True)
    chunked_full_graph(enc, obj, batch, CHUNK)
    reference = param_grads(enc)

    real_restore = RNGState.restore
    calls = {"n": 0}

    def restore_only_at_the_end(state: RNGState) -> None:
        calls["n"] += 1
        if calls["n"] > len(chunk_bounds(BATCH, CHUNK)):
            real_restore(state)

    monkeypatch.setattr(RNGState, "restore", restore_only_at_the_end)
    torch.manual_seed(3)
    with pytest.raises(ReplayMismatch, match="differs from the first pass"):
        cached_forward_backward(task(enc, obj), Batch(0, batch), CHUNK, verify=True)
    calls["n"] = 0
    torch.manual_seed(3)
    enc.zero_grad(set_to_none=True)
    cached_forward_backward(task(enc, obj), Batch(0, batch), CHUNK)
    assert max_diff(param_grads(enc), reference) > 1e-3 * max_abs(reference)


def test_loss_scale_reaches_the_parameters(plain_encoder) -> None:
    """``scale`` (fp16's GradScaler) multiplies the parameter gradients."""
    enc, obj = plain_encoder, objective("infonce")
    batch = enc.tokenize(SENTENCES[:BATCH])
    enc.zero_grad(set_to_none=True)
    cached_forward_backward(task(enc, obj), Batch(0, batch), CHUNK)
    plain = param_grads(enc)
    enc.zero_grad(set_to_none=True)
    cached_forward_backward(task(enc, obj), Batch(0, batch), CHUNK, scale=lambda x: x * 1024.0)
    scaled = param_grads(enc)
    assert max_diff({k: v / 1024.0 for k, v in scaled.items()}, plain) <= REL * max_abs(plain)


def test_chunk_bounds() -> None:
    assert chunk_bounds(7, 3) == [(0, 3), (3, 6), (6, 7)]
    assert chunk_bounds(4, 8) == [(0, 4)]
    with pytest.raises(ValueError):
        chunk_bounds(4, 0)


def test_peak_activation_memory_falls_with_the_chunk_size(tiny_bert: Path) -> None:
    """Bytes saved for backward at peak (ImSimCSE objective: three views per sentence)."""
    enc = tiny_encoder(tiny_bert, dropout=0.1)
    obj = objective("imsimcse")
    batch = enc.tokenize((SENTENCES * 6)[:64])
    with SavedTensorMeter(enc) as meter:
        total_loss(obj(compute_views(enc, batch, obj.required_views))).backward()
    uncached = meter.peak_bytes
    peaks = {}
    for chunk in (64, 32, 16, 8, 4):
        with SavedTensorMeter(enc) as meter:
            cached_forward_backward(task(enc, obj), Batch(0, batch), chunk)
        peaks[chunk] = meter.peak_bytes
    print("\nsaved-activation peak, batch 64:", f"uncached {uncached / 2**20:.2f} MiB;",
          ", ".join(f"chunk {c}: {b / 2**20:.2f} MiB" for c, b in peaks.items()))  # fmt: skip
    assert peaks[64] <= uncached * 1.05
    sizes = sorted(peaks)
    assert all(peaks[a] < peaks[b] for a, b in zip(sizes, sizes[1:], strict=False))
    assert peaks[8] < uncached / 4 and peaks[4] < uncached / 6


# ---------------------------------------------------------------------------------------------
# Through the trainer
# ---------------------------------------------------------------------------------------------


def tiny_run(tiny_bert: Path, tmp_path: Path, *extra: str):
    from cselab.config import load_config

    write_corpus(tmp_path, 48)
    return load_config(
        None,
        [
            f"--model.name_or_path={tiny_bert}",
            "--model.pooler=avg",
            f"--data.train_file={tmp_path / 'corpus.txt'}",
            f"--data.cache_dir={tmp_path / 'cache'}",
            f"--train.output_dir={tmp_path / 'out'}",
            "--train.batch_size=8",
            "--train.max_steps=3",
            "--train.lr=1e-3",
            "--train.eval_steps=0",
            "--train.log_steps=1",
            "--train.device=cpu",
            "--objective.off_dropout.enabled=true",
            "--objective.dcl.enabled=true",
            "--objective.gaussian.enabled=true",
            *extra,
        ],
    )


def test_trainer_with_cache_chunk_size_matches_the_uncached_trainer(
    tiny_bert64: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both train a float64 model: in float32 no weight tolerance holds on every CPU."""
    from safetensors.torch import load_file

    import cselab.training.step as step_module  # the step calls GradCache
    from cselab.app.train import build_trainer

    chunks: list[int] = []
    real = step_module.cached_forward_backward

    def counted(task, batch, chunk_size, **kwargs):
        chunks.append(chunk_size)
        return real(task, batch, chunk_size, **kwargs)

    monkeypatch.setattr(step_module, "cached_forward_backward", counted)

    tiny_bert = tiny_bert64
    # 3 steps at lr 1e-3; gradient sums over 8 sentences x <= 16 tokens x 32 features.
    tol = adamw_weight_tolerance(torch.float64, 3, 1e-3, 8 * 16 * 32)

    build_trainer(tiny_run(tiny_bert, tmp_path / "plain", "--model.dropout=0.0")).train()
    cached = build_trainer(
        tiny_run(
            tiny_bert, tmp_path / "cached", "--model.dropout=0.0", "--train.cache_chunk_size=3"
        )
    )
    assert chunks == []  # the uncached run never took the GradCache path
    cached.train()
    assert chunks == [3, 3, 3]
    a = load_file(str(tmp_path / "plain/out/last/model.safetensors"))
    b = load_file(str(tmp_path / "cached/out/last/model.safetensors"))
    for k in a:
        assert a[k].dtype == torch.float64
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=tol, msg=k)
    plain_rows = (tmp_path / "plain/out/metrics.csv").read_text().splitlines()
    cached_rows = (tmp_path / "cached/out/metrics.csv").read_text().splitlines()
    assert plain_rows[0] == cached_rows[0]  # same loss terms logged


def test_trainer_gradcache_with_dropout_and_bf16_replays_exactly(
    tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With dropout on and bf16 autocast, every re-encoded chunk equals its cached embeddings
    (checked at every step via ``CSELAB_GRADCACHE_VERIFY``)."""
    from cselab.app.train import build_trainer

    monkeypatch.setenv(gc.VERIFY_ENV, "1")
    trainer = build_trainer(
        tiny_run(
            tiny_bert,
            tmp_path,
            "--model.dropout=0.1",
            "--train.cache_chunk_size=3",
            "--train.precision=bf16",
            "--train.max_steps=2",
        )  # fmt: skip
    )
    results = trainer.train()
    assert results["steps"] == 2
