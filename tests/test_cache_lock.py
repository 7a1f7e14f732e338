"""The cache's file locks: one per download and per token-cache entry, a logged wait, and no
lock (one warning) where none can be had (a read-only cache, a filesystem without flock)."""

from __future__ import annotations

import errno
import logging
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from cselab.data import TokenizedCorpus, tokenize_corpus
from cselab.data import cache as data_cache
from cselab.data.cache import cache_lock


def _tokenizer(tiny_bert: Path):  # noqa: ANN202
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_bert)


def _old_file(path: Path, text: str) -> Path:
    """``text`` in ``path``, last modified an hour ago (its stat record is then trusted)."""
    path.write_text(text)
    hour_ago = path.stat().st_mtime_ns - 3600 * 10**9
    os.utime(path, ns=(hour_ago, hour_ago))
    return path


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def _refuse_open(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    """``os.open`` of a lock file fails with ``code``; other files open as usual."""
    real_open = os.open

    def refusing(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if str(path).endswith(".lock"):
            raise OSError(code, os.strerror(code), str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(data_cache.os, "open", refusing)


def _refuse_flock(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    def refusing(fd: int, op: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(data_cache.fcntl, "flock", refusing)


@pytest.mark.parametrize(
    ("refuse", "code"),
    [
        (_refuse_open, errno.EROFS),  # a read-only mount
        (_refuse_open, errno.EACCES),  # a folder without write permission
        (_refuse_flock, errno.ENOLCK),  # Lustre mounted noflock
        (_refuse_flock, errno.EOPNOTSUPP),
    ],
)
def test_where_no_lock_can_be_had_the_block_runs_unlocked_with_one_warning(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    refuse,  # noqa: ANN001
    code: int,
) -> None:
    refuse(monkeypatch, code)
    ran = []
    with caplog.at_level(logging.WARNING, logger="cselab.data.cache"):
        for name in ("download-wiki1m", "c.txt-file-abc", "c.txt-file-abc"):
            with cache_lock(tmp_path, name, "tokenising"):
                ran.append(name)
    assert len(ran) == 3
    (warning,) = _warnings(caplog)  # one per folder, not one per lock
    assert os.strerror(code) in warning and str(tmp_path) in warning
    assert "\n" not in warning


def test_a_read_only_cache_that_holds_the_entry_is_used(
    tmp_path: Path,
    tiny_bert: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A cache filled earlier and mounted read-only is read as before the locks came: its
    entry is found (no write, no tokenising), and a lock asked for there is done without."""
    tok = _tokenizer(tiny_bert)
    f = _old_file(tmp_path / "c.txt", "one two\nthree four five\n")
    cache = tmp_path / "cache"
    first, _ = tokenize_corpus(f, tok, 16, cache_dir=cache / "tokens", progress=False)
    monkeypatch.setattr(TokenizedCorpus, "build", None)  # tokenising would fail
    folders = [cache, cache / "tokens"]
    for folder in folders:
        folder.chmod(0o555)
    try:
        if os.access(cache, os.W_OK):  # root ignores the mode: refuse as a read-only mount
            _refuse_open(monkeypatch, errno.EROFS)
        with caplog.at_level(logging.WARNING, logger="cselab.data.cache"):
            again, _ = tokenize_corpus(f, tok, 16, cache_dir=cache / "tokens", progress=False)
            with cache_lock(cache, "download-wiki1m", "downloading"):
                pass
    finally:
        for folder in folders:
            folder.chmod(0o755)
    assert np.array_equal(again.ids, first.ids)
    (warning,) = _warnings(caplog)
    assert "going on without it" in warning


class _Gate:
    """``TokenizedCorpus.build`` held, for the files named in ``held``, until ``open`` is
    set; it records which files it built."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, held: set[str]) -> None:
        self.held, self.built, self.open = held, [], threading.Event()
        self.started = threading.Event()
        real = TokenizedCorpus.build.__func__

        def build(cls, stream, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            name = Path(stream.path).name
            self.built.append(name)
            if name in self.held:
                self.started.set()
                assert self.open.wait(30), "the gate was never opened"
            return real(cls, stream, *args, **kwargs)

        monkeypatch.setattr(TokenizedCorpus, "build", classmethod(build))


def test_different_corpora_do_not_wait_on_each_other_while_the_same_corpus_does(
    tmp_path: Path,
    tiny_bert: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Three tokenisations into one cache folder (as ranks or sweep cells sharing
    ``~/.cache/cselab`` do): while ``a.txt`` is being tokenised, ``b.txt`` is tokenised at
    once, and a second ``a.txt`` waits, says so in one line, then reads the entry built."""
    a = _old_file(tmp_path / "a.txt", "one two\nthree four five\n")
    b = _old_file(tmp_path / "b.txt", "six seven\neight\n")
    cache = tmp_path / "cache"
    gate = _Gate(monkeypatch, {"a.txt"})
    done: dict[str, threading.Event] = {}
    results: dict[str, np.ndarray] = {}
    errors: list[BaseException] = []

    def tokenise(key: str, path: Path) -> None:
        try:
            # a tokenizer each: one fast tokenizer is not safe to share between threads
            corpus, _ = tokenize_corpus(
                path, _tokenizer(tiny_bert), 16, cache_dir=cache, progress=False
            )
            results[key] = np.asarray(corpus.ids)
        except BaseException as err:  # noqa: BLE001 (reported by the main thread)
            errors.append(err)
        finally:
            done[key].set()

    def start(key: str, path: Path) -> threading.Thread:
        done[key] = threading.Event()
        thread = threading.Thread(target=tokenise, args=(key, path), daemon=True)
        thread.start()
        return thread

    with caplog.at_level(logging.INFO, logger="cselab.data.cache"):
        threads = [start("a", a)]
        assert gate.started.wait(30)  # a.txt is being tokenised, and stays so
        threads.append(start("b", b))
        assert done["b"].wait(30), "b.txt waited for a.txt"
        threads.append(start("a again", a))
        for _ in range(300):  # the wait is logged before it blocks
            if any("waiting for" in r.getMessage() for r in caplog.records):
                break
            done["a again"].wait(0.1)
        assert not done["a again"].is_set(), "a.txt was tokenised twice at once"
        gate.open.set()
        for thread in threads:
            thread.join(30)
    assert not errors, errors
    assert sorted(gate.built) == ["a.txt", "b.txt"]  # the second a.txt read the first's entry
    assert np.array_equal(results["a"], results["a again"])
    (line,) = [r.getMessage() for r in caplog.records if "waiting for" in r.getMessage()]
    assert line.endswith("(another process is tokenising it)") and "a.txt" in line
    assert [p.name for p in cache.iterdir() if not p.is_dir()] == [
        p.name for p in cache.glob("file-*.json")
    ]  # no lock file is left behind


_COUNTER = """
import sys
from pathlib import Path
from cselab.data.cache import cache_lock

folder, rounds = Path(sys.argv[1]), int(sys.argv[2])
counter = folder / "counter"
for _ in range(rounds):
    with cache_lock(folder, "x", "counting"):
        # read, then write back one more, non-atomically: only mutual exclusion keeps the count
        value = int(counter.read_text())
        counter.write_text(str(value + 1))
"""


def test_processes_holding_one_lock_never_overlap(tmp_path: Path) -> None:
    """Four processes each take the same lock 150 times around a read-increment-write of a
    file: the count is exact, and no lock file is left. Each holder removes its lock file when
    done, so exclusion rests on a taker checking that the file it locked is still the one at
    the path (an older name's lock guards nothing); without that check counts are lost."""
    import subprocess
    import sys

    (tmp_path / "counter").write_text("0")
    procs = [
        subprocess.Popen([sys.executable, "-c", _COUNTER, str(tmp_path), "150"]) for _ in range(4)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    assert (tmp_path / "counter").read_text() == "600"
    assert not list(tmp_path.glob(".cselab-*.lock"))


def test_a_corpus_already_downloaded_takes_no_lock(
    tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A named corpus (``wiki1m``) already in the cache is used without its download lock, so
    a shared read-only cache holding it neither waits nor warns; tokenising takes its own."""
    from cselab.app import train as app_train
    from cselab.config import load_config
    from cselab.model.hub import WIKI1M_FILE

    data = tmp_path / "cache" / "data"
    data.mkdir(parents=True)
    (data / WIKI1M_FILE).write_text("".join(f"sentence {i} of the corpus\n" for i in range(16)))
    taken: list[str] = []
    real = app_train.cache_lock

    def spy(folder, name, doing):  # noqa: ANN001, ANN202
        taken.append(name)
        return real(folder, name, doing)

    monkeypatch.setattr(app_train, "cache_lock", spy)
    argv = [
        f"--model.name_or_path={tiny_bert}", "--data.train_file=wiki1m",
        f"--data.cache_dir={tmp_path / 'cache'}", f"--train.output_dir={tmp_path / 'out'}",
        "--train.batch_size=8", "--train.max_steps=1", "--train.device=cpu", "--eval.dev=none",
    ]  # fmt: skip
    trainer = app_train.build_trainer(load_config(None, argv))
    assert Path(trainer.plan.train_file) == data / WIKI1M_FILE
    assert taken == []
