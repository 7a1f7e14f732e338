"""Matryoshka's section, ``objective.matryoshka`` (Kusupati et al. 2022, Eq. 1): it wraps
whichever objective the other keys describe.

Torch-free, so that a config is read without torch; the paper module
(:mod:`cselab.objectives.matryoshka`) turns the section into its part.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core.schema import check, finite
from .facts import ObjectiveFacts


@dataclass
class MatryoshkaConfig:
    """Matryoshka Representation Learning (Kusupati et al. 2022, Eq. 1): the objective the other
    keys describe, computed on the first ``d`` coordinates of every view for each ``d`` of
    ``dims`` and summed with ``weights``, so the model can be cut to any of those dimensions.

    Attributes:
        dims: the prefix dimensions, e.g. ``[384, 256, 128, 64]`` (any order; each at least 1,
            no repeats, none above the encoder's output width); ``null`` (default): off. List
            the full width too, or the full vector is not trained (sentence-transformers warns
            of the same).
        weights: ``c_d``, one factor per entry of ``dims`` (each ``>= 0``, at least one
            ``> 0``); ``null``: 1 each (the paper's setting).
    """

    dims: list[int] | None = None
    weights: list[float] | None = None

    @property
    def enabled(self) -> bool:
        return self.dims is not None

    def validate(self, facts: ObjectiveFacts | None = None, *, width: int | None = None) -> None:
        """The checks of ``objective.matryoshka`` (kinds are checked by the whole section);
        the encoder's output width (``facts.width`` or ``width``) where it is known (``None``:
        not yet)."""
        if facts is not None and width is None:
            width = facts.width
        p = "objective.matryoshka"
        if self.dims is None:
            check(self.weights is None, f"{p}.weights is set but {p}.dims is null; list the "
                  "dimensions the weights belong to", self.weights)  # fmt: skip
            return
        check(len(self.dims) > 0, f"{p}.dims must list at least one dimension (or be null)",
              self.dims)  # fmt: skip
        check(all(d >= 1 for d in self.dims), f"{p}.dims must all be >= 1", self.dims)
        check(len(set(self.dims)) == len(self.dims), f"{p}.dims must not repeat a dimension",
              self.dims)  # fmt: skip
        if self.weights is not None:
            check(len(self.weights) == len(self.dims),
                  f"{p}.weights must have one entry per dimension ({len(self.dims)})",
                  self.weights)  # fmt: skip
            check(all(finite(w) and w >= 0 for w in self.weights), f"{p}.weights must all be "
                  ">= 0", self.weights)  # fmt: skip
            check(any(w > 0 for w in self.weights), f"{p}.weights must not all be 0 (no "
                  "loss would be left)", self.weights)  # fmt: skip
        if width is not None:
            check(max(self.dims) <= width, f"{p}.dims must not exceed the encoder's output "
                  f"width {width}", self.dims)  # fmt: skip
