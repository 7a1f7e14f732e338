"""Focal-InfoNCE (Hou & Li 2023): value against Eq. 2 and gradients against Eq. 4/5."""

from __future__ import annotations

import pytest
import torch

import objectives_reference as ref
from cselab.objectives import (
    FocalConfig,
    FocalScore,
    InfoNCE,
    NegativeBlock,
    NegativeSource,
    ObjectiveConfig,
    ObjectiveContext,
    Pair,
    build_objective,
    total_loss,
)


def views(n: int = 6, d: int = 12, seed: int = 0) -> dict[str, torch.Tensor]:
    return ref.paired_views(n, d, noise=1.5, seed=seed, dtype=torch.float64)


@pytest.mark.parametrize("tau,m", [(0.05, 0.3), (0.1, 0.0), (0.5, 1.0)])
def test_focal_value_matches_loop_reference(tau: float, m: float) -> None:
    v = views()
    cfg = ObjectiveConfig(temperature=tau, focal=FocalConfig(enabled=True, hardness=m))
    got = total_loss(build_objective(cfg)(v))
    want = ref.focal(v["z1"].double(), v["z2"].double(), tau, m)
    assert got.item() == pytest.approx(want.item(), rel=1e-9, abs=1e-6)
    # and it is not plain InfoNCE
    assert abs(got.item() - ref.infonce(v["z1"].double(), v["z2"].double(), tau).item()) > 1e-3


class _FixedSims(NegativeSource):
    """Returns a given leaf similarity matrix, so autograd gives ∂l/∂s_n directly."""

    def __init__(self, sims: torch.Tensor) -> None:
        super().__init__()
        self.sims = sims

    def forward(self, pair: Pair, ctx: ObjectiveContext) -> NegativeBlock:
        return NegativeBlock(sims=self.sims)


def test_focal_gradients_match_analytic_derivatives() -> None:
    torch.manual_seed(0)
    tau, m, b, k = 0.1, 0.3, 4, 5
    s_p = (torch.rand(b) * 0.8 + 0.1).double().requires_grad_()
    s_n = (torch.rand(b, k) * 1.6 - 0.8).double().requires_grad_()
    # anchor = e1 and positive = (s_p, 0, ...) make the positive cosine equal to s_p exactly.
    anchor = torch.zeros(b, 3, dtype=torch.float64)
    anchor[:, 0] = 1
    positive = torch.zeros(b, 3, dtype=torch.float64)
    positive = positive.index_put((torch.arange(b), torch.zeros(b, dtype=torch.long)), s_p)
    obj = InfoNCE(tau, [_FixedSims(s_n)], score=FocalScore(m))
    losses = obj.anchor_loss(Pair(anchor, positive, {}), ObjectiveContext())
    losses.sum().backward()

    with torch.no_grad():
        e_pos = torch.exp(s_p**2 / tau)
        e_neg = torch.exp(s_n * (s_n + m) / tau)
        z = e_pos + e_neg.sum(1)
        d_pos = (2 / tau) * (e_pos / z - 1) * s_p  # Eq. 5
        d_neg = (1 / tau) * (e_neg / z[:, None]) * (2 * s_n + m)  # Eq. 4, corrected factor
        d_neg_printed = (2 / tau) * (e_neg / z[:, None]) * (s_n + m)  # Eq. 4 as printed
    torch.testing.assert_close(s_p.grad, d_pos)
    torch.testing.assert_close(s_n.grad, d_neg)
    # The printed factor 2(s_n + m) is not the derivative (it differs by m/τ · weight).
    assert not torch.allclose(s_n.grad, d_neg_printed)


def test_focal_gradients_through_embeddings_match_reference() -> None:
    v = views(5, 8, seed=3)
    z1 = v["z1"].double().requires_grad_()
    z2 = v["z2"].double().requires_grad_()
    cfg = ObjectiveConfig(temperature=0.05, focal=FocalConfig(enabled=True, hardness=0.3))
    total_loss(build_objective(cfg)({"z1": z1, "z2": z2})).backward()
    a1, a2 = z1.grad.clone(), z2.grad.clone()
    z1.grad = z2.grad = None
    ref.focal(z1, z2, 0.05, 0.3).backward()
    torch.testing.assert_close(a1, z1.grad, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(a2, z2.grad, rtol=1e-9, atol=1e-12)


def test_focal_reweights_hard_negatives_relative_to_infonce() -> None:
    """Negatives with s > 1 - m gain energy, easier ones lose it (the paper's Fig. 1)."""
    score = FocalScore(0.3)
    s = torch.tensor([0.9, 0.5, 0.1])
    assert (score.negative(s) > s).tolist() == [True, False, False]
    assert torch.equal(score.positive(s), s * s)


@pytest.mark.parametrize("m", [-0.1, 1.5, float("nan")])
def test_focal_bad_hardness_names_parameter(m: float) -> None:
    with pytest.raises(ValueError, match=r"objective\.focal\.hardness"):
        ObjectiveConfig(focal=FocalConfig(enabled=True, hardness=m)).validate()
