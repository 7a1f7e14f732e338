"""ESimCSE (Wu et al. 2022): word repetition and the momentum queue, against loops written from
the authors' code (``caskcsg/sentemb``, ``ESimCSE/train.py`` ``prepare_features`` with
``--dup_type bpe``; ``esimcse/models.py`` ``cl_forward``; ``esimcse/trainers.py``
``compute_loss``), in float64; neutral settings; composition; GradCache; DDP; config refusals.
(The bit-exact resume after SIGKILL is ``test_trainer.py``'s, parametrised with ESimCSE.)"""

from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from cselab.core.datakind import DataKind
from cselab.core.schema import ConfigError, from_dict
from cselab.data.repetition import repeat_tokens, repeated_positions
from cselab.model.encoder import SentenceEncoder
from cselab.objectives import (
    MomentumQueue,
    ObjectiveConfig,
    ObjectiveContext,
    build_objective,
    objective_papers,
    objective_tags,
    total_loss,
)
from cselab.training.gradcache import cached_forward_backward
from cselab.training.task import Batch, Task
from scaleout_helpers import (
    ESIMCSE_VARIANTS,
    SENTENCES,
    esimcse_worker,
    param_grads,
    spawn,
    tiny_batch,
    tiny_encoder,
)

pytestmark = pytest.mark.usefixtures("one_thread")

TAU = 0.05


# ------------------------------------------------------------------ the authors' procedures
def authors_repeat(input_ids: list[int], dup_rate: float, rng: random.Random) -> list[int]:
    """``prepare_features``' ``bpe`` branch, for one tokenised (truncated) sentence."""
    input_len = len(input_ids)
    if int(dup_rate * input_len) > 0:
        add_len = rng.randrange(min(10, int(dup_rate * input_len)))
        dup = sorted(rng.sample(range(1, input_len - 1), add_len))
        new_input_ids = []
        for i, token in enumerate(input_ids):
            if i in dup:
                new_input_ids.append(token)
            new_input_ids.append(token)
        return new_input_ids
    return input_ids


def authors_loss(z1: torch.Tensor, z2: torch.Tensor, queue: torch.Tensor | None) -> torch.Tensor:
    """``cl_forward``: cosine/τ of z1 to z2, then to the queue (``pre_z1``), cross-entropy."""
    cos = F.cosine_similarity(z1.unsqueeze(1), z2.unsqueeze(0), dim=-1) / TAU
    if queue is not None:
        cos_q = F.cosine_similarity(z1.unsqueeze(1), queue.unsqueeze(0), dim=-1) / TAU
        cos = torch.cat([cos, cos_q], dim=1)
    return F.cross_entropy(cos, torch.arange(cos.shape[0]))


def esimcse(**sections: dict) -> ObjectiveConfig:
    return from_dict(ObjectiveConfig, sections)


QUEUE = {"momentum_queue": {"enabled": True, "queue_size": 12, "momentum": 0.9}}
REPEAT = {"word_repetition": {"enabled": True, "dup_rate": 0.32}}


# -------------------------------------------------------------------------- word repetition
def test_repetition_matches_the_authors_loop_row_by_row() -> None:
    rows, lengths = [], [1, 2, 3, 4, 7, 12, 20, 32, 32, 31]
    for length in lengths:
        rows.append(
            [101] + [1000 + 7 * j for j in range(length - 2)] + [102] if length > 1 else [101]
        )
    width = max(lengths)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
    for rate in (0.32, 0.1, 0.9):
        seeds = [1000 * i + 17 for i in range(len(rows))]
        out = repeat_tokens(
            {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)},
            rate,
            [random.Random(s) for s in seeds],
        )
        assert torch.equal(out["token_type_ids"], torch.zeros_like(out["input_ids"]))
        for i, r in enumerate(rows):
            expected = authors_repeat(r, rate, random.Random(seeds[i]))
            n = int(out["attention_mask"][i].sum())
            assert out["input_ids"][i, :n].tolist() == expected, (rate, i)
            assert not out["attention_mask"][i, n:].any()


def test_repetition_count_positions_and_length() -> None:
    """``randrange(min(10, int(rate·L)))`` tokens, never [CLS]/[SEP], none for int(rate·L)=0,
    and a 32-token row may grow beyond the truncation length (no second truncation)."""
    seen_counts, longest = set(), 0
    for seed in range(400):
        rng = random.Random(seed)
        positions = repeated_positions(32, 0.32, rng)
        assert positions == sorted(set(positions))
        assert all(1 <= p <= 30 for p in positions)
        seen_counts.add(len(positions))
        longest = max(longest, 32 + len(positions))
    assert seen_counts == set(range(10))  # min(10, int(0.32·32) = 10) → 0..9
    assert longest == 41
    assert all(repeated_positions(n, 0.32, random.Random(0)) == [] for n in (1, 2, 3))
    assert {len(repeated_positions(10, 0.32, random.Random(s))) for s in range(200)} == {0, 1, 2}


