"""The GPU path's host-side properties, checked on the CPU: no host sync in a padded forward
(a prepared 4D mask), and the attention implementation refused in one line where missing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import aten_calls
from cselab.model.encoder import SentenceEncoder
from cselab.model.unpad import padded_attention_mask


class SyncCounter(TorchDispatchMode):
    """Counts the operators that read a device value back to the host
    (``aten._local_scalar_dense``: ``.item()``, ``bool(t)``; ``aten.nonzero``: a data-dependent
    size): on a GPU each is a sync of the CPU with the queue."""

    SYNCS = ("aten._local_scalar_dense", "aten.nonzero", "aten.is_nonzero")

    def __init__(self) -> None:
        super().__init__()
        self.syncs: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        name = str(func.overloadpacket)
        if name in self.SYNCS:
            self.syncs.append(name)
        return func(*args, **(kwargs or {}))


def padded_encoder(tiny_bert: Path) -> SentenceEncoder:
    """The padded forward, as on a GPU (the packed CPU path off)."""
    return SentenceEncoder.from_pretrained(str(tiny_bert), pooler="avg", fast_path=False)


def padded_trainer(tiny_bert: Path, tmp_path: Path, *extra: str):  # noqa: ANN201
    """The trainer of the step a GPU runs eagerly: the padded forward, dropout 0.1, no compile
    (whatever ``train.compile: null`` resolves to)."""
    from cselab.app.train import build_trainer
    from test_trainer import tiny_config

    args = ("--model.fast_path=false", "--train.compile=false", "--model.dropout=0.1", *extra)
    return build_trainer(tiny_config(tiny_bert, tmp_path, *args))


def test_the_padded_forward_reads_nothing_back(tiny_bert: Path) -> None:
    """A padded batch's forward hands BERT a 4D mask, so transformers' ``padding_mask.all()``
    (a host sync every forward) is not reached: no sync operator runs."""
    enc = padded_encoder(tiny_bert)
    batch = enc.tokenize(["a short one", "a much longer sentence than the other one is"])
    assert not bool(batch["attention_mask"].all())  # padded
    seen: list[torch.Tensor] = []
    enc.backbone.register_forward_pre_hook(
        lambda m, args, kwargs: seen.append(kwargs["attention_mask"]), with_kwargs=True
    )
    with SyncCounter() as counter:
        enc(**batch)
    assert seen[0].dim() == 4 and seen[0].dtype == torch.bool
    assert counter.syncs == []


def test_the_4d_mask_gives_the_2d_masks_vectors(tiny_bert: Path) -> None:
    enc = padded_encoder(tiny_bert).eval()
    batch = enc.tokenize(["a short one", "a much longer sentence than the other one is", "b"])
    mask = batch["attention_mask"]
    with torch.no_grad():
        four = enc.backbone(
            input_ids=batch["input_ids"], attention_mask=padded_attention_mask(enc.backbone, mask)
        )
        two = enc.backbone(input_ids=batch["input_ids"], attention_mask=mask)
    keep = mask.bool()
    torch.testing.assert_close(
        four.last_hidden_state[keep], two.last_hidden_state[keep], rtol=0, atol=1e-6
    )


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny models of the families with a prepared mask; ModernBERT with a local window (2)
    shorter than the test batch, so its band is exercised."""
    from backbone_models import make_tiny

    root = tmp_path_factory.mktemp("families")
    local = {"local_attention": 4, "sliding_window": 2}
    local["layer_types"] = ["full_attention", "sliding_attention"]
    return {
        "bert": make_tiny("bert", root / "bert"),
        "llama": make_tiny("llama", root / "llama"),
        "mistral": make_tiny("mistral", root / "mistral"),
        "qwen3": make_tiny("qwen3", root / "qwen3"),
        "modernbert": make_tiny("modernbert", root / "modernbert", **local),
    }


#: host syncs of one padded training forward, per family (none left: each gets a prepared mask)
FORWARD_SYNCS = [
    ("bert", "avg", False, 0),
    ("bert", "last", False, 0),
    ("llama", "avg", False, 0),
    ("llama", "last", False, 0),
    ("llama", "avg", True, 0),
    ("mistral", "avg", False, 0),
    ("qwen3", "last", False, 0),
    ("modernbert", "avg", False, 0),
]


