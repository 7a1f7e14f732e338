"""The sentence corpus: one sentence per line of a UTF-8 file, read in one streaming pass.

Blank lines are skipped and counted; invalid UTF-8 is an error naming the file and line unless
``errors="replace"``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import CorpusError

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

    Each raw line is fed to ``hasher`` (the content digest is computed in the same pass) and its
    byte count to ``progress`` (a tqdm bar), so the file is read exactly once. After iterating,
    :meth:`stats` gives the counts (and raises :class:`CorpusError` if there was no sentence).
    """

    def __init__(
        self, path: str | Path, errors: str = "strict", hasher: Any = None, progress: Any = None
    ) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise CorpusError(f"{self.path}: training file not found")
        self.errors = errors
        self.hasher = hasher
        self.progress = progress
        self.lines = self.sentences = self.blank = self.replaced = 0

    def __iter__(self) -> Iterator[str]:
        p, pending = self.path, 0
        with p.open("rb") as fh:
            for lineno, raw in enumerate(fh, start=1):
                self.lines = lineno
                if self.hasher is not None:
                    self.hasher.update(raw)
                if self.progress is not None:
                    pending += len(raw)
                    if lineno % 4096 == 0:  # tqdm.update per line would cost more than decoding
                        self.progress.update(pending)
                        pending = 0
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    if self.errors != "replace":
                        raise CorpusError(
                            f"{p}:{lineno}: invalid UTF-8 at byte {err.start} of the line "
                            f"({raw[max(0, err.start - 10) : err.start + 10]!r}); "
                            f"use --data.encoding_errors=replace to substitute bad bytes"
                        ) from None
                    text = raw.decode("utf-8", errors="replace")
                    self.replaced += 1
                text = text.rstrip("\r\n")
                if lineno == 1:
                    text = text.removeprefix("\ufeff")
                if not text.strip():
                    self.blank += 1
                    continue
                self.sentences += 1
                yield text
        if self.progress is not None and pending:
            self.progress.update(pending)

    def stats(self) -> CorpusStats:
        if not self.sentences:
            raise CorpusError(
                f"{self.path}: no sentences (the file has {self.lines} lines, all blank)"
            )
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
