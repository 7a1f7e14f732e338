"""Shared by the scale-out tests (``test_distributed.py``, ``test_gradcache.py``): the objective
variants every test is parametrised over, small inputs, and the 2-process gloo worker.

The worker runs in processes started by ``torch.multiprocessing.spawn``; it computes, on each
rank, the distributed quantities *and* the single-process reference of the same global batch, and
saves only the differences (tiny files), which the tests then check.
"""

from __future__ import annotations

import os
import socket
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from cselab.core.datakind import DataKind
from cselab.core.schema import from_dict
from cselab.data.inputs import StepInputs
from cselab.objectives import ObjectiveConfig, ObjectiveContext, build_objective, total_loss
from objectives_reference import centred_views

# ---------------------------------------------------------------------------------------------
# Objective variants: every objective of cselab, and combinations of them
# ---------------------------------------------------------------------------------------------

VARIANTS: dict[str, dict[str, Any]] = {
    "infonce": {},
    "infonce_symmetric": {"symmetric": True},
    "focal": {"focal": {"enabled": True, "hardness": 0.3}},
    "gaussian": {"gaussian": {"enabled": True, "batch_multiple": 3.0}},
    "gaussian_fixed_num_weighted": {"gaussian": {"enabled": True, "num": 5, "weight": 0.5}},
    "off_dropout": {"off_dropout": {"enabled": True, "tradeoff": 0.9}},
    "off_dropout_authors_code": {"off_dropout": {"enabled": True, "variant": "authors_code"}},
    "dcl": {"dcl": {"enabled": True, "weight": 0.1}},
    "dcl_paper": {"dcl": {"enabled": True, "weight": 0.01, "formulation": "paper"}},
    "imsimcse": {"off_dropout": {"enabled": True}, "dcl": {"enabled": True}},
    "barlow_twins": {"barlow_twins": {"enabled": True, "padding": 6, "center": True}},
    "mixcse": {"mixcse": {"enabled": True}},
    "mixcse_rolled_all": {"mixcse": {"enabled": True, "partner": "next", "columns": "all"}},
    "mixcse_single_no_sg": {
        "mixcse": {"enabled": True, "directions": "single", "stop_gradient": False}
    },
    "noise_negative": {"noise": {"enabled": True, "side": "negative"}},
    "noise_positive": {"noise": {"enabled": True, "side": "positive"}},
    "noise_both": {"noise": {"enabled": True, "side": "both"}},
    "everything": {
        "focal": {"enabled": True},
        "gaussian": {"enabled": True},
        "off_dropout": {"enabled": True},
        "mixcse": {"enabled": True},
        "dcl": {"enabled": True},
        "barlow_twins": {"enabled": True, "padding": 4},
    },
    "matryoshka": {"matryoshka": {"dims": [16, 8, 4], "weights": [1.0, 0.5, 0.25]}},
    # every random draw (Gaussian, MixCSE partners, BarlowTwins padding) at two prefixes
    "matryoshka_everything": {
        "symmetric": True,
        "focal": {"enabled": True},
        "gaussian": {"enabled": True},
        "mixcse": {"enabled": True},
        "dcl": {"enabled": True},
        "barlow_twins": {"enabled": True, "padding": 4},
        "matryoshka": {"dims": [8, 16]},
    },
}


#: Supervised SimCSE (pairs with given hard negatives, the ``neg`` view) and its compositions.
SUPERVISED_VARIANTS: dict[str, dict[str, Any]] = {
    "sup_simcse": {},
    "sup_simcse_weighted": {"hard_negative_weight": 0.5},
    "sup_symmetric_focal_gaussian_mixcse_dcl": {
        "hard_negative_weight": 0.3,
        "focal": {"enabled": True},
        "gaussian": {"enabled": True},
        "mixcse": {"enabled": True},
        "dcl": {"enabled": True},
    },
    "sup_matryoshka_gaussian": {
        "hard_negative_weight": 0.3,
        "gaussian": {"enabled": True},
        "matryoshka": {"dims": [16, 4], "weights": [1.0, 2.0]},
    },
}
ALL_VARIANTS = [*VARIANTS, *SUPERVISED_VARIANTS]
#: the variants also run with PromptBERT's ``prompt`` pooler (two templates, denoising on)
PROMPT_VARIANTS = ["infonce", "off_dropout", "mixcse", "everything", "sup_simcse"]
HARD_NEGATIVES = 2  # per pair, in the supervised variants
PAIRS = DataKind(pairs=True, negatives=HARD_NEGATIVES)


