"""A publication cselab implements: the facts the model card and ``cselab.st`` cite.

Each paper is a constant of the module that implements it: an objective part's module
(``SIMCSE`` in :mod:`cselab.objectives.infonce`, ...; :mod:`cselab.objectives.papers` asks a
built objective for them) or a model part's (``PROMPTBERT`` in :mod:`cselab.model.prompt`).
It lives here, below both layers, so that either can name its papers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Paper:
    """A publication an objective part or a model part implements.

    Attributes:
        key: its BibTeX key (``gao2021simcse``).
        name: its short name (``SimCSE``).
        summary: one line saying what it contributes.
        bibtex: the BibTeX entry, written from the paper's title page.
        tag: a Hub tag for the paper's whole method, given to an objective that has every part
            tag of ``method`` (``None``: its parts' tags say it all).
        method: the part tags that together are the paper's method.
    """

    key: str
    name: str
    summary: str
    bibtex: str
    tag: str | None = None
    method: tuple[str, ...] = ()