def test_repeated_positive_is_drawn_per_global_row_and_step(tiny_bert: Path) -> None:
    """Rank 1's rows get the draws they get in the whole batch (offset), a new step draws anew,
    GradCache's chunks see the batch's rows; dup_rate 0 leaves the batch alone."""
    enc = tiny_encoder(tiny_bert)
    batch = tiny_batch(enc, 8)
    obj = build_objective(esimcse(word_repetition={"enabled": True, "dup_rate": 0.6}))
    whole = Task(enc, obj, seed=3).prepare(Batch(5, batch))
    part = Task(enc, obj, ObjectiveContext(offset=4), seed=3)
    local = part.prepare(Batch(5, {k: v[4:] for k, v in batch.items()}))
    for k in ("input_ids", "attention_mask"):
        a, b = whole.inputs.positives[k][4:], local.inputs.positives[k]
        w = b.shape[1]
        assert torch.equal(a[:, :w], b) and not a[:, w:].any()
    other = Task(enc, obj, seed=3).prepare(Batch(6, batch))
    assert not torch.equal(other.inputs.positives["input_ids"], whole.inputs.positives["input_ids"])
    lengths = whole.inputs.positives["attention_mask"].sum(1) - batch["attention_mask"].sum(1)
    assert lengths.sum() > 0 and (lengths >= 0).all()
    plain = build_objective(esimcse(word_repetition={"enabled": True, "dup_rate": 0.0}))
    unchanged = Batch(5, batch)
    assert Task(enc, plain, seed=3).prepare(unchanged) is unchanged
    assert unchanged.inputs.anchors is batch and unchanged.inputs.positives is None


# ---------------------------------------------------------------------------- the queue loss
def test_queue_negatives_equal_the_authors_loss_and_gradients() -> None:
    g = torch.Generator().manual_seed(0)
    z1, z2, queue = (torch.randn(6, 16, generator=g, dtype=torch.float64) for _ in range(3))
    mom = torch.randn(6, 16, generator=g, dtype=torch.float64)
    obj = build_objective(esimcse(**QUEUE))
    for q in (None, queue[:4], queue):
        if q is not None:
            obj.load_run_state({"negatives.1.entries": q})
        a, b = z1.clone().requires_grad_(), z2.clone().requires_grad_()
        loss = total_loss(obj({"z1": a, "z2": b, "momentum": mom}))
        loss.backward()
        ra, rb = z1.clone().requires_grad_(), z2.clone().requires_grad_()
        ref = authors_loss(ra, rb, q)
        ref.backward()
        torch.testing.assert_close(loss, ref, rtol=1e-12, atol=0)
        torch.testing.assert_close(a.grad, ra.grad, rtol=1e-10, atol=1e-13)
        torch.testing.assert_close(b.grad, rb.grad, rtol=1e-10, atol=1e-13)


def test_queue_takes_in_the_global_batch_once_per_step_oldest_out() -> None:
    q = MomentumQueue(10, 0.9)
    batches = [torch.full((4, 3), float(i)) for i in range(4)]
    for i, b in enumerate(batches):
        q.on_step_end({"momentum": b}, ObjectiveContext())
        assert q.entries.shape[0] == min(10, 4 * (i + 1))  # the authors' growing queue
    assert q.entries[:, 0].tolist() == [1.0, 1.0] + [2.0] * 4 + [3.0] * 4
    ddp = MomentumQueue(10, 0.9)
    ctx = ObjectiveContext(gather=lambda t: torch.cat([t, t + 100]), world_size=2)
    ddp.on_step_end({"momentum": batches[1]}, ctx)
    assert ddp.entries[:, 0].tolist() == [1.0] * 4 + [101.0] * 4  # the gathered global rows
    none = MomentumQueue(0, 0.9)
    none.on_step_end({"momentum": batches[0]}, ObjectiveContext())
    assert none.run_state() == {}


