"""Composition of the paper objectives, distributed semantics, config loading and presets."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import objectives_reference as ref
from cselab.config import ConfigError, load_config
from cselab.objectives import (
    DCLConfig,
    FocalConfig,
    GaussianConfig,
    MixCSEConfig,
    NoiseConfig,
    ObjectiveConfig,
    ObjectiveContext,
    OffDropoutConfig,
    build_objective,
    total_loss,
)

REPO = Path(__file__).resolve().parents[1]
TAU = 0.1


def views(n: int = 6, d: int = 6, seed: int = 0) -> dict[str, torch.Tensor]:
    return ref.centred_views(n, d, noise=0.8, seed=seed, dtype=torch.float64)


def composed_reference(
    v: dict[str, torch.Tensor],
    *,
    focal_m: float | None = None,
    gaussian: torch.Tensor | None = None,
    gs_weight: float = 1.0,
    mix_ratio: float | None = None,
    off_m: float | None = None,
) -> torch.Tensor:
    """One direction, written out from the composition rules: positive s(z¹_i, z²_i); every
    negative column from the negative space (dropout: z¹_i vs z²; off: z^off_i vs z^off)."""
    n = v["z1"].shape[0]
    pos_e = (lambda s: s * s) if focal_m is not None else (lambda s: s)
    neg_e = (lambda s: s * (s + focal_m)) if focal_m is not None else (lambda s: s)
    a_key, c_key = ("off", "off") if off_m is not None else ("z1", "z2")
    losses = []
    for i in range(n):
        num = torch.exp(pos_e(ref.cos(v["z1"][i], v["z2"][i])) / TAU)
        neg = sum(
            torch.exp(neg_e(ref.cos(v[a_key][i], v[c_key][j])) / TAU) for j in range(n) if j != i
        )
        den = num + (off_m if off_m is not None else 1.0) * neg
        if gaussian is not None:
            for k in range(gaussian.shape[0]):
                den = den + gs_weight * torch.exp(neg_e(ref.cos(v[a_key][i], gaussian[k])) / TAU)
        if mix_ratio is not None:
            cand = [ref.unit(v[c_key][j]) for j in range(n)]
            mixed = ref.unit(mix_ratio * cand[i] + (1 - mix_ratio) * cand[(i + 1) % n])
            den = den + torch.exp(neg_e(ref.dot(ref.unit(v[a_key][i]), mixed)) / TAU)
        losses.append(-torch.log(num / den))
    return ref.mean(losses)


def test_focal_transform_applies_to_gaussian_and_mixed_columns() -> None:
    v = views()
    cfg = ObjectiveConfig(
        temperature=TAU,
        focal=FocalConfig(enabled=True, hardness=0.3),
        gaussian=GaussianConfig(enabled=True, num=5, weight=0.5),
        mixcse=MixCSEConfig(enabled=True, partner="next", directions="single"),
    )
    got = total_loss(
        build_objective(cfg)(v, ObjectiveContext(generator=torch.Generator().manual_seed(1)))
    )
    g = torch.randn(5, 6, generator=torch.Generator().manual_seed(1)).double()
    want = composed_reference(v, focal_m=0.3, gaussian=g, gs_weight=0.5, mix_ratio=0.2)
    assert got.item() == pytest.approx(want.item(), rel=1e-9)


def test_off_dropout_with_mixed_and_gaussian_negatives_uses_the_off_space() -> None:
    v = views()
    cfg = ObjectiveConfig(
        temperature=TAU,
        off_dropout=OffDropoutConfig(enabled=True, tradeoff=0.9),
        gaussian=GaussianConfig(enabled=True, num=4),
        mixcse=MixCSEConfig(enabled=True, partner="next", directions="single"),
    )
    obj = build_objective(cfg)
    assert obj.required_views == frozenset({"z1", "z2", "off"})
    got = total_loss(obj(v, ObjectiveContext(generator=torch.Generator().manual_seed(2))))
    g = torch.randn(4, 6, generator=torch.Generator().manual_seed(2)).double()
    want = composed_reference(v, gaussian=g, mix_ratio=0.2, off_m=0.9)
    assert got.item() == pytest.approx(want.item(), rel=1e-9)
    # the off-dropout weight m applies to the in-batch off-dropout columns only
    unweighted = composed_reference(v, gaussian=g, mix_ratio=0.2, off_m=1.0)
    assert abs(got.item() - unweighted.item()) > 1e-4


def test_symmetric_off_dropout_shares_the_off_view() -> None:
    v = views()
    cfg = ObjectiveConfig(
        temperature=TAU,
        off_dropout=OffDropoutConfig(enabled=True, tradeoff=0.9),
        mixcse=MixCSEConfig(enabled=True, partner="next"),
    )
    got = total_loss(build_objective(cfg)(v)).item()
    swapped = {"z1": v["z2"], "z2": v["z1"], "off": v["off"]}
    want = 0.5 * (
        composed_reference(v, mix_ratio=0.2, off_m=0.9)
        + composed_reference(swapped, mix_ratio=0.2, off_m=0.9)
    )
    assert got == pytest.approx(want.item(), rel=1e-9)


def test_with_off_dropout_mixcse_directions_both_equals_single() -> None:
    """Documented in docs/objectives.md: with off-dropout the second direction scores the same
    off-dropout negatives against the same (symmetric) positive, so it is the same loss."""

    def loss(off: bool, directions: str) -> float:
        cfg = ObjectiveConfig(
            temperature=TAU,
            off_dropout=OffDropoutConfig(enabled=off),
            mixcse=MixCSEConfig(enabled=True, directions=directions),
        )
        ctx = ObjectiveContext(generator=torch.Generator().manual_seed(0))
        return total_loss(build_objective(cfg)(views(), ctx)).item()

    assert loss(True, "both") == pytest.approx(loss(True, "single"), rel=1e-12)
    # Control: with dropout negatives the second direction mixes other vectors.
    assert abs(loss(False, "both") - loss(False, "single")) > 1e-3


def test_auxiliary_terms_add_to_any_contrastive_part() -> None:
    v = views()
    for extra in (
        {"focal": FocalConfig(enabled=True)},
        {"mixcse": MixCSEConfig(enabled=True, partner="next")},
        {"off_dropout": OffDropoutConfig(enabled=True)},
    ):
        plain = build_objective(ObjectiveConfig(temperature=TAU, **extra))(v)
        both = build_objective(
            ObjectiveConfig(temperature=TAU, dcl=DCLConfig(enabled=True, weight=0.3), **extra)
        )(v)
        assert both["infonce"].item() == pytest.approx(plain["infonce"].item(), rel=1e-12)
        want_dcl = 0.3 * ref.dcl(v["z1"], v["z2"], 5.0, "authors_code")
        assert both["dcl"].item() == pytest.approx(want_dcl.item(), rel=1e-9)


def test_plain_config_is_simcse_infonce() -> None:
    v = views()
    got = total_loss(build_objective(ObjectiveConfig(temperature=TAU))(v)).item()
    assert got == pytest.approx(ref.infonce(v["z1"], v["z2"], TAU).item(), rel=1e-9)


def test_noise_on_negatives_conflicts_with_off_dropout() -> None:
    cfg = ObjectiveConfig(
        off_dropout=OffDropoutConfig(enabled=True), noise=NoiseConfig(enabled=True)
    )
    with pytest.raises(ValueError, match=r"objective\.noise\.side.*objective\.off_dropout"):
        cfg.validate()
    ok = ObjectiveConfig(
        off_dropout=OffDropoutConfig(enabled=True), noise=NoiseConfig(enabled=True, side="positive")
    )
    ok.validate()


@pytest.mark.parametrize("tau", [0.0, -0.05, float("nan")])
def test_bad_temperature_names_the_parameter(tau: float) -> None:
    with pytest.raises(ValueError, match=r"objective\.temperature"):
        build_objective(ObjectiveConfig(temperature=tau, focal=FocalConfig(enabled=True)))


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("off_dropout", "variant", "Authors", "must be one of"),
        ("noise", "side", "neg", "must be one of"),
        ("mixcse", "directions", "one", "must be one of"),
        ("mixcse", "partner", "rand", "must be one of"),
        ("mixcse", "columns", "some", "must be one of"),
        ("dcl", "formulation", "eq5", "must be one of"),
        ("gaussian", "num", 2.5, r"expected a whole number or null"),
        ("gaussian", "num", True, r"expected a whole number or null"),
        ("barlow_twins", "padding", 1.5, "expected an integer"),
        ("focal", "enabled", "yes", "expected true/false"),
        ("focal", "hardness", True, "expected a number"),
    ],
)
def test_python_built_config_rejects_wrong_choices_and_kinds(
    section: str, key: str, value: object, message: str
) -> None:
    """A config built in Python skips the YAML loader's checks; a misspelled choice must still
    be an error naming the key (``variant="Authors"`` used to build neither variant)."""
    cfg = ObjectiveConfig()
    setattr(getattr(cfg, section), key, value)
    with pytest.raises(ValueError, match=rf"objective\.{section}\.{key}: {message}"):
        build_objective(cfg)


def test_python_built_config_accepts_every_documented_choice() -> None:
    for variant in ("paper", "authors_code"):
        build_objective(
            ObjectiveConfig(off_dropout=OffDropoutConfig(enabled=True, variant=variant))
        )
    for side in ("positive", "negative", "both"):
        build_objective(ObjectiveConfig(noise=NoiseConfig(enabled=True, side=side)))
    for columns, partner in (("one", "random"), ("one", "next"), ("all", "next")):
        mix = MixCSEConfig(enabled=True, columns=columns, partner=partner, directions="single")
        build_objective(ObjectiveConfig(mixcse=mix))
    build_objective(ObjectiveConfig(gaussian=GaussianConfig(enabled=True, num=7)))
    bad = ObjectiveConfig(symmetric="no")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"objective\.symmetric: expected true/false"):
        bad.validate()


# -------------------------------------------------------------------------- distributed semantics


def _fake_rank_context(
    known: list[torch.Tensor], rank: int, world: int, b: int
) -> ObjectiveContext:
    """A gather that puts this rank's (grad-carrying) rows into the full batch of a known view."""

    def gather(t: torch.Tensor) -> torch.Tensor:
        for full in known:
            full = full.to(t.dtype)
            if full.shape[1:] == t.shape[1:] and torch.allclose(
                full[rank * b : (rank + 1) * b], t.detach()
            ):
                return torch.cat([full[: rank * b], t, full[(rank + 1) * b :]])
        raise AssertionError("gather of an unknown tensor")

    gen = torch.Generator().manual_seed(
        123
    )  # seeded identically on every rank, as the trainer does
    return ObjectiveContext(
        gather=gather, rank=rank, world_size=world, offset=rank * b, generator=gen
    )


