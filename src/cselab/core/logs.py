"""How cselab's log lines look (time, level, message), and a run's log on stderr for a Python
caller that set no logging up (``cselab.train`` then shows its step lines as the CLI does)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

#: the format of every log line cselab shows (``cselab`` commands and ``cselab.train``)
LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"
LOG_DATEFMT = "%H:%M:%S"


@contextlib.contextmanager
def stderr_log_unless_configured() -> Iterator[None]:
    """While the block runs, cselab's INFO lines (a run's steps, evaluations, saves) go to
    stderr, unless the caller configured logging: a handler on the root or ``cselab`` logger,
    or a level set on ``cselab``, is left to decide (silence it with
    ``logging.getLogger("cselab").setLevel(logging.WARNING)``). Nothing stays installed after."""
    logger = logging.getLogger("cselab")
    if logging.getLogger().handlers or logger.handlers or logger.level != logging.NOTSET:
        yield
        return
    handler = logging.StreamHandler()  # the stderr of now
    handler.setFormatter(logging.Formatter(LOG_FORMAT, LOG_DATEFMT))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
