"""A checkpoint or model-folder write that fails (disk full, permission denied) ends in one
line naming the path and the cause, leaves no partial file, and the previous copy still loads."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

import cselab.training.checkpoint as ckpt
from conftest import write_corpus
from cselab.cli import main
from cselab.io.runfolder import RunFolder


def tiny_state() -> tuple[torch.nn.Module, torch.optim.Optimizer, object]:
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    return model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)


def half_written_then(error: BaseException):  # noqa: ANN201
    """A ``save_file`` that writes half of a real file's bytes to its target, then fails."""
    real = ckpt.save_file

    def save_file(tensors, path, metadata=None):  # noqa: ANN001, ANN202
        real(tensors, path, metadata=metadata)
        data = Path(path).read_bytes()
        Path(path).write_bytes(data[: len(data) // 2])
        raise error

    return save_file


FAILURES = {
    "ENOSPC": (
        "save_file",
        lambda: half_written_then(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))),
        "No space left on device (ENOSPC)",
    ),
    "EACCES": (
        "os.replace",
        lambda: _raiser(PermissionError(errno.EACCES, os.strerror(errno.EACCES))),
        "Permission denied (EACCES)",
    ),
    # safetensors reports its own I/O errors as SafetensorError with the OS message inside
    "safetensors": (
        "save_file",
        lambda: half_written_then(
            SafetensorError(
                "Error while serializing: I/O error: No space left on device (os error 28)"
            )
        ),
        "Error while serializing: I/O error: No space left on device (os error 28)",
    ),
}


