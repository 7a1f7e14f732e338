"""The evaluation layer's names that need no torch: the evaluation modes.

The command line builds its choice lists from here, so ``cselab --help`` never waits for torch;
:mod:`.api` re-exports them.
"""

from __future__ import annotations

#: ``evaluate(mode=...)``: SentEval's test protocol, the dev splits, or a quick test
MODES = ("test", "dev", "fasttest")
