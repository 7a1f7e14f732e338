"""The project's error types: what a user got wrong, each message one line naming the file,
line, key or value.

The command line prints any :class:`UserError` as one line and exits with status 2; every other
exception is a bug and keeps its traceback. Each type also derives from the built-in error a
caller would expect (``ValueError`` for bad values, ``FileNotFoundError`` for missing files), so
``except ValueError`` keeps working in library code.
"""

from __future__ import annotations

import os
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
