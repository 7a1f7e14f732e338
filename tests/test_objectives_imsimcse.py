"""ImSimCSE (Xu et al. 2023): off-dropout negatives (Eq. 3), DCL (Eq. 5-6), the BarlowTwins
baseline (Eq. 4, Table 2), the noise ablation (Table 1) and the off-dropout forward pass."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import objectives_reference as ref
from conftest import float_tolerance
from cselab.objectives import (
    BarlowTwinsConfig,
    BarlowTwinsTerm,
    DCLConfig,
    NoiseConfig,
    ObjectiveConfig,
    ObjectiveContext,
    OffDropoutConfig,
    build_objective,
    cross_correlation,
    dcl_loss,
    total_loss,
)


def views(n: int = 6, d: int = 8, seed: int = 0) -> dict[str, torch.Tensor]:
    return ref.centred_views(n, d, noise=0.7, seed=seed, dtype=torch.float64)


def dbl(v: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: t.double() for k, t in v.items()}


# ------------------------------------------------------------------------------ off-dropout


@pytest.mark.parametrize("m", [0.9, 0.5, 1.0])
def test_off_dropout_value_matches_eq3(m: float) -> None:
    v = views()
    cfg = ObjectiveConfig(temperature=0.1, off_dropout=OffDropoutConfig(enabled=True, tradeoff=m))
    obj = build_objective(cfg)
    assert "off" in obj.required_views
    got = total_loss(obj(v)).item()
    d = dbl(v)
    assert got == pytest.approx(
        ref.off_dropout(d["z1"], d["z2"], d["off"], 0.1, m).item(), rel=1e-9
    )


def test_off_dropout_authors_code_variant_matches_released_formula() -> None:
    v = views()
    cfg = ObjectiveConfig(
        temperature=0.1,
        off_dropout=OffDropoutConfig(enabled=True, tradeoff=0.9, variant="authors_code"),
    )
    got = total_loss(build_objective(cfg)(v)).item()
    d = dbl(v)
    want = ref.off_dropout_authors_code(d["z1"], d["z2"], d["off"], 0.1, 0.9)
    assert got == pytest.approx(want.item(), rel=1e-9)
    paper = ref.off_dropout(d["z1"], d["z2"], d["off"], 0.1, 0.9).item()
    assert abs(got - paper) > 1e-3  # a different objective, not a reparametrisation


def test_off_dropout_gradients_flow_through_the_off_view() -> None:
    d = {k: t.requires_grad_() for k, t in dbl(views(5, 6)).items()}
    cfg = ObjectiveConfig(temperature=0.1, off_dropout=OffDropoutConfig(enabled=True))
    total_loss(build_objective(cfg)(d)).backward()
    got = {k: t.grad.clone() for k, t in d.items()}
    for t in d.values():
        t.grad = None
    ref.off_dropout(d["z1"], d["z2"], d["off"], 0.1, 0.9).backward()
    for k in d:
        torch.testing.assert_close(got[k], d[k].grad, rtol=1e-9, atol=1e-12)
    assert got["off"].abs().sum() > 0


def test_off_dropout_with_no_dropout_and_m_1_is_infonce() -> None:
    z = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
    same = {"z1": z, "z2": z.clone(), "off": z.clone()}
    cfg = ObjectiveConfig(
        temperature=0.05, off_dropout=OffDropoutConfig(enabled=True, tradeoff=1.0)
    )
    got = total_loss(build_objective(cfg)(same)).item()
    want = total_loss(build_objective(ObjectiveConfig(temperature=0.05))(same)).item()
    assert got == pytest.approx(want, rel=1e-9)


# ------------------------------------------------------------------------------ the off view


def _tiny_encoder(hidden: float = 0.1, attention: float = 0.1):
    from transformers import BertConfig, BertModel

    from cselab.model.encoder import SentenceEncoder
    from cselab.model.pooling import Pooler

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=100,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        hidden_dropout_prob=hidden,
        attention_probs_dropout_prob=attention,
    )
    backbone = BertModel(config, add_pooling_layer=False)
    return SentenceEncoder(backbone, None, Pooler("cls", 16, mlp_only_train=True))


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(1, 100, (4, 7), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def test_off_dropout_view_is_deterministic_and_restores_module_states() -> None:
    from cselab.model.encoder import dropout_disabled
    from cselab.training import views as views_mod

    enc = _tiny_encoder()
    enc.train()
    enc.backbone.encoder.layer[1].attention.eval()  # a deliberately mixed state
    before = [(name, m.training) for name, m in enc.named_modules()]
    a = views_mod.compute_views(enc, _batch(), ["z1", "z2", "off"])
    b = views_mod.compute_views(enc, _batch(), ["z1", "z2", "off"])
    assert [(name, m.training) for name, m in enc.named_modules()] == before
    torch.testing.assert_close(a["off"], b["off"], rtol=0, atol=0)
    assert not torch.allclose(a["z1"], a["z2"])  # the dropout views still differ
    assert a["off"].requires_grad  # gradients flow through the off-dropout pass
    with dropout_disabled(enc.backbone):
        assert not any(m.training for m in enc.backbone.modules())
    assert [(name, m.training) for name, m in enc.named_modules()] == before


def test_switching_only_dropout_modules_leaves_attention_dropout_on() -> None:
    """The transformers-5 pitfall the off view must avoid: attention dropout follows the
    attention module's ``training`` flag, not an ``nn.Dropout`` submodule."""
    from cselab.model.encoder import dropout_disabled

    enc = _tiny_encoder(hidden=0.0, attention=0.5)
    enc.train()
    for m in enc.modules():
        if isinstance(m, nn.Dropout):
            m.eval()
    x, y = enc(**_batch()), enc(**_batch())
    assert not torch.allclose(x, y)  # nn.Dropout-only switching is not enough
    enc.train()
    with dropout_disabled(enc.backbone):
        x, y = enc(**_batch()), enc(**_batch())
    torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_off_dropout_objective_with_dropout_zero_encoder_equals_infonce() -> None:
    from cselab.training import views as views_mod

    enc = _tiny_encoder(hidden=0.0, attention=0.0).double()  # float64: only roundoff differs
    enc.train()
    v = views_mod.compute_views(enc, _batch(), ["z1", "z2", "off"])
    # "off" is its own forward, z1 half of a 2N-row one: the same sums, perhaps in another order.
    # Per layer the longest sums: hidden (16), sequence (7), intermediate (32); 2 layers.
    tol = float_tolerance(torch.float64, 2 * (16 + 7 + 32), v["z1"].abs().max().item())
    torch.testing.assert_close(v["off"], v["z1"], rtol=0, atol=tol)
    cfg = ObjectiveConfig(off_dropout=OffDropoutConfig(enabled=True, tradeoff=1.0))
    got = total_loss(build_objective(cfg)(v)).item()
    want = total_loss(build_objective(ObjectiveConfig())(v)).item()
    assert got == pytest.approx(want, rel=1e-9)