@pytest.mark.parametrize(("family", "pooler", "bidirectional", "syncs"), FORWARD_SYNCS)
def test_each_family_s_padded_forward_reads_nothing_back(
    family: str, pooler: str, bidirectional: bool, syncs: int, families: dict[str, Path]
) -> None:
    enc = SentenceEncoder.from_pretrained(
        str(families[family]), pooler=pooler, fast_path=False, dropout=0.1,
        bidirectional=bidirectional,
    ).train()  # fmt: skip
    batch = enc.tokenize(["alpha beta", "alpha beta gamma delta epsilon zeta eta"])
    assert not bool(batch["attention_mask"].all())  # padded
    with SyncCounter() as counter:
        enc(**batch)
    assert len(counter.syncs) == syncs, counter.syncs


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize(
    ("family", "bidirectional"),
    [
        ("llama", False),
        ("llama", True),
        ("mistral", False),
        ("qwen3", False),
        ("modernbert", False),
    ],
)
def test_the_prepared_mask_gives_the_2d_masks_states(
    family: str, bidirectional: bool, side: str, families: dict[str, Path]
) -> None:
    """On every real token the prepared mask (causal, bidirectional, ModernBERT's band) gives
    the states transformers computes from the 2D mask, under right and left padding."""
    enc = SentenceEncoder.from_pretrained(
        str(families[family]), pooler="avg", fast_path=False, bidirectional=bidirectional
    ).eval()
    enc.tokenizer.padding_side = side
    batch = enc.tokenize(["alpha", "alpha beta gamma delta epsilon zeta eta", "beta gamma"])
    ids, mask = batch["input_ids"], batch["attention_mask"]
    prepared = padded_attention_mask(enc.backbone, mask)
    assert prepared is not mask
    with torch.no_grad():
        mine = enc.backbone(input_ids=ids, attention_mask=prepared).last_hidden_state
        theirs = enc.backbone(input_ids=ids, attention_mask=mask).last_hidden_state
    keep = mask.bool()
    assert torch.isfinite(mine).all()
    torch.testing.assert_close(mine[keep], theirs[keep], rtol=0, atol=1e-5)


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("flash_attn") is not None and torch.cuda.is_available(),
    reason="flash-attn can run here",
)
def test_flash_attention_2_is_refused_in_one_line_where_it_cannot_run(tiny_bert: Path) -> None:
    from cselab.core.schema import ConfigError

    with pytest.raises(ConfigError, match=r"^model.attn_implementation=flash_attention_2 needs"):
        SentenceEncoder.from_pretrained(str(tiny_bert), attn_implementation="flash_attention_2")


def test_a_training_step_on_the_padded_path_reads_nothing_back(
    tiny_bert: Path, tmp_path: Path
) -> None:
    """The whole step as it runs on a GPU (the padded forward, dropout, InfoNCE, backward,
    clipping, fused AdamW, the schedule): no operator reads a device value back. The logged
    steps' loss check (``LossWindow.flush``) is the loop's one sync, outside the step."""

    trainer = padded_trainer(tiny_bert, tmp_path)
    trainer.forward_backward(trainer.batch_for(0))
    trainer.optimizer_step()
    with SyncCounter() as counter:
        trainer.forward_backward(trainer.batch_for(1))
        trainer.optimizer_step()
    assert counter.syncs == []


def test_fixed_shape_batches_are_bucketed_and_encode_the_same(
    tiny_bert: Path, tmp_path: Path
) -> None:
    """``train.compile_mode=reduce-overhead`` (CUDA graphs want fixed shapes): every batch is
    padded to a multiple of 16 tokens, and the padding, masked, changes no sentence vector."""
    from cselab.app.train import build_trainer
    from cselab.data import bucket_width, pad_to_width
    from test_trainer import tiny_config

    assert [bucket_width(w, 16) for w in (1, 16, 17, 32)] == [16, 16, 32, 32]
    cols = {"input_ids": torch.ones(2, 5, dtype=torch.long), "template": torch.zeros(2)}
    padded = pad_to_width(cols, 16, pad_id=7)
    assert padded["input_ids"].shape == (2, 16) and bool((padded["input_ids"][:, 5:] == 7).all())
    assert padded["template"] is cols["template"]
    fixed = build_trainer(
        tiny_config(tiny_bert, tmp_path / "a", "--train.compile=true",
                    "--train.compile_mode=reduce-overhead")
    )  # fmt: skip
    plain = build_trainer(tiny_config(tiny_bert, tmp_path / "b", "--train.compile=false"))
    assert plain.batches.width_multiple is None and fixed.batches.width_multiple == 16
    for step in range(3):
        a, b = fixed.batch_for(step).inputs.anchors, plain.batch_for(step).inputs.anchors
        assert (
            a["input_ids"].shape[1] % 16 == 0 and a["input_ids"].shape[1] >= b["input_ids"].shape[1]
        )
        fixed.encoder.eval(), plain.encoder.eval()
        with torch.no_grad():  # the raw encoder (no compile here): the padding is masked
            torch.testing.assert_close(fixed.encoder(**a), plain.encoder(**b), rtol=0, atol=1e-6)


