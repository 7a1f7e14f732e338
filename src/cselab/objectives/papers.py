"""What an objective says about itself: the papers it implements, its Hub tags, its parts in words.

Every part of an objective (:class:`~cselab.objectives.infonce.InfoNCE` itself, a score, a
negative source, a view transform, an auxiliary term) is :class:`Cited`: it names the
:class:`Paper`\\ s it implements, the Hub tags that name it and describes itself with its
parameters. Each paper is a constant of the module that implements it (``SIMCSE`` in
:mod:`.infonce`, ``FOCAL_INFONCE`` in :mod:`.focal`, ...), so a new paper is one module; the model
card and :mod:`cselab.st` ask a built objective (:func:`objective_papers`, :func:`objective_tags`,
:func:`describe_objective`) and keep no list of their own.
"""

from __future__ import annotations

from torch import nn

from ..core.datakind import SENTENCES, DataKind
from ..core.papers import Paper  # re-exported: the objectives name their papers with it


class Cited:
    """Mixed into every part: what it implements, its Hub tags and a line describing it."""

    #: the papers this part implements
    papers: tuple[Paper, ...] = ()
    #: Hub tags naming this part
    tags: tuple[str, ...] = ()

    def describe(self, kind: DataKind = SENTENCES) -> str | None:
        """This part in words with its parameters (markdown), for data of ``kind``; ``None``:
        nothing to add to what the other parts say."""
        return None


def _parts(objective: nn.Module) -> list[Cited]:
    """Every cited part of ``objective`` in the objective's own order (itself first)."""
    return [m for m in objective.modules() if isinstance(m, Cited)]


def objective_papers(objective: nn.Module) -> list[Paper]:
    """The papers a built objective implements, each once, in the order of its parts (SimCSE,
    the paper of :class:`~cselab.objectives.infonce.InfoNCE`, first)."""
    found: dict[str, Paper] = {}
    for part in _parts(objective):
        for paper in part.papers:
            found.setdefault(paper.key, paper)
    return list(found.values())


def objective_tags(objective: nn.Module) -> list[str]:
    """Hub tags of a built objective: each part's, then each paper's whose whole method it has."""
    tags = list(dict.fromkeys(t for part in _parts(objective) for t in part.tags))
    for paper in objective_papers(objective):
        if paper.tag and paper.tag not in tags and set(paper.method) <= set(tags):
            tags.append(paper.tag)
    return tags


def describe_objective(objective: nn.Module, kind: DataKind = SENTENCES) -> list[str]:
    """A built objective in words, one markdown bullet per part that has something to say."""
    lines = (part.describe(kind) for part in _parts(objective))
    return [f"- {line}" for line in lines if line]
