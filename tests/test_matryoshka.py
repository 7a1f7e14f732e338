"""Matryoshka Representation Learning (Kusupati et al. 2022): the wrapper equals
sentence-transformers' ``MatryoshkaLoss`` and a float64 loop written from Eq. 1, is the plain
objective with one full-width dimension, composes with every objective (same step's draws at
every prefix), is checked where the config enters, and trains and resumes bit-exactly.

GradCache and data parallelism: the variants ``matryoshka*`` of ``scaleout_helpers`` run through
every test of ``test_gradcache.py`` and ``test_distributed.py``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.losses import MatryoshkaLoss, MultipleNegativesRankingLoss

import objectives_reference as ref
from conftest import GREEK
from cselab.core.datakind import DataKind
from cselab.core.errors import ConfigError, SearchIndexError
from cselab.core.schema import from_dict
from cselab.model.encoder import SentenceEncoder
from cselab.objectives import (
    InfoNCE,
    Matryoshka,
    MatryoshkaConfig,
    Objective,
    ObjectiveConfig,
    ObjectiveContext,
    build_objective,
    describe_objective,
    objective_papers,
    objective_tags,
    total_loss,
)
from cselab.st import CSELoss
from scaleout_helpers import (
    PAIRS,
    SUPERVISED_VARIANTS,
    VARIANTS,
    generator,
    make_views,
    objective_config,
)

EPS = torch.finfo(torch.float64).eps
TAU = 0.05


def matryoshka_config(base: dict, dims: list[int], weights: list[float] | None = None):
    return from_dict(ObjectiveConfig, {**base, "matryoshka": {"dims": dims, "weights": weights}})


def views_for(obj: Objective, n: int = 8, d: int = 16) -> dict[str, torch.Tensor]:
    return {k: v.double() for k, v in make_views(n, d).items() if k in obj.required_views}


# ---------------------------------------------------------------------------------------------
# Values: sentence-transformers, the paper, the neutral setting
# ---------------------------------------------------------------------------------------------

SENTENCES = [
    " ".join(GREEK[(i * 5 + j * 3) % len(GREEK)] for j in range(2 + i % 6)) for i in range(8)
]
POSITIVES = SENTENCES[1:] + SENTENCES[:1]
NEGATIVES = [f"{s} {GREEK[i]}" for i, s in enumerate(SENTENCES[::-1])]


@pytest.fixture(scope="module")
def st_folder(tiny_bert: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("st") / "model"
    SentenceEncoder.from_pretrained(str(tiny_bert), pooler="avg").save(folder)
    return folder


@pytest.mark.parametrize("columns", [2, 3])
def test_equals_sentence_transformers_matryoshka_loss(
    st_folder: Path, columns: int, one_thread
) -> None:
    """``MatryoshkaLoss(model, MultipleNegativesRankingLoss(model, scale=1/τ), dims, weights)``
    on the same batch: the same loss and gradients as cselab's objective (through ``cselab.st``,
    which runs ``Task.losses``), pairs with and without a hard negative. Dropout is off (eval):
    sentence-transformers' losses embed the columns in separate forwards and ``cselab.st`` in one
    merged forward, so in train mode the two draw different masks (plain MNRL too)."""
    dims, weights = [32, 8, 16], [1.0, 0.5, 2.0]  # any order: sentence-transformers sorts them
    features_of = [SENTENCES, POSITIVES, NEGATIVES][:columns]
    results = []
    for which in ("st", "cselab"):
        model = SentenceTransformer(str(st_folder), device="cpu").double().eval()
        if which == "st":
            inner = MultipleNegativesRankingLoss(model, scale=1 / TAU)
            loss_fn = MatryoshkaLoss(model, inner, dims, weights)
        else:
            loss_fn = CSELoss(model, matryoshka_config({}, dims, weights))
        features = [model.tokenize(texts) for texts in features_of]
        loss = loss_fn(features, None)
        loss.backward()
        grads = {n: p.grad for n, p in model[0].auto_model.named_parameters() if p.grad is not None}
        results.append((loss.detach(), grads))
    (st_loss, st_grads), (loss, grads) = results
    torch.testing.assert_close(loss, st_loss, rtol=1e4 * EPS, atol=0)
    # one scale for all: the key biases' gradients are zero up to roundoff (softmax invariance)
    tol = 1e4 * EPS * max(float(g.abs().max()) for g in st_grads.values())
    for key, expected in st_grads.items():
        torch.testing.assert_close(grads[key], expected, rtol=0, atol=tol, msg=key)
    # the prefixes count: the full width alone is another loss
    model = SentenceTransformer(str(st_folder), device="cpu").double().eval()
    plain = CSELoss(model, ObjectiveConfig())([model.tokenize(t) for t in features_of], None)
    assert grads.keys() == st_grads.keys()
    assert not torch.allclose(plain.detach(), loss)


def test_equals_the_paper_equation_in_float64() -> None:
    """Eq. 1, ``Σ_m c_m L(z_{1:m})``, with L SimCSE's Eq. 1 and Focal's Eq. 2 as explicit loops."""
    views = make_views(6, 12, seed=3)
    z1, z2 = views["z1"].double(), views["z2"].double()
    dims, weights = [12, 5, 2], [1.0, 0.3, 2.0]
    got = Matryoshka(InfoNCE(TAU), dims, weights)({"z1": z1, "z2": z2})["infonce"]
    want = sum(
        c * ref.infonce(z1[:, :d], z2[:, :d], TAU) for d, c in zip(dims, weights, strict=True)
    )
    torch.testing.assert_close(got, want, rtol=1e3 * EPS, atol=0)

    focal = build_objective(matryoshka_config({"focal": {"enabled": True}}, [7, 3]))
    got = focal({"z1": z1, "z2": z2})["infonce"]
    want = ref.focal(z1[:, :7], z2[:, :7], TAU, 0.3) + ref.focal(z1[:, :3], z2[:, :3], TAU, 0.3)
    torch.testing.assert_close(got, want, rtol=1e3 * EPS, atol=0)

    dcl = build_objective(matryoshka_config({"dcl": {"enabled": True}}, [12, 4], [0.5, 1.0]))
    got = dcl({"z1": z1, "z2": z2})
    want = 0.5 * ref.dcl(z1, z2, 5.0, "authors_code") + ref.dcl(
        z1[:, :4], z2[:, :4], 5.0, "authors_code"
    )
    torch.testing.assert_close(got["dcl"], 0.1 * want, rtol=1e3 * EPS, atol=0)


PLAIN_VARIANTS = [v for v in [*VARIANTS, *SUPERVISED_VARIANTS] if "matryoshka" not in v]


@pytest.mark.parametrize("variant", PLAIN_VARIANTS)
def test_one_full_width_dimension_is_the_plain_objective_exactly(variant: str) -> None:
    """dims = [D], weight 1: every term bit for bit, random draws included."""
    kind = PAIRS if variant in SUPERVISED_VARIANTS else None
    base = objective_config(variant)
    plain = build_objective(base, kind)
    base.matryoshka = MatryoshkaConfig(dims=[16])
    wrapped = build_objective(base, kind, width=16)
    views = views_for(plain)
    want = plain(views, ObjectiveContext(generator=generator()))
    got = wrapped(views, ObjectiveContext(generator=generator()))
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k


class Draws(Objective):
    """Records what the objective's random draws are at each prefix."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, views, ctx=None):
        z1 = views["z1"]
        partners = torch.randint(0, 100, (5,), generator=ctx.generator)
        self.seen.append((ctx.normal(3, z1.shape[-1], z1), partners))
        return {"infonce": z1.sum() * 0}


