"""Data parallelism on 2 CPU processes (gloo): every objective means the same on 2 ranks as on
one process with the same global batch.

Tolerances (the equivalence checks run in float64; the 2-process run sums and gathers in a
different order, so only roundoff separates the two):

* loss terms: the mean over ranks of each term equals the single-process term within
  ``1e-10 × max(1, |term|)``;
* gradients (with respect to the embeddings, ×1/world; with respect to the parameters, after the
  all-reduce average; with GradCache on each rank): within ``1e-10 × max|reference gradient|``
  (+1e-14);
* weights after a few training steps (torchrun, dropout off): also run in float64 (a float64
  checkpoint), within :data:`WEIGHT_TOL` (see ``conftest.adamw_weight_tolerance``: in float32 no
  tolerance holds on every CPU).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from conftest import adamw_weight_tolerance, write_corpus
from cselab.data import BatchOrder, shard
from scaleout_helpers import (
    ALL_VARIANTS,
    PROMPT_VARIANTS,
    equivalence_worker,
    free_port,
    rng_worker,
    spawn,
)

REL = 1e-10
ABS = 1e-14
STEPS, LR = 4, 1e-3
# Gradient sums run over the global batch's 8 sentences x <= 16 tokens x 32 features. About
# 1.4e-7 (measured: 3e-14); skipping the gradient all-reduce moves weights by 5e-3.
WEIGHT_TOL = adamw_weight_tolerance(torch.float64, STEPS, LR, 8 * 16 * 32)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def ddp(tiny_bert: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """One 2-process run computing every comparison (spawning is the slow part)."""
    return spawn(equivalence_worker, tmp_path_factory.mktemp("ddp"), str(tiny_bert))


def test_gather_with_grad_concatenates_and_returns_gradients_to_their_rank(ddp: list[dict]) -> None:
    base = torch.arange(6.0).reshape(3, 2)
    expected = torch.cat([base, base + 10])
    weights = torch.arange(12.0).reshape(6, 2)
    for r, out in enumerate(ddp):
        assert torch.equal(out["gather_value"], expected)
        # Rank q's loss is Σ (q+1)·w·g: rank r's rows receive Σ_q (q+1)·w[rows of r] = 3·w[...].
        assert torch.equal(out["gather_grad"], 3 * weights[3 * r : 3 * r + 3])


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_two_ranks_equal_one_process(ddp: list[dict], variant: str) -> None:
    for out in ddp:
        rec = out["variants"][variant]
        assert rec["terms_match"] == 1.0
        assert rec["loss_diff"] <= REL * max(1.0, rec["loss_scale"]), rec
        assert rec["emb_grad_diff"] <= REL * rec["emb_grad_scale"] + ABS, rec
        assert rec["param_grad_diff"] <= REL * rec["param_grad_scale"] + ABS, rec


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_gradcache_under_ddp_equals_one_uncached_process(ddp: list[dict], variant: str) -> None:
    for out in ddp:
        rec = out["variants"][variant]
        assert rec["cached_param_grad_diff"] <= REL * rec["param_grad_scale"] + ABS, rec


@pytest.mark.parametrize("variant", PROMPT_VARIANTS)
def test_prompt_pooler_two_ranks_and_gradcache_equal_one_process(
    ddp: list[dict], variant: str
) -> None:
    """PromptBERT's two templates and template denoising run per rank on its own rows."""
    for out in ddp:
        rec = out["prompt_variants"][variant]
        assert rec["param_grad_diff"] <= REL * rec["param_grad_scale"] + ABS, rec
        assert rec["cached_param_grad_diff"] <= REL * rec["param_grad_scale"] + ABS, rec


