"""Experiments across configurations and seeds: ``cselab sweep sweep.yaml``.

A sweep file names a base config, the configurations to compare (a grid of overrides, or a
named list), the seeds and an output root::

    base: demo-minilm                     # a preset name, a YAML path, or a mapping of sections
    overrides: [train.max_steps=200]      # applied to every cell
    configs:                              # or `grid: {objective.focal.enabled: [false, true]}`
      simcse: []
      focal: [objective.focal.enabled=true]
    seeds: [1, 2, 3]
    output_root: runs/focal-vs-simcse
    baseline: simcse                      # for `cselab report`
    launcher: subprocess                  # inprocess | subprocess | torchrun
    parallel: 2                           # cells at once (subprocess/torchrun)
    threads_per_cell: 1                   # OMP/torch threads of each cell process
    nproc_per_node: 2                     # torchrun only
    evaluate: {tasks: sts, mode: test, model: best}   # `null`: no evaluation
    # or your own STS-format pairs, as `cselab evaluate --sts-file` (tasks default to none then):
    # evaluate: {sts_files: [my_dev.tsv], sts_columns: [sentence1, sentence2, score]}
    # or retrieval on a BEIR folder, as `cselab evaluate --retrieval`:
    # evaluate: {retrieval: my-beir, retrieval_split: test, k: 10}

Each (configuration, seed) cell trains into ``output_root/<config>/seed<N>/`` (with
``train.seed=N`` and ``train.resume=true``, so an interrupted cell continues from its last
checkpoint) through :func:`cselab.app.train.train`, in this process or as ``cselab train``
(which holds the cell folder's lock while it trains), then evaluates its ``best`` (or ``last``) model with :mod:`cselab.evaluation` into
``eval.json``. A cell whose ``results.json`` (and ``eval.json``, when evaluating) exist is
skipped. ``cell.json`` records each cell's configuration name, seed and overrides, which is how
``cselab report`` (:mod:`cselab.insight.report`) finds them.

A cell has one owner at a time: the sweep holds the cell's sweep lock
(:attr:`~cselab.io.runfolder.RunFolder.SWEEP_LOCK`) while it trains and evaluates it, and leaves
alone a cell that another sweep, or a ``cselab train`` holding the run folder's lock, is running
(the cell is reported busy and nothing is written into it). Cell processes stay in the sweep's
process group (a Ctrl-C reaches them) and, on Linux, end with the sweep however it ends
(:func:`die_with_parent`), so a killed sweep leaves no training running on its own.
"""

from __future__ import annotations

import copy
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

import yaml

from ..config import Config, ConfigError, apply_overrides, from_dict, load_yaml, save_config
from ..config.devset import DEV_COLUMNS
from ..config.presets import find_preset
from ..core.errors import RunFolderBusy, SweepError, UserError
from ..evaluation.names import RETRIEVAL_K
from ..io.files import write_json_atomic
from ..io.readers import read_text, yaml_dumper, yaml_loader
from ..io.runfolder import RunFolder
from ..model.choices import BATCH_SIZE

log = logging.getLogger("cselab")

LAUNCHERS = ("inprocess", "subprocess", "torchrun")
SWEEP_FILE = "sweep.json"