@pytest.mark.parametrize(
    "cfg",
    [
        ObjectiveConfig(temperature=TAU),
        ObjectiveConfig(temperature=TAU, focal=FocalConfig(enabled=True)),
        ObjectiveConfig(temperature=TAU, off_dropout=OffDropoutConfig(enabled=True)),
        ObjectiveConfig(temperature=TAU, mixcse=MixCSEConfig(enabled=True, partner="next")),
        ObjectiveConfig(
            temperature=TAU,
            mixcse=MixCSEConfig(enabled=True, partner="next", columns="all"),
            off_dropout=OffDropoutConfig(enabled=True),
            dcl=DCLConfig(enabled=True),
        ),
        ObjectiveConfig(
            temperature=TAU,
            focal=FocalConfig(enabled=True),
            gaussian=GaussianConfig(enabled=True),
            mixcse=MixCSEConfig(enabled=True, partner="random"),
        ),
    ],
)
def test_per_rank_losses_average_to_the_single_process_loss(cfg: ObjectiveConfig) -> None:
    """Same seed, 1 or 2 ranks: the same loss (random draws do not depend on the rank count)."""
    world, b = 2, 4
    v = views(world * b, 6)
    obj = build_objective(cfg)
    single = obj(v, ObjectiveContext(generator=torch.Generator().manual_seed(123)))
    known = [F.normalize(t, dim=-1) for t in v.values()] + list(v.values())
    per_rank = []
    for r in range(world):
        local = {k: t[r * b : (r + 1) * b] for k, t in v.items()}
        per_rank.append(obj(local, _fake_rank_context(known, r, world, b)))
    for name in single:
        if name == "infonce":  # per-anchor: the mean of local means
            got = sum(t[name] for t in per_rank) / world
            assert got.item() == pytest.approx(single[name].item(), rel=1e-9)
        else:  # batch-level: every rank computes the global term
            for t in per_rank:
                assert t[name].item() == pytest.approx(single[name].item(), rel=1e-9)


