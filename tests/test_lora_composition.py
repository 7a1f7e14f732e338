"""Every objective composes with a decoder backbone with LoRA adapters; the momentum encoder
averages only the adapters."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from backbone_models import make_tiny_decoder
from conftest import make_tiny_bert
from cselab.app.train import build_trainer
from cselab.model.encoder import SentenceEncoder
from cselab.training.momentum import MomentumEncoder
from test_lora import lora_config

#: each objective of cselab, as overrides (two steps each on a tiny decoder with LoRA)
COMPOSITIONS = {
    "simcse": [],
    "focal": ["--objective.focal.enabled=true"],
    "gaussian": ["--objective.gaussian.enabled=true"],
    "off_dropout": ["--objective.off_dropout.enabled=true"],
    "dcl": ["--objective.dcl.enabled=true"],
    "barlow_twins": ["--objective.barlow_twins.enabled=true"],
    "mixcse": ["--objective.mixcse.enabled=true"],
    "esimcse": [
        "--objective.word_repetition.enabled=true",
        "--objective.momentum_queue.enabled=true",
        "--objective.momentum_queue.queue_size=16",
    ],
    "matryoshka": ["--objective.matryoshka.dims=[32,16]"],
    "gradcache": ["--train.cache_chunk_size=4"],
    "esimcse_gradcache_matryoshka": [
        "--objective.word_repetition.enabled=true",
        "--objective.momentum_queue.enabled=true",
        "--objective.momentum_queue.queue_size=16",
        "--objective.matryoshka.dims=[32,16]",
        "--train.cache_chunk_size=4",
    ],
}


@pytest.fixture(scope="module")
def decoders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("decoders")
    models = {f: make_tiny_decoder(root / f, family=f) for f in ("llama", "qwen2")}
    return {**models, "bert": make_tiny_bert(root / "bert")}  # the control (packed CPU path)


@pytest.mark.parametrize("family", ["llama", "qwen2", "bert"])
@pytest.mark.parametrize("objective", sorted(COMPOSITIONS))
def test_objective_composes_with_a_decoder_and_lora(
    decoders: dict[str, Path], tmp_path: Path, objective: str, family: str
) -> None:
    config = lora_config(
        decoders[family], tmp_path, "--train.max_steps=2", *COMPOSITIONS[objective]
    )
    trainer = build_trainer(config)
    named = dict(trainer.encoder.named_parameters())
    before = {k: v.detach().clone() for k, v in named.items()}
    results = trainer.train()
    assert results["steps"] == 2
    changed = {k for k, v in named.items() if not torch.equal(v.detach(), before[k])}
    assert changed and all(".lora_" in k for k in changed)  # the base model never moves
    if trainer.task.momentum is not None:  # ESimCSE: adapters averaged, no copy of the base
        momentum = trainer.task.momentum
        assert momentum.shell.backbone is trainer.encoder.backbone
        assert set(momentum.state_dict()) == {
            k.removeprefix("backbone.") for k in named if ".lora_" in k
        }


def test_momentum_averages_the_adapters_only(tmp_path: Path) -> None:
    """θ_m ← m·θ_m + (1 - m)·θ on the adapters; the momentum view is the live backbone run with
    the averaged adapters, dropout off."""
    folder = make_tiny_decoder(tmp_path / "llama")
    enc = SentenceEncoder.from_pretrained(str(folder), pooler="avg", lora={"r": 4}).train()
    adapters = {k: p for k, p in enc.backbone.named_parameters() if p.requires_grad}
    inputs = enc.tokenize(["alpha beta gamma", "delta epsilon"])
    momentum = MomentumEncoder(enc, 0.75)
    start = {k: p.detach().clone() for k, p in adapters.items()}
    with torch.no_grad():
        for p in adapters.values():
            p.add_(torch.randn_like(p))
    momentum.update()
    for k, p in adapters.items():
        torch.testing.assert_close(momentum.averaged[k], 0.75 * start[k] + 0.25 * p.detach())
    # the reference: a plain copy of the model holding the averaged adapters, in eval mode
    import copy

    ref = copy.deepcopy(enc).eval()
    with torch.no_grad():
        for k, p in ref.backbone.named_parameters():
            if k in momentum.averaged:
                p.copy_(momentum.averaged[k])
        want = ref(**inputs)
    got = momentum(inputs)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    with torch.no_grad():
        live = enc.eval()(**inputs)
    assert (got - live).abs().max() > 1e-4  # the averaged adapters differ from the live ones


def test_two_ranks_with_lora_and_esimcse_train_like_one_process(tmp_path: Path) -> None:
    """``torchrun --nproc_per_node=2`` (batch 8 = 2 × 4) on a float64 Llama with LoRA and
    ESimCSE (the queue gathered over ranks, the momentum encoder averaging the adapters on each
    rank) gives the adapters of one process with batch 8. No dropout anywhere (the ranks draw
    their own masks), so the two runs compute the same thing."""
    import os
    import subprocess
    import sys

    from safetensors.torch import load_file

    from cselab.app.train import train
    from cselab.config import load_config
    from test_distributed import WEIGHT_TOL, corpus, free_port, overrides

    llama = make_tiny_decoder(tmp_path / "llama", dtype=torch.float64)
    data = corpus(tmp_path / "data")
    extra = [
        "--model.lora.r=4", "--model.lora.dropout=0.0",
        "--objective.word_repetition.enabled=true", "--objective.momentum_queue.enabled=true",
        "--objective.momentum_queue.queue_size=8", "--objective.momentum_queue.momentum=0.5",
    ]  # fmt: skip
    ddp_run, single_run = tmp_path / "ddp", tmp_path / "single"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        "-m", "cselab", "-q", "train", *overrides(llama, ddp_run, data, *extra),
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    train(load_config(None, overrides(llama, single_run, data, *extra)))
    a = load_file(str(ddp_run / "out/last/adapter_model.safetensors"))
    b = load_file(str(single_run / "out/last/adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(v.dtype == torch.float64 for v in a.values())
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=WEIGHT_TOL, msg=k)
    assert any(v.abs().max() > 0 for k, v in a.items() if "lora_B" in k)  # they trained
