"""MixCSE (Zhang et al. 2022): L_mix against a loop reference, stop-gradient, the single and
all-columns variants, masking, partner draws, errors."""

from __future__ import annotations

import pytest
import torch

import objectives_reference as ref
from cselab.objectives import (
    GaussianConfig,
    MixCSEConfig,
    MixedNegatives,
    NegativeBlock,
    NegativeSource,
    ObjectiveConfig,
    ObjectiveContext,
    Pair,
    build_objective,
    total_loss,
)

TAU = 0.1


def views(n: int = 5, d: int = 6, seed: int = 0, grad: bool = False) -> dict[str, torch.Tensor]:
    v = ref.paired_views(n, d, noise=0.8, seed=seed, dtype=torch.float64)
    return {k: t.requires_grad_() for k, t in v.items()} if grad else v


def mix(**kw: object) -> ObjectiveConfig:
    return ObjectiveConfig(temperature=TAU, mixcse=MixCSEConfig(enabled=True, **kw))


def nxt(n: int) -> list[int]:
    return [(i + 1) % n for i in range(n)]


def test_mixcse_both_directions_match_reference() -> None:
    v = views()
    obj = build_objective(mix(partner="next"))
    got = total_loss(obj(v)).item()
    fwd = ref.mixcse_direction(v["z1"], v["z2"], TAU, 0.2, nxt(5), True)
    bwd = ref.mixcse_direction(v["z2"], v["z1"], TAU, 0.2, nxt(5), True)
    assert got == pytest.approx(0.5 * (fwd + bwd).item(), rel=1e-9)


def test_mixcse_single_is_one_direction() -> None:
    v = views()
    got = total_loss(build_objective(mix(partner="next", directions="single"))(v)).item()
    want = ref.mixcse_direction(v["z1"], v["z2"], TAU, 0.2, nxt(5), True).item()
    assert got == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("stop_gradient", [True, False])
def test_mixcse_gradients_respect_stop_gradient(stop_gradient: bool) -> None:
    v = views(grad=True)
    cfg = mix(partner="next", directions="single", stop_gradient=stop_gradient)
    total_loss(build_objective(cfg)(v)).backward()
    got = {k: t.grad.clone() for k, t in v.items()}
    for t in v.values():
        t.grad = None
    ref.mixcse_direction(v["z1"], v["z2"], TAU, 0.2, nxt(5), stop_gradient).backward()
    for k in v:
        torch.testing.assert_close(got[k], v[k].grad)
    # and the two settings really differ in the gradient of the positive view
    for t in v.values():
        t.grad = None
    ref.mixcse_direction(v["z1"], v["z2"], TAU, 0.2, nxt(5), not stop_gradient).backward()
    assert not torch.allclose(got["z2"], v["z2"].grad)


def test_mixed_negatives_receive_no_gradient_unless_switched_off() -> None:
    v = views(grad=True)
    pair = Pair(v["z1"], v["z2"], v)
    for sg, expect_grad in ((True, False), (False, True)):
        block = MixedNegatives(0.2, "next", stop_gradient=sg)(pair, ObjectiveContext())
        (g2,) = torch.autograd.grad(block.sims.sum(), v["z2"], allow_unused=True, retain_graph=True)
        assert (g2 is not None and g2.abs().sum() > 0) == expect_grad


def test_mixcse_random_partner_is_another_sentence_drawn_from_the_generator() -> None:
    src = MixedNegatives(0.2, "random")
    rows = torch.arange(6)
    gen = torch.Generator().manual_seed(0)
    seen = torch.stack([src.partners(rows, 6, ObjectiveContext(generator=gen)) for _ in range(400)])
    assert not (seen == rows).any()
    assert all(len(set(seen[:, i].tolist())) == 5 for i in range(6))  # every other sentence
    # The loss uses those partners: reproduce the draw and compare with the reference.
    v = views(6)
    got = total_loss(
        build_objective(mix(directions="single"))(
            v, ObjectiveContext(generator=torch.Generator().manual_seed(4))
        )
    ).item()
    partners = src.partners(rows, 6, ObjectiveContext(generator=torch.Generator().manual_seed(4)))
    want = ref.mixcse_direction(v["z1"], v["z2"], TAU, 0.2, partners.tolist(), True).item()
    assert got == pytest.approx(want, rel=1e-9)


