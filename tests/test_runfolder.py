"""The run folder has one owner: its file names are spelled only in ``cselab/io/runfolder.py``
(checked on the AST of every module), and its lock gives it one run at a time, tested with real
``cselab train`` processes (two started together; one SIGKILLed) and with sweep cells."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import write_corpus
from cselab.cli import main
from cselab.core.errors import RunFolderBusy
from cselab.io.runfolder import RunFolder
from cselab.training.checkpoint import read_metadata

SRC = Path(__file__).resolve().parents[1] / "src"
HOME = SRC / "cselab/io/runfolder.py"

#: Every name RunFolder gives a file or folder of a run.
NAMES = {v for k, v in vars(RunFolder).items() if k.isupper() and isinstance(v, str)}
#: Plain words ("best", "checkpoint") also mean other things (a logger, a word in a message):
#: they count where a path is made or a folder chosen with them; names with a dot count anywhere.
WORDS = {n for n in NAMES if "." not in n}
PATH_CALLS = {"Path", "PurePath", "joinpath", "with_name", "join", "model", "save_model"}


def _joined(value: str) -> str | None:
    """The run-folder name ``value`` starts with after a slash (``"/best, last to "``)."""
    for name in NAMES:
        rest = value[len(name) + 1 :]
        if value.startswith("/" + name) and not (rest[:1].isalnum() or rest[:1] in ("_", "-")):
            return name
    return None


def spelled_names(source: str) -> list[tuple[int, str]]:
    """``(line, literal)`` of each place ``source`` spells a run-folder name itself."""
    tree = ast.parse(source)
    parent = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        value, up = node.value, parent.get(node)
        if isinstance(up, ast.Tuple | ast.List | ast.Set):
            up = parent.get(up)  # `name in ("best", "last")`
        if isinstance(up, ast.Call):
            func = up.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        in_path = (
            (isinstance(up, ast.BinOp) and isinstance(up.op, ast.Div))
            or isinstance(up, ast.Compare)
            or (isinstance(up, ast.Call) and called in PATH_CALLS)
        )
        if (value in NAMES and (value not in WORDS or in_path)) or _joined(value):
            found.append((node.lineno, value))
    return found


def test_only_runfolder_spells_the_run_folder_names() -> None:
    found = {
        str(path.relative_to(SRC)): hits
        for path in sorted(SRC.rglob("*.py"))
        if path != HOME and (hits := spelled_names(path.read_text(encoding="utf-8")))
    }
    assert found == {}, f"ask cselab.io.runfolder.RunFolder instead: {found}"


def test_the_name_check_sees_the_old_spellings() -> None:
    """What the modules spelled before RunFolder owned the names is all found; the same words
    meaning something else are not."""
    probe = textwrap.dedent(
        """
        RUN_FILES = ("checkpoint", "best", "config.yaml", "metrics.csv")
        CELL_FILE = "cell.json"
        def f(out, name, cell):
            a = out / "checkpoint" / CHECKPOINT_FILE
            b = f"saved best model to {out}/best, last to {out}/last"
            c = name == "best" or name not in ("best", "last")
            d = Path(out, "tensorboard")
            e = trainer.run.save_model("last", trainer.step)
            g = cell.dir / "sweep_config.yaml"
            h = Path(folder) / "cselab_config.yaml"
            report_to = ["tensorboard"]          # a logger's name, not a folder
            raise Error("could not write checkpoint")  # a word in a message
        """
    )
    assert sorted(v for _, v in spelled_names(probe)) == sorted(
        ["config.yaml", "metrics.csv", "cell.json", "checkpoint", "/best, last to ", "/last",
         "best", "best", "last", "tensorboard", "last", "sweep_config.yaml", "cselab_config.yaml"]
    )  # fmt: skip


def test_an_overwrite_or_a_start_without_a_step_removes_the_plan_too(tmp_path: Path) -> None:
    """``plan.json`` is a file of the run: ``train.overwrite`` removes it with the rest, and so
    does the clean-up of a start that took no step; a card never reads a stale plan."""
    from cselab.training.rundir import prepare_output_dir

    run = RunFolder(tmp_path / "out")
    run.checkpoint.mkdir(parents=True)  # a run that took steps
    run.config.write_text("train: {}\n", encoding="utf-8")
    run.plan.write_text("{}", encoding="utf-8")
    prepare_output_dir(run.path, {}, lambda: None, resume=False, overwrite=True)
    assert list(run.path.iterdir()) == []
    run.config.write_text("train: {}\n", encoding="utf-8")  # a start that took no step
    _a_plan().save(run.path)
    prepare_output_dir(run.path, {}, lambda: None, resume=False, overwrite=False)
    assert list(run.path.iterdir()) == []


def _a_plan() -> Any:
    from cselab.config.plan import RunPlan
    from cselab.core.datakind import DataKind
    from cselab.objectives.config import ObjectiveConfig

    return RunPlan("/data/corpus.txt", DataKind(), None, "cpu", "fp32", 1, "avg", 32, (),
                   ObjectiveConfig())  # fmt: skip


def test_a_user_s_files_of_a_run_s_names_are_never_removed_unasked(tmp_path: Path) -> None:
    """The user's own ``config.yaml`` and ``tensorboard/`` in the output folder (no
    ``plan.json``: no cselab run started there) are refused in one line and kept, not taken
    for a start that ran no step; ``train.overwrite`` replaces them when asked."""
    from cselab.core.errors import ConfigError
    from cselab.training.rundir import prepare_output_dir

    run = RunFolder(tmp_path / "proj")
    (run.tensorboard).mkdir(parents=True)
    (run.tensorboard / "events.out.other").write_text("x", encoding="utf-8")
    run.config.write_text("# my settings\ntrain: {lr: 1.0e-5}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"holds config.yaml, tensorboard, which a run writes "
                       r"but no cselab run wrote there \(no readable plan.json of one\)"):  # fmt: skip
        prepare_output_dir(run.path, {}, lambda: None, resume=False, overwrite=False)
    assert run.config.read_text(encoding="utf-8").startswith("# my settings")
    assert (run.tensorboard / "events.out.other").is_file()
    run.plan.write_text("{}", encoding="utf-8")  # not a plan cselab wrote either
    with pytest.raises(ConfigError, match="no cselab run wrote there"):
        prepare_output_dir(run.path, {}, lambda: None, resume=False, overwrite=False)
    prepare_output_dir(run.path, {}, lambda: None, resume=False, overwrite=True)
    assert list(run.path.iterdir()) == []


# ------------------------------------------------------------------------------------ the lock
def test_the_lock_leaves_no_empty_folder_it_created(tmp_path: Path) -> None:
    """A run refused before writing anything leaves nothing; any other folder keeps its lock
    file."""
    new = RunFolder(tmp_path / "new" / "run")
    with new.lock():
        assert [p.name for p in new.path.iterdir()] == [RunFolder.LOCK]
        with pytest.raises(RunFolderBusy), new.lock():
            pass
    assert not new.path.exists() and (tmp_path / "new").is_dir()
    with new.lock():
        new.metrics.write_text("step\n")
    assert sorted(p.name for p in new.path.iterdir()) == [RunFolder.LOCK, RunFolder.METRICS]
    kept = RunFolder(tmp_path / "kept")
    kept.path.mkdir()
    with kept.lock():
        pass
    assert [p.name for p in kept.path.iterdir()] == [RunFolder.LOCK]


def test_a_removed_lock_file_is_not_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between opening the lock file and locking it, the previous holder removed its empty
    folder and another process made a new lock file: the lock taken is on the new file."""
    import fcntl

    folder = RunFolder(tmp_path / "run")
    real_flock, swapped = fcntl.flock, []

    def flock_after_a_swap(fd: int, operation: int) -> None:
        if not swapped:
            swapped.append(fd)
            (folder.path / RunFolder.LOCK).unlink()
            (folder.path / RunFolder.LOCK).touch()
        real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock_after_a_swap)
    with folder.lock():
        monkeypatch.undo()
        assert swapped
        with pytest.raises(RunFolderBusy), folder.lock():
            pass  # the file on disk is the one held