def _raiser(error: BaseException):  # noqa: ANN202
    def fail(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise error

    return fail


def _patch(monkeypatch: pytest.MonkeyPatch, where: str, fake: object) -> None:
    if where == "save_file":
        monkeypatch.setattr(ckpt, "save_file", fake)
    else:
        monkeypatch.setattr(ckpt.os, "replace", fake)


@pytest.mark.parametrize("case", list(FAILURES))
def test_failed_checkpoint_write_names_path_and_cause_and_keeps_the_previous(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    where, make, cause = FAILURES[case]
    model, opt, sched = tiny_state()
    target = ckpt.write_snapshot(
        tmp_path, ckpt.snapshot_checkpoint(model, opt, sched, step=7, extra={"k": 1})
    )
    _patch(monkeypatch, where, make())
    with pytest.raises(ckpt.CheckpointWriteError) as info:
        ckpt.write_snapshot(
            tmp_path, ckpt.snapshot_checkpoint(model, opt, sched, step=8, extra={"k": 2})
        )
    msg = str(info.value)
    assert msg == f"could not write checkpoint {target}: {cause}; the previous one is kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == [RunFolder.CHECKPOINT_FILE]  # no partial
    monkeypatch.undo()
    _, meta = ckpt.load_checkpoint(tmp_path)
    assert meta["step"] == 7 and meta["extra"] == {"k": 1}


def test_first_checkpoint_failing_says_none_was_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, opt, sched = tiny_state()
    monkeypatch.setattr(ckpt, "save_file", FAILURES["ENOSPC"][1]())
    with pytest.raises(ckpt.CheckpointWriteError, match="none was written before$"):
        ckpt.write_snapshot(tmp_path, ckpt.snapshot_checkpoint(model, opt, sched, step=1, extra={}))
    assert list(tmp_path.iterdir()) == []


def _train_args(tiny_bert: Path, tmp_path: Path) -> list[str]:
    return [
        "-q", "train", f"--model.name_or_path={tiny_bert}", "--model.pooler=avg",
        f"--data.train_file={write_corpus(tmp_path / 'data', 48)}",
        f"--data.cache_dir={tmp_path / 'cache'}", f"--train.output_dir={tmp_path / 'out'}",
        "--train.batch_size=8", "--train.max_steps=2", "--train.eval_steps=0",
        "--train.device=cpu",
    ]  # fmt: skip


def test_disk_full_during_training_is_one_line(
    tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(ckpt, "save_file", FAILURES["ENOSPC"][1]())
    assert main(_train_args(tiny_bert, tmp_path)) == 2
    # stderr also carries the tokenising progress bar; the error is one line of its own.
    errors = [x for x in capsys.readouterr().err.splitlines() if "error" in x]
    target = tmp_path / "out" / "checkpoint" / RunFolder.CHECKPOINT_FILE
    assert len(errors) == 1
    assert errors[0] == (
        f"cselab train: error: could not write checkpoint {target}: No space left on device "
        "(ENOSPC); none was written before"
    )


def test_failed_model_folder_save_keeps_the_previous_folder(
    tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cselab.app.train import build_trainer
    from cselab.config import load_config
    from cselab.model.encoder import SentenceEncoder, load

    trainer = build_trainer(load_config(None, _train_args(tiny_bert, tmp_path)[2:]))
    best = trainer.run.save_model("best", trainer.step)
    before = load(str(best)).encode(["a sentence"])
    real_save = SentenceEncoder.save

    def disk_full(self, path):  # noqa: ANN001, ANN202 - writes part of the folder, then fails
        real_save(self, path)
        (Path(path) / "model.safetensors").write_bytes(b"trunc")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(SentenceEncoder, "save", disk_full)
    with torch.no_grad():
        for p in trainer.encoder.parameters():
            p.add_(1.0)  # the new save would differ
    with pytest.raises(ckpt.CheckpointWriteError) as info:
        trainer.run.save_model("best", trainer.step)
    assert str(info.value) == (
        f"could not write model folder {best}: No space left on device (ENOSPC); "
        "the previous one is kept"
    )
    assert sorted(p.name for p in best.parent.iterdir()) == ["best"]  # no best.tmp left
    assert (load(str(best)).encode(["a sentence"]) == before).all()


def kill_once_stuck(script: str, stuck: Path, metrics: Path, step: int) -> None:
    """Run ``script`` in a child process and SIGKILL it once its write is stuck (``stuck``
    exists) and training went on to ``step`` (a row of ``metrics``); fails naming the child's
    last words if it never got there within two minutes."""
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    deadline, reached = time.monotonic() + 120, False
    try:
        while not reached and time.monotonic() < deadline and proc.poll() is None:
            rows = metrics.read_text().splitlines()[1:] if metrics.is_file() else []
            reached = stuck.is_file() and any(r.startswith(f"{step},") for r in rows)
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)  # before reading its stderr, which waits for its end
        proc.wait()
    assert reached, f"never reached a stuck write at step {step}: {proc.stderr.read()[-2000:]}"


def test_kill_during_a_background_write_keeps_the_previous_checkpoint(
    tiny_bert: Path, tmp_path: Path
) -> None:
    """Checkpoints are written on a thread (``BackgroundWriter``): while the step-6 write is
    stuck half-way the loop trains on (its step-8 row is logged), and a SIGKILL then leaves the
    step-3 checkpoint whole; resuming from it gives the uninterrupted run's weights."""
    import textwrap

    from cselab.app.train import build_trainer
    from cselab.config import load_config

    def overrides(folder: Path) -> list[str]:
        return [
            f"--model.name_or_path={tiny_bert}", "--model.pooler=avg",
            f"--data.train_file={write_corpus(folder / 'data', 48)}",
            f"--data.cache_dir={folder / 'cache'}", f"--train.output_dir={folder / 'out'}",
            "--train.batch_size=8", "--train.max_steps=12", "--train.eval_steps=0",
            "--train.log_steps=2", "--train.save_steps=3", "--train.device=cpu",
            "--train.report_to=[]",
        ]  # fmt: skip

    build_trainer(load_config(None, overrides(tmp_path / "ref"))).train()
    run = tmp_path / "killed"
    stuck = run / "stuck"
    script = textwrap.dedent(
        f"""
        import threading, time
        from pathlib import Path
        import torch
        torch.set_num_threads({torch.get_num_threads()})
        import cselab.training.checkpoint as ckpt
        from cselab.config import load_config
        from cselab.app.train import build_trainer
        real = ckpt.save_file
        def save_file(tensors, path, metadata=None):
            if '"step": 6,' not in metadata["cselab"]:
                return real(tensors, path, metadata=metadata)
            real(tensors, path, metadata=metadata)  # the temporary file, cut in half
            data = Path(path).read_bytes()
            Path(path).write_bytes(data[: len(data) // 2])
            Path({str(stuck)!r}).write_text(threading.current_thread().name)
            time.sleep(600)  # a slow disk: the write never ends before the kill
        ckpt.save_file = save_file
        build_trainer(load_config(None, {overrides(run)!r})).train()
        """
    )
    # the write of step 6 is stuck and training went on past it
    kill_once_stuck(script, stuck, run / "out" / RunFolder.METRICS, 8)
    assert stuck.read_text() == "cselab-checkpoint"  # the writer's thread, not the loop's
    _, meta = ckpt.load_checkpoint(run / "out/checkpoint")
    assert meta["step"] == 3  # the previous checkpoint, complete
    resumed = build_trainer(load_config(None, [*overrides(run), "--train.resume=true"])).train()
    assert resumed["steps"] == 12
    a = load_file(str(tmp_path / "ref/out/last/model.safetensors"))
    b = load_file(str(run / "out/last/model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_kill_during_a_background_best_write_keeps_the_previous_best(
    tiny_bert: Path, tmp_path: Path
) -> None:
    """``best/`` is written on the writer's thread from a host copy of the model: while the
    step-6 ``best/`` is stuck half-written the loop trains on (its step-7 row is logged), and a
    SIGKILL then leaves the step-4 ``best/`` whole (the weights an uninterrupted run whose score
    peaked at step 4 keeps); resuming gives the uninterrupted run's last weights, and the
    checkpoint written after a new best never outruns that ``best/``."""
    import textwrap

    from cselab.app.train import build_trainer
    from cselab.config import load_config

    def overrides(folder: Path) -> list[str]:
        return [
            f"--model.name_or_path={tiny_bert}", "--model.pooler=avg",
            f"--data.train_file={write_corpus(folder / 'data', 48)}",
            f"--data.cache_dir={folder / 'cache'}", f"--train.output_dir={folder / 'out'}",
            "--train.batch_size=8", "--train.max_steps=12", "--train.eval_steps=2",
            "--eval.enabled=false", "--train.log_steps=1", "--train.save_steps=5",
            "--train.device=cpu", "--train.report_to=[]",
        ]  # fmt: skip

    def scores(peak: int | None, start: int = 0):  # noqa: ANN202 - the n-th evaluation's score
        calls = []

        def score(encoder) -> float:  # noqa: ANN001
            calls.append(1)
            n = start + len(calls) - 1  # evaluations at steps 0, 2, 4, ...
            return float(n if peak is None or n <= peak else -n)

        return score

    ref = build_trainer(load_config(None, overrides(tmp_path / "ref")))
    ref.selection.evaluator = scores(peak=2)  # the best is step 4's model
    ref.train()
    assert ref.selection.best_step == 4
    run = tmp_path / "killed"
    stuck = run / "stuck"
    script = textwrap.dedent(
        f"""
        import threading, time
        from pathlib import Path
        import torch
        torch.set_num_threads({torch.get_num_threads()})
        from cselab.config import load_config
        from cselab.model.encoder import SentenceEncoder
        from cselab.app.train import build_trainer
        real, saves = SentenceEncoder.save, []
        def save(self, path):
            saves.append(path)
            real(self, path)
            if len(saves) == 4:  # best/ at steps 0, 2, 4, then 6: cut in half and stuck
                weights = Path(path) / "model.safetensors"
                weights.write_bytes(weights.read_bytes()[:100])
                Path({str(stuck)!r}).write_text(threading.current_thread().name)
                time.sleep(600)  # a slow disk: the write never ends before the kill
        SentenceEncoder.save = save
        trainer = build_trainer(load_config(None, {overrides(run)!r}))
        calls = []
        def score(encoder):
            calls.append(1)
            return float(len(calls))
        trainer.selection.evaluator = score
        trainer.train()
        """
    )
    # the step-6 best/ is stuck and training went on past it
    kill_once_stuck(script, stuck, run / "out" / RunFolder.METRICS, 7)
    assert stuck.read_text() == "cselab-model"  # the writer's thread, not the loop's
    assert (run / "out/best.tmp").is_dir()  # the half-written new one, never published
    assert_same_weights(tmp_path / "ref/out/best", run / "out/best")
    _, meta = ckpt.load_checkpoint(run / "out/checkpoint")
    assert meta["step"] == 5 and meta["extra"]["selection"]["best_step"] == 4
    resumed = build_trainer(load_config(None, [*overrides(run), "--train.resume=true"]))
    resumed.selection.evaluator = scores(peak=None, start=10)  # every evaluation improves
    results = resumed.train()
    assert results["best_step"] == 12 and results["best_write_s"] >= 0
    assert_same_weights(tmp_path / "ref/out/last", run / "out/last")
    assert_same_weights(run / "out/last", run / "out/best")
    assert not (run / "out/best.tmp").exists()  # replaced by the next best/, then published


def assert_same_weights(a: Path, b: Path) -> None:
    wa = load_file(str(a / "model.safetensors"))
    wb = load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_snapshot_of_the_encoder_is_detached_from_training(
    tiny_bert: Path, tmp_path: Path
) -> None:
    """``snapshot_encoder`` (what a background ``best/`` writes): trainable weights copied (an
    update after the snapshot is not in the saved folder), tied weights still tied, frozen
    weights (LoRA's base) shared, the tokenizer a copy of its own."""
    from backbone_models import make_tiny_decoder
    from cselab.model.encoder import SentenceEncoder, load

    encoder = SentenceEncoder.from_pretrained(str(tiny_bert), pooler="cls")
    before = {k: v.detach().clone() for k, v in encoder.state_dict().items()}
    snapshot = ckpt.snapshot_encoder(encoder)
    assert snapshot.tokenizer is not encoder.tokenizer
    with torch.no_grad():
        for p in encoder.parameters():
            p.add_(1.0)
    snapshot.save(tmp_path / "best")
    saved = load(str(tmp_path / "best")).state_dict()
    assert all(torch.equal(saved[k], before[k]) for k in before)

    llama = make_tiny_decoder(tmp_path / "llama")
    tied = SentenceEncoder.from_pretrained(str(llama), pooler="avg", lm_head=True)
    tied.lm_head.weight = tied.backbone.get_input_embeddings().weight  # as tied models load
    copy = ckpt.snapshot_encoder(tied)
    assert copy.lm_head.weight is copy.backbone.get_input_embeddings().weight
    assert copy.lm_head.weight is not tied.lm_head.weight
    lora = SentenceEncoder.from_pretrained(str(llama), pooler="avg", lora={"r": 4})
    pairs = list(zip(lora.parameters(), ckpt.snapshot_encoder(lora).parameters(), strict=True))
    assert all((a is b) != a.requires_grad for a, b in pairs)  # frozen shared, trainable copied


@pytest.mark.parametrize("failure", ["quick", "slow"])
def test_a_failed_background_best_write_stops_the_run_and_keeps_the_previous_best(
    tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    """A dev score that rises at every evaluation writes ``best/`` on the writer's thread each
    time; the disk filling up during the second write reaches the training loop as the one-line
    :class:`~.checkpoint.CheckpointWriteError` (the run stops, no ``last/``), and the first
    ``best/`` is kept whole. Whether the failure is met at the next logged step (``quick``: the
    write is over by then) or only when the next ``best/`` is submitted (``slow``: the write
    lasts until the next evaluation has begun), the selection records the same best step: the
    one whose write failed is the last it knows of (the next one's is rolled back)."""
    import threading

    from cselab.app.train import build_trainer
    from cselab.config import load_config
    from cselab.model.encoder import SentenceEncoder, load

    args = [
        *_train_args(tiny_bert, tmp_path)[2:], "--train.max_steps=12", "--train.eval_steps=2",
        "--eval.enabled=false", "--train.log_steps=1", "--train.report_to=[]",
    ]  # fmt: skip
    trainer = build_trainer(load_config(None, args))
    scores, third = iter(range(100)), threading.Event()

    def rising(encoder: object) -> float:  # every evaluation improves: steps 0, 2, 4, ...
        score = float(next(scores))
        if score == 2:  # step 4's, after step 2's best/ was submitted
            third.set()
        return score

    trainer.selection.evaluator = rising
    real_save, first = SentenceEncoder.save, {}

    def disk_full_the_second_time(self, path):  # noqa: ANN001, ANN202
        real_save(self, path)
        weights = Path(path) / "model.safetensors"
        if not first:
            first["weights"] = weights.read_bytes()
            return
        weights.write_bytes(b"trunc")
        if failure == "slow":
            assert third.wait(60)  # step 4's submit now waits for this write, and meets it
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(SentenceEncoder, "save", disk_full_the_second_time)
    step = trainer.train_step

    def after_the_write(batch):  # noqa: ANN001, ANN202
        if failure == "quick" and trainer.step == 2:  # step 3 begins: step 2's write is over
            while trainer.run.writer.busy:
                time.sleep(0.01)
        return step(batch)

    monkeypatch.setattr(trainer, "train_step", after_the_write)
    out = tmp_path / "out"
    with pytest.raises(ckpt.CheckpointWriteError) as info:
        trainer.train()
    assert str(info.value) == (
        f"could not write model folder {out / 'best'}: No space left on device (ENOSPC); "
        "the previous one is kept"
    )
    assert trainer.selection.best_step == 2 and not (out / "last").exists()
    assert trainer.step == (3 if failure == "quick" else 4)  # where the failure was met
    assert (out / "best" / "model.safetensors").read_bytes() == first["weights"]
    load(str(out / "best")).encode(["a sentence"])  # whole: it loads


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_every_file_of_a_run_has_the_mode_the_umask_gives(
    tiny_bert: Path, tmp_path: Path, umask: int
) -> None:
    """safetensors 0.8 writes its files ``0600`` whatever the umask: a model saved for a team
    or a container image was readable by its writer only. Every file a run writes, the
    weights and the checkpoint included, now has the mode ``open()`` gives a new file."""
    old = os.umask(umask)
    try:
        assert main(_train_args(tiny_bert, tmp_path)) == 0
    finally:
        os.umask(old)
    files = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    weights = [p for p in files if p.suffix == ".safetensors"]
    assert {p.name for p in weights} >= {"model.safetensors", RunFolder.CHECKPOINT_FILE}
    modes = {str(p.relative_to(tmp_path)): oct(p.stat().st_mode & 0o777) for p in files}
    assert set(modes.values()) == {oct(0o666 & ~umask)}, modes


@pytest.mark.parametrize("family", ["bert", "modernbert", "llama-lora"])
def test_a_save_changes_the_mode_of_its_own_weights_only(
    tiny_bert: Path, tmp_path: Path, family: str
) -> None:
    """Saving into a folder that holds other files leaves their modes alone: a private model in
    a subfolder, and the target of a linked weights file (e.g. in the Hub cache). The weights
    the save wrote, a decoder's LoRA adapters too, get the umask's mode."""
    from backbone_models import make_tiny
    from cselab.model.encoder import SentenceEncoder

    if family == "bert":
        model = SentenceEncoder.from_pretrained(str(tiny_bert))
    elif family == "modernbert":
        model = SentenceEncoder.from_pretrained(str(make_tiny(family, tmp_path / "mb")))
    else:
        folder = make_tiny("llama", tmp_path / "llama")
        model = SentenceEncoder.from_pretrained(str(folder), pooler="avg", lora={"r": 2})
    out = tmp_path / "models"
    (out / "private_model").mkdir(parents=True)
    private = out / "private_model" / "model.safetensors"
    private.write_bytes(b"x")
    private.chmod(0o600)
    elsewhere = tmp_path / "cache.safetensors"
    elsewhere.write_bytes(b"y")
    elsewhere.chmod(0o600)
    (out / "linked.safetensors").symlink_to(elsewhere)
    old = os.umask(0o022)
    try:
        model.save(out)
    finally:
        os.umask(old)
    weights = {p.name for p in out.glob("*.safetensors") if not p.is_symlink()}
    own = "adapter_model.safetensors" if family == "llama-lora" else "model.safetensors"
    assert own in weights  # and the [CLS] head's file where the pooler has one
    assert {(out / w).stat().st_mode & 0o777 for w in weights} == {0o644}
    assert private.stat().st_mode & 0o777 == 0o600
    assert elsewhere.stat().st_mode & 0o777 == 0o600