def test_mixcse_all_columns_masks_the_mix_dominated_by_the_own_positive() -> None:
    v = views()
    got = total_loss(
        build_objective(mix(partner="next", columns="all", directions="single"))(v)
    ).item()
    want = ref.mixcse_all_columns(v["z1"], v["z2"], TAU, 0.2).item()
    assert got == pytest.approx(want, rel=1e-9)
    block = MixedNegatives(0.2, "next", columns="all")(
        Pair(v["z1"], v["z2"], v), ObjectiveContext()
    )
    expected = torch.zeros(5, 5, dtype=torch.bool)
    expected[torch.arange(5), (torch.arange(5) - 1) % 5] = True
    assert torch.equal(block.mask, expected)


class _Capture(NegativeSource):
    """Wraps a source and exposes its similarities as a leaf, to read softmax weights."""

    def __init__(self, inner: NegativeSource) -> None:
        super().__init__()
        self.inner = inner
        self.leaf: torch.Tensor | None = None

    def forward(self, pair: Pair, ctx: ObjectiveContext) -> NegativeBlock:
        block = self.inner(pair, ctx)
        self.leaf = block.sims.detach().clone().requires_grad_()
        return NegativeBlock(self.leaf, block.log_weight, block.mask)


def test_masked_columns_get_zero_softmax_weight() -> None:
    from cselab.objectives import InBatchNegatives, InfoNCE

    v = views()
    in_batch = _Capture(InBatchNegatives())
    mixed = _Capture(MixedNegatives(0.2, "next", columns="all"))
    obj = InfoNCE(TAU, [in_batch, mixed])
    obj(v)["infonce"].backward()
    for cap in (in_batch, mixed):
        block = cap.inner(Pair(v["z1"], v["z2"], v), ObjectiveContext())
        assert cap.leaf.grad[block.mask].abs().max() == 0  # exactly zero weight
        assert (cap.leaf.grad[~block.mask] > 0).all()


def test_mixcse_zero_ratio_duplicates_an_in_batch_negative() -> None:
    """λ = 0 makes the mix the partner's own positive: the partner column counts twice."""
    v = views()
    got = total_loss(build_objective(mix(partner="next", directions="single", mix_ratio=0.0))(v))
    want = ref.mixcse_direction(v["z1"], v["z2"], TAU, 0.0, nxt(5), True)
    assert got.item() == pytest.approx(want.item(), rel=1e-9)


@pytest.mark.parametrize("ratio", [-0.1, 1.0, 1.5])
def test_mixcse_bad_ratio_names_the_parameter(ratio: float) -> None:
    with pytest.raises(ValueError, match=r"objective\.mixcse\.mix_ratio"):
        mix(mix_ratio=ratio).validate()


def test_mixcse_invalid_combinations_say_why() -> None:
    cfg = mix(directions="single")
    cfg.symmetric = True
    with pytest.raises(ValueError, match=r"objective\.mixcse\.directions.*objective\.symmetric"):
        cfg.validate()
    with pytest.raises(ValueError, match=r"objective\.mixcse\.columns='all'.*partner='next'"):
        mix(columns="all", partner="random").validate()


def test_mixcse_needs_two_sentences() -> None:
    v = views(1)
    with pytest.raises(ValueError, match="at least 2"):
        MixedNegatives(0.2, "next")(Pair(v["z1"], v["z2"], v), ObjectiveContext())


def test_both_directions_share_the_random_partners_and_gaussian_vectors() -> None:
    v = views(6)
    gen = torch.Generator().manual_seed(7)
    got = total_loss(build_objective(mix())(v, ObjectiveContext(generator=gen))).item()
    partners = MixedNegatives(0.2, "random").partners(
        torch.arange(6), 6, ObjectiveContext(generator=torch.Generator().manual_seed(7))
    )
    fwd = ref.mixcse_direction(v["z1"], v["z2"], TAU, 0.2, partners.tolist(), True)
    bwd = ref.mixcse_direction(v["z2"], v["z1"], TAU, 0.2, partners.tolist(), True)
    assert got == pytest.approx(0.5 * (fwd + bwd).item(), rel=1e-9)

    cfg = ObjectiveConfig(
        temperature=TAU, symmetric=True, gaussian=GaussianConfig(enabled=True, num=5)
    )
    got = total_loss(
        build_objective(cfg)(v, ObjectiveContext(generator=torch.Generator().manual_seed(3)))
    )
    g = torch.randn(5, 6, generator=torch.Generator().manual_seed(3)).double()
    want = 0.5 * (
        ref.gs_infonce(v["z1"], v["z2"], g, TAU, 1.0)
        + ref.gs_infonce(v["z2"], v["z1"], g, TAU, 1.0)
    )
    assert got.item() == pytest.approx(want.item(), rel=1e-9)