def test_an_mntp_step_on_a_decoder_reads_nothing_back(tmp_path: Path) -> None:
    """MNTP's scored positions are made on the host with the masked copy (``Task._masked``):
    the step (padded causal forward, LM head at those positions, loss, backward, AdamW) reads
    no device value."""
    from backbone_models import make_tiny_decoder
    from cselab.app.train import build_trainer
    from test_trainer import tiny_config

    llama = make_tiny_decoder(tmp_path / "llama")  # with its LM head, which MNTP reads
    cfg = tiny_config(
        llama, tmp_path, "--model.pooler=avg", "--objective.mntp.enabled=true",
        "--objective.mntp.mask_token=a", "--model.fast_path=false", "--train.compile=false",
    )  # fmt: skip
    trainer = build_trainer(cfg)
    trainer.forward_backward(trainer.batch_for(0))
    trainer.optimizer_step()
    batch = trainer.batch_for(1)  # masked and scored on the host (CPU tensors: no sync there)
    with SyncCounter() as counter:
        trainer.forward_backward(batch)
        trainer.optimizer_step()
    assert counter.syncs == []


def test_an_fp16_step_reads_the_device_once(tiny_bert: Path, tmp_path: Path) -> None:
    """fp16 (``GradScaler``, fused AdamW): the step reads back one value, whether the scale fell
    (the update was skipped, so the schedule must not advance); not the scale itself twice."""

    trainer = padded_trainer(tiny_bert, tmp_path, "--train.precision=fp16", "--train.device=cpu")
    assert trainer.optim.scaler is not None
    trainer.forward_backward(trainer.batch_for(0))
    trainer.optimizer_step()
    batch = trainer.batch_for(1)
    with SyncCounter() as counter:
        trainer.forward_backward(batch)
        trainer.optimizer_step()
    assert len(counter.syncs) == 1, counter.syncs


@pytest.mark.parametrize(
    ("precision", "bf16", "tf32"),
    [("fp32", True, False), ("fp32", False, False), ("bf16", True, False),
     ("auto", True, False), ("auto", False, True)],
)  # fmt: skip
def test_tf32_is_on_only_where_auto_resolves_to_fp32_on_a_gpu(
    monkeypatch: pytest.MonkeyPatch, precision: str, bf16: bool, tf32: bool
) -> None:
    """The TF32 flags are global to the process: whatever an earlier run left (here: on), a
    CUDA run sets them, so an explicit ``fp32`` multiplies in IEEE fp32 (no CUDA needed: only
    the flags are read)."""
    from cselab.training import runtime

    monkeypatch.setattr(runtime, "bf16_native", lambda device: bf16)
    flags = (torch.backends.cuda.matmul, torch.backends.cudnn)
    before = [flag.allow_tf32 for flag in flags]
    try:
        for flag in flags:
            flag.allow_tf32 = not tf32
        runtime.autocast_dtype(precision, torch.device("cuda"))
        assert [flag.allow_tf32 for flag in flags] == [tf32, tf32]
    finally:
        for flag, value in zip(flags, before, strict=True):
            flag.allow_tf32 = value


def test_a_gradcache_step_reads_nothing_back(tiny_bert: Path, tmp_path: Path) -> None:
    """GradCache on the padded path with dropout (chunks of 3, 3 and 2 rows): the random-state
    snapshots and their replay are host-side generator states, the cached embeddings and their
    gradients stay on the model's device, so no operator of the step reads a device value."""

    trainer = padded_trainer(tiny_bert, tmp_path, "--train.cache_chunk_size=3")
    trainer.forward_backward(trainer.batch_for(0))
    trainer.optimizer_step()
    batch = trainer.batch_for(1)
    with SyncCounter() as counter:
        trainer.forward_backward(batch)
        trainer.optimizer_step()
    assert counter.syncs == []


def test_an_encoder_s_key_mask_builds_no_position_tensors(tiny_bert: Path) -> None:
    """BERT's prepared mask is its key mask: no ``arange`` of positions, no ``(L, L)``
    comparisons (the causal, band and diagonal masks are built only where they are used)."""
    enc = padded_encoder(tiny_bert)
    mask = enc.tokenize(["a short one", "a much longer sentence than the other one is"])
    with aten_calls() as ops:
        keys = padded_attention_mask(enc.backbone, mask["attention_mask"])
    assert keys.shape == (2, 1, 1, mask["attention_mask"].shape[1])
    assert "aten.arange" not in ops.names and "aten.eq" not in ops.names, ops.names