@dataclass
class EvalSpec:
    """What each cell's final model is evaluated on (see :func:`cselab.evaluation.evaluate`).

    ``tasks`` defaults to ``sts``, or to none when ``sts_files`` (your own STS-format pairs,
    as ``cselab evaluate --sts-file``) or ``retrieval`` (a BEIR folder, as ``cselab evaluate
    --retrieval``, scored on ``retrieval_split`` at cut-off ``k``) are given; ``sts_columns``
    names the files' two sentence columns and their score column."""

    tasks: str | None = None
    mode: str = "test"
    model: str = RunFolder.BEST
    data_dir: str | None = None
    batch_size: int = BATCH_SIZE
    download: bool = False
    sts_files: list[str] = field(default_factory=list)
    sts_columns: list[str] = field(default_factory=lambda: list(DEV_COLUMNS))
    retrieval: str | None = None
    retrieval_split: str = "test"
    k: int = RETRIEVAL_K

    @property
    def task_spec(self) -> str | None:
        """The SentEval tasks to run (``None``: only the STS files, or retrieval)."""
        if self.tasks is None and not self.sts_files and not self.retrieval:
            return "sts"
        return self.tasks

    def task_list(self) -> list[Any]:
        """What :func:`cselab.evaluation.evaluate` runs in process: the SentEval task names,
        then the retrieval task (the STS files go as ``sts_files``)."""
        from ..evaluation.tasks import RetrievalTask

        tasks: list[Any] = [self.task_spec] if self.task_spec is not None else []
        if self.retrieval:
            tasks.append(RetrievalTask(self.retrieval, self.retrieval_split, self.k))
        return tasks

    def argv(self) -> list[str]:
        """The same request as ``cselab evaluate`` options (a subprocess cell)."""
        args = ["--mode", self.mode, "--batch-size", str(self.batch_size)]
        if self.task_spec is not None:
            args += ["--tasks", self.task_spec]
        for sts_file in self.sts_files:
            args += ["--sts-file", sts_file]
        if self.sts_files:
            args += ["--sts-columns", ",".join(self.sts_columns)]
        if self.retrieval:
            args += ["--retrieval", self.retrieval, "--split", self.retrieval_split]
            args += ["--k", str(self.k)]
        if self.data_dir:
            args += ["--data-dir", self.data_dir]
        if not self.download:
            args.append("--no-download")
        return args


@dataclass
class SweepSpec:
    """A parsed sweep file (see the module docstring for the keys)."""

    base: dict[str, Any]
    configs: dict[str, list[str]]
    seeds: list[int]
    output_root: Path
    overrides: list[str] = field(default_factory=list)
    baseline: str | None = None
    launcher: str = "subprocess"
    parallel: int = 1
    threads_per_cell: int | None = None
    nproc_per_node: int = 1
    evaluate: EvalSpec | None = field(default_factory=EvalSpec)
    #: the cell folder under ``output_root`` (``{config}`` and ``{seed}`` are filled in)
    cell_dir: str = "{config}/seed{seed}"

    def cells(self) -> list[Cell]:
        """Every (configuration, seed), seeds outermost: an early stop leaves whole seeds."""
        return [
            Cell(
                name,
                seed,
                overrides,
                self.output_root / self.cell_dir.format(config=name, seed=seed),
            )
            for seed in self.seeds
            for name, overrides in self.configs.items()
        ]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["output_root"] = str(self.output_root)
        return d


@dataclass
class Cell:
    """One training run of a sweep."""

    config: str
    seed: int
    overrides: list[str]
    dir: Path

    @property
    def folder(self) -> RunFolder:
        return RunFolder(self.dir)

    def finished(self, spec: SweepSpec) -> bool:
        done = self.folder.results.is_file()
        return done and (spec.evaluate is None or self.folder.evaluation.is_file())

    def build_config(self, spec: SweepSpec) -> Config:
        data = apply_overrides(
            copy.deepcopy(spec.base),
            [
                *spec.overrides,
                *self.overrides,
                f"train.seed={self.seed}",
                "train.resume=true",  # an interrupted cell continues from its checkpoint
            ],
        )
        data.setdefault("train", {})["output_dir"] = str(self.dir)  # not YAML-parsed
        try:
            return Config.from_sections(data)
        except ConfigError as err:
            raise ConfigError(f"sweep cell {self.config} seed {self.seed}: {err}") from None


def _yaml_value(value: Any) -> str:
    text = yaml.dump(value, Dumper=yaml_dumper(), default_flow_style=True)
    return text.strip().removesuffix("...").strip()


