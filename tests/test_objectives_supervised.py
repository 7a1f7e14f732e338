"""Supervised SimCSE with given hard negatives (Gao et al. 2021, Sec. 4, Eq. 5) and its
composition with every objective, against loop references written from the equations."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import objectives_reference as ref
from cselab.config import ConfigError
from cselab.core.datakind import DataKind
from cselab.objectives import (
    BarlowTwinsConfig,
    DCLConfig,
    FocalConfig,
    GaussianConfig,
    HardNegatives,
    MixCSEConfig,
    NoiseConfig,
    ObjectiveConfig,
    ObjectiveContext,
    OffDropoutConfig,
    build_objective,
)

TAU = 0.1
N, K, D = 6, 2, 5


def loss(cfg: ObjectiveConfig, views: dict, hard_negatives: bool = True, seed: int = 1) -> dict:
    k = views["neg"].shape[1] if hard_negatives else 0
    obj = build_objective(cfg, DataKind(pairs=True, negatives=k))
    return obj(views, ObjectiveContext(generator=torch.Generator().manual_seed(seed)))


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("weight", [0.0, 0.7, -2.0])
def test_matches_eq5_with_the_weight_on_the_own_hard_negatives(k: int, weight: float) -> None:
    v = ref.triplet_views(N, k, D)
    got = loss(ObjectiveConfig(temperature=TAU, hard_negative_weight=weight), v)["infonce"]
    want = ref.supervised_simcse(v["z1"], v["z2"], v["neg"], TAU, weight)
    assert got.item() == pytest.approx(want.item(), rel=1e-12)


def test_gradients_match_the_reference() -> None:
    v = ref.triplet_views(N, K, D)
    leaves = {name: t.clone().requires_grad_(True) for name, t in v.items()}
    loss(ObjectiveConfig(temperature=TAU, hard_negative_weight=0.5), leaves)["infonce"].backward()
    ref_leaves = {name: t.clone().requires_grad_(True) for name, t in v.items()}
    ref.supervised_simcse(*ref_leaves.values(), TAU, 0.5).backward()
    for name in v:
        torch.testing.assert_close(leaves[name].grad, ref_leaves[name].grad, rtol=1e-10, atol=0)


def test_equals_the_authors_cross_entropy_over_the_n_by_2n_matrix() -> None:
    """SimCSE's code: cat([cos(z1, z2ᵀ), cos(z1, z3ᵀ)]) / τ, + w on the diagonal of the second
    block, cross-entropy with labels arange(N)."""
    v = ref.triplet_views(N, 1, D)
    w = 0.3
    z1, z2, z3 = (F.normalize(t, dim=-1) for t in (v["z1"], v["z2"], v["neg"][:, 0]))
    logits = torch.cat([z1 @ z2.T, z1 @ z3.T], dim=1) / TAU
    eye = torch.eye(N, dtype=torch.float64)
    logits = logits + torch.cat([torch.zeros_like(eye), w * eye], dim=1)
    want = F.cross_entropy(logits, torch.arange(N))
    got = loss(ObjectiveConfig(temperature=TAU, hard_negative_weight=w), v)["infonce"]
    assert got.item() == pytest.approx(want.item(), rel=1e-12)


def test_without_hard_negatives_pairs_are_plain_infonce_of_anchor_and_positive() -> None:
    v = ref.triplet_views(N, 1, D)
    got = loss(ObjectiveConfig(temperature=TAU), v, hard_negatives=False)["infonce"]
    assert got.item() == pytest.approx(ref.infonce(v["z1"], v["z2"], TAU).item(), rel=1e-12)
    # ... and the hard negatives change it (the block is really there when asked for).
    assert loss(ObjectiveConfig(temperature=TAU), v)["infonce"] > got


def test_a_very_negative_weight_removes_the_own_hard_negative_only() -> None:
    """w → -∞ leaves the other anchors' hard negatives in the denominator."""
    v = ref.triplet_views(N, 1, D)
    got = loss(ObjectiveConfig(temperature=TAU, hard_negative_weight=-1e4), v)["infonce"]
    z1, z2, z3 = (F.normalize(t, dim=-1) for t in (v["z1"], v["z2"], v["neg"][:, 0]))
    hard = (z1 @ z3.T / TAU).masked_fill(torch.eye(N, dtype=torch.bool), float("-inf"))
    want = F.cross_entropy(torch.cat([z1 @ z2.T / TAU, hard], dim=1), torch.arange(N))
    assert got.item() == pytest.approx(want.item(), rel=1e-12)


def test_focal_scores_hard_negatives_with_s_times_s_plus_m() -> None:
    v = ref.triplet_views(N, K, D)
    cfg = ObjectiveConfig(
        temperature=TAU, hard_negative_weight=0.4, focal=FocalConfig(enabled=True, hardness=0.3)
    )
    want = ref.supervised_simcse(v["z1"], v["z2"], v["neg"], TAU, 0.4, focal_m=0.3)
    assert loss(cfg, v)["infonce"].item() == pytest.approx(want.item(), rel=1e-12)


