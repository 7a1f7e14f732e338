"""Resumable checkpoints in one safetensors file, written atomically.

A checkpoint holds the model weights, the optimizer state, the scheduler state, every RNG state,
the data position (the step), the best dev score so far and the resolved config. Tensors go in
the safetensors body, everything else as JSON in its metadata: no pickle anywhere, so loading a
checkpoint never executes code. The file is written to a temporary name and ``os.replace``-d over
the previous one, so a crash or kill mid-write leaves the last complete checkpoint intact.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

CHECKPOINT_FILE = "checkpoint.safetensors"
FORMAT_VERSION = 1


def rng_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Every RNG the training step may use: torch CPU (+ CUDA), Python, NumPy."""
    tensors = {"rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = s
    py = random.getstate()
    np_state = np.random.get_state()
    meta = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
    }
    return tensors, meta


def set_rng_state(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["rng.torch"])
    cuda = sorted(k for k in tensors if k.startswith("rng.cuda."))
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensors[k] for k in cuda])
    py = meta["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    npst = meta["numpy"]
    np.random.set_state((npst[0], np.asarray(npst[1], dtype=np.uint32), *npst[2:]))


def _split_optimizer(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, Any] = {}
    for idx, per_param in state["state"].items():
        for key, value in per_param.items():
            name = f"optim.{idx}.{key}"
            if torch.is_tensor(value):
                tensors[name] = value
            else:
                scalars[name] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _join_optimizer(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for name, value in list(tensors.items()) + list(meta["scalars"].items()):
        if not name.startswith("optim."):
            continue
        _, idx, key = name.split(".", 2)
        state.setdefault(int(idx), {})[key] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def save_checkpoint(
    path: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    step: int,
    extra: dict[str, Any],
) -> Path:
    """Write ``path/checkpoint.safetensors`` atomically; returns the file path."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {
        f"model.{k}": v.detach().cpu().clone().contiguous() for k, v in model.state_dict().items()
    }
    opt_tensors, opt_meta = _split_optimizer(optimizer.state_dict())
    tensors.update({k: v.detach().cpu().contiguous() for k, v in opt_tensors.items()})
    rng_tensors, rng_meta = rng_state()
    tensors.update(rng_tensors)
    sched = {k: v for k, v in scheduler.state_dict().items() if k != "lr_lambdas"}
    meta = {
        "format": FORMAT_VERSION,
        "step": step,
        "optimizer": opt_meta,
        "scheduler": sched,
        "rng": rng_meta,
        "extra": extra,
    }
    target = folder / CHECKPOINT_FILE
    tmp = folder / (CHECKPOINT_FILE + ".tmp")
    save_file(tensors, str(tmp), metadata={"cselab": json.dumps(meta)})
    with open(tmp, "rb+") as fh:  # make the bytes durable before the rename publishes them
        os.fsync(fh.fileno())
    os.replace(tmp, target)
    return target


def load_checkpoint(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read tensors and metadata of ``path`` (a folder or the file itself)."""
    p = Path(path)
    file = p / CHECKPOINT_FILE if p.is_dir() else p
    with safe_open(str(file), framework="pt") as fh:
        meta = json.loads(fh.metadata()["cselab"])
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 - safe_open API
    if meta.get("format") != FORMAT_VERSION:
        raise ValueError(f"{file}: unsupported checkpoint format {meta.get('format')}")
    return tensors, meta


def restore(
    tensors: dict[str, torch.Tensor],
    meta: dict[str, Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
) -> None:
    """Load model, optimizer, scheduler and RNG states saved by :func:`save_checkpoint`."""
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    # Optimizer.load_state_dict moves each state tensor to its parameter's device itself.
    optimizer.load_state_dict(_join_optimizer(tensors, meta["optimizer"]))
    # LambdaLR stores its functions as ``lr_lambdas`` (None for plain functions); they are rebuilt
    # from the config, so only the counters travel.
    scheduler.load_state_dict(
        {"lr_lambdas": [None] * len(optimizer.param_groups), **meta["scheduler"]}
    )
    set_rng_state(tensors, meta["rng"])
