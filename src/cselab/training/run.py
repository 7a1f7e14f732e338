"""From a config to a trained model: :func:`build_trainer` assembles, :func:`train` runs.

The composition root of training: it validates the config, builds the objective, starts the
distributed group, takes the output folder's lock and checks the folder (:mod:`.rundir`) before
any heavy work, loads the model and the tokenised corpus, seeds the streams (:mod:`.rng`) and
hands everything to the :class:`~cselab.training.trainer.Trainer`.

:func:`train` holds the lock (:meth:`RunFolder.lock <cselab.io.runfolder.RunFolder.lock>`,
main process only) from before the folder check to the end of the run, however it ends: a
second run into the same folder stops at once with
:class:`~cselab.core.errors.RunFolderBusy`. ``cselab train`` and every sweep cell (in-process
or ``cselab train`` subprocesses) come through here.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..config import Config, load_config
from ..data import tokenize_corpus
from ..data.pairs import TokenizedPairs, load_pairs, source_digest
from ..io.files import file_digest
from ..io.runfolder import RunFolder
from ..model.encoder import SentenceEncoder
from ..model.hub import cache_root, resolve_train_file
from ..objectives import build_objective
from . import rundir
from .callbacks import Callback
from .distributed import init_distributed, main_process_first, shutdown_distributed
from .rng import dropout_seed, seed_everything
from .selection import make_dev_evaluator
from .trainer import Trainer

log = logging.getLogger("cselab")


def build_trainer(
    config: Config,
    callbacks: Sequence[Callback] = (),
    hold: contextlib.ExitStack | None = None,
) -> Trainer:
    """Everything :func:`train` sets up, without running the loop.

    ``hold``: where the main process keeps the output folder's lock, taken before the folder is
    checked; :func:`train` passes a stack that lives as long as the run. Without it no lock is
    taken (the caller owns the folder).
    """
    objective = build_objective(config.objective)
    dist_info = init_distributed(
        "cuda" if torch.cuda.is_available() and config.train.device != "cpu" else "cpu"
    )
    seed_everything(config.train.seed)
    cache = Path(config.data.cache_dir) if config.data.cache_dir else cache_root()
    # Rank 0 downloads and writes the token cache first; the other ranks then read it.
    with main_process_first(dist_info):
        train_file = Path(resolve_train_file(config.data.train_file, str(cache / "data")))
        if dist_info.is_main:  # before any heavy work: never replace or mis-resume a run
            tc = config.train
            if hold is not None:  # first: no other process can start a run after the check
                hold.enter_context(RunFolder(tc.output_dir).lock())
            digest = source_digest if config.data.pairs else file_digest
            rundir.prepare_output_dir(
                Path(tc.output_dir), config.to_dict(), lambda: digest(train_file),
                tc.resume, tc.overwrite,
            )  # fmt: skip
        evaluator = make_dev_evaluator(config)  # a bad dev file fails before tokenising
        if config.data.pairs:  # read before the model loads: a bad row fails fast
            records = load_pairs(train_file, config.data.format, config.data.columns)
        encoder = SentenceEncoder.from_config(config.model)
        if config.data.pairs:  # tokenised in memory (cselab.pairs)
            corpus = TokenizedPairs.build(records, encoder.tokenizer, config.model.max_seq_len)
            objective = build_objective(
                config.objective, pairs=True, hard_negatives=corpus.num_negatives > 0
            )
            data_digest = source_digest(train_file)
        else:
            corpus, stats = tokenize_corpus(
                train_file,
                encoder.tokenizer,
                config.model.max_seq_len,
                errors=config.data.encoding_errors,
                cache_dir=cache / "tokens",
            )
            data_digest = stats.content_sha256
    if dist_info.is_main and config.data.pairs:
        log.info("pairs %s: %d rows, %d hard negatives each", train_file, len(corpus),
                 corpus.num_negatives)  # fmt: skip
    elif dist_info.is_main:
        log.info(
            "corpus %s: %d sentences (%d blank lines skipped, %d lines with replaced bytes)",
            stats.path, stats.sentences, stats.blank_lines, stats.replaced_lines,
        )  # fmt: skip
    # Re-seed after model construction so that dropout does not depend on how many random numbers
    # building the model consumed (the data order and generated negatives have their own
    # generators). Each rank gets its own dropout stream.
    seed_everything(dropout_seed(config.train.seed, dist_info.rank))
    return Trainer(
        config,
        encoder,
        objective,
        corpus,
        evaluator,
        dist_info,
        data_digest=data_digest,
        callbacks=callbacks,
    )


def train(config: Config | str | Path, callbacks: Sequence[Callback] = ()) -> dict[str, Any]:
    """Train as described by ``config`` (a :class:`Config` or a YAML path); returns results.
    ``callbacks`` are called on every step, evaluation, checkpoint and at the end."""
    config = load_config(config) if not isinstance(config, Config) else config.validate()
    try:
        with contextlib.ExitStack() as hold:  # the run folder's lock, released on any exit
            return build_trainer(config, callbacks, hold).train()
    finally:
        shutdown_distributed()  # only if init_distributed created the process group