def train_args(tiny_bert: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "-q", "train", f"--model.name_or_path={tiny_bert}", "--model.max_seq_len=16",
        f"--data.train_file={write_corpus(data, 48)}", f"--data.cache_dir={data / 'cache'}",
        f"--train.output_dir={out}", "--train.batch_size=8", "--train.max_steps=3",
        "--train.eval_steps=0", "--train.log_steps=1", "--train.report_to=[]",
        "--train.device=cpu", *extra,
    ]  # fmt: skip


#: A real `cselab train` process that imports everything, says it is ready, and starts the
#: command when the go file appears: two of them reach the lock within milliseconds.
STARTER = """
import sys, time
from pathlib import Path
from typing import Any
import cselab.cli, cselab.app.train  # the slow imports, before the start line
ready, go, argv = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
ready.touch()
while not go.exists():
    time.sleep(0.005)
sys.exit(cselab.cli.main(argv))
"""


def child_env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    return env


def test_two_trainers_into_one_new_folder_one_runs_the_other_is_refused(
    tiny_bert: Path, tmp_path: Path
) -> None:
    out, go = tmp_path / "out", tmp_path / "go"
    procs, ready = [], []
    for seed in (1, 2):
        ready.append(tmp_path / f"ready{seed}")
        argv = train_args(tiny_bert, tmp_path / f"data{seed}", out, f"--train.seed={seed}")
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", STARTER, str(ready[-1]), str(go), *argv],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=child_env(),
            )  # fmt: skip
        )
    deadline = time.monotonic() + 300
    while not all(r.exists() for r in ready):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.05)
    go.touch()
    results = [(p.returncode, stderr) for p in procs for _, stderr in [p.communicate(timeout=600)]]
    codes = sorted(rc for rc, _ in results)
    assert codes == [0, 2], results
    winner = 1 + [rc for rc, _ in results].index(0)
    refused = [stderr for rc, stderr in results if rc == 2][0]
    assert refused.strip().splitlines() == [
        f"cselab train: error: {out} is in use by another cselab process (it holds "
        f"{out / RunFolder.LOCK}); wait for it to finish or choose another folder"
    ]
    # one complete run, all of it the winner's
    run = RunFolder(out)
    assert sorted(run.previous_run()) == sorted(
        [RunFolder.CHECKPOINT, RunFolder.BEST, RunFolder.LAST, RunFolder.CONFIG,
         RunFolder.PLAN, RunFolder.METRICS, RunFolder.RESULTS]
    )  # fmt: skip
    seeds = {
        "config": yaml.safe_load(run.config.read_text())["train"]["seed"],
        "best": yaml.safe_load((run.best / RunFolder.MODEL_CONFIG).read_text())["train"]["seed"],
        "last": yaml.safe_load((run.last / RunFolder.MODEL_CONFIG).read_text())["train"]["seed"],
        "checkpoint": read_metadata(run.checkpoint_file)["extra"]["config"]["train"]["seed"],
    }
    assert seeds == dict.fromkeys(seeds, winner)
    assert str(tmp_path / f"data{winner}") in run.config.read_text()
    steps = [line.split(",")[0] for line in run.metrics.read_text().splitlines()[1:]]
    assert steps == ["1", "2", "3"]  # one run's rows, once