def test_every_prefix_sees_the_same_steps_draws() -> None:
    """Gaussian-like draws at a prefix are the prefixes of the full-width draws, index draws
    (MixCSE's partners) are the same, and the generator ends where one plain call leaves it."""
    z = {"z1": torch.randn(4, 16, dtype=torch.float64), "z2": torch.randn(4, 16)}
    plain = Draws()
    plain_gen = generator()
    plain(z, ObjectiveContext(generator=plain_gen))
    (full, full_partners) = plain.seen[0]

    inner = Draws()
    gen = generator()
    Matryoshka(inner, [16, 8, 3])(z, ObjectiveContext(generator=gen))
    assert [g.shape[1] for g, _ in inner.seen] == [16, 8, 3]
    for drawn, partners in inner.seen:
        assert torch.equal(drawn, full[:, : drawn.shape[1]])
        assert torch.equal(partners, full_partners)
    assert torch.equal(gen.get_state(), plain_gen.get_state())


@pytest.mark.parametrize("variant", ["gaussian", "sup_simcse_weighted"])
def test_composed_values_are_the_sum_over_prefixes(variant: str) -> None:
    """With random draws (Gaussian negatives) and hard negatives: Σ_d c_d · the paper's loss on
    the prefix, the Gaussian vectors at d being the prefixes of those drawn at the full width."""
    z = views_for(build_objective(objective_config(variant), PAIRS if "sup" in variant else None))
    z1, z2 = z["z1"], z["z2"]
    dims, weights = [16, 6], [1.0, 0.5]
    cfg = objective_config(variant)
    cfg.matryoshka = MatryoshkaConfig(dims=dims, weights=weights)
    if variant == "gaussian":
        obj = build_objective(cfg)
        got = obj(z, ObjectiveContext(generator=generator()))["infonce"]
        g = torch.randn(3 * 8, 16, generator=generator()).double()  # M = 3 × batch, float32 draws
        want = sum(c * ref.gs_infonce(z1[:, :d], z2[:, :d], g[:, :d], TAU, 1.0)
                   for d, c in zip(dims, weights, strict=True))  # fmt: skip
    else:
        obj = build_objective(cfg, PAIRS)
        got = obj(z, ObjectiveContext())["infonce"]
        neg = z["neg"]
        want = sum(
            c * ref.supervised_simcse(z1[:, :d], z2[:, :d], neg[..., :d], TAU, 0.5)
            for d, c in zip(dims, weights, strict=True)
        )
    torch.testing.assert_close(got, want, rtol=1e3 * EPS, atol=0)


