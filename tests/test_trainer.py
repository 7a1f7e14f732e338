"""Trainer: determinism, resume after a kill, atomic checkpoints, divergence, model selection."""

from __future__ import annotations

import dataclasses
import json
import logging
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from conftest import write_corpus
from cselab.app.train import build_trainer
from cselab.config import load_config
from cselab.core.schema import ConfigError
from cselab.training import checkpoint as ckpt
from cselab.training.metrics import TrainingDiverged
from cselab.training.optim import linear_schedule


def tiny_config(tiny_bert: Path, tmp_path: Path, *extra: str):
    return load_config(
        None,
        [
            f"--model.name_or_path={tiny_bert}",
            f"--data.train_file={write_corpus(tmp_path)}",
            f"--data.cache_dir={tmp_path / 'cache'}",
            f"--train.output_dir={tmp_path / 'out'}",
            "--train.batch_size=8",
            "--train.max_steps=12",
            "--train.lr=1e-3",
            "--train.eval_steps=0",
            "--train.log_steps=2",
            *extra,
        ],
    )


def weights(folder: Path) -> dict[str, torch.Tensor]:
    """A saved model's weights, or its LoRA adapters' (an adapter folder holds only those)."""
    adapters = folder / "adapter_model.safetensors"
    return load_file(str(adapters if adapters.is_file() else folder / "model.safetensors"))


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


def test_same_seed_same_weights_and_logs(tiny_bert: Path, tmp_path: Path) -> None:
    r1 = build_trainer(tiny_config(tiny_bert, tmp_path / "a")).train()
    build_trainer(tiny_config(tiny_bert, tmp_path / "b")).train()
    assert_same_weights(tmp_path / "a/out/last", tmp_path / "b/out/last")
    assert r1["steps"] == 12 and r1["sentences_per_s"] > 0
    header = (tmp_path / "a/out/metrics.csv").read_text().splitlines()[0].split(",")
    assert {"step", "lr", "loss", "infonce", "sentences_per_s"} <= set(header)
    build_trainer(tiny_config(tiny_bert, tmp_path / "c", "--train.seed=1")).train()
    with pytest.raises(AssertionError):
        assert_same_weights(tmp_path / "a/out/last", tmp_path / "c/out/last")


@pytest.mark.parametrize("data", ["sentences", "pairs"])
def test_results_count_the_tokens_and_the_padding_trained_on(
    tiny_bert: Path, tmp_path: Path, data: str
) -> None:
    """``results.json``'s ``tokens_per_s`` and ``padding`` are those of the batches the run
    trained on: every sentence column's real tokens (anchors, positives, hard negatives, each
    once) over the training time, and the share of their padded positions that held padding,
    a resumed run's included (carried in its checkpoint)."""
    extra = []
    if data == "pairs":
        pairs = tmp_path / "pairs.csv"
        rows = ["anchor,positive,negative"] + [
            f"a man plays {'the guitar ' * (i % 4)}{i},someone plays {i},a cat sleeps {i}"
            for i in range(40)
        ]
        pairs.write_text("\n".join(rows) + "\n", encoding="utf-8")
        extra = [f"--data.train_file={pairs}"]
    trainer = build_trainer(tiny_config(tiny_bert, tmp_path / "a", *extra))
    real = padded = 0
    for step in range(12):
        counts = trainer.batch_for(step).inputs.token_counts()
        real, padded = real + counts[0], padded + counts[1]
    assert 0 < real < padded  # batches of different lengths pad
    results = trainer.train()
    totals = trainer.totals
    assert (totals.tokens, totals.padded_tokens) == (real, padded)
    assert results["padding"] == round(1 - real / padded, 4)
    assert results["tokens_per_s"] == round(real / totals.counted_s, 1)
    assert 0 < totals.counted_s == totals.train_s
    # stopped at step 6, as a killed run would be, and resumed: the same totals in the end
    stopped = build_trainer(tiny_config(tiny_bert, tmp_path / "b", *extra, "--train.save_steps=3"))
    stopped.loop = dataclasses.replace(stopped.loop, total_steps=6)
    stopped.train()
    assert stopped.totals.tokens < real
    resumed = build_trainer(
        tiny_config(
            tiny_bert, tmp_path / "b", *extra, "--train.save_steps=3", "--train.resume=true"
        )
    )
    again = resumed.train()
    assert (resumed.totals.tokens, resumed.totals.padded_tokens) == (real, padded)
    assert again["padding"] == results["padding"]


