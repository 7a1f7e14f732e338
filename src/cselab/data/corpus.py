"""The sentence corpus: one sentence per line of a UTF-8 file, read in one streaming pass.

The lines are read by :class:`cselab.io.readers.Lines` (its plain-line rule): blank lines are
skipped and counted; invalid UTF-8 is an error naming the file and line unless
``errors="replace"``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import CorpusError
from ..io.readers import Lines, reraise_as

#: What an invalid-UTF-8 error in the training corpus suggests.
ENCODING_HINT = "use --data.encoding_errors=replace to substitute bad bytes"

log = logging.getLogger(__name__)


@dataclass
class CorpusStats:
    path: str
    lines: int
    sentences: int
    blank_lines: int
    replaced_lines: int
    #: SHA-256 of the file's bytes (names the corpus in caches and checkpoints).
    content_sha256: str | None = None


class SentenceStream:
    """Iterate over the sentences of a text file, counting what was skipped.

    The file is read by :class:`cselab.io.readers.Lines` (the plain-line rule): each raw line is
    fed to ``hasher`` (the content digest is computed in the same pass) and its byte count to
    ``progress`` (a tqdm bar), so the file is read exactly once. After iterating, :meth:`stats`
    gives the counts (and raises :class:`CorpusError` if there was no sentence).
    """

    def __init__(
        self, path: str | Path, errors: str = "strict", hasher: Any = None, progress: Any = None
    ) -> None:
        self.path = Path(path)
        with reraise_as(CorpusError):
            self._lines = Lines(
                self.path,
                errors=errors,
                hasher=hasher,
                progress=progress,
                what="training file",
                hint=ENCODING_HINT,
            )

    @property
    def lines(self) -> int:
        return self._lines.lines

    @property
    def blank(self) -> int:
        return self._lines.blank

    @property
    def replaced(self) -> int:
        return self._lines.replaced

    @property
    def sentences(self) -> int:
        return self._lines.lines - self._lines.blank

    def __iter__(self) -> Iterator[str]:
        with reraise_as(CorpusError):
            for _, text in self._lines:
                yield text

    def stats(self) -> CorpusStats:
        if not self.sentences:
            n = self.lines
            found = f"has {n} line{'s' * (n != 1)}, all blank" if n else "is empty"
            raise CorpusError(f"{self.path}: no sentences (the file {found})")
        return CorpusStats(str(self.path), self.lines, self.sentences, self.blank, self.replaced)


def iter_sentences(path: str | Path, errors: str = "strict") -> Iterator[str]:
    """Stream the sentences of ``path`` (the rules of :func:`read_corpus`, without a list)."""
    return iter(SentenceStream(path, errors))


def read_corpus(path: str | Path, errors: str = "strict") -> tuple[list[str], CorpusStats]:
    """Read one sentence per line into memory.

    Args:
        path: UTF-8 text file.
        errors: ``strict`` raises :class:`CorpusError` naming file and line on invalid UTF-8;
            ``replace`` substitutes U+FFFD for bad bytes and counts the lines affected.

    Returns:
        The sentences (line endings removed, blank lines skipped) and counts.
    """
    stream = SentenceStream(path, errors)
    sentences = list(stream)
    return sentences, stream.stats()