# ---------------------------------------------------------------------------------------------
# Config, description
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"dims": []}, r"objective.matryoshka.dims must list at least one dimension"),
        ({"dims": [16, 0]}, r"objective.matryoshka.dims must all be >= 1"),
        ({"dims": [8, 16, 8]}, r"objective.matryoshka.dims must not repeat"),
        ({"dims": [16, 8], "weights": [1.0]}, r"objective.matryoshka.weights must have one entry"),
        ({"dims": [16, 8], "weights": [1.0, -1.0]}, r"objective.matryoshka.weights must all be"),
        ({"dims": [16, 8], "weights": [0, 0]}, r"objective.matryoshka.weights must not all be 0"),
        ({"weights": [1.0]}, r"objective.matryoshka.weights is set but"),
        (
            {"dims": [64, 8]},
            r"objective.matryoshka.dims must not exceed the encoder's output "
            r"width 32, got \[64, 8\]",
        ),  # fmt: skip
        ({"dims": "64"}, r"matryoshka.dims: expected a list or null, got '64'"),
    ],
)
def test_bad_settings_name_the_key(section: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_objective(from_dict(ObjectiveConfig, {"matryoshka": section}), width=32)


def test_the_width_is_checked_where_the_model_is_known(tiny_bert: Path, tmp_path: Path) -> None:
    """``cselab train`` (the encoder's width, 32) and ``cselab.st`` (the model's) refuse dims
    above the width with one line naming the key."""
    from conftest import write_corpus
    from cselab.cli import main

    argv = [
        "train", f"--model.name_or_path={tiny_bert}",
        f"--data.train_file={write_corpus(tmp_path)}", f"--data.cache_dir={tmp_path / 'cache'}",
        f"--train.output_dir={tmp_path / 'out'}", "--train.max_steps=1",
        "--objective.matryoshka.dims=[48,16]",
    ]  # fmt: skip
    assert main(argv) == 2
    folder = tmp_path / "st"
    SentenceEncoder.from_pretrained(str(tiny_bert), pooler="avg").save(folder)
    model = SentenceTransformer(str(folder), device="cpu")
    with pytest.raises(ConfigError, match="dims must not exceed the encoder's output width 32"):
        CSELoss(model, matryoshka_config({}, [48, 16]))


def test_papers_tags_and_description() -> None:
    obj = build_objective(matryoshka_config({"focal": {"enabled": True}}, [16, 8], [1.0, 0.5]))
    assert [p.key for p in objective_papers(obj)] == [
        "gao2021simcse", "hou2023focal", "kusupati2022matryoshka",
    ]  # fmt: skip
    assert objective_tags(obj)[:1] == ["simcse"] and "matryoshka" in objective_tags(obj)
    assert "first d = 16, 8 coordinates" in describe_objective(obj)[-1]
    assert "weights 1, 0.5" in describe_objective(obj)[-1]
    assert obj.required_views == build_objective(objective_config("focal")).required_views


def test_hard_negative_views_are_cut_too() -> None:
    obj = build_objective(objective_config("sup_simcse"), DataKind(pairs=True, negatives=2))
    wrapped = Matryoshka(obj, [4])
    z = views_for(obj)
    cut = {k: v[..., :4] for k, v in z.items()}
    assert torch.equal(wrapped(z)["infonce"], obj(cut)["infonce"])
    assert total_loss(wrapped(z)).ndim == 0


# ---------------------------------------------------------------------------------------------
# A run: resume bit-exact, the dev score per dimension in results.json and the model card
# ---------------------------------------------------------------------------------------------


def _width_score(encoder) -> float:
    """A scripted dev score that says at which width the evaluator saw the encoder."""
    from cselab.evaluation.embed import call_encoder

    return float(call_encoder(encoder, ["alpha beta", "gamma"], 8).shape[1])


def test_a_run_resumes_bit_exactly_and_the_card_has_a_row_per_dimension(
    tiny_bert: Path, tmp_path: Path, one_thread
) -> None:
    """Matryoshka with Gaussian negatives (draws from the step's generator): a run stopped at
    its step-3 checkpoint resumes to the same weights as an uninterrupted one; at the end the
    selected model is scored at each dimension (results.json) and the card shows the table."""
    from safetensors.torch import load_file

    from cselab.app.train import build_trainer
    from cselab.io.runfolder import RunFolder
    from cselab.publish.card import CARD_FILE
    from test_trainer import tiny_config

    extra = ["--objective.matryoshka.dims=[16,8]", "--objective.matryoshka.weights=[1,0.5]",
             "--objective.gaussian.enabled=true", "--train.max_steps=6", "--train.save_steps=3",
             "--train.eval_steps=3"]  # fmt: skip

    def trainer(folder: Path, *more: str):
        t = build_trainer(tiny_config(tiny_bert, folder, *extra, *more))
        t.selection.evaluator = _width_score  # the full width (32) at every evaluation
        return t

    whole = trainer(tmp_path / "whole").train()
    stopped = trainer(tmp_path / "part")
    stopped.loop = dataclasses.replace(stopped.loop, total_steps=3)  # a killed run stops so
    stopped.train()
    assert trainer(tmp_path / "part", "--train.resume=true").train()["steps"] == 6  # not a no-op
    a = load_file(str(RunFolder(tmp_path / "whole" / "out").last / "model.safetensors"))
    b = load_file(str(RunFolder(tmp_path / "part" / "out").last / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    # the best model is step 0's (no later score beats 32): opened from best/ and scored at
    # the full width and at each prefix, widest first
    assert whole["best_step"] == 0
    want = [{"dim": 32, "stsb_dev": 32.0}, {"dim": 16, "stsb_dev": 16.0},
            {"dim": 8, "stsb_dev": 8.0}]  # fmt: skip
    assert whole["dev_at_dims"] == want
    out = RunFolder(tmp_path / "whole" / "out")
    assert json.loads(out.results.read_text())["dev_at_dims"] == want
    card = (out.best / CARD_FILE).read_text()
    table = card.split("## Matryoshka dimensions")[1].split("##")[0]
    assert "`best/`, step 0" in table
    for row in ("| 32 | 32.00 |", "| 16 | 16.00 |", "| 8 | 8.00 |"):
        assert row in table
    assert "kusupati2022matryoshka" in card and "first d = 16, 8 coordinates" in card


def test_a_run_without_matryoshka_has_no_table(tiny_bert: Path, tmp_path: Path) -> None:
    from cselab.publish.card import write_model_card
    from test_trainer import tiny_config

    config = tiny_config(tiny_bert, tmp_path)
    folder = tmp_path / "m"
    SentenceEncoder.from_pretrained(str(tiny_bert), pooler="avg").save(folder)
    text = write_model_card(folder, config, results={"best_step": 3}).read_text()
    assert "Matryoshka" not in text
    rows = [{"dim": 32, "stsb_dev": 70.0}, {"dim": 8, "stsb_dev": 61.5}]
    text = write_model_card(folder, config, results={"best_step": 3, "dev_at_dims": rows})
    assert "| 8 | 61.50 |" in text.read_text()


# ---------------------------------------------------------------------------------------------
# Inference at a dimension: encode, cselab encode --dim, cselab index build --dim
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_folder(tiny_bert64: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("m64") / "model"
    SentenceEncoder.from_pretrained(str(tiny_bert64), pooler="avg").save(folder)
    return folder


def test_encode_at_a_dimension_is_the_renormalised_prefix(model_folder: Path) -> None:
    from cselab.model.encoder import load

    enc = load(str(model_folder))
    sentences = ["a first sentence .", "and a second , longer one .", "three"]
    full = enc.encode(sentences).astype(np.float64)
    want = full[:, :8] / np.linalg.norm(full[:, :8], axis=1, keepdims=True)
    got = enc.encode(sentences, dim=8)
    assert got.shape == (3, 8) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=4 * np.finfo(np.float32).eps)
    assert enc.encode([], dim=8).shape == (0, 8)
    np.testing.assert_allclose(  # the full width: the normalised vectors
        enc.encode(sentences, dim=32), enc.encode(sentences, normalize=True),
        rtol=0, atol=4 * np.finfo(np.float32).eps,
    )  # fmt: skip
    for bad in (0, 33):
        with pytest.raises(ConfigError, match=rf"dimension {bad} is outside 1\.\.32"):
            enc.encode(sentences, dim=bad)


def test_cli_encode_dim(model_folder: Path, tmp_path: Path, capsys) -> None:
    from cselab.cli import main
    from cselab.model.encoder import load

    sentences = ["a first sentence .", "and a second , longer one ."]
    (tmp_path / "in.txt").write_text("\n".join(sentences) + "\n")
    args = ["encode", str(model_folder), "--input", str(tmp_path / "in.txt"),
            "--output", str(tmp_path / "v.npy")]  # fmt: skip
    assert main([*args, "--dim", "8"]) == 0
    np.testing.assert_allclose(
        np.load(tmp_path / "v.npy"), load(str(model_folder)).encode(sentences, dim=8),
        rtol=0, atol=4 * np.finfo(np.float32).eps,
    )  # fmt: skip
    capsys.readouterr()
    assert main([*args, "--dim", "64"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "cselab encode: error: --dim 64 is outside 1..32 (the vectors' width)"


def test_index_built_at_a_dimension_searches_at_it(model_folder: Path, tmp_path: Path) -> None:
    """``cselab index build --dim 8``: 8-wide vectors, recorded in index.json; ``cselab search``
    encodes queries at the same prefix (the hits are brute force over the prefixes); resuming at
    another dim and a query model of another width are refused."""
    from cselab.cli import main
    from cselab.model.encoder import load
    from cselab.search.index import Index

    corpus = [f"{GREEK[i % len(GREEK)]} {GREEK[(3 * i) % len(GREEK)]} {i}" for i in range(30)]
    (tmp_path / "corpus.txt").write_text("\n".join(corpus) + "\n")
    out = tmp_path / "small.index"
    build = ["index", "build", str(tmp_path / "corpus.txt"), "--model", str(model_folder),
             "-o", str(out)]  # fmt: skip
    assert main([*build, "--dim", "8"]) == 0
    index = Index.open(out)
    assert index.meta["dim"] == 8 and index.meta["model_dim"] == 32
    enc = load(str(model_folder))
    vectors = enc.encode(corpus, dim=8)
    np.testing.assert_allclose(np.asarray(index.vectors), vectors, rtol=0, atol=1e-6)
    assert index.query_dim() == 8
    hits = index.search("alpha beta", k=5)
    query = enc.encode(["alpha beta"], dim=8)[0]
    ref = np.asarray(index.vectors) @ query
    rows = [h.row for h in hits]
    # the five best rows at the 8-d prefix, best first; a near tie may order either way on
    # another CPU's matrix product, so ranks are compared up to float rounding
    np.testing.assert_allclose([h.score for h in hits], ref[rows], rtol=0, atol=1e-5)
    assert all(a >= b - 1e-5 for a, b in zip(ref[rows][:-1], ref[rows][1:], strict=True))
    assert ref[rows].min() >= np.sort(ref)[-6] - 1e-5

    assert main([*build, "--dim", "16"]) == 2  # an index at 8 is there: not resumed at 16
    wide = Index.open(out, model=_wider_model(tmp_path))
    with pytest.raises(SearchIndexError, match="built from a model of width 32 .*first 8"):
        wide.search("alpha", k=1)


def _wider_model(tmp_path: Path) -> Path:
    from conftest import make_tiny_bert

    folder = tmp_path / "wide-model"
    backbone = make_tiny_bert(tmp_path / "wide-bert", hidden=48)
    SentenceEncoder.from_pretrained(str(backbone), pooler="avg").save(folder)
    return folder