def grid_configs(
    grid: dict[str, list[Any]], written: dict[str, list[str | None]] | None = None
) -> dict[str, list[str]]:
    """Cartesian product of ``{key: [values]}`` as ``{name: overrides}``; the name lists each
    ``key=value`` (``objective.focal.enabled=true,train.lr=1.0e-05``). ``written``: the values'
    text in the sweep file (:func:`grid_texts`): a number written as YAML 1.1 read text
    (``1e-5``) keeps that text, so a sweep's cell folders keep the names they had when such a
    value was text (a sweep run again finds its finished cells)."""
    keys = list(grid)
    texts = {
        k: [
            t if t is not None and isinstance(v, float) and not _yaml11_number(t)
            else _yaml_value(v)
            for v, t in zip(grid[k], (written or {}).get(k) or [None] * len(grid[k]), strict=True)
        ]
        for k in keys
    }  # fmt: skip
    out: dict[str, list[str]] = {}
    for values in product(*(texts[k] for k in keys)):
        overrides = [f"{k}={v}" for k, v in zip(keys, values, strict=True)]
        out[",".join(overrides)] = overrides
    return out


def _yaml11_number(text: str) -> bool:
    """Whether PyYAML's YAML 1.1 resolver reads ``text`` as a number."""
    tag = yaml.resolver.Resolver().resolve(yaml.ScalarNode, text, (True, False))
    return tag in ("tag:yaml.org,2002:float", "tag:yaml.org,2002:int")


def grid_texts(path: Path) -> dict[str, list[str | None]]:
    """The values of the sweep file's ``grid`` as written (``None``: not a plain scalar)."""
    root = yaml.compose(read_text(path, what="sweep file"), Loader=yaml_loader())
    out: dict[str, list[str | None]] = {}
    for key, value in root.value if isinstance(root, yaml.MappingNode) else []:
        if key.value == "grid" and isinstance(value, yaml.MappingNode):
            for name, values in value.value:
                if isinstance(values, yaml.SequenceNode):
                    out[name.value] = [
                        v.value if isinstance(v, yaml.ScalarNode) else None for v in values.value
                    ]
    return out


_KEYS = {
    "base", "overrides", "grid", "configs", "seeds", "output_root", "baseline", "launcher",
    "parallel", "threads_per_cell", "nproc_per_node", "evaluate", "cell_dir",
}  # fmt: skip