@pytest.fixture(scope="module")
def rng_runs(tiny_bert: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    folder = tmp_path_factory.mktemp("rng")
    args = overrides(tiny_bert, folder / "run", corpus(folder / "data"), "--model.dropout=0.1")
    return spawn(rng_worker, folder / "workers", str(folder / "checkpoint"), args)


def test_gather_backward_leaves_a_shared_incoming_gradient_alone(rng_runs: list[dict]) -> None:
    for out in rng_runs:
        torch.testing.assert_close(out["u_grad"], torch.full((4, 3), 3.0))  # d(3u)/du, once
        torch.testing.assert_close(out["x_grad"], torch.full((2, 3), 2.0))  # both ranks' use


def test_ranks_disagreeing_is_an_error_on_every_rank(rng_runs: list[dict]) -> None:
    for out in rng_runs:
        assert out["disagreement"] == "ranks disagree on the rank (rank 0: 0, rank 1: 1)"


def test_generated_draws_are_shared_by_the_ranks_and_fresh_each_step(rng_runs: list[dict]) -> None:
    """The trainer's task re-seeds the objective's generator from (seed, step) on every rank:
    the ranks draw the same vectors at a step (the objective does not depend on the number of
    ranks), a new step draws new ones, and the same step again (a resumed run) the same ones."""
    first, second = rng_runs
    for a, b in zip(first["step_draws"], second["step_draws"], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    s0, s1, s0_again = first["step_draws"]
    assert not torch.equal(s0, s1)
    torch.testing.assert_close(s0, s0_again, rtol=0, atol=0)


def test_each_rank_resumes_its_own_dropout_stream(rng_runs: list[dict]) -> None:
    """Ranks draw different dropout streams (rank 0 keeps the configured seed), and a checkpoint
    written by rank 0 restores every rank's own stream, not rank 0's copy of it."""
    first, second = rng_runs
    assert not torch.equal(first["after_build_trainer"], second["after_build_trainer"])
    assert not torch.equal(first["next"], second["next"])
    for out in rng_runs:
        assert out["restored"] and out["missing_rank"]
        torch.testing.assert_close(out["next_after_restore"], out["next"], rtol=0, atol=0)
    torch.manual_seed(11)
    torch.nn.Linear(2, 2)  # the worker builds one after seeding
    torch.testing.assert_close(first["next"], torch.rand(4), rtol=0, atol=0)


def test_data_order_is_partitioned_without_overlap_and_resumable() -> None:
    order = BatchOrder(103, 12, seed=5)
    world = 4
    for epoch in range(2):
        seen: list[int] = []
        for index in range(order.batches_per_epoch):
            batch = order.batch(epoch, index)
            parts = [shard(batch, r, world) for r in range(world)]
            flat = np.concatenate(parts)
            assert sorted(flat.tolist()) == sorted(batch.tolist())  # no overlap, nothing lost
            assert all(len(p) == 3 for p in parts)
            seen += flat.tolist()
            # Each rank recomputes the same global batch from (seed, epoch, index) alone.
            again = BatchOrder(103, 12, seed=5).batch(epoch, index)
            assert np.array_equal(again, batch)
        assert len(set(seen)) == len(seen) == 12 * order.batches_per_epoch
    with pytest.raises(ValueError):
        shard(order.batch(0, 0), 0, 5)


# ---------------------------------------------------------------------------------------------
# End to end: torchrun, resume
# ---------------------------------------------------------------------------------------------


def corpus(folder: Path, n: int = 64) -> Path:
    return write_corpus(folder, n)


def overrides(tiny_bert: Path, run: Path, data: Path, *extra: str) -> list[str]:
    return [
        f"--model.name_or_path={tiny_bert}",
        # Mean pooling: the random tiny model's CLS vectors are nearly collinear (cosine > 0.9999),
        # which makes float32 training ill-conditioned; mean-pooled vectors are not.
        "--model.pooler=avg",
        "--model.dropout=0.0",
        f"--data.train_file={data}",
        f"--data.cache_dir={run / 'cache'}",
        f"--train.output_dir={run / 'out'}",
        "--train.batch_size=8",
        f"--train.max_steps={STEPS}",
        f"--train.lr={LR}",
        "--train.eval_steps=0",
        "--train.log_steps=1",
        "--train.device=cpu",
        *extra,
    ]


def assert_close_weights(a: Path, b: Path, atol: float) -> None:
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for k in wa:
        assert wa[k].dtype == wb[k].dtype
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=atol, msg=k)


def test_torchrun_two_processes_train_like_one_with_the_global_batch(
    tiny_bert64: Path, tmp_path: Path
) -> None:
    """``torchrun --nproc_per_node=2 -m cselab train`` (batch 8 = 2 × 4) gives the weights of one
    process with batch 8, with an objective that gathers in every way (in-batch, off-dropout,
    mixed and Gaussian negatives, DCL, BarlowTwins). Both train a float64 model."""
    tiny_bert = tiny_bert64
    from cselab.app.train import train
    from cselab.config import load_config

    data = corpus(tmp_path / "data")
    objective = [
        "--objective.focal.enabled=true",
        "--objective.gaussian.enabled=true",
        "--objective.off_dropout.enabled=true",
        "--objective.mixcse.enabled=true",
        "--objective.dcl.enabled=true",
        "--objective.barlow_twins.enabled=true",
        "--objective.barlow_twins.padding=4",
    ]
    ddp_run = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        "-m", "cselab", "-q", "train", *overrides(tiny_bert, ddp_run, data, *objective),
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]

    single_run = tmp_path / "single"
    results = train(load_config(None, overrides(tiny_bert, single_run, data, *objective)))
    assert results["world_size"] == 1
    assert (
        load_file(str(single_run / "out/last/model.safetensors"))["pooler.dense.weight"].dtype
        == torch.float64
    )
    assert_close_weights(ddp_run / "out/last", single_run / "out/last", WEIGHT_TOL)

    # Only rank 0 logs: one metrics row per step, not two.
    rows = (ddp_run / "out/metrics.csv").read_text().strip().splitlines()
    assert [r.split(",")[0] for r in rows[1:]] == ["1", "2", "3", "4"]
    ddp_results = (ddp_run / "out/results.json").read_text()
    assert '"world_size": 2' in ddp_results


