"""GS-InfoNCE (Wu et al.): value against Eq. 5, exact λ, reductions, RNG, errors."""

from __future__ import annotations

import math

import pytest
import torch

import objectives_reference as ref
from conftest import float_tolerance
from cselab.objectives import (
    GaussianConfig,
    GaussianNegatives,
    ObjectiveConfig,
    ObjectiveContext,
    Pair,
    build_objective,
    total_loss,
)


def views(n: int = 5, d: int = 8, seed: int = 0) -> dict[str, torch.Tensor]:
    return ref.paired_views(n, d, noise=1.0, seed=seed, dtype=torch.float64)


def gs(**kw: object) -> ObjectiveConfig:
    return ObjectiveConfig(temperature=0.1, gaussian=GaussianConfig(enabled=True, **kw))


def same_draws(seed: int, m: int, d: int, mean: float = 0.0, std: float = 1.0) -> torch.Tensor:
    return torch.randn(m, d, generator=torch.Generator().manual_seed(seed)) * std + mean


@pytest.mark.parametrize("lam,mean", [(1.0, 0.0), (0.25, 0.0), (3.0, 0.5)])
def test_gs_value_matches_loop_reference_with_exact_lambda(lam: float, mean: float) -> None:
    v = views()
    obj = build_objective(gs(num=7, weight=lam, mean=mean))
    got = total_loss(obj(v, ObjectiveContext(generator=torch.Generator().manual_seed(11))))
    g = same_draws(11, 7, 8, mean=mean)
    want = ref.gs_infonce(v["z1"].double(), v["z2"].double(), g.double(), 0.1, lam)
    assert got.item() == pytest.approx(want.item(), rel=1e-9)
    if lam != 1.0:  # λ is really used (the authors' code ignores it)
        unweighted = ref.gs_infonce(v["z1"].double(), v["z2"].double(), g.double(), 0.1, 1.0)
        assert abs(got.item() - unweighted.item()) > 1e-3


def test_gs_default_count_is_three_times_the_batch() -> None:
    v = views(n=6)
    src = build_objective(gs()).negatives[1]
    assert isinstance(src, GaussianNegatives)
    assert src.count(64) == 192  # the authors' 192 at batch 64
    block = src(Pair(v["z1"], v["z2"], {"z1": v["z1"], "z2": v["z2"]}), ObjectiveContext())
    assert block.sims.shape == (6, 18)
    assert block.log_weight == 0.0


@pytest.mark.parametrize("kw", [{"num": 0}, {"batch_multiple": 0.0}, {"weight": 0.0}])
def test_gs_reduces_to_infonce(kw: dict) -> None:
    v = views()
    got = total_loss(build_objective(gs(**kw))(v))
    want = total_loss(build_objective(ObjectiveConfig(temperature=0.1))(v))
    assert got.item() == pytest.approx(want.item(), rel=1e-9)


def test_gs_sigma_has_no_effect_when_mean_is_zero_but_does_otherwise() -> None:
    v = views()

    def loss(std: float, mean: float) -> float:
        ctx = ObjectiveContext(generator=torch.Generator().manual_seed(5))
        return total_loss(build_objective(gs(num=9, std=std, mean=mean))(v, ctx)).item()

    # The draws are scaled by σ in float32 (ObjectiveContext.normal), one rounding per element of
    # the 8-dim noise vectors before normalisation: the float32 bound, not float64's.
    assert loss(1.0, 0.0) == pytest.approx(loss(7.0, 0.0), rel=float_tolerance(torch.float32, 8))
    assert abs(loss(1.0, 0.5) - loss(7.0, 0.5)) > 1e-4


def test_gs_draws_follow_the_generator_and_are_fresh_each_step() -> None:
    v = views()
    obj = build_objective(gs(num=16))
    gen = torch.Generator().manual_seed(0)
    a = total_loss(obj(v, ObjectiveContext(generator=gen))).item()
    b = total_loss(obj(v, ObjectiveContext(generator=gen))).item()  # next step: new draws
    c = total_loss(obj(v, ObjectiveContext(generator=torch.Generator().manual_seed(0)))).item()
    assert a != b
    assert a == c
    torch.manual_seed(3)  # without a generator: the global RNG
    d = total_loss(obj(v)).item()
    torch.manual_seed(3)
    assert total_loss(obj(v)).item() == d


def test_gs_noise_gets_no_gradient_and_anchor_gradient_matches_reference() -> None:
    v = views()
    z1 = v["z1"].double().requires_grad_()
    z2 = v["z2"].double().requires_grad_()
    obj = build_objective(gs(num=7, weight=0.5))
    total_loss(
        obj({"z1": z1, "z2": z2}, ObjectiveContext(generator=torch.Generator().manual_seed(2)))
    ).backward()
    got1, got2 = z1.grad.clone(), z2.grad.clone()
    z1.grad = z2.grad = None
    g = same_draws(2, 7, 8).double().requires_grad_()
    ref.gs_infonce(z1, z2, g, 0.1, 0.5).backward()
    torch.testing.assert_close(got1, z1.grad, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(got2, z2.grad, rtol=1e-9, atol=1e-12)
    assert g.grad.abs().sum() > 0  # the reference's noise would receive gradient ...
    block = obj.negatives[1](Pair(z1, z2, {"z1": z1, "z2": z2}), ObjectiveContext())
    assert block.sims.requires_grad  # ... ours only through the anchors:
    (grad_z2,) = torch.autograd.grad(block.sims.sum(), z2, allow_unused=True)
    assert grad_z2 is None  # Gaussian columns never reach the positive view


@pytest.mark.parametrize(
    "kw,key",
    [
        ({"num": -1}, "objective.gaussian.num"),
        ({"weight": -0.5}, "objective.gaussian.weight"),
        ({"std": 0.0}, "objective.gaussian.std"),
        ({"batch_multiple": -1.0}, "objective.gaussian.batch_multiple"),
        ({"mean": math.inf}, "objective.gaussian.mean"),
    ],
)
def test_gs_bad_hyperparameters_name_the_parameter(kw: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        gs(**kw).validate()


def test_a_long_lived_context_never_serves_stale_draws() -> None:
    """The trainer reuses one context across steps: every call must draw afresh."""
    from cselab.objectives import InBatchNegatives, InfoNCE

    v = views()
    ctx = ObjectiveContext(generator=torch.Generator().manual_seed(0))
    for obj in (
        build_objective(gs(num=16)),
        InfoNCE(0.1, [InBatchNegatives(), GaussianNegatives(num=16)]),
    ):
        a = total_loss(obj(v, ctx)).item()
        b = total_loss(obj(v, ctx)).item()
        assert a != b