def objective_config(name: str) -> ObjectiveConfig:
    return from_dict(ObjectiveConfig, {**VARIANTS, **SUPERVISED_VARIANTS}[name])


def objective(name: str) -> torch.nn.Module:
    if name in SUPERVISED_VARIANTS:
        return build_objective(objective_config(name), PAIRS)
    return build_objective(objective_config(name))


def make_views(n: int = 8, d: int = 16, seed: int = 0) -> dict[str, torch.Tensor]:
    """Three distinct, correlated views of ``n`` sentences, and ``HARD_NEGATIVES`` hard
    negatives ``(n, K, D)`` near each (used by the supervised variants only)."""
    views = centred_views(n, d, noise=0.6, seed=seed, off_noise=0.1)
    g = torch.Generator().manual_seed(seed + 1)
    noise = torch.randn(n, HARD_NEGATIVES, d, generator=g)
    views["neg"] = views["off"].unsqueeze(1) + noise
    return views


SENTENCES = [
    "a man is playing a guitar .",
    "the cat sat on the mat",
    "two dogs run across a snowy field",
    "she reads a long book about history",
    "stocks fell sharply on monday",
    "a child is eating an apple",
    "rain is expected tomorrow in the north",
    "the orchestra played for three hours",
    "he fixed the bicycle with a wrench",
    "music fills the empty hall",
    "a woman slices onions in the kitchen",
    "the train was late again",
]


def tiny_encoder(path: str | Path, dropout: float | None = 0.0, pooler: str = "cls"):
    from cselab.model.encoder import SentenceEncoder

    torch.manual_seed(0)  # the cls head is freshly initialised
    enc = SentenceEncoder.from_pretrained(str(path), pooler=pooler, dropout=dropout)
    enc.train()
    return enc


def tiny_batch(encoder, n: int = 8) -> dict[str, torch.Tensor]:
    return encoder.tokenize(SENTENCES[:n])


def tiny_pair_batch(encoder, n: int = 8) -> StepInputs:
    """``n`` triplets from :data:`SENTENCES`: row ``i`` pairs sentence ``i`` with ``i+1`` and
    takes the next ``HARD_NEGATIVES`` as its hard negatives (inputs of :mod:`cselab.data.pairs`)."""
    from cselab.data.pairs import PairRecords, TokenizedPairs

    def col(shift: int) -> list[str]:
        return [SENTENCES[(i + shift) % len(SENTENCES)] for i in range(n)]

    records = PairRecords("tiny", col(0), col(1), [col(2 + k) for k in range(HARD_NEGATIVES)])
    pad = int(encoder.tokenizer.pad_token_id or 0)
    return TokenizedPairs.build(records, encoder.tokenizer, 32).step_inputs(list(range(n)), pad)


def rows(batch: StepInputs | dict[str, torch.Tensor], start: int, end: int) -> Any:
    """Rows ``start:end`` of a sentence batch (a token dict) or of step inputs."""
    if isinstance(batch, StepInputs):
        return batch.rows(start, end)
    return {k: v[start:end] for k, v in batch.items()}


def param_grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
        for n, p in module.named_parameters()
    }


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def max_abs(a: dict[str, torch.Tensor]) -> float:
    return max(float(v.abs().max()) for v in a.values())


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def generator(seed: int = 1234) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------------------------
# Spawning
# ---------------------------------------------------------------------------------------------


def _entry(
    rank: int, world: int, port: int, fn: Callable[..., Any], out: str, args: tuple, group: bool
) -> None:
    import torch.distributed as dist

    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank),
        }  # fmt: skip
    )
    torch.set_num_threads(1)
    if group:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        result = fn(rank, world, *args)
        torch.save(result, Path(out) / f"rank{rank}.pt")
    except BaseException:
        (Path(out) / f"rank{rank}.err").write_text(traceback.format_exc())
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn(
    fn: Callable[..., Any], out: Path, *args: Any, world: int = 2, group: bool = True
) -> list[Any]:
    """Run ``fn(rank, world, *args)`` in ``world`` gloo processes; return each rank's result.
    ``group=False``: the environment only (as ``torchrun`` sets it), ``fn`` forms the group."""
    import torch.multiprocessing as mp

    out.mkdir(parents=True, exist_ok=True)
    try:
        mp.spawn(
            _entry, args=(world, free_port(), fn, str(out), args, group), nprocs=world, join=True
        )
    except Exception as err:
        logs = "\n".join(p.read_text() for p in sorted(out.glob("rank*.err")))
        raise AssertionError(f"distributed worker failed:\n{logs or err}") from err
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]