def load_sweep(path: str | os.PathLike[str]) -> SweepSpec:
    """Parse and check a sweep file; errors are :class:`ConfigError` naming the file and key."""
    p = Path(path)
    data = load_yaml(p)

    def fail(message: str) -> ConfigError:
        return ConfigError(f"{p}: {message}")

    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise fail(f"unknown key '{unknown[0]}' (valid: {', '.join(sorted(_KEYS))})")
    base = data.get("base") or {}
    if isinstance(base, str):
        try:
            base_path = find_preset(base)
        except ConfigError as err:
            raise fail(f"'base': {err}") from None
        base = load_yaml(base_path)
    if not isinstance(base, dict):
        raise fail("'base' must be a config file path or a mapping of sections")
    if ("grid" in data) == ("configs" in data):
        raise fail("give exactly one of 'grid' (key: [values]) and 'configs' (name: [overrides])")
    if "grid" in data:
        grid = data["grid"]
        if (
            not isinstance(grid, dict)
            or not grid
            or not all(isinstance(v, list) and v for v in grid.values())
        ):
            raise fail("'grid' must map each config key to a non-empty list of values")
        configs = grid_configs(grid, grid_texts(p))
    else:
        raw = data["configs"]
        if isinstance(raw, list):  # a list of override lists: named by their overrides
            raw = {",".join(o) or "base": o for o in raw}
        if not isinstance(raw, dict) or not raw:
            raise fail("'configs' must map names to lists of overrides")
        configs = {}
        for name, overrides in raw.items():
            overrides = overrides or []
            if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
                raise fail(f"configs.{name}: expected a list of 'section.key=value' strings")
            if "/" in str(name):
                raise fail(f"configs.{name}: a configuration name cannot contain '/'")
            configs[str(name)] = overrides
    seeds = data.get("seeds", [42])
    if (
        not isinstance(seeds, list)
        or not seeds
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)
    ):
        raise fail("'seeds' must be a non-empty list of integers")
    if len(set(seeds)) != len(seeds):
        raise fail("'seeds' lists a seed twice")
    if "output_root" not in data:
        raise fail("'output_root' is required (where the cells' folders go)")
    overrides = data.get("overrides") or []
    if not isinstance(overrides, list):
        raise fail("'overrides' must be a list of 'section.key=value' strings")
    evaluate = data.get("evaluate", {})
    if evaluate is not None:
        if not isinstance(evaluate, dict):
            raise fail("'evaluate' must be a mapping (tasks, mode, model, ...) or null")
        try:
            evaluate = from_dict(EvalSpec, evaluate, prefix="evaluate")
        except ConfigError as err:
            raise fail(str(err)) from None
        if evaluate.batch_size < 1:  # as `cselab evaluate --batch-size`, before any cell trains
            raise fail(f"evaluate.batch_size must be at least 1, not {evaluate.batch_size}")
        if evaluate.model not in (RunFolder.BEST, RunFolder.LAST):
            raise fail(f"evaluate.model must be best or last, got {evaluate.model!r}")
        from ..evaluation.api import MODES, parse_tasks

        if evaluate.mode not in MODES:
            raise fail(f"evaluate.mode must be one of {', '.join(MODES)}, got {evaluate.mode!r}")
        if evaluate.task_spec is not None:
            try:
                parse_tasks(evaluate.task_spec, evaluate.mode)
            except ValueError as err:
                raise fail(f"evaluate.tasks: {err}") from None
        from ..evaluation.custom import read_sts_file

        for sts_file in evaluate.sts_files:  # read and checked now, before any cell trains
            try:
                read_sts_file(sts_file, evaluate.sts_columns)
            except UserError as err:
                raise fail(f"evaluate.sts_files: {err}") from None
        if evaluate.retrieval is not None:
            from ..io.readers import read_beir

            if evaluate.k < 1:
                raise fail(f"evaluate.k must be at least 1, not {evaluate.k}")
            try:  # read and checked now, before any cell trains
                read_beir(evaluate.retrieval, evaluate.retrieval_split)
            except UserError as err:
                raise fail(f"evaluate.retrieval: {err}") from None
    spec = SweepSpec(
        base=base,
        configs=configs,
        seeds=seeds,
        output_root=Path(str(data["output_root"])),
        overrides=[str(o) for o in overrides],
        baseline=data.get("baseline"),
        launcher=data.get("launcher", "subprocess"),
        parallel=data.get("parallel", 1),
        threads_per_cell=data.get("threads_per_cell"),
        nproc_per_node=data.get("nproc_per_node", 1),
        evaluate=evaluate,
        cell_dir=data.get("cell_dir", "{config}/seed{seed}"),
    )
    try:
        check_spec(spec)
    except ConfigError as err:
        raise fail(str(err)) from None
    return spec


def check_spec(spec: SweepSpec) -> None:
    """Value checks shared by sweep files and specs built in Python; also builds every cell's
    config, so that a bad override fails before the first cell trains."""
    if spec.launcher not in LAUNCHERS:
        raise ConfigError(
            f"'launcher' must be one of {', '.join(LAUNCHERS)}, got {spec.launcher!r}"
        )
    if not isinstance(spec.parallel, int) or spec.parallel < 1:
        raise ConfigError(f"'parallel' must be an integer >= 1, got {spec.parallel!r}")
    if spec.launcher == "inprocess" and spec.parallel > 1:
        raise ConfigError("launcher 'inprocess' runs one cell at a time; use 'subprocess'")
    if spec.threads_per_cell is not None and spec.threads_per_cell < 1:
        raise ConfigError("'threads_per_cell' must be >= 1")
    if not isinstance(spec.nproc_per_node, int) or spec.nproc_per_node < 1:
        raise ConfigError("'nproc_per_node' must be an integer >= 1")
    if spec.baseline is not None and spec.baseline not in spec.configs:
        raise ConfigError(
            f"'baseline' {spec.baseline!r} is none of the configurations ({', '.join(spec.configs)})"
        )
    for cell in spec.cells()[: len(spec.configs)]:
        cell.build_config(spec)