def test_a_lock_left_by_a_killed_run_does_not_block_the_next(
    tiny_bert: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    argv = train_args(tiny_bert, tmp_path / "data", out, "--train.max_steps=100000")
    proc = subprocess.Popen(
        [sys.executable, "-m", "cselab", *argv],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_env(),
    )  # fmt: skip
    lock_file = out / RunFolder.LOCK
    deadline = time.monotonic() + 300
    while not (lock_file.is_file() and lock_file.read_text() == f"{proc.pid}\n"):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    with pytest.raises(RunFolderBusy), RunFolder(out).lock():
        pass  # held by the child
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    assert lock_file.read_text() == f"{proc.pid}\n"  # the file stays; the lock went with it
    assert main([*argv[:-1], "--train.max_steps=3", "--train.resume=true"]) == 0
    assert RunFolder(out).results.is_file()


def write_sweep(folder: Path, tiny_bert: Path, launcher: str) -> Path:
    spec = {
        "base": {
            "model": {"name_or_path": str(tiny_bert), "max_seq_len": 16},
            "data": {"train_file": str(write_corpus(folder, 48)), "cache_dir": str(folder / "c")},
            "train": {
                "batch_size": 8,
                "max_steps": 2,
                "eval_steps": 0,
                "device": "cpu",
                "report_to": [],
            },
        },  # fmt: skip
        "configs": {"simcse": []},
        "seeds": [1],
        "output_root": str(folder / "runs"),
        "launcher": launcher,
        "evaluate": None,
    }
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    return path


@pytest.mark.parametrize("launcher", ["inprocess", "subprocess"])
def test_a_sweep_cell_in_use_is_not_trained_into(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture, launcher: str
) -> None:
    """A cell whose folder another process holds (a `cselab train` of a second sweep, or the
    child of a killed one) is left alone by the sweep, in-process or as a subprocess: it is
    named at the end and nothing is written into it; once free, it runs."""
    spec = write_sweep(tmp_path, tiny_bert, launcher)
    cell = RunFolder(tmp_path / "runs" / "simcse" / "seed1")
    # flock locks belong to an open file: a second open in this process is another owner
    with cell.lock():
        assert main(["-q", "sweep", str(spec)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "cselab sweep: error: 1 cell(s) left alone, in use by another cselab process: "
        f"simcse seed 1 ({cell.path}) (run the sweep again when it has finished)"
    ]
    assert cell.previous_run() == []  # nothing was trained into it
    assert not cell.cell.exists() and not cell.cell_log.exists()  # nor written
    assert main(["-q", "sweep", str(spec)]) == 0
    assert cell.results.is_file()


def test_a_folder_the_process_cannot_write_in_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A read-only output folder (tests run as root, where permissions do not refuse: the
    file system's refusal is simulated) is one line naming it, before any work, from
    ``cselab train`` and ``cselab index build`` alike."""
    import errno

    from cselab.core.errors import WriteError

    def read_only(*args: object, **kwargs: object) -> int:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr("cselab.io.runfolder.os.open", read_only)
    refused = pytest.raises(WriteError, match=r"ro: cannot write there \(Read-only file system\)")
    with refused, RunFolder(tmp_path / "ro").lock():
        pass
    corpus = write_corpus(tmp_path, 8)
    assert main(["index", "build", str(corpus), "--model", "m", "-o", str(tmp_path / "i")]) == 2
    err = capsys.readouterr().err
    assert "i: cannot write there (Read-only file system)" in err and err.count("\n") == 1