#: Objectives with state across steps (ESimCSE's queue and momentum encoder, Wu et al. 2022):
#: their state travels in the checkpoint, so a resume stays bit-exact.
STATEFUL_OBJECTIVES = {
    "simcse": [],
    "esimcse": [
        "--objective.word_repetition.enabled=true",
        "--objective.momentum_queue.enabled=true",
        "--objective.momentum_queue.queue_size=20",
        "--model.dropout=0.1",
    ],
    # PromptBERT's two templates (slow: its template-alone passes), and ESimCSE's state under
    # Matryoshka prefixes with the prompt pooler: every stateful part at once.
    "prompt": ["--model.pooler=prompt"],
    "esimcse_matryoshka_prompt": [
        "--objective.word_repetition.enabled=true",
        "--objective.momentum_queue.enabled=true",
        "--objective.momentum_queue.queue_size=20",
        "--objective.matryoshka.dims=[32,16]",
        "--model.pooler=prompt",
    ],
}
SLOW_RESUMES = {"prompt", "esimcse_matryoshka_prompt"}
#: Resumes on a tiny Llama with LoRA adapters: the adapters, their optimiser state and the
#: momentum encoder's averaged adapters travel in the checkpoint.
STATEFUL_OBJECTIVES["esimcse_llama_lora"] = [
    *STATEFUL_OBJECTIVES["esimcse"], "--model.lora.r=4", "--model.pooler=avg",
]  # fmt: skip
DECODER_RESUMES = {"esimcse_llama_lora"}


@pytest.mark.parametrize(
    "objective",
    [
        pytest.param(name, marks=pytest.mark.slow) if name in SLOW_RESUMES else name
        for name in sorted(STATEFUL_OBJECTIVES)
    ],
)
def test_resume_after_kill_gives_identical_weights(
    tiny_bert: Path, tmp_path: Path, objective: str
) -> None:
    """Kill a run with SIGKILL right after step 7 (checkpoint at 6), resume, compare."""
    extra = STATEFUL_OBJECTIVES[objective]
    if objective in DECODER_RESUMES:
        from backbone_models import make_tiny_decoder

        tiny_bert = make_tiny_decoder(tmp_path / "llama")
    ref = tiny_config(tiny_bert, tmp_path / "ref", "--train.save_steps=3", *extra)
    build_trainer(ref).train()
    run_dir = tmp_path / "killed"
    overrides = [
        f"--model.name_or_path={tiny_bert}",
        f"--data.train_file={write_corpus(run_dir)}",
        f"--data.cache_dir={run_dir / 'cache'}",
        f"--train.output_dir={run_dir / 'out'}",
        "--train.batch_size=8", "--train.max_steps=12", "--train.lr=1e-3",
        "--train.eval_steps=0", "--train.log_steps=2", "--train.save_steps=3", *extra,
    ]  # fmt: skip
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        import torch
        torch.set_num_threads({torch.get_num_threads()})  # this process's: the same reductions
        from cselab.config import load_config
        from cselab.app.train import build_trainer
        from cselab.training.trainer import Trainer
        original = Trainer.train_step
        def step_then_die(self, batch):
            terms = original(self, batch)
            if self.step == 6:  # 0-based count before increment: this is update number 7
                # step 6's checkpoint is written on a thread: let it land first (a kill during
                # that write is test_checkpoint_writes' kill-during-background-write test)
                self.run.writer.wait()
                os.kill(os.getpid(), signal.SIGKILL)
            return terms
        Trainer.train_step = step_then_die
        build_trainer(load_config(None, {overrides!r})).train()
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    _, meta = ckpt.load_checkpoint(run_dir / "out/checkpoint")
    assert meta["step"] == 6
    assert not (run_dir / "out/last").exists()
    resumed = build_trainer(load_config(None, [*overrides, "--train.resume=true"])).train()
    assert resumed["steps"] == 12
    assert_same_weights(tmp_path / "ref/out/last", run_dir / "out/last")
    steps = [
        int(r.split(",")[0]) for r in (run_dir / "out/metrics.csv").read_text().splitlines()[1:]
    ]
    assert steps == sorted(set(steps))  # rows of the killed run after step 6 were dropped