# ------------------------------------------------------------------------------ DCL


@pytest.mark.parametrize("formulation", ["authors_code", "paper"])
def test_dcl_value_matches_loop_reference(formulation: str) -> None:
    v = views(7, 5)
    tau = 5.0 if formulation == "authors_code" else 2.0
    got = dcl_loss(v["z1"], v["z2"], tau, formulation).item()
    want = ref.dcl(v["z1"].double(), v["z2"].double(), tau, formulation).item()
    assert got == pytest.approx(want, rel=1e-9)


def test_dcl_formulations_agree_under_the_documented_rescaling() -> None:
    v = views(9, 6)
    n, d = v["z1"].shape
    code = 0.1 * dcl_loss(v["z1"].double(), v["z2"].double(), 5.0, "authors_code", eps=1e-12)
    paper = (0.1 / d) * dcl_loss(
        v["z1"].double(), v["z2"].double(), 5.0 * (n - 1), "paper", eps=1e-12
    )
    assert code.item() == pytest.approx(paper.item(), rel=1e-9)
    raw_paper = 0.1 * dcl_loss(v["z1"], v["z2"], 5.0, "paper")
    assert raw_paper.item() > 3 * code.item()  # same numbers, very different scale


def test_dcl_standardises_each_dimension_over_the_batch() -> None:
    v = views(8, 5)
    scale = torch.tensor([3.0, 0.5, 10.0, 1.0, 2.0])
    shift = torch.tensor([1.0, -4.0, 0.0, 9.0, 2.0])
    a = dcl_loss(v["z1"], v["z2"], 5.0)
    b = dcl_loss(v["z1"] * scale + shift, v["z2"] * scale - shift, 5.0)
    # Not a roundoff tolerance: standardize's eps (1e-5, added to the variance) makes the
    # invariance approximate, by ~eps/var relative; 1e-4 allows the smallest variance here.
    assert a.item() == pytest.approx(b.item(), rel=1e-4)


