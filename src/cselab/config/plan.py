"""The run plan: what a training run resolved once at its entry, kept in the run folder.

A config says what the user asked for (``train.precision: auto``, ``model.pooler: null``,
``eval.dev: stsb``, a training file); :class:`RunPlan` says what that became for this run: the
kind of the training data (decided when the file was opened), the dev set, the device and the
precision, the number of processes, the pooler, the encoder's width, Matryoshka's prefixes and
the validated ``objective`` section. ``cselab.app.plan.resolve`` builds it once; everything after
it (the trainer, model selection, the model card) reads the plan instead of deriving the same
fact again from config strings or from the disk. It is saved as one JSON file in the run folder
(:attr:`~cselab.io.runfolder.RunFolder.plan`), so the card of a saved model, written later by
``cselab evaluate --update-card``, reads the same facts. No torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..core.datakind import DataKind
from ..core.errors import DataFormatError
from ..core.schema import ConfigError, from_dict
from ..io.files import write_json_atomic
from ..io.readers import read_json
from ..io.runfolder import RunFolder
from ..model.choices import BATCH_SIZE
from ..objectives.config import ObjectiveConfig
from .devset import DevSet

#: what a plan file holds; a newer layout is refused by name rather than misread
PLAN_FORMAT = 1


@dataclass(frozen=True)
class RunPlan:
    """The facts of one training run, resolved once (see the module doc).

    Attributes:
        train_file: the training file as opened, an absolute path (a download name resolved
            to its file).
        kind: sentences, or pairs with ``K`` hard negatives (the data layer's decision).
        dev: the dev set of model selection (``None``: no dev set, ``eval.dev: none``); what
            the card names the score by, also when ``eval.enabled`` is off.
        device: this run's device (``cpu``, ``cuda:0``, ...; rank 0's for a run on several).
        precision: the precision it trains in, ``train.precision: auto`` resolved
            (``fp32``, ``bf16``, ``fp16``).
        world_size: the number of processes.
        pooler: the pooler, ``model.pooler: null`` resolved from the table of backbones and
            the model's ``config.json`` (``None``: the model folder's own pooler, known once
            the folder is opened).
        width: the backbone's hidden size from its ``config.json`` (``None``: not stated).
        matryoshka_dims: the prefixes the card and ``results.json`` score (empty: none).
        objective: the validated ``objective`` section (checked against ``kind`` when
            :func:`~cselab.objectives.build_objective` builds it).
        lora_targets: the modules LoRA adapters were put on, as the load chose them (the
            architecture's default unless ``model.lora.target_modules`` named them; ``None``:
            no adapters).
        bidirectional: whether a decoder's causal mask is removed, as the load resolved
            ``model.bidirectional`` (``null``: the starting folder's record, else causal).
        compile_mode: the ``torch.compile`` mode the encoder is trained through (``None``:
            eagerly), ``train.compile``/``train.compile_mode: null`` resolved for the device
            (:func:`cselab.app.plan.compile_mode`).
        eval_batch_size: the dev set's encoding batch, ``eval.batch_size: null`` resolved for
            the device and the dev set (:func:`cselab.app.plan.dev_encoding`).
        eval_precision: the precision the dev set is encoded in: the run's for STS pairs on a
            GPU, else ``fp32`` (:func:`cselab.app.plan.dev_encoding`).
    """

    train_file: str
    kind: DataKind
    dev: DevSet | None
    device: str
    precision: str
    world_size: int
    pooler: str | None
    width: int | None
    matryoshka_dims: tuple[int, ...]
    objective: ObjectiveConfig
    lora_targets: tuple[str, ...] | None = None
    bidirectional: bool = False
    compile_mode: str | None = None
    eval_batch_size: int = BATCH_SIZE
    eval_precision: str = "fp32"

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready values (what :meth:`save` writes)."""
        return {"format": PLAN_FORMAT, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "plan") -> RunPlan:
        """The plan :meth:`to_dict` gave; a file of another layout is one clear error."""
        if data.get("format") != PLAN_FORMAT:
            raise ConfigError(f"{where}: not a cselab run plan of format {PLAN_FORMAT}")
        dev = data["dev"]
        if dev is not None:
            columns = dev.get("columns")
            dev = DevSet(**{**dev, "columns": tuple(columns) if columns else None})
        return cls(
            train_file=str(data["train_file"]),
            kind=DataKind(**data["kind"]),
            dev=dev,
            device=str(data["device"]),
            precision=str(data["precision"]),
            world_size=int(data["world_size"]),
            pooler=data["pooler"],
            width=data["width"],
            matryoshka_dims=tuple(int(d) for d in data["matryoshka_dims"]),
            objective=from_dict(ObjectiveConfig, data["objective"], "objective"),
            lora_targets=as_lora_targets(data.get("lora_targets")),
            bidirectional=bool(data.get("bidirectional", False)),
            compile_mode=data.get("compile_mode"),
            # a plan saved before the dev encoding was resolved: the encoding it used
            eval_batch_size=int(data.get("eval_batch_size", cls.eval_batch_size)),
            eval_precision=str(data.get("eval_precision", cls.eval_precision)),
        )

    def save(self, folder: str | Path) -> Path:
        """Write the plan into the run folder ``folder`` (atomically); returns its path."""
        path = RunFolder(folder).plan
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, self.to_dict(), indent=2, what="run plan")
        return path

    @classmethod
    def load(cls, folder: str | Path) -> RunPlan | None:
        """The plan saved in the run folder ``folder``, or ``None`` if it holds none."""
        path = RunFolder(folder).plan
        data = read_json(path)
        if data is None:
            return None
        try:
            return cls.from_dict(data, str(path))
        except (KeyError, TypeError, ValueError) as err:
            raise DataFormatError(path, None, f"not a run plan ({err})") from None

    def how_it_ran(self) -> dict[str, Any]:
        """The resolved settings ``results.json`` reports: ``precision``, ``compile_mode``
        (``None``: eager) and ``eval_precision`` (the dev scores')."""
        return {
            "precision": self.precision,
            "compile_mode": self.compile_mode,
            "eval_precision": self.eval_precision,
        }

    def replace(self, **changes: Any) -> RunPlan:
        """A copy with ``changes`` (the frozen dataclass's ``replace``)."""
        return dataclasses.replace(self, **changes)


def as_lora_targets(value: Any) -> tuple[str, ...] | None:
    """LoRA's target modules as a plan keeps them: names, or one pattern (``peft`` takes a
    regular expression as a string); ``None``: no adapters."""
    if value is None:
        return None
    return (value,) if isinstance(value, str) else tuple(str(v) for v in value)


__all__ = ["PLAN_FORMAT", "RunPlan", "as_lora_targets"]