# ---------------------------------------------------------------------------------------------
# The worker of the DDP equivalence tests
# ---------------------------------------------------------------------------------------------

GLOBAL_BATCH = 8
CHUNK = 3  # GradCache chunk on each rank's 4 rows: chunks of 3 and 1


def equivalence_worker(rank: int, world: int, tiny_bert: str) -> dict[str, Any]:
    """Everything the DDP tests compare, computed on one rank (see ``test_distributed.py``)."""
    import torch.distributed as dist

    from cselab.training.distributed import average_gradients, gather_with_grad
    from cselab.training.gradcache import cached_forward_backward
    from cselab.training.task import Batch, Task
    from cselab.training.views import compute_views

    n_local = GLOBAL_BATCH // world
    lo, hi = rank * n_local, (rank + 1) * n_local
    out: dict[str, Any] = {"rank": rank, "world": world}

    # --- the gather itself -------------------------------------------------------------------
    x = torch.arange(6.0).reshape(3, 2).add(10 * rank).requires_grad_(True)
    g = gather_with_grad(x)
    weights = torch.arange(g.numel(), dtype=torch.float32).reshape(g.shape) * (rank + 1)
    (g * weights).sum().backward()
    out["gather_value"] = g.detach()
    out["gather_grad"] = x.grad.detach()

    def ddp_ctx() -> ObjectiveContext:
        return ObjectiveContext(
            gather=gather_with_grad, rank=rank, world_size=world, offset=lo, generator=generator()
        )

    def mean_over_ranks(t: torch.Tensor) -> torch.Tensor:
        t = t.detach().clone()
        dist.all_reduce(t)
        return t / world

    # Double precision: the 2-process and 1-process sums differ only by roundoff, which float64
    # makes small enough for a tight tolerance (the tiny random model's embeddings are nearly
    # collinear, so float32 gradients lose ~4 digits to cancellation).
    encoder = tiny_encoder(tiny_bert, dropout=0.0).double()
    batches = {"sentences": tiny_batch(encoder, GLOBAL_BATCH)}
    batches["pairs"] = tiny_pair_batch(encoder, GLOBAL_BATCH)

    def parameter_level(
        encoder: torch.nn.Module, name: str, batches: dict[str, dict[str, torch.Tensor]]
    ) -> dict[str, float]:
        """The tiny BERT's parameter gradients for variant ``name``, dropout off: 2 ranks (and
        GradCache on each) against one process with the global batch."""
        obj = objective(name)
        kind = PAIRS if name in SUPERVISED_VARIANTS else DataKind()
        batch = batches["pairs" if kind.pairs else "sentences"]
        local_batch = rows(batch, lo, hi)
        names = obj.required_views
        rec: dict[str, float] = {}
        encoder.zero_grad(set_to_none=True)
        total_loss(obj(compute_views(encoder, batch, names, kind), ObjectiveContext(generator=generator()))).backward()  # fmt: skip
        reference = param_grads(encoder)

        encoder.zero_grad(set_to_none=True)
        terms = obj(compute_views(encoder, local_batch, names, kind), ddp_ctx())
        total_loss(terms).backward()
        average_gradients(list(encoder.parameters()))
        rec["param_grad_diff"] = max_diff(param_grads(encoder), reference)
        rec["param_grad_scale"] = max_abs(reference)

        # GradCache under DDP
        encoder.zero_grad(set_to_none=True)
        task = Task(encoder, obj, ddp_ctx(), kind=kind)
        cached_forward_backward(task, Batch(0, local_batch), CHUNK, verify=True)
        average_gradients(list(encoder.parameters()))
        rec["cached_param_grad_diff"] = max_diff(param_grads(encoder), reference)
        return rec

    per_variant: dict[str, dict[str, float]] = {}
    for name in ALL_VARIANTS:
        obj = objective(name)
        rec: dict[str, float] = {}

        # --- embedding level: arbitrary distinct views ---------------------------------------
        full = {
            k: v.double() for k, v in make_views(GLOBAL_BATCH).items() if k in obj.required_views
        }
        ref_leaves = {k: v.clone().requires_grad_(True) for k, v in full.items()}
        ref_terms = obj(ref_leaves, ObjectiveContext(generator=generator()))
        total_loss(ref_terms).backward()
        leaves = {k: v[lo:hi].clone().requires_grad_(True) for k, v in full.items()}
        terms = obj(leaves, ddp_ctx())
        total_loss(terms).backward()
        rec["loss_diff"] = max(
            float((mean_over_ranks(terms[k]) - ref_terms[k].detach()).abs()) for k in ref_terms
        )
        rec["loss_scale"] = max(float(t.detach().abs()) for t in ref_terms.values())
        rec["terms_match"] = float(set(terms) == set(ref_terms))
        # Rank r's embedding gradient is world × the single-process one (the parameter-gradient
        # averaging divides the world back out).
        diffs, scale = [], []
        for k, leaf in leaves.items():
            ref_grad = ref_leaves[k].grad
            if ref_grad is None:
                diffs.append(0.0 if leaf.grad is None else float(leaf.grad.abs().max()))
                continue
            diffs.append(float((leaf.grad / world - ref_grad[lo:hi]).abs().max()))
            scale.append(float(ref_grad.abs().max()))
        rec["emb_grad_diff"] = max(diffs)
        rec["emb_grad_scale"] = max(scale)

        rec.update(parameter_level(encoder, name, batches))
        per_variant[name] = rec
    out["variants"] = per_variant

    # --- PromptBERT's pooler: the spliced templates and their denoising under DDP -------------
    encoder = tiny_encoder(tiny_bert, dropout=0.0, pooler="prompt").double()
    prompt_batches = {"sentences": tiny_batch(encoder, GLOBAL_BATCH)}
    prompt_batches["pairs"] = tiny_pair_batch(encoder, GLOBAL_BATCH)
    out["prompt_variants"] = {
        name: parameter_level(encoder, name, prompt_batches) for name in PROMPT_VARIANTS
    }
    return out