def test_imsimcse_is_off_dropout_plus_weighted_dcl_and_gradients_match() -> None:
    d = {k: t.requires_grad_() for k, t in dbl(views(6, 5)).items()}
    cfg = ObjectiveConfig(
        temperature=0.1,
        off_dropout=OffDropoutConfig(enabled=True, tradeoff=0.9),
        dcl=DCLConfig(enabled=True, weight=0.1, temperature=5.0),
    )
    terms = build_objective(cfg)(d)
    assert set(terms) == {"infonce", "dcl"}
    total_loss(terms).backward()
    got = {k: t.grad.clone() for k, t in d.items()}
    for t in d.values():
        t.grad = None
    want = ref.off_dropout(d["z1"], d["z2"], d["off"], 0.1, 0.9) + 0.1 * ref.dcl(
        d["z1"], d["z2"], 5.0, "authors_code"
    )
    assert total_loss(terms).item() == pytest.approx(want.item(), rel=1e-9)
    want.backward()
    for k in d:
        torch.testing.assert_close(got[k], d[k].grad, rtol=1e-9, atol=1e-12)


def test_dcl_alone_uses_dropout_negatives_and_zero_weight_is_infonce() -> None:
    v = views()
    cfg = ObjectiveConfig(dcl=DCLConfig(enabled=True))
    obj = build_objective(cfg)
    assert "off" not in obj.required_views
    base = total_loss(build_objective(ObjectiveConfig())(v)).item()
    assert obj(v)["infonce"].item() == pytest.approx(base, rel=1e-9)
    zero = build_objective(ObjectiveConfig(dcl=DCLConfig(enabled=True, weight=0.0)))
    assert total_loss(zero(v)).item() == pytest.approx(base, rel=1e-9)


# ------------------------------------------------------------------------------ BarlowTwins


def test_barlow_twins_value_matches_eq4() -> None:
    v = views(6, 5)
    term = BarlowTwinsTerm(weight=1.0, off_diagonal=5e-3)
    got = term(v, ObjectiveContext()).item()
    want = ref.barlow_twins(v["z1"].double(), v["z2"].double(), 5e-3).item()
    assert got == pytest.approx(want, rel=1e-9)
    assert got > 0  # minimised, not maximised (the paper's sign typo)


def test_barlow_padding_raises_the_rank_of_c() -> None:
    n, d, m = 8, 32, 16
    v = dbl(views(n, d))
    ranks = []
    for padding in (0, m, 64):
        term = BarlowTwinsTerm(padding=padding)
        z1, z2 = term.padded_views(v, ObjectiveContext(generator=torch.Generator().manual_seed(0)))
        assert z1.shape == (n + padding, d)
        ranks.append(int(torch.linalg.matrix_rank(cross_correlation(z1, z2))))
    assert ranks == [n, n + m, d]  # rank ≤ min(N + M, D), and reached


def test_barlow_padding_is_fresh_noise_without_gradient() -> None:
    # Padding plain (no-grad) views gives plain tensors: the artificial rows carry no graph.
    plain1, plain2 = BarlowTwinsTerm(padding=10).padded_views(views(5, 6), ObjectiveContext())
    assert not plain1.requires_grad and not plain2.requires_grad
    v = {k: t.requires_grad_() for k, t in views(5, 6).items()}
    term = BarlowTwinsTerm(padding=10)
    gen = torch.Generator().manual_seed(0)
    a, b = term(v, ObjectiveContext(generator=gen)), term(v, ObjectiveContext(generator=gen))
    assert a.item() != b.item()
    z1, z2 = term.padded_views(v, ObjectiveContext())
    torch.testing.assert_close(z1[5:], z2[5:])  # the same artificial rows pad both views
    a.backward()
    assert v["z1"].grad is not None and v["z1"].grad.abs().sum() > 0


