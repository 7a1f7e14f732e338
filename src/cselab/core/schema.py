"""Typed configuration sections: dataclasses built from plain data with errors that name the key.

The one loader behind every config section (:mod:`cselab.config` and
:mod:`cselab.objectives.config`): unknown keys, wrong kinds (``true``/``false``, whole numbers,
choices of a ``Literal``) and misspellings are a :class:`ConfigError` naming the full key, e.g.
``objective.mixcse.partner: must be one of ['random', 'next'], got 'rand'``. A key a section
has dropped is listed in its class attribute :data:`REMOVED` and refused with the reason. It
imports nothing from cselab, so every layer can use it.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import types
import typing
from typing import Any, Literal

from .errors import ConfigError  # noqa: F401 - re-exported

#: The class attribute of a section that lists the keys it no longer has:
#: ``{key: (its last default, why it was removed)}``. A config saved by an earlier cselab records
#: every key, so the last default (which changes nothing) is dropped quietly; any other value is
#: refused with the reason.
REMOVED = "removed_keys"


def check(ok: bool, message: str, value: object = dataclasses.MISSING) -> None:
    """Raise :class:`ConfigError` with ``message`` (and the offending value) unless ``ok``."""
    if not ok:
        raise ConfigError(message if value is dataclasses.MISSING else f"{message}, got {value!r}")


def finite(x: object) -> bool:
    """Whether ``x`` is a real, finite number (not a bool, NaN or infinity)."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def check_kinds(section: Any, prefix: str) -> Any:
    """Re-run the loader's kind checks on a section built in Python (it skipped the loader);
    returns the section as the loader builds it (a path as text, a numpy number as Python's)."""
    return from_dict(type(section), dataclasses.asdict(section), prefix=prefix)


def _type_name(tp: Any) -> str:
    """What a value of type ``tp`` is, in words (``a whole number or null``, ``one of cls,
    avg or null``): what an error says was expected, never a Python type name."""
    args = typing.get_args(tp)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        choices = [c for a in args if typing.get_origin(a) is Literal for c in typing.get_args(a)]
        others = (a for a in args if a is not type(None) and typing.get_origin(a) is not Literal)
        words = list(dict.fromkeys(map(_type_name, others)))  # once each: list | tuple
        if choices:
            words.insert(0, "one of " + ", ".join(map(str, choices)))
        if type(None) in args:
            words.append("null")
        return " or ".join(words)
    if origin is Literal:
        return "one of " + ", ".join(map(str, args))
    if origin in (list, tuple):
        return "a list"
    if dataclasses.is_dataclass(tp):
        return "a section (mapping)"
    names = {bool: "true/false", int: "a whole number", float: "a number", str: "a string"}
    if tp in names:
        return names[tp]
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Return ``value`` as type ``tp`` or raise :class:`ConfigError` naming ``key``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise ConfigError(f"{key}: null is not allowed (expected {_type_name(tp)})")
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as err:
                errors.append(str(err))
        # one alternative that failed inside (an item of a list): that item is the error to name
        if len(errors) == 1 and errors[0].startswith(f"{key}["):
            raise ConfigError(errors[0])
        raise ConfigError(
            f"{key}: expected {_type_name(tp)}, got {value!r}{_quote_hint(tp, value)}"
        )
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{key}: must be one of {list(allowed)}, got {value!r}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (item_tp, *_) = typing.get_args(tp) or (Any,)
        return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a section (mapping), got {value!r}")
        return from_dict(tp, value, prefix=key)
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    # A config built in Python may hold what Python code has at hand: a numpy number, a Path.
    # They are taken as the loader's kinds, so the config saves as YAML and compares equal.
    if tp is int:
        number = isinstance(value, numbers.Real) and not isinstance(value, bool)
        # an integer of any kind (numpy's too); a float only when whole (64.0)
        if number and (isinstance(value, numbers.Integral) or float(value).is_integer()):
            return int(value)
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, os.PathLike) and isinstance(os.fspath(value), str):
            return os.fspath(value)
        raise ConfigError(f"{key}: expected a string, got {value!r}{_quote_hint(tp, value)}")
    return value


def _quote_hint(tp: Any, value: Any) -> str:
    """What to do about a number where text is expected: YAML reads ``12345e6`` (a short
    commit hash) or ``1e3`` as a number, which quoting keeps as written."""
    text_expected = tp is str or str in typing.get_args(tp)
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return (
        " (YAML read a number: quote the value to keep it as text)"
        if text_expected and number
        else ""
    )


def _removed_default(cls: type, key: str, value: Any) -> bool:
    """Whether ``key`` is one ``cls`` has dropped (:data:`REMOVED`) and ``value`` its last
    default, which changes nothing."""
    removed: dict[str, tuple[Any, str]] = getattr(cls, REMOVED, {})
    if key not in removed:
        return False
    default = removed[key][0]
    return type(value) is type(default) and value == default


def without_removed(cls: type, options: dict[str, Any], where: str) -> dict[str, Any]:
    """Keyword ``options`` named as ``cls``'s keys (``cselab.load(..., unpad_cuda=False)``)
    without the removed ones at their last default, which change nothing; another value of a
    removed one is a :class:`ConfigError` naming ``where`` and the reason it went."""
    removed: dict[str, tuple[Any, str]] = getattr(cls, REMOVED, {})
    for key, value in options.items():
        if key in removed and not _removed_default(cls, key, value):
            raise ConfigError(f"{where}: {key}={value!r}: {key} was removed: {removed[key][1]}")
    return {k: v for k, v in options.items() if k not in removed}


def drop_removed(cls: type, data: Any) -> Any:
    """A saved config ``data`` of dataclass ``cls`` (nested sections followed) without the
    removed keys at their last default: what a config saved by an earlier cselab compares as
    (a resume's check, a sweep's settings). Any other value is left for :func:`from_dict` to
    refuse."""
    if not isinstance(data, dict) or not dataclasses.is_dataclass(cls):
        return data
    hints = typing.get_type_hints(cls)
    return {
        key: drop_removed(hints[key], value) if key in hints else value
        for key, value in data.items()
        if not _removed_default(cls, key, value)
    }


def from_dict(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``; unknown keys and wrong types name the key."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    removed: dict[str, tuple[Any, str]] = getattr(cls, REMOVED, {})
    kwargs = {}
    for key, value in data.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        if key in removed and key not in names:
            if _removed_default(cls, key, value):
                continue
            raise ConfigError(f"{full} was removed: {removed[key][1]}")
        if key not in names:
            raise ConfigError(f"unknown config key {full!r} (valid: {', '.join(sorted(names))})")
        kwargs[key] = _coerce(value, hints[key], full)
    return cls(**kwargs)
