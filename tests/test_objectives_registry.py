"""The objectives' registry (docs/design.md, "One home per objective parameter"): every key of
the ``objective:`` section that makes a part is registered once, in assembly order, and each
section checks its own keys."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from cselab.core.datakind import DataKind
from cselab.core.errors import ConfigError
from cselab.objectives import OBJECTIVE_PARTS, build_objective
from cselab.objectives.config import (
    GaussianConfig,
    MixCSEConfig,
    NoiseConfig,
    ObjectiveConfig,
    ObjectiveFacts,
    OffDropoutConfig,
)
from cselab.objectives.gaussian import GaussianNegatives
from cselab.objectives.hard_negatives import HardNegatives
from cselab.objectives.infonce import InBatchNegatives
from cselab.objectives.mixcse import MixedNegatives
from cselab.objectives.spaces import NOISY_SPACE, OFF_DROPOUT_SPACE

SRC = Path(__file__).resolve().parents[1] / "src"


def test_every_section_is_registered_once() -> None:
    keys = [key for key, _ in OBJECTIVE_PARTS]
    assert len(keys) == len(set(keys))
    assert set(ObjectiveConfig.sections()) | {"hard_negative_weight"} == set(keys)
    names = {f.name for f in dataclasses.fields(ObjectiveConfig)}
    assert set(keys) <= names


def test_every_section_checks_its_own_keys() -> None:
    """Each sub-section has its ``validate``, and a bad value is named by its full key."""
    config = ObjectiveConfig()
    for name in ObjectiveConfig.sections():
        assert callable(getattr(getattr(config, name), "validate", None)), name
    with pytest.raises(ConfigError, match=r"objective\.gaussian\.std must be > 0"):
        GaussianConfig(std=0.0).validate(ObjectiveFacts(config))
    with pytest.raises(ConfigError, match=r"objective\.symmetric"):
        MixCSEConfig(enabled=True, directions="single").validate(
            ObjectiveFacts(ObjectiveConfig(symmetric=True))
        )


def test_assembly_order_the_space_first_then_the_columns_in_order() -> None:
    """Noisy negatives score every block in the noisy space, off-dropout replaces the in-batch
    block, and the blocks keep the registry's column order (hard, Gaussian, mixed)."""
    cfg = ObjectiveConfig(
        gaussian=GaussianConfig(enabled=True),
        mixcse=MixCSEConfig(enabled=True),
        noise=NoiseConfig(enabled=True, side="negative"),
        hard_negative_weight=0.5,
    )
    with pytest.raises(ConfigError):  # noisy negatives and given hard negatives
        build_objective(cfg, DataKind(pairs=True, negatives=1))
    cfg.noise = NoiseConfig(enabled=True, side="positive")
    objective = build_objective(cfg, DataKind(pairs=True, negatives=1))
    assert [type(n) for n in objective.negatives] == [
        InBatchNegatives,
        HardNegatives,
        GaussianNegatives,
        MixedNegatives,
    ]
    noisy = build_objective(ObjectiveConfig(gaussian=GaussianConfig(enabled=True),
                                            noise=NoiseConfig(enabled=True)))  # fmt: skip
    assert {n.space for n in noisy.negatives} == {NOISY_SPACE}
    off = build_objective(ObjectiveConfig(off_dropout=OffDropoutConfig(enabled=True),
                                          gaussian=GaussianConfig(enabled=True)))  # fmt: skip
    assert {n.space for n in off.negatives} == {OFF_DROPOUT_SPACE}


def test_the_st_losses_build_sections_with_keywords() -> None:
    """A positional section would swap values silently when a field moves."""
    tree = ast.parse((SRC / "cselab/st.py").read_text(encoding="utf-8"))
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id.endswith("Config")
    ]
    assert calls
    assert [ast.unparse(c) for c in calls if c.args] == []