def test_gaussian_columns_are_added_next_to_the_hard_negatives() -> None:
    v = ref.triplet_views(N, K, D)
    cfg = ObjectiveConfig(temperature=TAU, gaussian=GaussianConfig(enabled=True, num=4, weight=0.5))
    g = torch.randn(4, D, generator=torch.Generator().manual_seed(1)).double()
    want = ref.supervised_simcse(v["z1"], v["z2"], v["neg"], TAU, gaussian=g, gs_weight=0.5)
    assert loss(cfg, v)["infonce"].item() == pytest.approx(want.item(), rel=1e-12)


def test_mixcse_mixes_from_the_given_positive() -> None:
    v = ref.triplet_views(N, K, D)
    cfg = ObjectiveConfig(
        temperature=TAU,
        focal=FocalConfig(enabled=True, hardness=0.2),
        mixcse=MixCSEConfig(enabled=True, partner="next", directions="single"),
    )
    want = ref.supervised_simcse(v["z1"], v["z2"], v["neg"], TAU, focal_m=0.2, mix_ratio=0.2)
    assert loss(cfg, v)["infonce"].item() == pytest.approx(want.item(), rel=1e-12)


def test_symmetric_gives_the_positive_as_anchor_the_same_hard_negatives() -> None:
    v = ref.triplet_views(N, K, D)
    cfg = ObjectiveConfig(temperature=TAU, symmetric=True, hard_negative_weight=0.2)
    want = 0.5 * (
        ref.supervised_simcse(v["z1"], v["z2"], v["neg"], TAU, 0.2)
        + ref.supervised_simcse(v["z2"], v["z1"], v["neg"], TAU, 0.2)
    )
    assert loss(cfg, v)["infonce"].item() == pytest.approx(want.item(), rel=1e-12)


def test_dcl_and_barlow_twins_use_the_anchor_and_positive_views() -> None:
    v = ref.triplet_views(N, K, D)
    cfg = ObjectiveConfig(
        temperature=TAU,
        dcl=DCLConfig(enabled=True, weight=0.1, temperature=5.0),
        barlow_twins=BarlowTwinsConfig(enabled=True, weight=0.5),
    )
    terms = loss(cfg, v)
    want = ref.supervised_simcse(v["z1"], v["z2"], v["neg"], TAU)
    assert terms["infonce"].item() == pytest.approx(want.item(), rel=1e-12)
    dcl = 0.1 * ref.dcl(v["z1"], v["z2"], 5.0, "authors_code")
    assert terms["dcl"].item() == pytest.approx(dcl.item(), rel=1e-10)
    bt = 0.5 * ref.barlow_twins(v["z1"], v["z2"], 5e-3)
    assert terms["barlow_twins"].item() == pytest.approx(bt.item(), rel=1e-10)


def test_noise_on_the_positive_side_composes_with_hard_negatives() -> None:
    """noise.side=positive perturbs only the positive column; the hard negatives stay clean."""
    v = ref.triplet_views(N, K, D)
    cfg = ObjectiveConfig(temperature=TAU, noise=NoiseConfig(enabled=True, side="positive"))
    terms = loss(cfg, v)
    plain = ref.supervised_simcse(v["z1"], v["z2"], v["neg"], TAU)
    assert terms["infonce"].item() != pytest.approx(plain.item(), rel=1e-6)


def test_off_dropout_with_pairs_is_rejected_with_the_reason() -> None:
    cfg = ObjectiveConfig(off_dropout=OffDropoutConfig(enabled=True))
    with pytest.raises(
        ConfigError, match=r"objective\.off_dropout .*dropout views of one sentence"
    ):
        build_objective(cfg, DataKind(pairs=True))
    build_objective(cfg, DataKind(pairs=False))  # sentences: fine


def test_weight_without_hard_negatives_is_rejected() -> None:
    cfg = ObjectiveConfig(hard_negative_weight=1.0)
    for pairs in (False, True):
        with pytest.raises(ConfigError, match=r"objective\.hard_negative_weight=1\.0 .* has none"):
            build_objective(cfg, DataKind(pairs=pairs))
    with pytest.raises(ConfigError, match="hard_negative_weight must be finite"):
        ObjectiveConfig(hard_negative_weight=float("nan")).validate()


def test_noise_on_the_negative_side_with_hard_negatives_is_rejected() -> None:
    cfg = ObjectiveConfig(noise=NoiseConfig(enabled=True, side="negative"))
    with pytest.raises(ConfigError, match=r"objective\.noise\.side='negative'"):
        build_objective(cfg, DataKind(pairs=True, negatives=1))
    build_objective(cfg, DataKind(pairs=True))


def test_the_block_is_built_only_for_hard_negatives() -> None:
    obj = build_objective(ObjectiveConfig(hard_negative_weight=0.5), DataKind(True, negatives=1))
    (block,) = [p for p in obj.negatives if isinstance(p, HardNegatives)]
    assert block.weight == 0.5 and "neg" in obj.required_views
    assert "neg" not in build_objective(ObjectiveConfig()).required_views