def _resume_worker(rank: int, world: int, config_args: list[str], phase: str) -> dict:
    """Build the trainer the way ``torchrun`` would (environment variables) and train."""
    from cselab.app.train import build_trainer
    from cselab.config import load_config

    trainer = build_trainer(load_config(None, config_args))
    if phase == "interrupted":
        # stop (and checkpoint) half-way; the lr schedule stays at 4
        trainer.loop = dataclasses.replace(trainer.loop, total_steps=2)
    results = trainer.train()
    return {"step": trainer.step, "results": results}


@pytest.mark.slow
def test_two_process_resume_matches_an_uninterrupted_run(tiny_bert: Path, tmp_path: Path) -> None:
    data = corpus(tmp_path / "data")
    # Dropout on: each rank's own random stream must survive the checkpoint.
    full = overrides(
        tiny_bert, tmp_path / "full", data, "--train.save_steps=2", "--model.dropout=0.1"
    )
    spawn(_resume_worker, tmp_path / "w1", full, "full")
    part = overrides(
        tiny_bert,
        tmp_path / "part",
        data,
        "--train.save_steps=2",
        "--model.dropout=0.1",
        "--train.resume=true",
    )
    first = spawn(_resume_worker, tmp_path / "w2", part, "interrupted")
    assert [r["step"] for r in first] == [2, 2]
    second = spawn(_resume_worker, tmp_path / "w3", part, "resume")
    assert [r["step"] for r in second] == [4, 4]
    assert second[1]["results"] == {}  # rank 1 neither saves nor reports
    assert_close_weights(tmp_path / "full/out/last", tmp_path / "part/out/last", atol=0)


# ---------------------------------------------------------------------------------------------
# Waiting ranks: the collective timeout, the upload after the group is gone
# ---------------------------------------------------------------------------------------------


def _timeout_worker(rank: int, world: int, timeout_s: float) -> dict:
    """Rank 1 arrives at a barrier 3 s after rank 0 (rank 0 working alone, as when it
    tokenises); with ``timeout_s`` below that, rank 0's wait fails."""
    import time

    from cselab.training.distributed import barrier, init_distributed

    init_distributed("cpu", timeout_s=timeout_s)
    if rank == 1:
        time.sleep(3)
    try:
        barrier()
    except RuntimeError as err:
        return {"timed_out": True, "error": str(err).splitlines()[0]}
    return {"timed_out": False}


def test_dist_timeout_is_the_process_groups(tmp_path: Path) -> None:
    """``init_distributed(timeout_s=...)`` (``train.dist_timeout_s``) is the collective timeout:
    a 1 s timeout fails rank 0's wait for a rank 3 s late, the default waits."""
    short = spawn(_timeout_worker, tmp_path / "short", 1.0, group=False)
    assert short[0]["timed_out"], short
    generous = spawn(_timeout_worker, tmp_path / "long", 7200.0, group=False)
    assert [r["timed_out"] for r in generous] == [False, False]


#: How long the rank that fills the token cache tokenises (slowed down), and the collective
#: timeout of the run: longer, so a rank waiting for it in a collective would time out.
SLOW_TOKENISE_S, SHORT_TIMEOUT_S = 14.0, 8.0


