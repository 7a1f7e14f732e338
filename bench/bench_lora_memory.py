"""Benchmark: the memory of a SimCSE training step with and without LoRA (and gradient
checkpointing), on a random model of a Qwen2-0.5B shape.

Each side runs in a fresh process (``harness.run_worker``), so its peak resident set is its own:
a random ``Qwen2Model`` of the chosen shape (Qwen2-0.5B's by default: hidden 896, 24 layers,
14 heads, 2 key/value heads, MLP 4864, vocabulary 151,936), cselab's ``avg`` pooler, unsupervised
SimCSE (two dropout views, InfoNCE) and AdamW, ``--steps`` steps on random token ids of
``--batch-size`` × ``--max-seq-len``. Sides:

* ``full``: every weight trains;
* ``lora``: ``model.lora`` with rank ``--lora-r`` on LLM2Vec's targets (cselab's default);
* ``full+gc``, ``lora+gc``: the same with the backbone's gradient checkpointing (transformers'
  ``gradient_checkpointing_enable``, non-reentrant).

Reported per side: the bytes of the parameters, of the trainable ones, of their gradients and of
AdamW's state (counted from the tensors: exact on any machine), the peak resident set
(``VmHWM``: includes the activations and allocator slack, so it depends on the machine and its
load) and, on a GPU, ``torch.cuda.max_memory_allocated``.

    nice python bench/bench_lora_memory.py                       # Qwen2-0.5B shape, CPU
    python bench/bench_lora_memory.py --device cuda              # on a GPU
    python bench/bench_lora_memory.py --smoke                    # tiny shape, for the test
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import harness

SIDES = ("full", "lora", "full+gc", "lora+gc")
#: Qwen2-0.5B's shape (its config.json), and a tiny one for the smoke test
SHAPES = {
    "qwen2-0.5b": dict(
        hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        intermediate_size=4864, vocab_size=151936, max_position_embeddings=32768,
    ),
    "tiny": dict(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        intermediate_size=64, vocab_size=1000, max_position_embeddings=128,
    ),
}  # fmt: skip
MIB = 1 << 20


def tensor_bytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def worker(args: argparse.Namespace) -> None:
    """One side, in this process: build, train ``args.steps`` steps, reply the figures."""
    import torch
    from transformers import Qwen2Config, Qwen2Model

    from cselab.model.config import LoRAConfig
    from cselab.model.lora import add_adapters
    from cselab.model.pooling import Pooler
    from cselab.model.sentence_encoder import SentenceEncoder
    from cselab.objectives import ObjectiveConfig, build_objective, total_loss
    from cselab.training.task import Batch, Task

    side, device = args.worker, torch.device(args.device)
    torch.manual_seed(0)
    config = Qwen2Config(**SHAPES[args.shape], attention_dropout=0.1)  # SimCSE needs noise
    backbone = Qwen2Model(config)
    if side.endswith("+gc"):
        backbone.gradient_checkpointing_enable({"use_reentrant": False})
    if side.startswith("lora"):
        backbone = add_adapters(backbone, LoRAConfig(r=args.lora_r), base=None)
    encoder = SentenceEncoder(
        backbone, None, Pooler("avg", config.hidden_size, mlp_only_train=False)
    ).to(device)
    encoder.train()
    task = Task(encoder, build_objective(ObjectiveConfig()))
    trainable = [p for p in encoder.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-5)
    gen = torch.Generator().manual_seed(1)
    grads = 0
    for step in range(args.steps):
        ids = torch.randint(config.vocab_size, (args.batch_size, args.max_seq_len), generator=gen)
        mask = torch.ones_like(ids)
        mask[: args.batch_size // 2, args.max_seq_len // 2 :] = 0  # half the rows padded
        batch = Batch(step, {"input_ids": ids.to(device), "attention_mask": mask.to(device)})
        total_loss(task(batch)).backward()
        grads = tensor_bytes(p.grad for p in trainable if p.grad is not None)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    harness.reply(
        {
            "side": side,
            "params_mib": tensor_bytes(encoder.parameters()) / MIB,
            "trainable_mib": tensor_bytes(trainable) / MIB,
            "trainable_params": sum(p.numel() for p in trainable),
            "grads_mib": grads / MIB,
            "optimizer_mib": tensor_bytes(state) / MIB,
            "peak_rss_mib": harness.peak_rss_mib(),
            "cuda_peak_mib": torch.cuda.max_memory_allocated(device) / MIB
            if device.type == "cuda"
            else None,
        }
    )


def render(args: argparse.Namespace, runs: list[dict[str, Any]]) -> str:
    def mib(x: float | None) -> str:
        return "–" if x is None else f"{x:,.1f}"

    rows = [
        f"| {r['side']} | {r['trainable_params']:,} | {mib(r['params_mib'])} | "
        f"{mib(r['grads_mib'])} | {mib(r['optimizer_mib'])} | {mib(r['peak_rss_mib'])} | "
        f"{mib(r['cuda_peak_mib'])} |"
        for r in runs
    ]
    return "\n".join(
        [
            f"# Memory of a SimCSE step with and without LoRA ({args.shape} shape)",
            "",
            f"Batch {args.batch_size} × {args.max_seq_len} tokens, {args.steps} steps, LoRA r "
            f"{args.lora_r}, device {args.device}, {harness.cpu_model()}. Tensor bytes are "
            "exact; the peak resident set depends on the machine.",
            "",
            "| side | trainable parameters | parameters MiB | gradients MiB | AdamW state MiB "
            "| peak RSS MiB | CUDA peak MiB |",
            "|---|---|---|---|---|---|---|",
            *rows,
            "",
            f"`{harness.command('bench_lora_memory.py')}`",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="qwen2-0.5b", choices=sorted(SHAPES))
    p.add_argument("--sides", default=",".join(SIDES))
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-seq-len", type=int, default=32)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default=None, help="write the results page (markdown) here")
    p.add_argument("--smoke", action="store_true", help="tiny shape, batch 4 x 8, one step")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.smoke:
        args.shape, args.batch_size, args.max_seq_len, args.steps = "tiny", 4, 8, 1
    if args.worker:
        worker(args)
        return []
    runs = []
    for side in harness.pick_sides(args.sides, SIDES):
        forwarded = ["--worker", side, "--shape", args.shape, "--batch-size",
                     str(args.batch_size), "--max-seq-len", str(args.max_seq_len), "--steps",
                     str(args.steps), "--lora-r", str(args.lora_r), "--device", args.device]  # fmt: skip
        runs.append(harness.run_worker(Path(__file__), forwarded, what=side))
    page = render(args, runs)
    if args.out:
        harness.write_page(args.out, page)
    print(page)
    return runs


if __name__ == "__main__":
    main(sys.argv[1:])