# --------------------------------------------------------------------------------------------
# running cells


def cell_commands(spec: SweepSpec, cell: Cell, config_file: Path) -> list[list[str]]:
    """The processes a subprocess/torchrun cell runs: train (unless done), then evaluate."""
    commands = []
    if not cell.folder.results.is_file():
        if spec.launcher == "torchrun":
            launcher = [
                sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc_per_node={spec.nproc_per_node}", "-m", "cselab",
            ]  # fmt: skip
        else:
            launcher = [sys.executable, "-m", "cselab"]
        commands.append([*launcher, "-q", "train", str(config_file)])
    ev = spec.evaluate
    if ev is not None:
        evaluate = [
            sys.executable, "-m", "cselab", "-q", "evaluate", str(cell.folder.model(ev.model)),
            *ev.argv(), "--output", str(cell.folder.evaluation),
        ]  # fmt: skip
        commands.append(evaluate)
    return commands


def _evaluate_inprocess(spec: SweepSpec, cell: Cell) -> None:
    from ..evaluation import evaluate
    from ..evaluation.report import save_json
    from ..model.encoder import load

    ev = spec.evaluate
    assert ev is not None
    encoder = load(str(cell.folder.model(ev.model)), device="cpu")
    out = evaluate(
        encoder,
        tasks=ev.task_list(),
        mode=ev.mode,
        data_dir=ev.data_dir,
        batch_size=ev.batch_size,
        download=ev.download,
        model_name=f"{cell.config} seed {cell.seed}",
        sts_files=ev.sts_files,
        sts_columns=ev.sts_columns,
    )
    save_json(out, cell.folder.evaluation)


#: ``prctl`` option: the signal the kernel sends a process when its parent thread ends.
PR_SET_PDEATHSIG = 1


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes a cell's process end when the sweep ends, however it ends.

    Why this and not only a process group: the cell processes stay in the sweep's process group
    (so a Ctrl-C or a ``kill -- -PGID`` reaches them), but a SIGKILL of the sweep's own process
    (``kill -9 PID``, the out-of-memory killer) gives it no chance to stop them. Linux's
    ``prctl(PR_SET_PDEATHSIG)`` asks the kernel itself to signal the child when its parent dies.
    The signal is SIGTERM, not SIGKILL: ``cselab train`` ends on it at once, and ``torchrun``
    (whose workers run in their own sessions) stops its workers on it. ``None`` elsewhere than
    on Linux (no such call: cells then outlive a killed sweep, and the cell locks still keep a
    rerun out of them).
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)  # loaded here: the child only calls it
    prctl = libc.prctl
    prctl.argtypes = [ctypes.c_int, *[ctypes.c_ulong] * 4]
    parent = os.getpid()

    def preexec() -> None:  # runs in the child between fork and exec
        if prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            os._exit(126)
        if os.getppid() != parent:  # the sweep died before the request took effect
            os._exit(126)

    return preexec


def run_cell(spec: SweepSpec, cell: Cell) -> str:
    """Train and evaluate one cell as the spec says; returns ``done``, ``skipped``,
    ``busy: <why>`` (another sweep or ``cselab train`` is running it: nothing is written into
    it) or ``failed: <log>``."""
    if cell.finished(spec):
        return "skipped"
    folder = RunFolder(cell.dir)
    try:
        with folder.lock(RunFolder.SWEEP_LOCK):
            with folder.lock():  # a live `cselab train` holds the run folder's own lock
                pass
            return _run_cell(spec, cell)
    except RunFolderBusy as err:
        return f"busy: {err}"