# ---------------------------------------------------------------------------------------------
# The worker of the per-rank RNG and collective-helper tests
# ---------------------------------------------------------------------------------------------


def rng_worker(rank: int, world: int, folder: str, config_args: list[str]) -> dict[str, Any]:
    """Per-rank dropout streams from the trainer and through a checkpoint, the gather's backward
    with a shared incoming gradient, and the cross-rank agreement check (see
    ``test_distributed.py``)."""
    from cselab.app.train import build_trainer
    from cselab.config import load_config
    from cselab.training import checkpoint as ckpt
    from cselab.training.distributed import (
        all_gather_objects,
        barrier,
        check_same_on_all_ranks,
        gather_with_grad,
    )
    from cselab.training.rng import RNGState, dropout_seed, seed_everything

    out: dict[str, Any] = {}
    trainer = build_trainer(load_config(None, config_args))
    out["after_build_trainer"] = torch.rand(4)  # the first numbers dropout would draw

    # The objective's generated vectors at steps 0, 1 and 0 again, drawn through the trainer's
    # own task (its per-step seeding of the context's generator) on this rank.
    from cselab.objectives import Objective

    class Draw(Objective):  # the interface the task calls (forward, then on_step_end)
        def forward(self, views: dict, ctx: ObjectiveContext) -> dict:
            return {"g": ctx.normal(3, 4, views["z1"])}

    trainer.task.objective = Draw()
    leaf = {"z1": torch.zeros(2, 4)}
    out["step_draws"] = [trainer.task.losses(leaf, s)["g"] for s in (0, 1, 0)]
    # The sum hands one gradient tensor to both of its inputs. The gather is created after
    # ``3u``, so autograd runs its backward first: an in-place all-reduce there would change
    # the tensor that ``3u``'s backward then reads (u.grad 6 instead of 3).
    x = torch.ones(2, 3, requires_grad=True)
    u = torch.ones(2 * world, 3, requires_grad=True)
    scaled = u * 3
    ((gather_with_grad(x) + scaled) * torch.ones(2 * world, 3)).sum().backward()
    out["u_grad"], out["x_grad"] = u.grad.clone(), x.grad.clone()

    check_same_on_all_ranks(5, "a value every rank agrees on")
    try:
        check_same_on_all_ranks(rank, "the rank")
        out["disagreement"] = None
    except RuntimeError as err:
        out["disagreement"] = str(err)

    seed_everything(dropout_seed(11, rank))
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    records = all_gather_objects(RNGState.capture(host=True).to_record())
    if rank == 0:
        ckpt.write_snapshot(
            folder, ckpt.snapshot_checkpoint(model, opt, sched, 3, extra={}, rng=records)
        )
    barrier()
    out["next"] = torch.rand(4)
    torch.rand(100)  # move on, as training would
    tensors, meta = ckpt.load_checkpoint(folder)
    out["restored"] = ckpt.restore(tensors, meta, model, opt, sched, rank=rank)
    out["next_after_restore"] = torch.rand(4)
    out["missing_rank"] = ckpt.rng_record(tensors, meta, world) is None
    return out