@pytest.mark.parametrize(
    "other",
    [
        {},
        {"focal": {"enabled": True}},
        {"gaussian": {"enabled": True}},
        {"off_dropout": {"enabled": True}},
        {"dcl": {"enabled": True}},
        {"mixcse": {"enabled": True}},
        {"barlow_twins": {"enabled": True, "padding": 3}},
    ],
    ids=lambda o: next(iter(o), "infonce"),
)
def test_neutral_queue_is_the_objective_without_it_and_a_full_one_changes_it(other: dict) -> None:
    """queue_size 0, or an empty queue (the first step), is the objective without ESimCSE;
    with entries the loss changes (the queue composes with every part)."""
    g = torch.Generator().manual_seed(1)
    views = {k: torch.randn(6, 8, generator=g, dtype=torch.float64) for k in ("z1", "z2", "off")}
    views["momentum"] = torch.randn(6, 8, generator=g, dtype=torch.float64)
    base = build_objective(esimcse(**other))
    ctx = lambda: ObjectiveContext(generator=torch.Generator().manual_seed(5))  # noqa: E731
    plain = base(views, ctx())
    zero = build_objective(esimcse(**other, momentum_queue={"enabled": True, "queue_size": 0}))
    assert zero.required_views == base.required_views
    with_queue = build_objective(esimcse(**other, **QUEUE))
    for obj in (zero, with_queue):
        terms = obj(views, ctx())
        assert terms.keys() == plain.keys()
        for k in plain:
            torch.testing.assert_close(terms[k], plain[k], rtol=1e-14, atol=0)
    with_queue.on_step_end(views, ctx())
    changed = with_queue(views, ctx())
    assert changed["infonce"] > plain["infonce"]  # more negatives: a larger denominator


def test_repetition_off_is_simcse_step(tiny_bert: Path) -> None:
    """dup_rate 0 (no positive columns) gives the very views and loss of plain SimCSE."""
    enc = tiny_encoder(tiny_bert, dropout=0.1)
    batch = tiny_batch(enc, 6)
    off = build_objective(esimcse(word_repetition={"enabled": True, "dup_rate": 0.0}))
    losses = []
    for obj in (build_objective(ObjectiveConfig()), off):
        torch.manual_seed(0)
        losses.append(Task(enc, obj, seed=1)(Batch(0, batch))["infonce"])
    assert torch.equal(losses[0], losses[1])


# ------------------------------------------------------------- the momentum encoder, in order
def test_momentum_encoder_and_queue_follow_the_authors_order(tiny_bert: Path) -> None:
    """Three SGD steps of cselab's task against a loop written from the authors' code: EMA with
    the weights the step's forward uses, the loss against the earlier batches' queue, then the
    batch encoded by the (updated) momentum encoder without dropout enters the queue."""
    m, size, steps = 0.8, 6, 3
    enc = tiny_encoder(tiny_bert, dropout=0.0).double()
    ref = copy.deepcopy(enc)
    batches = [enc.tokenize(SENTENCES[4 * s : 4 * s + 4]) for s in range(steps)]
    cfg = esimcse(momentum_queue={"enabled": True, "queue_size": size, "momentum": m})
    task = Task(enc, build_objective(cfg), seed=0)
    opt = torch.optim.SGD(enc.parameters(), lr=0.5)
    for s, b in enumerate(batches):
        opt.zero_grad()
        total_loss(task(Batch(s, b))).backward()
        opt.step()
        task.after_step()

    momentum_model = copy.deepcopy(ref.backbone)  # the copy made when the model is built
    shell = SentenceEncoder(momentum_model, ref.tokenizer, ref.pooler)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    pre_z1 = None
    for b in batches:
        ref_opt.zero_grad()
        n = b["input_ids"].shape[0]
        both = ref(**{k: torch.cat([v, v]) for k, v in b.items()})
        for param, param_m in zip(
            ref.backbone.parameters(), momentum_model.parameters(), strict=True
        ):
            param_m.data = param_m.data * m + param.data * (1.0 - m)
        loss = authors_loss(both[:n], both[n:], pre_z1)
        with torch.no_grad():
            eval_z = shell(**b)
        pre_z1 = eval_z.clone() if pre_z1 is None else torch.cat([pre_z1, eval_z])[-size:]
        loss.backward()
        ref_opt.step()
    # The authors' next step would average once more before encoding: cselab did it already.
    for param, param_m in zip(ref.backbone.parameters(), momentum_model.parameters(), strict=True):
        param_m.data = param_m.data * m + param.data * (1.0 - m)

    # float64: the two loss formulas (log-sum-exp, cross-entropy) differ by roundoff only, which
    # three SGD steps at lr 0.5 amplify to ~1e-11; a wrong order moves values by ~1e-2.
    tol = {"rtol": 1e-8, "atol": 1e-9}
    for (name, a), b in zip(enc.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, **tol, msg=name)
    state = task.state_dict()
    for name, value in momentum_model.state_dict().items():
        torch.testing.assert_close(state[f"momentum.{name}"], value, **tol)
    torch.testing.assert_close(state["objective.negatives.1.entries"], pre_z1, **tol)


