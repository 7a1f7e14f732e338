"""The project's error types: what a user got wrong, each message one line naming the file,
line, key or value.

The command line prints any :class:`UserError` as one line and exits with status 2; every other
exception is a bug and keeps its traceback. Each type also derives from the built-in error a
caller would expect (``ValueError`` for bad values, ``FileNotFoundError`` for missing files), so
``except ValueError`` keeps working in library code.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable
from pathlib import Path


class UserError(Exception):
    """Base of every error caused by input, settings or the environment, not by a bug."""


class ConfigError(UserError, ValueError):
    """A configuration value is unknown, of the wrong type or out of range."""


class CorpusError(UserError, ValueError):
    """The training corpus is missing, unreadable or too small."""


class DataFormatError(UserError, ValueError):
    """A data file does not have the layout it should; the message names file and line."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        line: int | None,
        message: str,
        column: int | None = None,
    ) -> None:
        self.path = Path(path)
        self.line, self.column = line, column
        where = str(self.path)
        if line is not None:  # ``file:line[:column]``, the form editors jump to
            where += f":{line}" if column is None else f":{line}:{column}"
        super().__init__(f"{where}: {message}")


class MissingDataError(UserError, FileNotFoundError):
    """Evaluation files are absent from the data folder (the message lists them)."""


class ModelFormatError(UserError, ValueError):
    """A model folder cannot be used the way it was asked for (pooler, pooling mode, weights)."""


class ResolveError(UserError, RuntimeError):
    """A model or corpus could not be found locally nor downloaded."""


class TrainingDiverged(UserError, RuntimeError):
    """A loss term became NaN or infinite."""


class CheckpointWriteError(UserError, RuntimeError):
    """A checkpoint or model folder could not be written (disk full, permission denied...);
    the previous complete copy is kept."""


class WriteError(UserError, OSError):
    """A file for the user could not be written (disk full, permission denied...); the previous
    file, if any, is kept. The message names the path and the cause."""


class PublishError(UserError, RuntimeError):
    """A push could not be done (not a model folder, no token, Hub unreachable, refused)."""


class SearchIndexError(UserError, ValueError):
    """An index folder, its corpus or a search request is missing, malformed or inconsistent."""


class PlotError(UserError, ValueError):
    """A run folder or output path cannot be plotted (one line naming it)."""


class ReportError(UserError, ValueError):
    """Nothing to report, or an unknown baseline (one line naming it)."""


class SweepError(UserError, RuntimeError):
    """One or more cells failed (their logs are named)."""


class RunFolderBusy(UserError, RuntimeError):
    """Another process holds the run folder's lock."""


class SettingError(UserError, ValueError):
    """A setting is refused or needed: one the caller passes by keyword (a library argument or a
    settings field such as ``IndexSettings.nlist``), which a command line shows as its own option.

    The message is rendered from the parts, never parsed back: ``template`` is the project's
    own text with ``{setting}`` where the setting is named, and ``{name}`` for each of
    ``fields`` (paths and values the user gave, inserted as they are). ``str(err)`` names the
    setting as a Python keyword (``nlist=50``, ``overwrite=True``, ``pooler=NAME``);
    :meth:`render` takes another spelling of it (the CLI's ``--nlist 50``).

    Attributes:
        setting: the keyword (``nlist``), as a library caller passes it.
        value: the value refused, or the ones suggested (``values``: a tuple of alternatives).
        placeholder: ``value`` is a name for any value (``NAME``), written bare.
        key: the config key holding the setting in a run's config (``model.pooler``), if any.
        command: a setting of another command than the one that failed (``index build``: the
            index's build, named by a search), with ``call``, the library call that takes it
            (``Index.build(..., IndexSettings({}))``, ``{}`` where the keyword goes).
    """

    def __init__(
        self,
        setting: str,
        value: object,
        template: str,
        *,
        values: tuple[object, ...] = (),
        placeholder: bool = False,
        key: str | None = None,
        command: str | None = None,
        call: str | None = None,
        **fields: object,
    ) -> None:
        self.setting = setting
        self.value = value
        self.values = values or (value,)
        self.placeholder = placeholder
        self.key = key
        self.command = command
        self.call = call
        self.template = template
        self.fields = fields
        super().__init__(self.render(self.keyword))

    def keyword(self, value: object) -> str:
        """``setting=value`` as a Python caller writes it (``call`` around it, if any)."""
        text = f"{self.setting}={value if self.placeholder else repr(value)}"
        return self.call.replace("{}", text) if self.call else text

    def render(self, spell: Callable[[object], str]) -> str:
        """The message with each suggested value of the setting spelled by ``spell``."""
        named = " or ".join(spell(v) for v in self.values)
        return self.template.format(setting=named, **self.fields)


class IndexSettingError(SettingError, SearchIndexError):
    """An index, search or mining setting is refused or needed (:class:`SettingError`)."""


class ConfigSettingError(SettingError, ConfigError):
    """A setting is out of range or unknown (:class:`SettingError`)."""


class ModelSettingError(SettingError, ModelFormatError):
    """A model folder needs another setting to be used, e.g. ``pooler`` (:class:`SettingError`)."""


class MissingDataSettingError(SettingError, MissingDataError):
    """Evaluation files are absent; the message names the setting that points at another
    folder (``data_dir``; :class:`SettingError`)."""


def check_count(
    setting: str, value: object, error: type[SettingError] = ConfigSettingError, **kwargs: object
) -> int:
    """``value`` as an ``int`` where it is a whole number of at least 1 (a batch size, ``k``, a
    chunk size; a bool, a float or a text is none), else ``error`` naming ``setting`` (``kwargs``
    go to it: ``key``, ``command``...)."""
    try:
        count = None if isinstance(value, bool) else operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        count = None
    if count is None:
        raise error(setting, value, "{setting} is refused: it must be a whole number", **kwargs)
    if count < 1:
        raise error(setting, value, "{setting} is refused: it must be at least 1", **kwargs)
    return count


def first_line(err: BaseException, limit: int = 200) -> str:
    """What a library's error ``err`` says first, for a one-line message: its first line
    (its type's name when it says nothing), cut at a word before ``limit`` characters."""
    text = (str(err).strip().splitlines() or [type(err).__name__])[0]
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0].rstrip(",;:") + " …"