def _slow_tokenise_worker(rank: int, world: int, config_args: list[str]) -> dict:
    """``train`` with tokenising slowed to :data:`SLOW_TOKENISE_S` on whichever rank does it
    (the cache's builder): the others must wait for it without a collective."""
    import time

    from cselab.app.train import train
    from cselab.config import load_config
    from cselab.data.store import TokenizedCorpus

    built: list[float] = []
    real_build = TokenizedCorpus.build.__func__

    def slow_build(cls, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        built.append(time.monotonic())
        time.sleep(SLOW_TOKENISE_S)
        return real_build(cls, *args, **kwargs)

    TokenizedCorpus.build = classmethod(slow_build)
    results = train(load_config(None, config_args))
    return {"built": len(built), "results": results}


@pytest.mark.slow
def test_no_rank_waits_in_a_collective_while_another_tokenises(
    tiny_bert: Path, tmp_path: Path
) -> None:
    """The corpus is tokenised once, by one rank, before the process group forms; the other
    rank waits on the token cache's file lock, which no collective timeout bounds, and reads
    the cache. With ``train.dist_timeout_s`` shorter than the tokenising the run completes
    (before, rank 1 waited for rank 0 in a barrier and the group timed out)."""
    data = corpus(tmp_path / "data", 16)
    args = overrides(
        tiny_bert, tmp_path / "run", data, "--train.max_steps=2",
        f"--train.dist_timeout_s={SHORT_TIMEOUT_S}",
    )  # fmt: skip
    out = spawn(_slow_tokenise_worker, tmp_path / "w", args, group=False)
    assert sum(r["built"] for r in out) == 1  # one rank tokenised, the other read its entry
    assert out[0]["results"]["steps"] == 2 and out[0]["results"]["world_size"] == 2
    assert len(list((tmp_path / "run/cache/tokens").glob("tokens-*"))) == 1


def _push_worker(rank: int, world: int, config_args: list[str]) -> dict:
    """``cselab.app.train.train`` with ``push_to_hub``: the upload (recorded, not sent)
    sees whether a process group still exists."""
    import torch.distributed as dist

    import cselab.publish.callbacks as pc
    from cselab.app.train import train
    from cselab.config import load_config

    pushes: list[bool] = []
    pc.push_folder = lambda folder, repo: pushes.append(dist.is_initialized())
    os.environ["HF_TOKEN"] = "hf_test_token"  # checked before the run trains
    train(load_config(None, config_args))
    return {"pushes": pushes}


@pytest.mark.slow
def test_push_to_hub_runs_after_the_process_group_is_destroyed(
    tiny_bert: Path, tmp_path: Path
) -> None:
    data = corpus(tmp_path / "data", 16)
    args = overrides(
        tiny_bert, tmp_path / "run", data, "--train.max_steps=1", "--train.push_to_hub=me/model"
    )
    results = spawn(_push_worker, tmp_path / "w", args, group=False)
    assert results[0]["pushes"] == [False]  # rank 0 uploads once, with no group left
    assert results[1]["pushes"] == []


def _overlap_worker(rank: int, world: int) -> dict:
    """The same per-rank loss backpropagated twice: once with the overlapped reducer (hooks
    start bucket all-reduces during the backward), once plainly, then averaged after."""
    from cselab.training.distributed import OverlappedReducer, average_gradients

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(4)])
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(rank + 1))

    def backward() -> None:
        model(x).square().mean().mul(rank + 1).backward()

    reducer = OverlappedReducer(list(model.parameters()), bucket_bytes=16 * 16 * 4)
    backward()
    reducer.finish()
    overlapped = [p.grad.clone() for p in model.parameters()]
    started, buckets = reducer.started_in_backward, len(reducer.buckets)
    reducer.remove()
    model.zero_grad()
    backward()
    average_gradients(list(model.parameters()))
    plain = [p.grad.clone() for p in model.parameters()]
    return {"overlapped": overlapped, "plain": plain, "started": started, "buckets": buckets}


def test_overlapped_gradient_average_equals_the_plain_one(tmp_path: Path) -> None:
    """DDP-style buckets started from gradient hooks during the backward give exactly the
    average taken after it, on both ranks; every bucket was started inside the backward."""
    out = spawn(_overlap_worker, tmp_path)
    for r in out:
        assert r["buckets"] >= 3 and r["started"] == r["buckets"]
        for a, b in zip(r["overlapped"], r["plain"], strict=True):
            assert torch.equal(a, b)
    for a, b in zip(out[0]["overlapped"], out[1]["overlapped"], strict=True):
        assert torch.equal(a, b)  # the ranks agree
