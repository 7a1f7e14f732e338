"""An objective owns its token-level views: the task calls its ``setup`` once and its
``prepare`` once per step, knows no paper by name, and GradCache sees the prepared batch."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from cselab.data.inputs import StepInputs
from cselab.objectives import InfoNCE, InputPart, Objective, ObjectiveContext, PrepareContext
from cselab.training.gradcache import cached_forward_backward
from cselab.training.task import Batch, Task
from scaleout_helpers import tiny_batch, tiny_encoder

SRC = Path(__file__).resolve().parents[1] / "src" / "cselab"


class SwapFirstToken(InputPart):
    """A DiffCSE-like corruption: the positive is the sentence with its first real token
    replaced by a token drawn per global row from the step's seed."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[PrepareContext] = []
        self.vocab = 0

    def setup(self, tokenizer: object) -> None:
        self.vocab = len(tokenizer)  # type: ignore[arg-type]

    def prepare(self, inputs: StepInputs, ctx: PrepareContext) -> StepInputs:
        self.calls.append(ctx)
        ids = inputs.anchors["input_ids"].clone()
        for i in range(len(inputs)):
            gen = torch.Generator().manual_seed(ctx.step_seed + ctx.offset + i)
            ids[i, 1] = int(torch.randint(self.vocab, (1,), generator=gen))
        return inputs.replace(positives={**inputs.anchors, "input_ids": ids})


def test_the_task_runs_the_objective_s_own_prepare_once_per_step(tiny_bert: Path) -> None:
    enc = tiny_encoder(tiny_bert)
    part = SwapFirstToken()
    task = Task(enc, InfoNCE(0.05, inputs=[part]), seed=3)
    assert part.vocab == len(enc.tokenizer)  # setup ran once, with the encoder's tokenizer
    batch = Batch(5, tiny_batch(enc, 8))
    prepared = task.prepare(batch)
    positives = prepared.inputs.positives["input_ids"]
    assert not torch.equal(positives, batch.inputs.anchors["input_ids"])
    assert torch.equal(positives[:, 2:], batch.inputs.anchors["input_ids"][:, 2:])
    assert task.prepare(prepared) is prepared  # the trainer's prepared batch: not again
    terms = task(prepared)
    chunked = cached_forward_backward(task, prepared, 3)
    assert len(part.calls) == 1 and part.calls[0].offset == 0
    assert torch.isfinite(terms["infonce"]) and set(chunked) == {"infonce"}
    # the views were encoded from the prepared positives: z2 differs from z1 without dropout
    views = task.encode(prepared.inputs)
    assert not torch.allclose(views["z1"], views["z2"])
    # rank 1 of two draws the global rows 4..7: the same positives as the whole batch's
    rank1 = Task(enc, InfoNCE(0.05, inputs=[SwapFirstToken()]), ObjectiveContext(offset=4), seed=3)
    local = rank1.prepare(Batch(5, {k: v[4:] for k, v in batch.inputs.anchors.items()}))
    assert torch.equal(local.inputs.positives["input_ids"], positives[4:])


def test_the_base_objective_and_the_task_know_no_paper() -> None:
    """The base class carries no paper's data knob; the task names no paper's key, part or
    module (its docstrings may cite them)."""
    for knob in ("positive_repetition", "masked_token_rate", "encoder_momentum", "mask_token"):
        assert not hasattr(Objective, knob), knob
    code = re.sub(r'"""[\s\S]*?"""|#.*', "", (SRC / "training" / "task.py").read_text())
    for word in ("repetition", "repeat", "mask_token", "masking", "mntp", "esimcse", "dup_rate"):
        assert word not in code.lower(), word
