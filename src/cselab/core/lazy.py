"""A package's face without the import weight: names re-exported from their home modules,
imported on first use (PEP 562's module ``__getattr__``).

A package ``__init__`` lists ``name -> home submodule`` once; ``import cselab.config`` then
reads the config dataclasses of ``cselab.data`` and ``cselab.objectives`` without loading torch
through those packages' other modules.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, namespace: dict[str, Any], homes: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``homes`` maps each public name to the
    relative module it lives in (``".store"``), or ``"module:name"`` where the home spells it
    otherwise; a name is imported on first access and then kept in ``namespace`` (the
    package's globals), so later accesses are plain lookups."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attribute = home.partition(":")
        value = getattr(importlib.import_module(module, package), attribute or name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(homes))

    return __getattr__, __dir__
