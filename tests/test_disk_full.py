"""A full disk under every file cselab writes for a user: one line naming the file and the cause
(exit 2), the previous file as it was, no partial or temporary file left.

Each writer is tested on a real full disk (a small tmpfs mounted for the test; skipped where
mounting is not permitted) and with the writes into a folder patched to write half of their
bytes, then fail with ``ENOSPC`` (``open``, ``os.write`` and ``os.posix_fallocate``).
"""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from conftest import write_corpus
from cselab.cli import main
from cselab.core.errors import WriteError
from cselab.io import files
from cselab.io.runfolder import RunFolder

SRC = Path(__file__).resolve().parents[1] / "src"
NO_SPACE = os.strerror(errno.ENOSPC)  # "No space left on device"


def enospc() -> OSError:
    return OSError(errno.ENOSPC, NO_SPACE)


class HalfThenFull:
    """A file whose first write puts half of its bytes on disk, then fails as a full disk does."""

    def __init__(self, real: io.IOBase) -> None:
        self._real = real

    def write(self, data: bytes | str) -> int:
        self._real.write(data[: len(data) // 2])
        self._real.flush()
        raise enospc()

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)

    def __enter__(self) -> HalfThenFull:
        return self

    def __exit__(self, *exc: object) -> None:
        self._real.close()


class FullDisk:
    """``folder`` lies on a disk that :meth:`fill` makes full.

    ``tmpfs``: the folder is a tmpfs of :meth:`mount`'s size; :meth:`fill` writes a filler file
    until the disk refuses. ``patched``: :meth:`fill` makes the writes into the folder (files
    whose name matches ``only``; by ``calls``) write half their bytes and raise ``ENOSPC``.
    """

    FILLER = "filler"

    def __init__(self, kind: str, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.kind, self.monkeypatch = kind, monkeypatch
        self.folder = root / "disk"
        self.folder.mkdir()
        self.mounted = False
        self.only: str | None = None

    def mount(self, size: str) -> None:
        if self.kind != "tmpfs":
            return
        command = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(self.folder)]
        proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
        self.mounted = True

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.folder)], check=True)

    def fill(
        self,
        only: str | None = None,
        calls: tuple[str, ...] = ("open", "write", "fallocate"),
        after: int = 0,
    ) -> None:
        if self.kind == "tmpfs":
            assert self.mounted
            fd = os.open(self.folder / self.FILLER, os.O_WRONLY | os.O_CREAT)
            try:
                with pytest.raises(OSError) as info:
                    while True:
                        os.write(fd, bytes(4096))
                assert info.value.errno == errno.ENOSPC
            finally:
                os.close(fd)
            return
        self.only = only
        real_open, real_write, real_fallocate = builtins.open, os.write, os.posix_fallocate

        def fake_open(file, mode="r", *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            fh = real_open(file, mode, *args, **kwargs)
            named = isinstance(file, str | bytes | os.PathLike)
            if named and set(mode) & set("wax+") and self._full(os.fsdecode(file)):
                return HalfThenFull(fh)
            return fh

        passed = [after]  # matching os.write calls still let through

        def fake_write(fd: int, data: bytes) -> int:
            if self._full(_fd_path(fd)) and passed[0] == 0:
                real_write(fd, bytes(data)[: len(data) // 2])
                raise enospc()
            if self._full(_fd_path(fd)):
                passed[0] -= 1
            return real_write(fd, data)

        def fake_fallocate(fd: int, offset: int, size: int) -> None:
            if self._full(_fd_path(fd)):
                raise enospc()
            real_fallocate(fd, offset, size)

        if "open" in calls:
            self.monkeypatch.setattr(builtins, "open", fake_open)
            self.monkeypatch.setattr(io, "open", fake_open)
        if "write" in calls:
            self.monkeypatch.setattr(os, "write", fake_write)
        if "fallocate" in calls:
            self.monkeypatch.setattr(os, "posix_fallocate", fake_fallocate)

    def _full(self, path: str | None) -> bool:
        if path is None:
            return False
        p = Path(os.path.abspath(path))
        return self.folder in p.parents and (
            self.only is None or bool(re.fullmatch(self.only, p.name))
        )

    def snapshot(self) -> dict[str, bytes]:
        """Every file under the folder (the filler left out) and its bytes."""
        return {
            str(p.relative_to(self.folder)): p.read_bytes()
            for p in sorted(self.folder.rglob("*"))
            if p.is_file() and p.name != self.FILLER
        }


def _fd_path(fd: int) -> str | None:
    try:
        return os.readlink(f"/proc/self/fd/{fd}").removesuffix(" (deleted)")
    except OSError:
        return None


@pytest.fixture(params=["tmpfs", "patched"])
def disk(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FullDisk]:
    full = FullDisk(request.param, tmp_path, monkeypatch)
    yield full
    monkeypatch.undo()  # before unmounting: nothing patched may run in teardown
    full.unmount()


def assert_one_line(err: str, command: str, what: str, path: Path, detail: str = "") -> None:
    """stderr holds one error line (progress bars aside), naming ``path`` and the cause."""
    assert "Traceback" not in err and "Exception ignored" not in err, err
    errors = [line for line in err.splitlines() if "error" in line]
    assert errors == [
        f"cselab {command}: error: could not write the {what} {path}: {NO_SPACE}{detail}"
    ]


# ------------------------------------------------------------------------- the io.files helpers
HELPERS = {
    "text": lambda p: files.write_text_atomic(p, "new " * 5000, "thing"),
    "bytes": lambda p: files.write_bytes_atomic(p, b"new " * 5000, "thing"),
    "json": lambda p: files.write_json_atomic(p, {"new": ["x" * 100] * 200}, what="thing"),
    "npy": lambda p: _save_npy(p, np.ones((100, 100), dtype=np.float32)),
    "append": lambda p: files.append_text(p, "new line\n" * 5000, "thing"),
}


def _save_npy(path: Path, array: np.ndarray) -> None:
    with files.atomic_path(path, "thing") as tmp:
        np.save(tmp, array)


@pytest.mark.parametrize("helper", list(HELPERS))
def test_a_failed_write_keeps_the_previous_file_and_names_it(disk: FullDisk, helper: str) -> None:
    disk.mount("64k")
    target = disk.folder / ("thing.npy" if helper == "npy" else "thing.out")
    target.write_bytes(b"old\n")
    disk.fill()
    with pytest.raises(WriteError) as info:
        HELPERS[helper](target)
    assert str(info.value) == f"could not write the thing {target}: {NO_SPACE}"
    assert disk.snapshot() == {target.name: b"old\n"}  # no partial file, no temporary one


def test_reserve_refuses_before_anything_is_written(disk: FullDisk) -> None:
    disk.mount("64k")
    target = disk.folder / "vectors.npy"
    disk.fill(calls=("fallocate",))
    with target.open("wb") as fh, pytest.raises(WriteError) as info:
        files.reserve(fh.fileno(), 1 << 20, target, "index vectors")
    assert str(info.value) == f"could not write the index vectors {target}: {NO_SPACE}"


# --------------------------------------------------------------------------------- commands
def test_encode_output(
    disk: FullDisk, tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    disk.mount("64k")
    out = disk.folder / "v.npy"
    np.save(out, np.zeros((2, 3), dtype=np.float32))
    before = disk.snapshot()
    lines = tmp_path / "lines.txt"
    lines.write_text("".join(f"sentence number {i}\n" for i in range(600)))
    disk.fill()
    argv = ["encode", str(tiny_bert), "--input", str(lines), "--output", str(out)]
    assert main(argv) == 2
    # the message says how much the vectors needed: 600 x 32 float32 and the .npy header
    free = ", 0 free" if disk.kind == "tmpfs" else ""
    assert_one_line(
        capsys.readouterr().err, "encode", "vectors", out, f" (76,928 bytes needed{free})"
    )
    assert disk.snapshot() == before


def test_encode_output_on_a_disk_that_fills_during_the_write(
    tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """numpy reports a short write of the vectors without an errno ("19200 requested and 14304
    written", in items): the message said that, not that the disk is full (issue 31)."""
    disk = FullDisk("tmpfs", tmp_path, monkeypatch)
    disk.mount("64k")
    try:
        # room for the header and part of the vectors: the write starts, then the disk is full
        (disk.folder / disk.FILLER).write_bytes(bytes(50_000))
        free = os.statvfs(disk.folder).f_bavail * os.statvfs(disk.folder).f_frsize
        assert 128 < free < 76_928
        lines = tmp_path / "lines.txt"
        lines.write_text("".join(f"sentence number {i}\n" for i in range(600)))
        out = disk.folder / "v.npy"
        argv = ["encode", str(tiny_bert), "--input", str(lines), "--output", str(out)]
        assert main(argv) == 2
        assert_one_line(
            capsys.readouterr().err, "encode", "vectors", out,
            f" (76,928 bytes needed, {free:,} free)",
        )  # fmt: skip
        assert disk.snapshot() == {}
    finally:
        disk.unmount()


def test_plot(disk: FullDisk, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("matplotlib")
    run = tmp_path / "run"
    run.mkdir()
    rows = "".join(f"{s},{1 / s},1e-5,{60 + s}\n" for s in range(1, 9))
    (run / RunFolder.METRICS).write_text("step,loss,lr,stsb_dev\n" + rows)
    disk.mount("64k")
    png = disk.folder / "curves.png"
    png.write_bytes(b"the previous figure")
    disk.fill()
    assert main(["plot", str(run), "-o", str(png)]) == 2
    assert_one_line(capsys.readouterr().err, "plot", "plot", png)
    assert disk.snapshot() == {"curves.png": b"the previous figure"}


def test_report(disk: FullDisk, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    root = tmp_path / "sweep"
    for config, seed, score in [("a", 1, 70.0), ("a", 2, 71.0), ("b", 1, 72.5), ("b", 2, 72.0)]:
        cell = RunFolder(root / config / f"seed{seed}")
        cell.path.mkdir(parents=True)
        cell.cell.write_text(json.dumps({"config": config, "seed": seed, "overrides": []}))
        cell.results.write_text(json.dumps({"best_stsb_dev": score}))
    disk.mount("64k")
    for ext in ("md", "csv", "png"):
        (disk.folder / f"report.{ext}").write_text(f"previous {ext}")
    before = disk.snapshot()
    disk.fill()
    assert main(["report", str(root), "--baseline", "a", "--out-dir", str(disk.folder)]) == 2
    assert_one_line(capsys.readouterr().err, "report", "report", disk.folder / "report.md")
    assert disk.snapshot() == before


PAIRS = "".join(
    f"{a}\t{b}\t{s}\n"
    for a, b, s in [
        ("a man plays a guitar", "a person plays music", 4.2),
        ("the cat sleeps", "a dog barks", 0.4),
        ("rain falls", "it is raining", 4.8),
        ("stocks fell", "markets dropped sharply", 3.9),
        ("a child reads", "the sun is hot", 0.0),
        ("she sings", "a woman is singing", 4.5),
    ]
)


@pytest.mark.parametrize("option", ["--output", "--csv", "--update-card"])
def test_evaluate_outputs(
    disk: FullDisk,
    tiny_bert: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    option: str,
) -> None:
    sts = tmp_path / "pairs.tsv"
    sts.write_text("sentence1\tsentence2\tscore\n" + PAIRS)
    disk.mount("16m")
    if option == "--update-card":  # a model folder on the full disk, with its card
        model = disk.folder / "model"
        model.mkdir()
        for f in tiny_bert.iterdir():
            (model / f.name).write_bytes(f.read_bytes())
        target, what = model / "README.md", "model card"
        target.write_text("---\nlicense: mit\n---\n# the previous card\n")
        argv = ["evaluate", str(model), "--sts-file", str(sts), "--update-card"]
    else:
        name, what = (
            ("res.json", "evaluation results")
            if option == "--output"
            else ("res.csv", "evaluation table")
        )
        target = disk.folder / name
        target.write_text("the previous results")
        argv = ["evaluate", str(tiny_bert), "--sts-file", str(sts), option, str(target)]
    before = disk.snapshot()
    disk.fill()
    assert main(argv) == 2
    assert_one_line(capsys.readouterr().err, "evaluate", what, target)
    assert disk.snapshot() == before


def test_sweep_record(
    disk: FullDisk, tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    import yaml

    disk.mount("64k")
    root = disk.folder / "runs"
    spec = tmp_path / "sweep.yaml"
    base = {"model": {"name_or_path": str(tiny_bert)}, "data": {"train_file": "x.txt"}}
    spec.write_text(
        yaml.safe_dump(
            {"base": base, "configs": {"a": []}, "output_root": str(root), "evaluate": None}
        )
    )
    disk.fill()
    assert main(["sweep", str(spec)]) == 2
    assert_one_line(capsys.readouterr().err, "sweep", "sweep record", root / "sweep.json")
    assert disk.snapshot() == {}


@pytest.mark.parametrize("case", ["vectors", "texts"])
def test_index_build(
    disk: FullDisk,
    tiny_bert: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    case: str,
) -> None:
    """Vectors: 800 lines need 100 KiB of vectors on a 64 KiB disk, refused before any vector is
    encoded (the memory map would otherwise meet the full disk as a SIGBUS). Texts: one long
    line fills the disk with the texts file."""
    corpus = tmp_path / "corpus.txt"
    if case == "vectors":
        corpus.write_text("".join(f"line {i}\n" for i in range(800)))
    else:
        corpus.write_text("word " * 20000 + "\n")
    disk.mount("64k")
    out = disk.folder / "my.index"
    argv = ["index", "build", str(corpus), "--model", str(tiny_bert), "-o", str(out)]
    file, what = (
        ("vectors.npy", "index vectors") if case == "vectors" else ("texts.bin", "index texts")
    )
    if disk.kind == "tmpfs":  # the disk fills by itself; a SIGBUS would end a test process
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])
        )
        proc = subprocess.run(
            [sys.executable, "-m", "cselab", *argv], capture_output=True, text=True, env=env
        )
        rc, err = proc.returncode, proc.stderr
    else:
        if case == "vectors":
            disk.fill(calls=("fallocate",))
        else:
            disk.fill(only=r"\.texts\..*")
        rc, err = main(argv), capsys.readouterr().err
    assert rc == 2, err[-3000:]
    assert_one_line(err, "index", what, out / file)
    left = set(disk.snapshot())
    assert "my.index/index.json" not in left  # no index that a search or a resume would trust
    assert not [name for name in left if ".tmp" in name]


# ------------------------------------------------------------------------------ cselab train
def train_argv(tiny_bert: Path, data: Path, out: Path, cache: Path, *extra: str) -> list[str]:
    return [
        "-q",
        "train",
        f"--model.name_or_path={tiny_bert}",
        "--model.max_seq_len=16",
        f"--data.train_file={write_corpus(data, 48)}",
        f"--data.cache_dir={cache}",
        f"--train.output_dir={out}",
        "--train.batch_size=8",
        "--train.eval_steps=0",
        "--train.log_steps=1",
        "--train.report_to=[]",
        "--train.device=cpu",
        *extra,
    ]


#: the file a resumed run fails on: (the names it fails on in the patched variant, what the
#: message calls it, the run-folder file)
RESUMED_CASES = {
    "plan": (r"\.plan\..*", "run plan", RunFolder.PLAN),
    "config": (r"\.config\..*", "config", RunFolder.CONFIG),
    "results": (r"\.results\..*", "run results", RunFolder.RESULTS),
}


@pytest.mark.parametrize("case", list(RESUMED_CASES))
def test_train_rewrites_of_a_resumed_run(
    disk: FullDisk,
    tiny_bert: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    one_thread: None,
    case: str,
) -> None:
    """A run stopped after its last checkpoint, before its ``results.json`` (a finished run's
    resume writes nothing), resumed on a full disk (with a changed log cadence) stops at the
    file of its end it cannot write; the first run's file is kept, and no results are left
    half-written."""
    only, what, name = RESUMED_CASES[case]
    if disk.kind == "tmpfs" and case != "plan":
        pytest.skip("a real full disk stops at the first file a run writes: the plan")
    disk.mount("48m")
    out = disk.folder / "out"
    argv = train_argv(tiny_bert, tmp_path / "data", out, tmp_path / "cache", "--train.max_steps=3")
    assert main(argv) == 0
    (out / RunFolder.RESULTS).unlink()  # stopped before it: the resume writes the run's end
    before = disk.snapshot()
    capsys.readouterr()
    disk.fill(only=only)
    assert main([*argv, "--train.resume=true", "--train.log_steps=2"]) == 2
    assert_one_line(capsys.readouterr().err, "train", what, out / name)
    after = disk.snapshot()
    assert after.get(f"out/{name}") == before.get(f"out/{name}")
    assert not [n for n in after if ".tmp" in n]


def test_train_model_card_in_a_model_folder(
    tiny_bert: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    one_thread: None,
) -> None:
    """The card of a model folder being saved cannot be written: the folder is not published,
    and the message is the model folder's, with the card's cause."""
    disk = FullDisk("patched", tmp_path, monkeypatch)
    out = RunFolder(disk.folder / "out")
    argv = train_argv(
        tiny_bert, tmp_path / "data", out.path, tmp_path / "cache", "--train.max_steps=3"
    )
    assert main(argv) == 0
    out.results.unlink()  # stopped before it: the resume saves last/ again
    before = disk.snapshot()
    capsys.readouterr()
    disk.fill(only=r"\.README\..*")
    assert main([*argv, "--train.resume=true", "--train.log_steps=2"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert errors == [
        f"cselab train: error: could not write model folder {out.last}: {NO_SPACE} (ENOSPC); "
        "the previous one is kept"
    ]
    after = disk.snapshot()
    assert {k: v for k, v in after.items() if k.startswith("out/last/")} == {
        k: v for k, v in before.items() if k.startswith("out/last/")
    }
    assert not [n for n in after if ".tmp" in n]


def test_train_metrics_row_is_appended_whole_or_not_at_all(
    tiny_bert: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    one_thread: None,
) -> None:
    """The second row's append meets a full disk after writing half of its bytes: one line, and
    metrics.csv holds the header and the first row, whole (patched: no real disk can be made
    full between two rows)."""
    disk = FullDisk("patched", tmp_path, monkeypatch)
    out = disk.folder / "out"
    argv = train_argv(tiny_bert, tmp_path / "data", out, tmp_path / "cache", "--train.max_steps=3")
    disk.fill(only=re.escape(RunFolder.METRICS), calls=("write",), after=1)
    assert main(argv) == 2
    assert_one_line(capsys.readouterr().err, "train", "metrics log", out / RunFolder.METRICS)
    lines = (out / RunFolder.METRICS).read_bytes().split(b"\r\n")
    assert lines[0].startswith(b"step,") and lines[1].startswith(b"1,") and lines[2:] == [b""]
    assert len(lines[1].split(b",")) == len(lines[0].split(b","))


def test_token_cache(
    disk: FullDisk, tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture, one_thread: None
) -> None:
    disk.mount("64k")
    cache = disk.folder / "cache"
    argv = train_argv(tiny_bert, tmp_path / "data", tmp_path / "out", cache, "--train.max_steps=1")
    disk.fill(only=r".*\.npy")  # the store's id and offset arrays
    assert main(argv) == 2
    assert_one_line(capsys.readouterr().err, "train", "token cache", cache / "tokens")
    assert list((cache / "tokens").iterdir()) == []  # no entry, complete or partial