# ---------------------------------------------------------------------------------------------
# The worker of ESimCSE's DDP tests (a queue and word-repeated positives: test_esimcse.py)
# ---------------------------------------------------------------------------------------------

ESIMCSE_ON = {
    "word_repetition": {"enabled": True, "dup_rate": 0.32},
    "momentum_queue": {"enabled": True, "queue_size": 10, "momentum": 0.9},
}
#: ESimCSE alone and composed with the other papers' parts.
ESIMCSE_VARIANTS: dict[str, dict[str, Any]] = {
    "esimcse": ESIMCSE_ON,
    "esimcse+everything": {
        **ESIMCSE_ON,
        "symmetric": True,
        "focal": {"enabled": True},
        "off_dropout": {"enabled": True},
        "gaussian": {"enabled": True},
        "mixcse": {"enabled": True},
        "dcl": {"enabled": True},
        "barlow_twins": {"enabled": True, "padding": 4},
    },
}
ESIMCSE_SEED = 7


def esimcse_objective(name: str, queue: torch.Tensor) -> torch.nn.Module:
    """The variant's objective with its queue holding ``queue`` (as after earlier steps)."""
    from cselab.objectives import MomentumQueue

    obj = build_objective(from_dict(ObjectiveConfig, ESIMCSE_VARIANTS[name]))
    for source in obj.negatives:
        if isinstance(source, MomentumQueue):
            source.load_run_state({"entries": queue})
    return obj


def queue_of(obj: torch.nn.Module) -> torch.Tensor:
    (state,) = obj.run_state().values()
    return state


def esimcse_worker(rank: int, world: int, tiny_bert: str) -> dict[str, Any]:
    """One step of every ESimCSE variant on 2 ranks and on one process (the same global batch):
    loss terms, parameter gradients (also with GradCache) and the queue after the step."""
    import torch.distributed as dist

    from cselab.training.distributed import average_gradients, gather_with_grad
    from cselab.training.gradcache import cached_forward_backward
    from cselab.training.task import Batch, Task

    n_local = GLOBAL_BATCH // world
    lo, hi = rank * n_local, (rank + 1) * n_local
    encoder = tiny_encoder(tiny_bert, dropout=0.0).double()
    batch = tiny_batch(encoder, GLOBAL_BATCH)
    queue = torch.randn(5, encoder.dim, generator=generator(3), dtype=torch.float64)

    def ddp_ctx() -> ObjectiveContext:
        return ObjectiveContext(
            gather=gather_with_grad, rank=rank, world_size=world, offset=lo, generator=generator()
        )

    def step(task: Task, inputs: dict[str, torch.Tensor], chunk: int = 0) -> dict[str, float]:
        encoder.zero_grad(set_to_none=True)
        if chunk:
            terms = cached_forward_backward(task, Batch(3, inputs), chunk, verify=True)
        else:
            terms = task(Batch(3, inputs))
            total_loss(terms).backward()
        return {k: v.detach() for k, v in terms.items()}

    out: dict[str, Any] = {}
    for name in ESIMCSE_VARIANTS:
        rec: dict[str, float] = {}
        ref = Task(encoder, esimcse_objective(name, queue), seed=ESIMCSE_SEED)
        ref.ctx = ObjectiveContext(generator=generator())
        ref_terms = step(ref, batch)
        reference = param_grads(encoder)
        for label, chunk in (("", 0), ("cached_", CHUNK)):
            task = Task(encoder, esimcse_objective(name, queue), ddp_ctx(), seed=ESIMCSE_SEED)
            terms = step(task, rows(batch, lo, hi), chunk)
            average_gradients(list(encoder.parameters()))
            means = {}
            for k, v in terms.items():
                t = v.clone()
                dist.all_reduce(t)
                means[k] = t / world
            rec[label + "loss_diff"] = max(
                float((means[k] - ref_terms[k]).abs()) for k in ref_terms
            )
            rec[label + "param_grad_diff"] = max_diff(param_grads(encoder), reference)
            rec[label + "queue_diff"] = float(
                (queue_of(task.objective) - queue_of(ref.objective)).abs().max()
            )
        rec["loss_scale"] = max(float(v.abs()) for v in ref_terms.values())
        rec["param_grad_scale"] = max_abs(reference)
        rec["queue_rows"] = float(queue_of(ref.objective).shape[0])
        out[name] = rec
    return out
