"""Each objective module carries its own paper facts; the model card and ``cselab.st`` ask the
built objective for its papers, tags and description; every part takes its defaults from its
config section (one home per fact)."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

from cselab.config import load_config
from cselab.core.datakind import SENTENCES, DataKind
from cselab.data.source import TrainingData
from cselab.objectives import (
    AuxiliaryTerm,
    Cited,
    InfoNCE,
    ObjectiveConfig,
    Paper,
    build_objective,
    describe_objective,
    objective_papers,
    objective_tags,
)
from cselab.objectives import config as objective_config
from cselab.publish.card import CARD_FILE, write_model_card

#: module -> (its part classes, the paper keys they cite)
PARTS = {
    "infonce": ({"InfoNCE"}, {"gao2021simcse"}),
    "hard_negatives": ({"HardNegatives"}, {"gao2021simcse"}),
    "focal": ({"FocalScore"}, {"hou2023focal"}),
    "gaussian": ({"GaussianNegatives"}, {"wu2022smoothed"}),
    "off_dropout": ({"OffDropoutNegatives", "PositiveRatioScore"}, {"xu2023imsimcse"}),
    "dcl": ({"DimensionContrastive"}, {"xu2023imsimcse"}),
    "noise": ({"AdditiveNoise"}, {"xu2023imsimcse"}),
    "barlow": ({"BarlowTwinsTerm"}, {"xu2023imsimcse", "zbontar2021barlow"}),
    "mixcse": ({"MixedNegatives"}, {"zhang2022mixcse"}),
    "esimcse": ({"WordRepetition", "MomentumQueue"}, {"wu2022esimcse"}),
}


@pytest.mark.parametrize("name", sorted(PARTS))
def test_each_module_carries_its_papers(name: str) -> None:
    module = importlib.import_module(f"cselab.objectives.{name}")
    classes, keys = PARTS[name]
    for cls_name in classes:
        cls = getattr(module, cls_name)
        assert issubclass(cls, Cited) and cls.__module__ == module.__name__
        assert {p.key for p in cls.papers} == keys
        assert cls.describe is not Cited.describe  # says what it does, with its parameters
        for paper in cls.papers:
            assert paper.name and paper.summary and paper.bibtex.startswith("@")
            assert f"{{{paper.key}," in paper.bibtex  # the key is the entry's


def test_each_paper_has_one_home() -> None:
    """Every paper is one module-level constant (other modules import it, never copy it)."""
    homes: dict[str, set[int]] = {}
    for name in PARTS:
        for value in vars(importlib.import_module(f"cselab.objectives.{name}")).values():
            if isinstance(value, Paper):
                homes.setdefault(value.key, set()).add(id(value))
    cited = {p.key for classes, _ in PARTS.values() for p in _papers(classes)}
    assert set(homes) == cited
    assert all(len(objects) == 1 for objects in homes.values()), homes


def _papers(classes: set[str]) -> list[Paper]:
    import cselab.objectives as objectives

    return [p for c in classes for p in getattr(objectives, c).papers]


def every_part() -> ObjectiveConfig:
    on = {"enabled": True}
    oc = objective_config
    return ObjectiveConfig(
        focal=oc.FocalConfig(**on), gaussian=oc.GaussianConfig(**on),
        off_dropout=oc.OffDropoutConfig(**on), dcl=oc.DCLConfig(**on),
        barlow_twins=oc.BarlowTwinsConfig(**on), mixcse=oc.MixCSEConfig(**on),
        noise=oc.NoiseConfig(enabled=True, side="positive"),
    )  # fmt: skip


def test_the_built_objective_lists_its_papers_tags_and_parts() -> None:
    objective = build_objective(every_part())
    keys = [p.key for p in objective_papers(objective)]
    assert keys[0] == "gao2021simcse" and len(keys) == len(set(keys)) == 6
    tags = objective_tags(objective)
    assert tags[0] == "simcse"
    want = {"focal-infonce", "gs-infonce", "off-dropout", "dcl", "barlow-twins", "mixcse"}
    assert want | {"embedding-noise", "imsimcse"} <= set(tags)
    lines = describe_objective(objective)
    assert len(lines) == 8 and all(line.startswith("- **") for line in lines)
    # ImSimCSE's own tag needs its whole method (off-dropout and DCL), not one of its parts.
    dcl_only = ObjectiveConfig(dcl=objective_config.DCLConfig(enabled=True))
    assert "imsimcse" not in objective_tags(build_objective(dcl_only))
    assert [p.key for p in objective_papers(build_objective(ObjectiveConfig()))] == [
        "gao2021simcse"
    ]


def test_a_new_part_is_cited_without_touching_the_card() -> None:
    """A part defined elsewhere, with its paper, is cited and described by the same functions
    the card uses: the card keeps no list of papers."""
    paper = Paper("doe2030new", "NewCSE", "a new term", "@article{doe2030new,\n  title = {New}\n}")

    class NewTerm(AuxiliaryTerm):
        name = "new"
        papers = (paper,)
        tags = ("new-term",)

        def describe(self, kind: DataKind = SENTENCES) -> str:
            return "**NewCSE** (Doe 2030): a new term."

    objective = InfoNCE(auxiliary=[NewTerm()])
    assert [p.key for p in objective_papers(objective)] == ["gao2021simcse", "doe2030new"]
    assert objective_tags(objective) == ["simcse", "new-term"]
    assert describe_objective(objective)[-1] == "- **NewCSE** (Doe 2030): a new term."
    import cselab.publish.card as card

    assert not hasattr(card, "BIBTEX") and card.objective_papers is objective_papers


def test_the_card_cites_every_paper_of_a_combined_objective(
    tiny_bert: Path, tmp_path: Path
) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a sentence\nanother one\n", encoding="utf-8")
    config = load_config(
        None,
        [f"--model.name_or_path={tiny_bert}", f"--data.train_file={corpus}", "--model.pooler=cls"],
    )  # the card describes a resolved pooler (a run resolves it when the model loads)
    config.objective = every_part()
    folder = tmp_path / "model"
    folder.mkdir()
    write_model_card(folder, config, data=TrainingData(corpus, DataKind(), rows=2))
    card = ModelCard.load(folder / CARD_FILE)
    objective = build_objective(config.objective)
    for paper in objective_papers(objective):
        assert paper.bibtex in card.text
    for line in describe_objective(objective):
        assert line in card.text
    assert set(objective_tags(objective)) <= set(card.data.tags)


@pytest.mark.parametrize(
    ("module", "cls", "section"),
    [
        ("infonce", "InfoNCE", ObjectiveConfig),
        ("focal", "FocalScore", objective_config.FocalConfig),
        ("gaussian", "GaussianNegatives", objective_config.GaussianConfig),
        ("dcl", "DimensionContrastive", objective_config.DCLConfig),
        ("barlow", "BarlowTwinsTerm", objective_config.BarlowTwinsConfig),
        ("mixcse", "MixedNegatives", objective_config.MixCSEConfig),
        ("noise", "AdditiveNoise", objective_config.NoiseConfig),
        ("off_dropout", "OffDropoutNegatives", objective_config.OffDropoutConfig),
        ("esimcse", "WordRepetition", objective_config.WordRepetitionConfig),
        ("esimcse", "MomentumQueue", objective_config.MomentumQueueConfig),
    ],
)
def test_part_defaults_are_their_config_sections(module: str, cls: str, section: type) -> None:
    """τ, DCL's τ and every other default have one home: the config section (the papers'
    values); a part's keyword default is read from it."""
    part = getattr(importlib.import_module(f"cselab.objectives.{module}"), cls)
    defaults = section()
    params = inspect.signature(part.__init__).parameters
    shared = {name for name in params if hasattr(defaults, name)}
    assert shared, cls
    for name in shared:
        assert params[name].default == getattr(defaults, name), (cls, name)