def test_crash_while_writing_keeps_previous_checkpoint(
    tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = build_trainer(tiny_config(tiny_bert, tmp_path, "--train.save_steps=3"))
    trainer.train()
    path = tmp_path / "out/checkpoint"
    _, meta = ckpt.load_checkpoint(path)

    def die(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ckpt.os, "replace", die)
    trainer.step = 99
    with pytest.raises(ckpt.CheckpointWriteError, match="disk full"):
        trainer.run.save_checkpoint(trainer.step, 0.0)
    _, again = ckpt.load_checkpoint(path)  # still the complete step-12 checkpoint
    assert again["step"] == meta["step"] == 12


def test_nan_loss_stops_naming_step_and_term(tiny_bert: Path, tmp_path: Path) -> None:
    trainer = build_trainer(tiny_config(tiny_bert, tmp_path, "--train.save_steps=2"))
    real = trainer.task.objective.forward

    def poisoned(views, ctx=None):
        terms = real(views, ctx)
        if trainer.step == 4:  # the 5th update
            terms["infonce"] = terms["infonce"] * float("nan")
        return terms

    trainer.task.objective.forward = poisoned
    with pytest.raises(TrainingDiverged, match=r"'infonce' is nan at step 5; the last good "
                       r"checkpoint is kept in .*checkpoint \(resume with --train.resume=true"):  # fmt: skip
        trainer.train()
    tensors, meta = ckpt.load_checkpoint(tmp_path / "out/checkpoint")
    assert meta["step"] == 4
    assert all(torch.isfinite(v).all() for k, v in tensors.items() if k.startswith("model."))


def test_nan_before_any_checkpoint_says_none_was_written(tiny_bert: Path, tmp_path: Path) -> None:
    trainer = build_trainer(tiny_config(tiny_bert, tmp_path, "--train.save_steps=100"))
    real = trainer.task.objective.forward
    trainer.task.objective.forward = lambda views, ctx=None: {
        k: v * float("nan") for k, v in real(views, ctx).items()
    }
    with pytest.raises(TrainingDiverged, match=r"at step 1; no checkpoint had been written yet"):
        trainer.train()
    assert not (tmp_path / "out/checkpoint").exists()


def test_best_model_is_kept(tiny_bert: Path, tmp_path: Path) -> None:
    config = tiny_config(tiny_bert, tmp_path, "--train.eval_steps=4")
    trainer = build_trainer(config)
    scores = iter([10.0, 30.0, 50.0, 40.0])  # steps 0, 4, 8, 12
    trainer.selection.evaluator = lambda encoder: next(scores)
    results = trainer.train()
    assert (results["best_step"], results["best_stsb_dev"], results["initial_stsb_dev"]) == (
        8,
        50.0,
        10.0,
    )
    saved = json.loads((tmp_path / "out/results.json").read_text())
    assert saved["best_step"] == 8
    with pytest.raises(AssertionError):  # best (step 8) differs from last (step 12)
        assert_same_weights(tmp_path / "out/best", tmp_path / "out/last")


def test_linear_schedule() -> None:
    f = linear_schedule(warmup=2, total=10)
    assert [round(f(s), 3) for s in (0, 1, 2, 6, 10)] == [0.5, 1.0, 1.0, 0.5, 0.0]


def test_bf16_autocast_on_cpu_trains(tiny_bert: Path, tmp_path: Path) -> None:
    trainer = build_trainer(
        tiny_config(tiny_bert, tmp_path, "--train.precision=bf16", "--train.max_steps=2")
    )
    assert trainer.amp_dtype == torch.bfloat16
    trainer.train()
    assert all(v.dtype == torch.float32 for v in weights(tmp_path / "out/last").values())


def fp16_trainer(tiny_bert: Path, folder: Path, init_scale: float, *extra: str):  # noqa: ANN201
    """A trainer in fp16 on the CPU (``GradScaler("cpu")``) whose scaler starts at
    ``init_scale`` (the default 2**16 never overflows on the tiny model)."""
    trainer = build_trainer(
        tiny_config(tiny_bert, folder, "--train.precision=fp16", "--train.device=cpu", *extra)
    )
    assert trainer.amp_dtype == torch.float16 and trainer.optim.scaler is not None
    trainer.optim.scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    return trainer


def test_fp16_overflow_skips_the_update_and_the_schedule(tiny_bert: Path, tmp_path: Path) -> None:
    """An overflowing fp16 step changes no weight, halves the scale and leaves the learning-rate
    schedule where it was; the next finite step updates."""
    trainer = fp16_trainer(tiny_bert, tmp_path, 2.0**127)  # loss · 2**127 overflows float32
    o = trainer.optim
    before = {k: v.clone() for k, v in trainer.encoder.state_dict().items()}
    trainer.forward_backward(trainer.batch_for(0))
    trainer.optimizer_step()
    assert o.scaler.get_scale() == 2.0**126 and o.skipped_steps == 1
    assert o.scheduler.last_epoch == 0  # the schedule did not advance
    assert all(torch.equal(before[k], v) for k, v in trainer.encoder.state_dict().items())
    o.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    trainer.forward_backward(trainer.batch_for(1))
    trainer.optimizer_step()
    assert o.skipped_steps == 1 and o.scheduler.last_epoch == 1
    assert any(not torch.equal(before[k], v) for k, v in trainer.encoder.state_dict().items())


def test_fp16_resume_keeps_the_scaler(
    tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fp16 on the CPU through a resume: the scale (lowered by four overflowing steps from
    2**20) travels in the checkpoint, so the resumed run skips no step the uninterrupted one did
    not, and ends with the same weights."""
    from cselab.training.trainer import Trainer

    ref = fp16_trainer(tiny_bert, tmp_path / "ref", 2.0**20, "--train.save_steps=3")
    ref.train()
    assert ref.optim.skipped_steps >= 1  # else the scale would not matter
    original = Trainer.train_step

    def stop_after_6(self: Trainer, batch: Any) -> Any:
        terms = original(self, batch)
        if self.step == 6:  # update 7: the checkpoint of step 6 is the last
            raise KeyboardInterrupt
        return terms

    monkeypatch.setattr(Trainer, "train_step", stop_after_6)
    with pytest.raises(KeyboardInterrupt):
        fp16_trainer(tiny_bert, tmp_path / "cut", 2.0**20, "--train.save_steps=3").train()
    monkeypatch.undo()
    resumed = fp16_trainer(
        tiny_bert, tmp_path / "cut", 2.0**20, "--train.save_steps=3", "--train.resume=true"
    )
    resumed.train()
    assert resumed.optim.scaler.get_scale() == ref.optim.scaler.get_scale()
    assert resumed.optim.scheduler.last_epoch == ref.optim.scheduler.last_epoch
    assert_same_weights(tmp_path / "ref/out/last", tmp_path / "cut/out/last")


def test_precision_auto_is_fp32_on_the_cpu_and_recorded(tiny_bert: Path, tmp_path: Path) -> None:
    """The default ``auto`` changes nothing on the CPU (fp32, as the old default), and what it
    resolved to is kept in results.json and the checkpoint."""
    config = tiny_config(tiny_bert, tmp_path, "--train.device=cpu", "--train.max_steps=2")
    assert config.train.precision == "auto"
    trainer = build_trainer(config)
    assert trainer.amp_dtype is None
    results = trainer.train()
    assert results["precision"] == "fp32"
    assert json.loads((tmp_path / "out/results.json").read_text())["precision"] == "fp32"
    _, meta = ckpt.load_checkpoint(tmp_path / "out/checkpoint")
    assert meta["extra"]["precision"] == "fp32"


@pytest.mark.parametrize("native", [True, False])
def test_precision_auto_on_a_cpu_with_native_bf16_says_bf16_is_faster(
    native: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``auto`` stays fp32 on every CPU; where bf16 is native (AVX512-BF16, AMX) its one log
    line says that ``train.precision=bf16`` is the faster choice, and elsewhere it does not."""
    from cselab.training import runtime

    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: native)
    with caplog.at_level(logging.INFO, logger="cselab"):
        assert runtime.autocast_dtype("auto", torch.device("cpu")) is None
    said = [r.getMessage() for r in caplog.records if "train.precision=auto" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("train.precision=auto: fp32 on cpu")
    assert ("train.precision=bf16 trains faster" in said[0]) is native


# ---------------------------------------------------------------------------------------------
# Never lose a run: the output folder and resuming
# ---------------------------------------------------------------------------------------------


def test_a_second_run_into_the_same_folder_is_refused_until_asked(
    tiny_bert: Path, tmp_path: Path
) -> None:
    build_trainer(tiny_config(tiny_bert, tmp_path, "--train.max_steps=2")).train()
    before = weights(tmp_path / "out/last")
    with pytest.raises(ConfigError) as err:
        build_trainer(tiny_config(tiny_bert, tmp_path, "--train.max_steps=2", "--train.seed=7"))
    message = str(err.value)
    assert f"train.output_dir={tmp_path / 'out'} already holds a run" in message
    assert "--train.resume=true" in message and "--train.overwrite=true" in message
    assert "\n" not in message
    for k, v in weights(tmp_path / "out/last").items():  # the refused run touched nothing
        assert torch.equal(v, before[k])
    build_trainer(
        tiny_config(
            tiny_bert, tmp_path, "--train.max_steps=2", "--train.seed=7", "--train.overwrite=true"
        )
    ).train()
    after = weights(tmp_path / "out/last")  # replaced: a different seed, different weights
    assert any(not torch.equal(v, before[k]) for k, v in after.items())


def test_resume_refuses_a_run_changing_key_and_names_both_values(
    tiny_bert: Path, tmp_path: Path
) -> None:
    build_trainer(tiny_config(tiny_bert, tmp_path, "--train.save_steps=3")).train()
    for changed, key, old, new in [
        ("--train.lr=2e-3", "train.lr", "0.001", "0.002"),
        ("--train.batch_size=4", "train.batch_size", "8", "4"),
        ("--objective.focal.enabled=true", "objective.focal.enabled", "False", "True"),
        ("--train.seed=3", "train.seed", "42", "3"),
    ]:
        with pytest.raises(ConfigError) as err:
            build_trainer(tiny_config(tiny_bert, tmp_path, "--train.resume=true", changed))
        assert f"{key}: {old} -> {new}" in str(err.value), str(err.value)
    # The same file name with other content is another corpus.
    config = tiny_config(tiny_bert, tmp_path, "--train.resume=true")  # (re)writes corpus.txt
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(corpus.read_text(encoding="utf-8") + "one more line\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"data\.train_file \(content sha256\): '[0-9a-f]{64}'"):
        build_trainer(config)


def test_resume_allows_bookkeeping_changes_and_keeps_the_initial_score(
    tiny_bert: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="cselab")
    config = tiny_config(
        tiny_bert, tmp_path, "--train.eval_steps=4", "--train.save_steps=4",
        "--train.overwrite=true",  # started so; its resume leaves it off, as resumes do
    )  # fmt: skip
    trainer = build_trainer(config)
    # stop at a checkpoint, as a killed run would
    trainer.loop = dataclasses.replace(trainer.loop, total_steps=8)
    scores = iter([10.0, 30.0, 20.0])  # steps 0, 4, 8
    trainer.selection.evaluator = lambda encoder: next(scores)
    trainer.train()
    resumed = build_trainer(
        tiny_config(
            tiny_bert,
            tmp_path,
            "--train.eval_steps=4",
            "--train.save_steps=4",
            "--train.log_steps=1",
            "--train.resume=true",
        )  # fmt: skip
    )
    assert "resuming with a changed setting: train.log_steps: 2 -> 1" in caplog.text
    # how a run starts, not what it trains: never reported (the first run had overwrite on)
    assert "train.resume: False" not in caplog.text
    assert "train.overwrite" not in caplog.text
    resumed.selection.evaluator = lambda encoder: 40.0  # step 12
    results = resumed.train()
    assert (results["initial_stsb_dev"], results["best_stsb_dev"], results["best_step"]) == (
        10.0,
        40.0,
        12,
    )


def test_both_warm_up_settings_use_the_steps_and_say_so(
    tiny_bert: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A config holding both (a saved one from before, or given so) warms up for the steps,
    said in one warning, rather than refused: saved folders must keep loading."""
    import logging

    config = tiny_config(tiny_bert, tmp_path, "--train.warmup_steps=2", "--train.warmup_ratio=0.5")
    with caplog.at_level(logging.WARNING, logger="cselab"):
        trainer = build_trainer(config)
    assert "train.warmup_steps=2 and train.warmup_ratio=0.5 both set: the warm-up is 2 steps" in (
        caplog.text
    )
    lrs = []
    for _ in range(3):
        lrs.append(trainer.optim.scheduler.get_last_lr()[0])
        trainer.optim.scheduler.step()
    assert lrs[:2] == pytest.approx([5e-4, 1e-3])  # lr 1e-3 reached at step 2, not 6