# -------------------------------------------------------------------------- config files


def test_nested_objective_keys_load_from_yaml_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("objective:\n  temperature: 0.05\n  focal: {enabled: true}\n", encoding="utf-8")
    cfg = load_config(path, ["--objective.gaussian.enabled=true", "--objective.gaussian.num=12"])
    assert cfg.objective.focal.enabled and cfg.objective.focal.hardness == 0.3
    assert cfg.objective.gaussian.num == 12
    with pytest.raises(ConfigError, match=r"objective\.gaussian\.weight"):
        load_config(path, ["--objective.gaussian.weight=-1"])
    with pytest.raises(ConfigError, match=r"objective\.mixcse\.partner"):
        load_config(path, ["--objective.mixcse.partner=previous"])
    with pytest.raises(ConfigError, match=r"objective\.focal\.gamma"):
        load_config(path, ["--objective.focal.gamma=2"])


PAPER_PRESETS = sorted(
    p
    for p in (REPO / "src/cselab/presets").glob("*.yaml")
    if p.name.split("-")[0]
    in {"focal", "gs", "offdropout", "dcl", "imsimcse", "barlow", "mixcse", "esimcse"}
)


def test_paper_presets_exist() -> None:
    names = {p.stem for p in PAPER_PRESETS}
    for expected in (
        "focal-bert-base",
        "gs-bert-base",
        "offdropout-bert-base",
        "dcl-bert-base",
        "imsimcse-bert-base",
        "barlow-bert-base",
        "barlow-pad704-bert-base",
        "mixcse-bert-base",
        "esimcse-bert-base",
    ):
        assert expected in names