def _run_cell(spec: SweepSpec, cell: Cell) -> str:
    """:func:`run_cell` once the cell is this sweep's."""
    info = {"config": cell.config, "seed": cell.seed, "overrides": cell.overrides}
    write_json_atomic(cell.folder.cell, info, indent=2, what="sweep cell record")
    config = cell.build_config(spec)
    if spec.launcher == "inprocess":
        from ..app.train import train

        if not cell.folder.results.is_file():
            train(config)  # holds the cell's lock while it trains
        if spec.evaluate is not None:
            _evaluate_inprocess(spec, cell)
        return "done"
    config_file = cell.folder.cell_config
    save_config(config, config_file)
    env = dict(os.environ)
    if spec.threads_per_cell:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(spec.threads_per_cell)
    logfile = cell.folder.cell_log
    with logfile.open("a", encoding="utf-8") as fh:
        for command in cell_commands(spec, cell, config_file):
            fh.write("$ " + " ".join(command) + "\n")
            fh.flush()
            rc = subprocess.call(
                command, stdout=fh, stderr=subprocess.STDOUT, env=env,
                preexec_fn=die_with_parent(),  # thread-safe: only prctl and getppid run there
            )  # fmt: skip
            if rc != 0:
                fh.write(f"exit status {rc}\n")
                return f"failed: {logfile}"
    return "done"


def run_sweep(
    spec: SweepSpec, progress: Callable[[Cell, str], None] | None = None
) -> dict[str, list[Cell]]:
    """Run every unfinished cell (``spec.parallel`` at a time); returns the cells by outcome
    (``done``, ``skipped``, ``busy``, ``failed``). Raises :class:`SweepError` if any cell failed
    or was busy (run by another process: run the sweep again once that has finished)."""
    check_spec(spec)
    spec.output_root.mkdir(parents=True, exist_ok=True)
    write_json_atomic(spec.output_root / SWEEP_FILE, spec.to_dict(), indent=2, what="sweep record")
    outcome: dict[str, list[Cell]] = {"done": [], "skipped": [], "busy": [], "failed": []}
    failures: list[str] = []
    busy: list[str] = []

    def one(cell: Cell) -> None:
        status = run_cell(spec, cell)
        key = status.split(":", 1)[0]
        outcome[key].append(cell)
        if key == "failed":
            failures.append(f"{cell.config} seed {cell.seed} ({status.split(': ', 1)[1]})")
        elif key == "busy":
            busy.append(f"{cell.config} seed {cell.seed} ({cell.dir})")
        if progress is not None:
            progress(cell, status)

    cells = spec.cells()
    if spec.parallel == 1:
        for cell in cells:
            one(cell)
    else:
        with ThreadPoolExecutor(max_workers=spec.parallel) as pool:
            list(pool.map(one, cells))
    problems = []
    if failures:
        problems.append(f"{len(failures)} cell(s) failed: " + "; ".join(failures))
    if busy:
        problems.append(
            f"{len(busy)} cell(s) left alone, in use by another cselab process: "
            + "; ".join(busy)
            + " (run the sweep again when it has finished)"
        )
    if problems:
        raise SweepError("; ".join(problems))
    return outcome


def sweep_progress(cells_total: int) -> Callable[[Cell, str], None]:
    """A progress printer for the CLI: one line per finished cell."""
    count = [0]

    def report(cell: Cell, status: str) -> None:
        count[0] += 1
        print(f"[{count[0]}/{cells_total}] {cell.config} seed {cell.seed}: {status}", flush=True)

    return report


def cell_dirs(root: Path) -> Sequence[Path]:
    """The cell folders under ``root`` (those holding a ``cell.json``), sorted."""
    return sorted(p.parent for p in root.rglob(RunFolder.CELL))
