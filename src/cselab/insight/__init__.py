"""Insight across runs: plots of training runs, sweeps over configs and seeds, and their
statistics.

:mod:`.plots` (``cselab plot``), :mod:`.sweep` (``cselab sweep``), :mod:`.report` (``cselab
report``), :mod:`.stats` (paired differences with confidence intervals and tests, from
``scipy.stats``); the three commands are :mod:`cselab.cli.insight`.
"""