@pytest.mark.parametrize("path", PAPER_PRESETS, ids=lambda p: p.stem)
def test_paper_presets_load_and_build(path: Path) -> None:
    cfg = load_config(path)
    obj = build_objective(cfg.objective)
    o = cfg.objective
    family = path.stem.split("-")[0]
    assert o.temperature == 0.05
    assert cfg.train.output_dir.endswith(path.stem)
    if family == "focal":
        assert o.focal.enabled and o.focal.hardness == 0.3
    if family == "gs":
        assert (
            o.gaussian.enabled and o.gaussian.batch_multiple == 3.0 and cfg.train.batch_size == 64
        )
    if family in ("offdropout", "imsimcse"):
        assert (
            o.off_dropout.enabled and o.off_dropout.tradeoff == 0.9 and "off" in obj.required_views
        )
    if family in ("dcl", "imsimcse"):
        assert o.dcl.enabled and o.dcl.weight == 0.1 and o.dcl.temperature == 5.0
    if family == "mixcse":
        assert o.mixcse.enabled and o.mixcse.mix_ratio == 0.2
    if family == "esimcse":  # the authors' run.sh for bert-base-uncased
        assert o.word_repetition.enabled and o.word_repetition.dup_rate == 0.32
        q = o.momentum_queue
        assert q.enabled and q.queue_size == 160 and q.momentum == 0.995
        assert obj.inputs[0].dup_rate == 0.32 and "momentum" in obj.required_views
        assert cfg.model.dropout == 0.1 and cfg.model.max_seq_len == 32
    if path.stem == "barlow-pad704-bert-base":
        assert o.barlow_twins.padding == 704 and cfg.train.batch_size + 704 == 768
    if path.stem.endswith("-bert-base"):
        assert cfg.train.batch_size == 64 and cfg.train.lr == 3e-5
