"""Run configuration: dataclasses, YAML files and ``--section.key=value`` overrides.

The defaults are unsupervised SimCSE's BERT-base recipe (Gao et al. 2021, Appendix A / the
authors' ``run_unsup_example.sh``): lr 3e-5, batch 64, one epoch, max_seq_len 32, τ 0.05, the
``cls`` pooler with ``mlp_only_train``, STS-B dev every 125 steps, seed 42.

The resolved config is saved in every checkpoint and output folder, so a run can be re-created
from its outputs alone.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import yaml

from ..core.devices import SCALER_TYPES, check_device
from ..core.errors import UserError
from ..core.prompts import model_prompts_from_data
from ..core.schema import ConfigError, check_kinds, from_dict
from ..data.config import DataConfig, is_pairs_source
from ..io.files import write_text_atomic
from ..io.readers import parse_yaml, read_text, reraise_as, yaml_dumper, yaml_loader
from ..model.config import ModelConfig
from ..objectives.config import ObjectiveConfig
from .devset import (  # noqa: F401 - re-exported
    DEV_COLUMNS,
    STSB,
    DevSet,
    check_sts_columns,
    dev_metric_for,
    resolve_dev_set,
)

ReportTo = Literal["tensorboard", "wandb", "mlflow"]
Precision = Literal["fp32", "bf16", "fp16", "auto"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune"]

#: the steps between two dev scores of model selection: SimCSE's (``run_unsup_example.sh``)
EVAL_STEPS = 125


@dataclass
class TrainConfig:
    """Optimisation, checkpointing and logging.

    Attributes:
        output_dir: where checkpoints, the best/last models, logs and results go.
        batch_size: sentences per step (global batch under DDP).
        lr: peak learning rate of AdamW.
        epochs: passes over the corpus.
        max_steps: stop after this many steps (overrides epochs when set).
        warmup_steps / warmup_ratio: linear warm-up, then linear decay to 0 (the steps when both are set).
        weight_decay: AdamW weight decay (SimCSE uses 0).
        grad_clip: max gradient norm (``0`` disables).
        seed: seeds Python, NumPy and torch; same seed and config give the same weights on CPU.
        precision: ``auto`` (default: bf16 autocast on GPUs that support it, fp32 with TF32
            matrix products on older GPUs, fp32 on the CPU; what it resolved to is logged and
            kept in ``results.json``), ``fp32``, ``bf16`` (autocast, also on CPU) or ``fp16``
            (autocast with loss scaling; meant for GPUs, allowed on the CPU to test the path).
        device: ``auto``, ``cpu``, ``cuda``, ``cuda:1``, ...
        eval_steps: the dev score every this many steps (and at the end), the best model kept
            as ``best/``; 0 disables. ``null`` (the default): :data:`EVAL_STEPS`, or 0 under
            ``objective.mntp``, which does not train for similarity: its last step is kept
            (:attr:`Config.eval_cadence`).
        save_steps: write a resumable checkpoint every this many steps (0: every
            ``save_minutes`` instead). Checkpoints do not follow evaluations: ``best/`` is saved
            whenever the dev score improves, the checkpoint on its own cadence.
        save_minutes: with ``save_steps`` 0, write a resumable checkpoint when this many minutes
            have passed since the last one (checked at the logged steps), and always at the
            end; 0: only at the end, so a kill loses the whole run. Checkpoints are written on
            a background thread from a copy in host memory: the step waits for the copy only.
        log_steps: write a metrics row every this many steps.
        resume: continue from ``output_dir/checkpoint`` if present (its config must match in
            every key that changes the run; see :mod:`cselab.training.rundir`).
        overwrite: replace a previous run in ``output_dir`` (nothing of it is kept). Without
            ``resume`` or ``overwrite`` a folder holding a run is refused.
        cache_chunk_size: GradCache chunk size in sentences (``null``: no caching).
        gradient_checkpointing: keep only each layer's input in the forward and recompute the
            layer in the backward (the backbone's ``gradient_checkpointing_enable``, non-reentrant,
            so dropout draws the same masks again): far less activation memory for about a
            third more compute. Runs the plain padded forward (no CPU packing).
        compile: wrap the encoder in ``torch.compile``
            (:func:`cselab.model.encoder.compile_encoder`: the packed CPU forward, attention
            operator included, is one graph, its backward another). ``null`` (the default):
            decided per run (:func:`cselab.app.plan.compile_mode`): eager for now, on the CPU
            and on GPUs (the encoder in CUDA graphs is to become a GPU's default once its
            equality with the eager step is shown on a GPU: ``docs/results/gpu_benchmark.md``).
        compile_mode: ``torch.compile``'s mode with ``compile``: ``default`` (Inductor, dynamic
            shapes: one compile for every batch shape), ``max-autotune`` or ``reduce-overhead``
            (CUDA graphs: the step's kernels replayed without the host launching each, for
            GPUs whose eager step waits for the host). With ``reduce-overhead`` the shapes are
            fixed: every batch is padded to a multiple of 16 tokens (few widths, each captured
            once) and the graph is compiled per shape. ``null``: ``default``. A mode given
            with ``compile: null`` compiles.
        fused_adamw: use the fused AdamW kernel where available.
        push_to_hub: a Hugging Face Hub repo id; at the end of training the best model is
            uploaded there (:mod:`cselab.publish`; ``HF_TOKEN`` and ``HF_ENDPOINT`` honoured).
        dist_timeout_s: under ``torchrun``, how long (seconds) a rank may wait in a collective
            before the process group aborts: rank 0 evaluates and saves ``best/`` while the
            others wait (PyTorch's NCCL default is 10 minutes); tokenising happens before the
            group forms, the other ranks waiting on the token cache's file lock.
        report_to: experiment loggers, any of ``tensorboard`` (``output_dir/tensorboard``),
            ``wandb``, ``mlflow`` (see :mod:`cselab.training.callbacks`); ``[]`` for none;
            ``null`` (the default): ``tensorboard`` when it is installed, else none.
        save_merged: with ``model.lora``, also write ``output_dir/merged``: the best model with
            its adapters merged into the weights, a plain model folder (as ``cselab merge``);
            ``best/`` and ``last/`` keep the adapters.
    """

    output_dir: str = "outputs/run"
    batch_size: int = 64
    lr: float = 3e-5
    epochs: int = 1
    max_steps: int | None = None
    warmup_steps: int = 0
    warmup_ratio: float = 0.0
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 42
    precision: Precision = "auto"
    device: str = "auto"
    eval_steps: int | None = None
    save_steps: int = 0
    save_minutes: float = 10.0
    log_steps: int = 10
    resume: bool = False
    overwrite: bool = False
    cache_chunk_size: int | None = None
    gradient_checkpointing: bool = False
    compile: bool | None = None
    compile_mode: CompileMode | None = None
    fused_adamw: bool = True
    push_to_hub: str | None = None
    dist_timeout_s: float = 7200.0
    report_to: list[ReportTo] | None = None
    save_merged: bool = False

    @property
    def compile_asked(self) -> bool | None:
        """``compile`` as asked: ``True``/``False``, or ``None`` (``null`` with no mode
        given), which the run decides (:func:`cselab.app.plan.compile_mode`). A
        ``compile_mode`` given with ``compile: null`` asks for a compile."""
        if self.compile is None and self.compile_mode is not None:
            return True
        return self.compile


@dataclass
class EvalConfig:
    """Model selection during training.

    Attributes:
        data_dir: SentEval ``data/downstream`` folder (default: ``$CSELAB_DATA`` or user cache).
        batch_size: encoding batch size for the dev set; ``null`` (the default): 1024 for
            STS-B dev on a GPU (its short sentences in a few large batches: a GPU's dev
            evaluation waits on the host launching each batch's kernels), else 128; a resumed
            run keeps its own (:func:`cselab.app.plan.dev_encoding`).
        enabled: evaluate during training (STS-B dev Spearman, ×100; best checkpoint kept).
        dev: what model selection scores: ``stsb`` (STS-B dev, as SimCSE), the path of your own
            STS-format pairs (``.tsv``/``.csv`` with a header, ``.jsonl``, or a ``datasets``
            ``save_to_disk`` folder; see :mod:`cselab.evaluation.custom`), a BEIR retrieval
            folder (``corpus.jsonl``, ``queries.jsonl``, ``qrels/dev.tsv``; see
            :mod:`cselab.evaluation.retrieval`), or ``none`` (no selection: the last model is kept).
        dev_metric: for STS pairs ``spearman`` or ``pearson`` correlation of cosine vs the gold
            score (×100); for a BEIR folder ``ndcg@K``, ``mrr@K``, ``recall@K`` or ``map@K``
            (×100; K one of 1, 3, 5, 10, 20, 50, 100, 1000). Default: ``spearman``, or
            ``ndcg@10`` for a BEIR folder.
        dev_columns: the two sentence columns and the score column of a ``dev`` file.
    """

    data_dir: str | None = None
    batch_size: int | None = None
    enabled: bool = True
    dev: str = STSB
    dev_metric: str | None = None
    dev_columns: list[str] = field(default_factory=lambda: list(DEV_COLUMNS))


def compile_with_denoising() -> ConfigError:
    """The refusal of a compiled run with PromptBERT's template denoising: the template-alone
    pass groups the batch's rows by their template id (a value read from the data), which
    ``torch.compile`` cannot trace as one graph."""
    return ConfigError(
        "train.compile=true does not support model.pooler=prompt with "
        "model.prompt.denoise=true (template denoising reads the batch's template ids); "
        "train eagerly (train.compile=false) or set model.prompt.denoise=false"
    )


@dataclass
class Config:
    """A complete run: ``model``, ``data``, ``objective``, ``train``, ``eval`` sections."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def eval_cadence(self) -> int:
        """``train.eval_steps`` with ``null`` resolved: :data:`EVAL_STEPS`, or 0 (no model
        selection, the last step kept) under ``objective.mntp``: a dev score of similarity
        would pick an MNTP model by what it does not train for, as often as not its start."""
        steps = self.train.eval_steps
        if steps is not None:
            return steps
        return 0 if self.objective.mntp.enabled else EVAL_STEPS

    @classmethod
    def from_sections(cls, data: Mapping[str, Any]) -> Config:
        """The checked config of ``data``, its sections as a YAML file holds them
        (``{"train": {"lr": 3e-5}}``; a wrong key or value is named; ``data`` is not changed)."""
        return from_dict(cls, copy.deepcopy(dict(data))).validate()

    def validate(self) -> Config:
        """Check value ranges; raises :class:`ConfigError` naming the key. A config built in
        Python has its kinds and choices checked as a file's are (it skipped the loader), and
        keeps its values as the loader gives them: a ``Path`` as text, a numpy number as
        Python's (so it is saved as YAML, and compares equal to the file's)."""
        for f in fields(self):
            kind, section = type(f.default_factory()), getattr(self, f.name)  # type: ignore[misc]
            if not isinstance(section, kind):
                raise ConfigError(
                    f"{f.name}: expected a {kind.__name__}, got {section!r}; pass "
                    f"{kind.__name__}(...) or read the config with load_config"
                )
        loaded = check_kinds(self, "")
        for f in fields(self):
            setattr(self, f.name, getattr(loaded, f.name))
        t, m = self.train, self.model
        checks = [
            (t.batch_size >= 2, "train.batch_size must be >= 2 (in-batch negatives need a pair)"),
            # an empty one (an unset shell variable) would be the working directory
            (str(t.output_dir).strip() != "", "train.output_dir is empty: name the run's folder"),
            (t.lr > 0, "train.lr must be > 0"),
            (t.epochs >= 1, "train.epochs must be >= 1"),
            (t.max_steps is None or t.max_steps >= 1, "train.max_steps must be >= 1"),
            (t.warmup_steps >= 0, "train.warmup_steps must be >= 0"),
            (0 <= t.warmup_ratio < 1, "train.warmup_ratio must be in [0, 1)"),
            (t.grad_clip >= 0, "train.grad_clip must be >= 0"),
            (t.eval_steps is None or t.eval_steps >= 0, "train.eval_steps must be >= 0"),
            (t.save_steps >= 0, "train.save_steps must be >= 0"),
            (t.save_minutes >= 0, f"train.save_minutes={t.save_minutes} must be >= 0"),
            (t.dist_timeout_s > 0, "train.dist_timeout_s must be > 0"),
            (t.log_steps >= 1, "train.log_steps must be >= 1"),
            (
                t.cache_chunk_size is None or t.cache_chunk_size >= 1,
                "train.cache_chunk_size must be >= 1 or null",
            ),
            (m.max_seq_len >= 2, "model.max_seq_len must be >= 2"),
            (m.dropout is None or 0 <= m.dropout < 1, "model.dropout must be in [0, 1)"),
            (
                self.eval.batch_size is None or self.eval.batch_size >= 1,
                "eval.batch_size must be >= 1",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        check_sts_columns(self.eval.dev_columns, "eval.dev_columns")  # as the file is read
        m.lora.validate()
        pairs = is_pairs_source(self.data.train_file, self.data.format)
        # the data's prompts checked first: the model's default may name one saved from them
        m.validate_prompts(model_prompts_from_data(self.data.check_prompts(pairs), pairs))
        if self.data.prompts and not m.pool_prompt and self.objective.word_repetition.enabled:
            raise ConfigError(
                "model.pool_prompt=false with objective.word_repetition: the repeated copy's "
                "tokens no longer line up with the prompt's; pool the prompt or drop repetition"
            )
        if m.dtype == "bfloat16" and not m.lora.enabled:
            # AdamW's update (lr 3e-5) is below half a bf16 step of most weights: they stay put
            raise ConfigError(
                "model.dtype=bfloat16 without LoRA (model.lora.r=0): AdamW's small steps round "
                "away on bf16 weights, so almost nothing trains; use train.precision: bf16 "
                "(autocast, float32 weights) or LoRA adapters (model.lora.r > 0)"
            )
        if t.cache_chunk_size and self.objective.mntp.enabled:
            raise ConfigError(
                "train.cache_chunk_size (GradCache) caches sentence vectors for in-batch "
                "negatives; objective.mntp predicts tokens and has none: leave it null"
            )
        if t.save_merged and not m.lora.enabled:
            raise ConfigError(
                "train.save_merged=true merges LoRA adapters, but model.lora.r is 0 (no adapters)"
            )
        if m.pooler == "prompt":
            m.prompt.validate()
            if not m.mlp_only_train:
                raise ConfigError(
                    "model.mlp_only_train must be true with model.pooler=prompt: PromptBERT's MLP "
                    "head is used in training only (the authors' unsupervised recipe), and "
                    "sentence-transformers and the transformers recipe read the [MASK] state alone"
                )
            if t.compile_asked and m.prompt.denoise:
                raise compile_with_denoising()
        dev_metric_for(self.eval.dev, self.eval.dev_metric)  # None stays: resolved where used
        _check_device(t.device)
        if t.device != "auto":  # auto is resolved, and checked, when the run starts
            check_precision(t.precision, t.device.partition(":")[0], f"train.device={t.device}")
        # The kind of data as far as the config can tell (pairs or not; the hard negatives are
        # known once the file is read): impossible combinations fail here, naming the key.
        self.objective.validate(pairs=is_pairs_source(self.data.train_file, self.data.format))
        mntp = self.objective.mntp
        if mntp.enabled and mntp.mask_ratio * t.batch_size * m.max_seq_len < 1:
            # fewer than one chosen token per batch on average: most steps score nothing and the
            # adapters do not move (a ratio in the section's range, checked just above)
            raise ConfigError(
                f"objective.mntp.mask_ratio={mntp.mask_ratio:g} chooses "
                f"{mntp.mask_ratio * t.batch_size * m.max_seq_len:.2g} tokens per batch of "
                f"train.batch_size={t.batch_size} x model.max_seq_len={m.max_seq_len} tokens, "
                "so MNTP has almost nothing to predict; use at least "
                f"{1 / (t.batch_size * m.max_seq_len):.2g} (LLM2Vec: 0.2)"
            )
        self.__dict__["_checked"] = _fingerprint(self)
        return self

    def checked(self) -> Config:
        """This config, validated unless exactly these values were validated already: the
        entry points call it, so a config read by :func:`load_config` is not checked (and the
        disk not read) a second time when the run starts, while one changed since is."""
        if self.__dict__.get("_checked") != _fingerprint(self):
            self.validate()
        return self


def _fingerprint(config: Config) -> str:
    """Every value of ``config``, as one string (what :meth:`Config.checked` compares)."""
    return repr(asdict(config))


def check_precision(precision: str, device_type: str, device: str | None = None) -> None:
    """``train.precision`` on a device of type ``device_type`` (``cpu``, ``cuda``, ...): fp16
    needs loss scaling, which PyTorch's ``GradScaler`` offers on CUDA and on the CPU (there it
    is slow, emulated fp16, and serves to test the fp16 path: skipped steps, the scale, resume).
    Checked for an explicit ``train.device`` when the config is read, and for the device
    ``auto`` resolved to when the run starts.

    Raises:
        ConfigError: naming the key and ``device`` (default: ``device_type``).
    """
    if precision == "fp16" and device_type not in SCALER_TYPES:
        raise ConfigError(
            f"train.precision=fp16 needs a CUDA GPU or the CPU (loss scaling), not "
            f"{device or device_type}; use bf16 or fp32"
        )


def _check_device(name: str) -> None:
    """``train.device`` is ``auto`` or a device name (:func:`~cselab.core.devices.check_device`)."""
    try:
        check_device(name, auto=True)
    except ConfigError as err:
        raise ConfigError(f"train.device: {err}") from None


def _parse_scalar(text: str) -> Any:
    """Parse an override value as a config file's value is read (:func:`~cselab.io.readers.
    yaml_loader`: ``1e-5`` → float, ``null``, ``true``...); text that is not valid YAML
    (``runs/[a``) is taken as the string it is."""
    try:
        return yaml.load(text, Loader=yaml_loader()) if text.strip() else ""  # noqa: S506
    except (yaml.YAMLError, RecursionError):  # RecursionError: deep nesting
        return text


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides (a leading ``--`` is accepted) to nested dicts."""
    for item in overrides:
        text = item[2:] if item.startswith("--") else item
        if "=" not in text:
            raise ConfigError(f"override {item!r} is not of the form --section.key=value")
        path, raw = text.split("=", 1)
        parts = [p for p in path.split(".") if p]
        if not parts:
            raise ConfigError(f"override {item!r} names no key")
        node = data
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                # e.g. a section currently set to null: replace it by a mapping.
                child = node[part] = {}
            node = child
        node[parts[-1]] = _parse_scalar(raw)
    return data


def load_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping of sections in a YAML config file (one-line errors for a missing or bad file)."""
    p = Path(path)
    # the readers' words for a missing file, a folder, bad UTF-8, a .gz, bad YAML
    with reraise_as(ConfigError):
        data = parse_yaml(read_text(p, what="config file"), p) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of sections")
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | str | None = None) -> Config:
    """Read a YAML config (optional: a file, or a preset's name as ``cselab train`` takes it,
    :func:`~cselab.config.presets.find_preset`), apply overrides, build and validate a
    :class:`Config`.

    A key or value of the file that is refused names the file first (``bad.yaml: unknown
    config key 'train.batch_sise' ...``): an error the file gives on its own too, without the
    overrides."""
    from .presets import find_preset

    data = load_yaml(find_preset(os.fspath(path))) if path is not None else {}
    # one override is one, not a list of its characters
    given = [overrides] if isinstance(overrides, str) else list(overrides or [])
    merged = apply_overrides(copy.deepcopy(data), given)
    try:
        return Config.from_sections(merged)
    except ConfigError as err:
        if path is None or type(err) is not ConfigError or not _file_refuses(data, err, overrides):
            raise
        raise ConfigError(f"{path}: {err}") from None


def _file_refuses(data: dict[str, Any], err: ConfigError, overrides: list[str] | None) -> bool:
    """Whether the config file's ``data`` alone gives ``err`` (no overrides: it does)."""
    if not overrides:
        return True
    try:
        Config.from_sections(data)
    except UserError as alone:  # the file alone may fail otherwise (a missing train_file...)
        return str(alone) == str(err)
    return False


def save_config(config: Config, path: str | Path) -> None:
    """Write ``config`` as YAML to ``path`` atomically (a failed write keeps the old file)."""
    text = yaml.dump(config.to_dict(), Dumper=yaml_dumper(), sort_keys=False)
    write_text_atomic(path, text, "config")