def test_gradcache_equals_the_plain_step_and_enqueues_once(tiny_bert: Path) -> None:
    """Dropout off for the equality (chunks draw their dropout masks in another layout than
    the whole batch); with dropout on, the replay must reproduce every chunk (verify)."""
    dropped = tiny_encoder(tiny_bert, dropout=0.1)
    task = Task(dropped, build_objective(esimcse(**QUEUE, **REPEAT)), seed=4)
    cached_forward_backward(task, Batch(0, tiny_batch(dropped, 8)), 3, verify=True)
    enc = tiny_encoder(tiny_bert, dropout=0.0).double()
    batch = tiny_batch(enc, 8)
    cfg = esimcse(**QUEUE, **REPEAT, focal={"enabled": True})
    queue = torch.randn(5, enc.dim, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    results = []
    for chunk in (0, 3):
        obj = build_objective(cfg)
        obj.load_run_state({"negatives.1.entries": queue})
        task = Task(enc, obj, ObjectiveContext(generator=torch.Generator()), seed=4)
        enc.zero_grad(set_to_none=True)
        torch.manual_seed(9)
        if chunk:
            terms = cached_forward_backward(task, Batch(2, batch), chunk, verify=True)
        else:
            terms = task(Batch(2, batch))
            total_loss(terms).backward()
        results.append(
            (terms, param_grads(enc), task.state_dict()["objective.negatives.1.entries"])
        )
    (t0, g0, q0), (t1, g1, q1) = results
    assert q0.shape[0] == q1.shape[0] == 12  # 5 + 8 rows, the last 12: once, not per chunk
    torch.testing.assert_close(t1["infonce"], t0["infonce"], rtol=1e-10, atol=0)
    torch.testing.assert_close(q1, q0, rtol=1e-10, atol=1e-12)
    for k in g0:
        torch.testing.assert_close(g1[k], g0[k], rtol=1e-8, atol=1e-11, msg=k)


# --------------------------------------------------------------------------------------- DDP
@pytest.fixture(scope="module")
def ddp(tiny_bert: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return spawn(esimcse_worker, tmp_path_factory.mktemp("esimcse-ddp"), str(tiny_bert))


@pytest.mark.parametrize("variant", sorted(ESIMCSE_VARIANTS))
def test_two_ranks_equal_one_process_and_hold_the_same_queue(ddp: list[dict], variant: str) -> None:
    """Loss, parameter gradients (plain and GradCache) and the queue after the step: 2 ranks of
    4 rows each equal one process of 8 (float64; only roundoff separates them)."""
    for out in ddp:
        rec = out[variant]
        assert rec["queue_rows"] == 10
        for label in ("", "cached_"):
            assert rec[label + "loss_diff"] <= 1e-10 * max(1.0, rec["loss_scale"]), rec
            assert rec[label + "param_grad_diff"] <= 1e-9 * rec["param_grad_scale"] + 1e-14, rec
            assert rec[label + "queue_diff"] <= 1e-10, rec


# ----------------------------------------------------------------------------- the config
@pytest.mark.parametrize(
    ("sections", "data", "message"),
    [
        (REPEAT, DataKind(pairs=True), "word_repetition makes the positive view of one sentence"),
        (REPEAT, DataKind(pairs=True, negatives=1), "disable it for pairs data"),
        (
            {"word_repetition": {"enabled": True, "dup_rate": 1.0}},
            None,
            r"dup_rate must be in \[0, 1\)",
        ),
        ({"momentum_queue": {"enabled": True, "queue_size": -1}}, None, "queue_size must be >= 0"),
        ({"momentum_queue": {"momentum": 1.5}}, None, r"momentum must be in \[0, 1\]"),
        (
            {"momentum_queue": {"init": "zero"}},
            None,
            "momentum_queue.init must be one of pretrained, random",
        ),
        ({**QUEUE, "noise": {"enabled": True, "side": "negative"}}, None, "half noisy"),
    ],
)
def test_config_refusals_name_the_key_and_the_reason(
    sections: dict, data: DataKind | None, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        build_objective(esimcse(**sections), data)


def test_queue_composes_with_pairs_and_the_card_cites_esimcse() -> None:
    obj = build_objective(esimcse(**QUEUE), DataKind(pairs=True, negatives=1))
    assert "momentum" in obj.required_views
    both = build_objective(esimcse(**QUEUE, **REPEAT))
    assert [p.key for p in objective_papers(both)] == ["gao2021simcse", "wu2022esimcse"]
    assert "esimcse" in objective_tags(both)
    assert "esimcse" not in objective_tags(build_objective(esimcse(**QUEUE)))


def test_sentence_transformers_loss_refuses_esimcse() -> None:
    from cselab.st import CSELoss

    for sections in (QUEUE, REPEAT):
        with pytest.raises(ConfigError, match="not available as a sentence-transformers loss"):
            CSELoss(torch.nn.Module(), esimcse(**sections))


@pytest.mark.parametrize("init", ["pretrained", "random"])
def test_the_momentum_encoder_starts_pretrained_or_random_as_the_authors_code(
    tiny_bert: Path, tmp_path: Path, init: str
) -> None:
    """The authors' ``BertForCL.__init__`` copies the backbone before the checkpoint loads, so
    their momentum encoder starts from random weights (issue 31). ``init: random`` starts from
    the architecture's own random initialisation under ``train.seed``; ``pretrained`` (the
    default) from the backbone. Momentum 1 keeps the start, which the checkpoint then holds."""
    from safetensors.torch import load_file
    from transformers import BertConfig, BertModel

    from conftest import write_corpus
    from cselab.cli import main
    from cselab.io.runfolder import RunFolder

    out = tmp_path / "run"
    argv = ["-q", "train", f"--model.name_or_path={tiny_bert}", "--model.pooler=cls",
            f"--data.train_file={write_corpus(tmp_path / 'data', 32)}",
            f"--data.cache_dir={tmp_path / 'cache'}", f"--train.output_dir={out}",
            "--train.batch_size=8", "--train.max_steps=1", "--train.eval_steps=0",
            "--train.device=cpu", "--train.seed=7", "--objective.momentum_queue.enabled=true",
            "--objective.momentum_queue.momentum=1", f"--objective.momentum_queue.init={init}",
            "--train.save_steps=1"]  # fmt: skip
    assert main(argv) == 0
    saved = load_file(str(RunFolder(out).checkpoint_file))
    prefix = next(k for k in saved if k.endswith("momentum.embeddings.word_embeddings.weight"))
    prefix = prefix.removesuffix("embeddings.word_embeddings.weight")
    momentum = {k[len(prefix) :]: v for k, v in saved.items() if k.startswith(prefix)}
    pretrained = BertModel.from_pretrained(str(tiny_bert)).state_dict()
    torch.manual_seed(7)
    fresh = BertModel(BertConfig.from_pretrained(str(tiny_bert))).state_dict()
    names = [k for k in pretrained if "pooler" not in k and k in momentum]
    assert len(names) > 10
    want = pretrained if init == "pretrained" else fresh
    other = fresh if init == "pretrained" else pretrained
    for name in names:
        torch.testing.assert_close(momentum[name], want[name], rtol=0, atol=0, msg=name)
    weights = [n for n in names if n.endswith("weight") and "LayerNorm" not in n]
    assert all(not torch.equal(momentum[n], other[n]) for n in weights)


def test_momentum_update_is_bit_identical_to_the_authors_formula(tiny_bert: Path) -> None:
    """The multi-tensor update equals ``p_m * m + p * (1 - m)`` per parameter bit for bit."""
    from cselab.training.momentum import MomentumEncoder

    enc = tiny_encoder(tiny_bert)
    mom = MomentumEncoder(enc, 0.995)
    with torch.no_grad():
        for p in enc.backbone.parameters():
            p.add_(torch.randn_like(p))
    expected = [
        pm * 0.995 + p * (1.0 - 0.995)
        for pm, p in zip(mom.shell.backbone.parameters(), enc.backbone.parameters(), strict=True)
    ]
    mom.update()
    for got, want in zip(mom.shell.backbone.parameters(), expected, strict=True):
        assert torch.equal(got, want)


def test_the_trainer_repeats_words_on_the_host(tiny_bert: Path, tmp_path: Path) -> None:
    """The word-repeated positive is made in batch preparation, before the copy to the device:
    the batch the trainer hands over already carries it, and the task adds nothing."""
    from test_trainer import tiny_config

    config = tiny_config(
        tiny_bert, tmp_path, "--objective.word_repetition.enabled=true", "--train.max_steps=1"
    )
    from cselab.app.train import build_trainer

    trainer = build_trainer(config)
    batch = trainer.batch_for(0)
    assert batch.inputs.positives is not None and batch.inputs.positives["input_ids"].shape[0] == 8
    assert trainer.task.prepare(batch) is batch