def test_barlow_objective_adds_named_term() -> None:
    cfg = ObjectiveConfig(barlow_twins=BarlowTwinsConfig(enabled=True, weight=0.5, padding=4))
    terms = build_objective(cfg)(views())
    assert set(terms) == {"infonce", "barlow_twins"}


# ------------------------------------------------------------------------------ noise ablation


def test_noise_on_negatives_keeps_the_positive_clean_and_vice_versa() -> None:
    v = views()
    tau = 0.1
    clean = ObjectiveConfig(temperature=tau)
    base = build_objective(clean)
    pair_base = base(v)["infonce"].item()
    for side in ("positive", "negative", "both"):
        cfg = ObjectiveConfig(
            temperature=tau, noise=NoiseConfig(enabled=True, side=side, variance=0.1)
        )
        obj = build_objective(cfg)
        assert obj.required_views == frozenset({"z1", "z2"})
        gen = torch.Generator().manual_seed(0)
        got = obj(v, ObjectiveContext(generator=gen))["infonce"].item()
        # Reproduce the draws: g¹ then g², variance 0.1.
        gen = torch.Generator().manual_seed(0)
        g1 = torch.randn(v["z1"].shape, generator=gen) * 0.1**0.5
        g2 = torch.randn(v["z2"].shape, generator=gen) * 0.1**0.5
        n1, n2 = (v["z1"] + g1).double(), (v["z2"] + g2).double()
        c1, c2 = v["z1"].double(), v["z2"].double()
        p1, p2 = (n1, n2) if side in ("positive", "both") else (c1, c2)
        q1, q2 = (n1, n2) if side in ("negative", "both") else (c1, c2)
        losses = []
        for i in range(6):
            pos = torch.exp(ref.cos(p1[i], p2[i]) / tau)
            neg = sum(torch.exp(ref.cos(q1[i], q2[j]) / tau) for j in range(6) if j != i)
            losses.append(-torch.log(pos / (pos + neg)))
        assert got == pytest.approx(ref.mean(losses).item(), rel=1e-9)
        assert abs(got - pair_base) > 1e-4
    zero = ObjectiveConfig(
        temperature=tau, noise=NoiseConfig(enabled=True, side="both", variance=0.0)
    )
    assert build_objective(zero)(v)["infonce"].item() == pytest.approx(pair_base, rel=1e-9)


# ------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    "cfg,key",
    [
        (
            ObjectiveConfig(off_dropout=OffDropoutConfig(tradeoff=0.0)),
            "objective.off_dropout.tradeoff",
        ),
        (ObjectiveConfig(dcl=DCLConfig(temperature=-1.0)), "objective.dcl.temperature"),
        (ObjectiveConfig(dcl=DCLConfig(weight=-0.1)), "objective.dcl.weight"),
        (ObjectiveConfig(dcl=DCLConfig(eps=0.0)), "objective.dcl.eps"),
        (
            ObjectiveConfig(barlow_twins=BarlowTwinsConfig(padding=-1)),
            "objective.barlow_twins.padding",
        ),
        (
            ObjectiveConfig(barlow_twins=BarlowTwinsConfig(off_diagonal=-1.0)),
            "objective.barlow_twins.off_diagonal",
        ),
        (
            ObjectiveConfig(barlow_twins=BarlowTwinsConfig(weight=-1.0)),
            "objective.barlow_twins.weight",
        ),
        (ObjectiveConfig(noise=NoiseConfig(variance=-0.1)), "objective.noise.variance"),
    ],
)
def test_bad_imsimcse_hyperparameters_name_the_parameter(cfg: ObjectiveConfig, key: str) -> None:
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        cfg.validate()
