"""What a step does not redo: the in-batch diagonal and the hard negatives' weights are made once
per shape, offset and device; a one-term loss is its term; the views are checked once."""

from __future__ import annotations

import torch

from conftest import aten_calls
from cselab.core.datakind import SENTENCES, DataKind
from cselab.objectives import HardNegatives, InfoNCE, ObjectiveContext, Pair, total_loss
from cselab.objectives.infonce import own_column_mask
from cselab.training import views


def test_the_diagonal_mask_is_made_once_per_shape_and_offset() -> None:
    sims = torch.randn(3, 6)
    first = own_column_mask(sims, 3)
    later = torch.randn(3, 6)  # the next step's similarities
    with aten_calls() as ops:
        again = own_column_mask(later, 3)
    assert again is first and ops.names == []  # no operator: the step reuses it
    expected = torch.zeros(3, 6, dtype=torch.bool)
    expected[[0, 1, 2], [3, 4, 5]] = True
    assert torch.equal(first, expected)
    other = own_column_mask(sims, 0)  # rank 0 of two: its own diagonal
    assert torch.equal(other, expected.roll(-3, dims=1)) and other is not first
    assert own_column_mask(torch.randn(2, 6), 3).shape == (2, 6)
    with torch.inference_mode():  # made outside inference mode: usable in a later backward
        fresh = own_column_mask(torch.randn(5, 5), 0)
    assert not fresh.is_inference()


def test_a_step_s_objective_builds_no_index_and_a_one_term_loss_is_its_term() -> None:
    g = torch.Generator().manual_seed(0)
    z = {k: torch.randn(8, 16, generator=g, requires_grad=True) for k in ("z1", "z2")}
    loss = InfoNCE(0.05)
    loss(z)  # the first step makes the constants
    with aten_calls() as ops:
        terms = loss(z)
        total = total_loss(terms)
    assert total is terms["infonce"]
    assert not {"aten.arange", "aten.index_put_", "aten.stack", "aten.zeros_like"} & set(ops.names)
    two = {"a": torch.tensor(1.5), "b": torch.tensor(2.25)}
    assert total_loss(two).item() == 3.75


def test_the_hard_negatives_weights_equal_their_definition_and_are_reused() -> None:
    """Anchor ``i`` (global row ``offset + i``) weighs its own ``K`` columns by ``w``."""
    g = torch.Generator().manual_seed(1)
    anchor = torch.randn(2, 4, generator=g)
    neg = torch.randn(4, 3, 4, generator=g)  # N = 4 sentences of the global batch, K = 3
    part = HardNegatives(0.7)
    ctx = ObjectiveContext(offset=2, world_size=2)
    pair = Pair(anchor, anchor, {"z1": anchor, "neg": neg})
    block = part(pair, ctx)
    expected = torch.zeros(2, 12)
    expected[0, 6:9] = expected[1, 9:12] = 0.7
    assert torch.equal(block.log_weight, expected)
    assert (
        part(Pair(anchor, anchor, {"z1": anchor, "neg": neg}), ctx).log_weight is block.log_weight
    )


def test_the_views_are_checked_once_per_set_and_kind() -> None:
    views._check_views.cache_clear()
    for _ in range(3):
        views.check_views(["z1", "z2"], SENTENCES)
    info = views._check_views.cache_info()
    assert (info.misses, info.hits) == (1, 2)
    pairs = DataKind(pairs=True)
    try:
        views.check_views(["off"], pairs)
    except ValueError as e:
        assert "off-dropout" in str(e)
    else:  # pragma: no cover - the check must refuse
        raise AssertionError("off-dropout on pairs was not refused")
