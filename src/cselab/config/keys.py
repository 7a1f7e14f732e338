"""Every run-config key with its type, default and meaning, read from the config dataclasses.

The meaning of a key is its entry in the ``Attributes:`` section of its class's docstring (the
one place it is written), its type the field's annotation and its default the field's default;
``cselab config`` prints them, so the listing cannot drift from the code. A field without an
entry is an error here (and in ``tests/test_config_command.py``): a new key must be documented.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

#: A docstring entry: ``name: text`` or several names sharing one text (``a / b:``, ``a, b:``).
_ENTRY = re.compile(r"^(?P<names>[A-Za-z_][\w ,/]*?):\s*(?P<text>.*)$")
#: Sphinx markup shown as plain text: ``code``, :role:`~a.b.name`, :role:`target`.
_ROLE = re.compile(r":\w+:`~?(?P<target>[^`]+)`")


@dataclass(frozen=True)
class Key:
    """One config key: ``train.lr``, its type, default (or a preset's value) and meaning."""

    name: str
    type: str
    value: Any
    meaning: str
    section: bool = False  # a nested section (``objective.focal``); its keys follow it


def plain(text: str) -> str:
    """Docstring markup as plain text: ``\\`\\`x\\`\\``` -> ``x``, ``:mod:\\`~a.b\\``` -> ``b``."""
    text = _ROLE.sub(
        lambda m: m["target"].rsplit(".", 1)[-1] if m[0].count("~") else m["target"], text
    )
    return text.replace("``", "")


def field_docs(cls: type) -> dict[str, str]:
    """``{field: meaning}`` from the ``Attributes:`` section of ``cls``'s docstring (Google
    style: ``name: text``, continued on deeper-indented lines), as plain one-line text."""
    lines = inspect.cleandoc(cls.__doc__ or "").splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Attributes:")
    except StopIteration:
        return {}
    base = len(lines[start]) - len(lines[start].lstrip())
    docs: dict[str, str] = {}
    names: list[str] = []
    entry_indent = None
    for line in lines[start + 1 :]:
        indent = len(line) - len(line.lstrip())
        if line.strip() and indent <= base:
            break  # the next section
        if not line.strip():
            continue
        match = _ENTRY.match(line.strip())
        if match and (entry_indent is None or indent <= entry_indent):
            entry_indent = indent
            names = [n.strip() for n in re.split(r"[,/]", match["names"]) if n.strip()]
            for name in names:
                docs[name] = match["text"]
        else:  # a continuation line of the current entry
            for name in names:
                docs[name] = f"{docs[name]} {line.strip()}"
    return {name: plain(text).strip() for name, text in docs.items()}


def summary(cls: type) -> str:
    """The first line of ``cls``'s docstring, as plain text."""
    return plain(inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0].replace("\n", " "))


def type_label(tp: Any) -> str:
    """A field type as a user writes its value: ``int or null``, ``one of: a, b``, ``list of str``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        shown = [type_label(a) for a in args if a is not type(None)]
        return " or ".join(shown + (["null"] if type(None) in args else []))
    if origin is Literal:
        return "one of: " + ", ".join(str(a) for a in typing.get_args(tp))
    if origin in (list, tuple):
        (item,) = typing.get_args(tp)[:1] or (Any,)
        label = type_label(item)
        return f"list of ({label})" if " " in label else f"list of {label}"
    if tp is bool:
        return "true/false"
    return getattr(tp, "__name__", str(tp))


class UndocumentedKey(TypeError):
    """A config field has no entry in its class's ``Attributes:`` docstring (a programming
    error: every key a user can set must say what it does)."""


def keys(section: Any, prefix: str = "") -> list[Key]:
    """Every key of a config object (a :class:`~cselab.config.Config` or one of its sections),
    depth first, with the object's values: nested sections come as a :class:`Key` with
    ``section=True`` followed by their own keys.

    Raises:
        UndocumentedKey: a field has no docstring entry (for a nested section, its class's
            first docstring line is enough).
    """
    cls = type(section)
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    out: list[Key] = []
    missing: list[str] = []
    for f in dataclasses.fields(cls):
        name = f"{prefix}{f.name}"
        value = getattr(section, f.name)
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            meaning = summary(tp) or docs.get(f.name, "")
            out.append(Key(name, "section", None, meaning, section=True))
            out += keys(value, f"{name}.")
            if not meaning:
                missing.append(name)
            continue
        meaning = docs.get(f.name, "")
        if not meaning:
            missing.append(name)
        out.append(Key(name, type_label(tp), value, meaning))
    if missing:
        raise UndocumentedKey(
            f"{cls.__name__}: no docstring entry (Attributes:) for {', '.join(missing)}"
        )
    return out
