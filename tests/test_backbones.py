"""Modern backbones (issue 29): the table of backbones, dropout that is really there, decoders as
bidirectional encoders (LLM2Vec), the ``last``/``weighted_mean`` poolers, PromptEOL, bf16 weights
and gradient checkpointing. Tiny random models built in code (tests/backbone_models.py)."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from backbone_models import DECODER_FAMILIES, make_tiny, tiny_decoder_tokenizer, tiny_run_argv
from conftest import write_corpus
from cselab.app.train import build_trainer
from cselab.config import load_config
from cselab.core.errors import ConfigError
from cselab.model import backbones, unpad
from cselab.model.config import PROMPTEOL_TEMPLATE, PromptConfig
from cselab.model.encoder import SentenceEncoder, load
from cselab.model.pooling import Pooler, last_index
from cselab.model.prompt import Prompt

REPO = Path(__file__).resolve().parents[1]
ISSUE_FAMILIES = (
    "bert", "roberta", "xlm-roberta", "mpnet", "deberta-v2", "electra", "distilbert",
    "modernbert", "llama", "mistral", "qwen2", "qwen3", "gemma2",
)  # fmt: skip


@pytest.fixture(autouse=True)
def _one_thread(one_thread):  # noqa: ANN001, ANN202
    yield


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("backbones")
    return {f: make_tiny(f, root / f) for f in ("bert", "modernbert", *DECODER_FAMILIES)}


def run_config(model: Path, tmp_path: Path, *extra: str):
    return load_config(None, tiny_run_argv(model, tmp_path, "--train.lr=1e-3", *extra, rows=48))


# ------------------------------------------------------------------------------------ the table
def test_table_covers_the_families_and_names_real_dropout_keys() -> None:
    """Every family of the issue has a row; each row's dropout keys are keys of the real
    ``transformers`` config, and each is read by the model built from it (setting it to 0.5
    changes the train-mode output)."""
    from transformers import AutoConfig

    assert set(ISSUE_FAMILIES) <= set(backbones.BACKBONES)
    for kind, row in backbones.BACKBONES.items():
        config = AutoConfig.for_model(kind)
        for key in row.dropout_keys:
            assert hasattr(config, key), (kind, key)
        assert row.default_pooler in ("cls", "avg")
        assert row.is_decoder == (row.bidirectional == backbones.SWITCHABLE)
    assert unpad.FAST_PATH_MODEL_TYPES is backbones.FAST_PATH_MODEL_TYPES == frozenset({"bert"})


@pytest.mark.parametrize("family", ["modernbert", "llama", "gemma2"])
def test_each_dropout_key_is_noise_the_model_applies(family: str, tmp_path: Path) -> None:
    """Each key of the row, set alone, makes two train-mode forwards differ: the table names
    dropouts that are really applied (ModernBERT's three, a decoder's attention dropout)."""
    from transformers import AutoModel

    folder = make_tiny(family, tmp_path / family)
    ids = (
        torch.tensor([[1, 3, 4, 5, 6]])
        if family != "modernbert"
        else torch.tensor([[101, 2000, 2001, 2002, 102]])
    )
    for key in backbones.BACKBONES[family].dropout_keys:
        model = AutoModel.from_pretrained(folder, **{key: 0.5}).train()
        a, b = (model(input_ids=ids).last_hidden_state for _ in range(2))
        assert (a - b).abs().max() > 1e-4, key
        model = AutoModel.from_pretrained(folder).train()
        a, b = (model(input_ids=ids).last_hidden_state for _ in range(2))
        assert torch.equal(a, b), key


def test_docs_and_cselab_config_hold_the_table(capsys: pytest.CaptureFixture) -> None:
    from cselab.cli import main
    from cselab.evaluation.report import markdown_table

    text = (REPO / "docs" / "backbones.md").read_text(encoding="utf-8")
    assert markdown_table(backbones.TABLE_HEADER, backbones.table_rows()) in text
    assert main(["config"]) == 0
    out = capsys.readouterr().out  # the header is wrapped into comment lines
    header = " ".join(line[2:] for line in out.splitlines() if line.startswith("# "))
    assert backbones.summary() in header


def test_unknown_type_takes_the_plain_path_with_one_note(caplog: pytest.LogCaptureFixture) -> None:
    from transformers import GPT2Config

    caplog.set_level(logging.INFO, logger="cselab")
    config = GPT2Config()
    assert backbones.lookup("gpt2") is None and backbones.lookup("gpt2") is None
    notes = [r for r in caplog.records if "not in cselab's table" in r.getMessage()]
    assert len(notes) == 1
    # gpt2's keys are found by their names (not a head's: summary_first_dropout is left)
    assert backbones.set_dropout(config, 0.0) == ("resid_pdrop", "embd_pdrop", "attn_pdrop")
    assert config.summary_first_dropout == 0.1 and backbones.noise_free(config) is not None
    assert backbones.set_dropout(config, 0.2) and backbones.noise_free(config) is None


# ------------------------------------------------------------------------------------- dropout
def test_model_dropout_sets_every_key_and_logs_them(
    models: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="cselab")
    enc = SentenceEncoder.from_pretrained(str(models["modernbert"]), pooler="avg", dropout=0.1)
    cfg = enc.backbone.config
    assert (cfg.attention_dropout, cfg.mlp_dropout, cfg.embedding_dropout) == (0.1, 0.1, 0.1)
    line = [r.getMessage() for r in caplog.records if "model.dropout=0.1 set" in r.getMessage()]
    assert line == [
        "model.dropout=0.1 set attention_dropout, mlp_dropout, embedding_dropout of modernbert"
    ]
    enc.train()
    batch = enc.tokenize(["alpha beta gamma", "delta"])
    assert (enc(**batch) - enc(**batch)).abs().max() > 1e-4  # two views differ
    dec = SentenceEncoder.from_pretrained(str(models["llama"]), pooler="avg", dropout=0.3)
    assert dec.backbone.config.attention_dropout == 0.3


def test_dropout_refusal_fires_on_modernbert_defaults_and_not_with_dropout(
    models: dict[str, Path], tmp_path: Path
) -> None:
    expected = (
        "modernbert applies no dropout (attention_dropout, mlp_dropout, embedding_dropout are 0): "
        "set model.dropout (SimCSE: 0.1; LLM2Vec uses 0.3 for decoders)"
    )
    cfg = run_config(models["modernbert"], tmp_path / "a", "--model.pooler=avg")
    with pytest.raises(ConfigError) as err:
        build_trainer(cfg)
    assert str(err.value) == expected
    with pytest.raises(ConfigError, match=r"^qwen3 applies no dropout \(attention_dropout is 0\)"):
        build_trainer(run_config(models["qwen3"], tmp_path / "b", "--model.pooler=avg"))
    cfg = run_config(
        models["modernbert"], tmp_path / "c", "--model.pooler=avg", "--model.dropout=0.1"
    )
    results = build_trainer(cfg).train()
    assert math.isfinite(results["final_loss"]) if "final_loss" in results else True


def test_pairs_runs_are_not_refused(models: dict[str, Path], tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.csv"
    rows = [f"alpha beta {w},gamma {w}" for w in ("delta", "zeta", "eta", "theta")] * 4
    pairs.write_text("sent0,sent1\n" + "\n".join(rows) + "\n")
    cfg = run_config(models["modernbert"], tmp_path, "--model.pooler=avg", "--train.max_steps=1")
    cfg.data.train_file = str(pairs)
    cfg.data.columns.anchor, cfg.data.columns.positive = "sent0", "sent1"
    build_trainer(cfg).train()


# ------------------------------------------------------------- every family trains, saves, loads
@pytest.mark.parametrize("family", ["bert", "modernbert", *DECODER_FAMILIES])
def test_family_trains_three_steps_and_loads_back_equal_vectors(
    family: str, models: dict[str, Path], tmp_path: Path
) -> None:
    extra = ["--model.pooler=avg", "--model.dropout=0.1"]
    if family in DECODER_FAMILIES:
        extra.append("--model.bidirectional=true")
    trainer = build_trainer(run_config(models[family], tmp_path, *extra))
    before = {k: v.clone() for k, v in trainer.encoder.backbone.state_dict().items()}
    trainer.train()
    after = trainer.encoder.backbone.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it learnt something
    sentences = ["alpha beta gamma", "delta epsilon", "zeta"]
    trainer.encoder.eval()
    mine = trainer.encoder.encode(sentences)
    loaded = load(str(tmp_path / "out" / "last"))
    assert loaded.bidirectional == (family in DECODER_FAMILIES)
    np.testing.assert_allclose(loaded.encode(sentences), mine, rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------- bidirectional
def reference_llama(model, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Llama's forward in float64 from the equations (Touvron et al. 2023): RMSNorm, rotary
    position embeddings, softmax attention over every real key (no causal mask), SwiGLU MLP."""
    cfg = model.config
    h = model.embed_tokens.weight[ids].double()
    n, length, _ = h.shape
    heads, kv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    pos = torch.arange(length, dtype=torch.float64)
    inv = 1.0 / (
        cfg.rope_parameters["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    )
    ang = torch.cat([pos[:, None] * inv[None]] * 2, -1)  # (L, hd)
    cos, sin = ang.cos(), ang.sin()

    def rms(x, w):  # noqa: ANN001, ANN202
        return w.double() * x / torch.sqrt((x * x).mean(-1, keepdim=True) + cfg.rms_norm_eps)

    def rot(x):  # noqa: ANN001, ANN202
        a, b = x[..., : hd // 2], x[..., hd // 2 :]
        return x * cos + torch.cat([-b, a], -1) * sin

    def lin(layer, x):  # noqa: ANN001, ANN202
        return x @ layer.weight.double().T

    for layer in model.layers:
        att = layer.self_attn
        x = rms(h, layer.input_layernorm.weight)
        q = rot(lin(att.q_proj, x).view(n, length, heads, hd).transpose(1, 2))
        k = rot(lin(att.k_proj, x).view(n, length, kv, hd).transpose(1, 2))
        v = lin(att.v_proj, x).view(n, length, kv, hd).transpose(1, 2)
        k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
        scores = scores.masked_fill(~mask.bool()[:, None, None, :], float("-inf"))
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(n, length, heads * hd)
        h = h + lin(att.o_proj, out)
        x = rms(h, layer.post_attention_layernorm.weight)
        mlp = layer.mlp
        h = h + lin(
            mlp.down_proj, torch.nn.functional.silu(lin(mlp.gate_proj, x)) * lin(mlp.up_proj, x)
        )
    return rms(h, model.norm.weight)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_bidirectional_forward_equals_attention_without_causal_mask(
    attn: str, tmp_path: Path
) -> None:
    folder = make_tiny("llama", tmp_path / "llama", dtype=torch.float64)
    enc = SentenceEncoder.from_pretrained(
        str(folder), pooler="avg", bidirectional=True, attn_implementation=attn
    ).eval()
    ids = torch.tensor([[1, 3, 4, 5, 6, 7], [1, 8, 9, 10, 2, 2]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    for rows in (slice(0, 1), slice(0, 2)):  # no padding (no mask built) and padding
        got = enc.backbone(input_ids=ids[rows], attention_mask=mask[rows]).last_hidden_state
        want = reference_llama(enc.backbone, ids[rows], mask[rows])
        real = mask[rows].bool()
        assert got.dtype == torch.float64
        # transformers keeps the rotary tables in float32 (its inv_freq buffer): their rounding,
        # about 1e-7 here, is the only float32 in the forward; a causal mask moves states by ~1
        torch.testing.assert_close(got[real], want[real], rtol=0, atol=1e-5)
    causal = SentenceEncoder.from_pretrained(str(folder), pooler="avg").eval()
    got = causal.backbone(input_ids=ids[:1]).last_hidden_state
    assert (got - reference_llama(causal.backbone, ids[:1], mask[:1])).abs().max() > 1e-2
    # a token's state changes when a later token changes; causally loaded, it does not
    later = ids[:1].clone()
    later[0, -1] = 11
    for model, changes in ((enc, True), (causal, False)):
        a = model.backbone(input_ids=ids[:1]).last_hidden_state[0, 0]
        b = model.backbone(input_ids=later).last_hidden_state[0, 0]
        assert bool((a - b).abs().max() > 1e-9) == changes


@pytest.mark.parametrize("family", DECODER_FAMILIES)
def test_every_decoder_is_bidirectional_on_an_unpadded_sentence(
    family: str, models: dict[str, Path]
) -> None:
    """No padding: no mask is built, and the attention call's own causal flag decides (the
    config's ``is_causal``, which transformers passes to each call); each attention module keeps
    its ``is_causal = True``."""
    enc = SentenceEncoder.from_pretrained(str(models[family]), pooler="avg", bidirectional=True)
    enc.eval()
    ids = torch.tensor([[1, 3, 4, 5, 6]])
    later = ids.clone()
    later[0, -1] = 7
    with torch.no_grad():
        a = enc.backbone(input_ids=ids).last_hidden_state[0, 0]
        b = enc.backbone(input_ids=later).last_hidden_state[0, 0]
    assert (a - b).abs().max() > 1e-6


def test_bidirectional_leaves_the_saved_config_causal(
    models: dict[str, Path], tmp_path: Path
) -> None:
    enc = SentenceEncoder.from_pretrained(str(models["qwen3"]), pooler="avg", bidirectional=True)
    enc.save(tmp_path / "saved")
    import json

    assert "is_causal" not in json.loads((tmp_path / "saved" / "config.json").read_text())
    assert json.loads((tmp_path / "saved" / "cselab.json").read_text())["bidirectional"] is True
    assert enc.backbone.config.is_causal is False  # the live model stays bidirectional


def test_causal_decoder_with_a_first_token_pooler_is_refused(models: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match=r"^model\.pooler=cls: llama is a causal decoder"):
        SentenceEncoder.from_pretrained(str(models["llama"]), pooler="cls")
    with pytest.raises(ConfigError, match="model.bidirectional: cselab cannot remove"):
        from transformers import GPT2Config, GPT2Model

        GPT2Model(GPT2Config(n_layer=1, n_embd=16, n_head=2)).save_pretrained(
            models["llama"].parent / "gpt2"
        )
        tiny_decoder_tokenizer().save_pretrained(models["llama"].parent / "gpt2")
        SentenceEncoder.from_pretrained(
            str(models["llama"].parent / "gpt2"), pooler="avg", bidirectional=True
        )


# --------------------------------------------------------------------------------------- poolers
def test_last_picks_the_last_real_token_under_left_and_right_padding() -> None:
    hidden = torch.arange(2 * 5 * 3, dtype=torch.float64).view(2, 5, 3)
    right = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    left = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    pooler = Pooler("last", 3, mlp_only_train=False)
    assert last_index(right).tolist() == [2, 4] and last_index(left).tolist() == [4, 4]
    torch.testing.assert_close(pooler(hidden, right), hidden[[0, 1], [2, 4]])
    torch.testing.assert_close(pooler(hidden, left), hidden[[0, 1], [4, 4]])


@pytest.mark.parametrize("side", ["right", "left"])
def test_last_makes_the_tokenizer_end_every_row_with_eos(
    side: str, models: dict[str, Path]
) -> None:
    """The tokenizer (which adds no EOS) is made to append it, inside the max length: a
    truncated row ends with EOS too, and the vector is the backbone's state at that EOS."""
    enc = SentenceEncoder.from_pretrained(str(models["llama"]), pooler="last", max_seq_len=4)
    enc.eval()
    eos = enc.tokenizer.eos_token_id
    assert enc.end_id == eos == 2
    enc.tokenizer.padding_side = side
    batch = enc.tokenize(["alpha", "alpha beta gamma delta epsilon"])  # the second truncated
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert ids.shape[1] == 4 and mask.sum(1).tolist() == [3, 4]
    assert ids[torch.arange(2), last_index(mask)].tolist() == [eos, eos]
    assert ids[1].tolist() == [1, 3, 4, eos]  # <s> kept before, EOS kept at the cut
    with torch.no_grad():
        vec = enc(**enc.tokenize(["alpha beta"]))
        explicit = enc.backbone(input_ids=torch.tensor([[1, 3, 4, 2]])).last_hidden_state[:, -1]
    torch.testing.assert_close(vec, explicit)


def test_sentence_transformers_gives_the_last_pooler_s_vectors_on_a_decoder(
    models: dict[str, Path], tmp_path: Path
) -> None:
    """Two training steps with ``last`` on Llama (whose tokenizer adds no EOS): the token
    store's rows end in EOS, and the saved tokenizer.json appends it, so SentenceTransformer
    (folder)'s lasttoken reads the token cselab reads: the same vectors, and no note."""
    from sentence_transformers import SentenceTransformer

    cfg = run_config(
        models["llama"], tmp_path, "--model.pooler=last", "--model.dropout=0.1",
        "--train.max_steps=2",
    )  # fmt: skip
    trainer = build_trainer(cfg)
    eos = trainer.encoder.tokenizer.eos_token_id
    assert all(int(row[-1]) == eos for row in trainer.batches.corpus.rows(range(8)))
    trainer.train()
    folder = tmp_path / "out" / "last"
    sentences = ["alpha beta gamma delta", "epsilon", "zeta eta"]
    st = SentenceTransformer(str(folder), device="cpu")
    mine = load(str(folder)).encode(sentences)
    np.testing.assert_allclose(st.encode(sentences), mine, rtol=0, atol=1e-5)
    trainer.encoder.eval()
    np.testing.assert_allclose(trainer.encoder.encode(sentences), mine, rtol=0, atol=1e-5)
    assert "sentence_transformers" not in json.loads((folder / "cselab.json").read_text())


def test_weighted_mean_equals_a_loop_over_positions() -> None:
    torch.manual_seed(0)
    hidden = torch.randn(3, 6, 4, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    got = Pooler("weighted_mean", 4, mlp_only_train=False)(hidden, mask)
    for row in range(3):
        real = [j for j in range(6) if mask[row, j]]
        total = sum(range(1, len(real) + 1))
        want = sum((i + 1) / total * hidden[row, j] for i, j in enumerate(real))
        torch.testing.assert_close(got[row], want)


def test_prompteol_reads_the_last_template_token_of_the_filled_template(
    models: dict[str, Path],
) -> None:
    prompt = {"template": PROMPTEOL_TEMPLATE, "template2": None, "denoise": False}
    enc = SentenceEncoder.from_pretrained(
        str(models["llama"]), pooler="prompt", bidirectional=False, prompt=prompt
    ).eval()
    sentence = "alpha beta gamma"
    with torch.no_grad():
        vec = enc(**enc.tokenize([sentence]))
        full = enc.tokenizer(PROMPTEOL_TEMPLATE.replace("[X]", sentence), return_tensors="pt")
        want = enc.backbone(**full).last_hidden_state[:, -1]
    assert full["input_ids"][0, -1].item() == enc.tokenizer.convert_tokens_to_ids('"')
    torch.testing.assert_close(vec, want)


def test_mask_prompt_on_a_tokenizer_without_mask_is_one_line() -> None:
    with pytest.raises(ConfigError) as err:
        Prompt(PromptConfig(), tiny_decoder_tokenizer())
    message = str(err.value)
    assert "\n" not in message and message.startswith(
        "model.prompt.template: the tokenizer has no mask"
    )
    assert "PromptEOL" in message


# ------------------------------------------------------------------- dtype, gradient checkpointing
@pytest.mark.parametrize(
    ("family", "expected"), [("bert", "cls"), ("modernbert", "avg"), ("llama", "avg")]
)
def test_the_table_s_default_pooler_is_resolved_and_recorded(
    family: str, expected: str, models: dict[str, Path], tmp_path: Path
) -> None:
    """``model.pooler`` left out: the architecture's default (SimCSE's cls for BERT), written to
    the run's saved config and ``cselab.json``; a resume with the option still left out goes on."""
    import json

    import yaml

    extra = ("--model.dropout=0.1", "--train.max_steps=1", "--train.save_steps=1")
    trainer = build_trainer(run_config(models[family], tmp_path, *extra))
    assert trainer.encoder.pooler.kind == expected
    trainer.train()
    out = tmp_path / "out"
    assert yaml.safe_load((out / "config.yaml").read_text())["model"]["pooler"] == expected
    saved = yaml.safe_load((out / "last" / "cselab_config.yaml").read_text())
    assert saved["model"]["pooler"] == expected
    assert json.loads((out / "last" / "cselab.json").read_text())["pooler"] == expected
    resumed = build_trainer(run_config(models[family], tmp_path, *extra, "--train.resume=true"))
    assert resumed.encoder.pooler.kind == expected


def test_bfloat16_weights_without_lora_are_refused(models: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        run_config(models["bert"], tmp_path, "--model.dtype=bfloat16")
    message = str(err.value)
    assert "\n" not in message and message.startswith("model.dtype=bfloat16 without LoRA")
    assert "train.precision: bf16" in message


def test_the_cls_head_of_a_bfloat16_backbone_trains_in_float32(models: dict[str, Path]) -> None:
    enc = SentenceEncoder.from_pretrained(
        str(models["bert"]), pooler="cls", dtype="bfloat16", fast_path=False
    ).train()
    assert enc.backbone.dtype == torch.bfloat16
    assert enc.pooler.mlp.dense.weight.dtype == torch.float32
    out = enc(**enc.tokenize(["alpha beta", "gamma"]))
    out.float().pow(2).sum().backward()
    assert enc.pooler.mlp.dense.weight.grad.dtype == torch.float32
    f64 = SentenceEncoder.from_pretrained(str(models["bert"]), pooler="cls", fast_path=False)
    assert f64.to(torch.float64).pooler.mlp.dense.weight.dtype == torch.float64


def test_bfloat16_weights_train_and_encode(models: dict[str, Path], tmp_path: Path) -> None:
    cfg = run_config(
        models["llama"], tmp_path, "--model.pooler=avg", "--model.dropout=0.1",
        "--model.dtype=bfloat16", "--model.lora.r=4", "--train.max_steps=1",
    )  # fmt: skip
    trainer = build_trainer(cfg)
    assert trainer.encoder.backbone.dtype == torch.bfloat16
    trainer.train()
    loaded = load(str(tmp_path / "out" / "last"))
    assert loaded.backbone.dtype == torch.bfloat16
    assert np.isfinite(loaded.encode(["alpha beta"])).all()


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_gradient_checkpointing_gives_the_same_gradients_with_dropout(
    family: str, models: dict[str, Path]
) -> None:
    def grads(checkpointing: bool) -> dict[str, torch.Tensor]:
        enc = SentenceEncoder.from_pretrained(
            str(models[family]), pooler="avg", dropout=0.3, fast_path=False
        ).train()
        enc.gradient_checkpointing(checkpointing)
        assert enc.backbone.is_activation_checkpointing == checkpointing
        batch = enc.tokenize(["alpha beta gamma", "delta epsilon zeta eta"])
        torch.manual_seed(7)
        enc(**batch).pow(2).sum().backward()
        return {k: p.grad.clone() for k, p in enc.named_parameters() if p.grad is not None}

    plain, ckpt = grads(False), grads(True)
    assert plain.keys() == ckpt.keys() and plain
    for key in plain:
        torch.testing.assert_close(ckpt[key], plain[key], rtol=1e-5, atol=1e-6, msg=key)


# ---------------------------------------------------------------------------------------- presets
def test_presets_hold_the_authors_settings() -> None:
    cfg = load_config(REPO / "src/cselab/presets" / "llm2vec-simcse-llama3-8b.yaml")
    m, t = cfg.model, cfg.train
    assert (m.pooler, m.dropout, m.bidirectional, m.dtype, m.max_seq_len) == (
        "avg", 0.3, True, "bfloat16", 128,
    )  # fmt: skip
    assert (t.batch_size, t.lr, t.max_steps, t.gradient_checkpointing) == (128, 3e-5, 1000, True)
    assert (cfg.data.train_file, cfg.objective.temperature) == ("wiki1m", 0.05)
    assert (m.lora.r, m.lora.alpha, m.lora.dropout) == (16, 32, 0.05)
    mntp = load_config(REPO / "src/cselab/presets" / "llm2vec-mntp-llama3-8b.yaml")
    assert (mntp.model.bidirectional, mntp.model.lora.r, mntp.objective.mntp.mask_ratio) == (
        True, 16, 0.2,
    )  # fmt: skip
    assert mntp.train.gradient_checkpointing
    mb = load_config(REPO / "src/cselab/presets" / "simcse-modernbert-base.yaml").model
    assert (mb.pooler, mb.dropout) == ("avg", 0.1)


@pytest.mark.parametrize("pooler", ["last", "weighted_mean"])
def test_sentence_transformers_loads_the_new_poolers_with_cselab_s_vectors(
    pooler: str, models: dict[str, Path], tmp_path: Path
) -> None:
    """On an encoder whose tokenizer ends every sentence in [SEP] (nothing appended),
    sentence-transformers' lasttoken / weightedmean modes give cselab's vectors."""
    from sentence_transformers import SentenceTransformer

    enc = SentenceEncoder.from_pretrained(str(models["bert"]), pooler=pooler).eval()
    enc.save(tmp_path / pooler)
    sentences = ["alpha beta gamma delta", "epsilon", "zeta eta"]
    st = SentenceTransformer(str(tmp_path / pooler), device="cpu")
    np.testing.assert_allclose(st.encode(sentences), enc.encode(sentences), rtol=0, atol=1e-5)
    assert load(str(tmp_path / pooler)).pooler.kind == pooler


def test_a_sentence_transformers_lasttoken_folder_is_read_as_it_reads_it(
    models: dict[str, Path], tmp_path: Path
) -> None:
    """A third-party folder with lasttoken pooling on a tokenizer that adds no EOS: cselab.load
    reads the last token as tokenised (sentence-transformers' vectors), appending nothing."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers import models as st_models

    module = st_models.Transformer(str(models["llama"]))
    module.tokenizer.pad_token = module.tokenizer.eos_token
    pooling = st_models.Pooling(module.get_embedding_dimension(), pooling_mode="lasttoken")
    SentenceTransformer(modules=[module, pooling], device="cpu").save(str(tmp_path / "st"))
    sentences = ["alpha beta gamma", "delta"]
    want = SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(sentences)
    got = load(str(tmp_path / "st"))
    assert got.pooler.kind == "last" and got.end_id is None
    np.testing.assert_allclose(got.encode(sentences), want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("pooler", ["avg", "weighted_mean"])
def test_card_of_a_bidirectional_decoder_says_so_and_its_snippets_give_cselab_s_vectors(
    pooler: str, models: dict[str, Path], tmp_path: Path
) -> None:
    from cselab.model.st_folder import BIDIRECTIONAL_NOT_REPRODUCED
    from cselab.publish.card import CARD_FILE, code_blocks, write_model_card

    cfg = run_config(
        models["llama"], tmp_path, f"--model.pooler={pooler}", "--model.bidirectional=true"
    )
    enc = SentenceEncoder.from_config(cfg.model).eval()
    folder = tmp_path / "model"
    enc.save(folder)
    write_model_card(folder, cfg)
    text = (folder / CARD_FILE).read_text()
    assert BIDIRECTIONAL_NOT_REPRODUCED in text
    blocks = code_blocks(text)
    # sentence-transformers through cselab's module (trust_remote_code), cselab, transformers
    assert len(blocks) == 3 and "trust_remote_code=True" in blocks[0]
    spaces = []
    for block in blocks:
        ns: dict = {}
        exec(compile(block, f"{folder}/README.md", "exec"), ns)  # noqa: S102 - the test's point
        spaces.append(ns)
    st, cs, hf = spaces[0]["embeddings"], spaces[1]["vectors"], spaces[2]["vectors"].numpy()
    np.testing.assert_allclose(hf[:2], cs, rtol=0, atol=1e-5)
    np.testing.assert_allclose(st[:2], cs, rtol=0, atol=1e-5)


def test_cli_refuses_a_noise_free_backbone_in_one_line(
    models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from cselab.cli import main

    args = [
        "train", f"--model.name_or_path={models['qwen3']}", "--model.pooler=avg",
        f"--data.train_file={write_corpus(tmp_path, 16)}", f"--train.output_dir={tmp_path / 'out'}",
        "--train.max_steps=1", "--train.batch_size=4", "--train.report_to=[]",
        "--train.eval_steps=0", f"--data.cache_dir={tmp_path / 'cache'}",
    ]  # fmt: skip
    assert main(args) == 2
    assert not (tmp_path / "out").exists()  # refused before anything was written
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        "cselab train: error: qwen3 applies no dropout (attention_dropout is 0): set "
        "model.dropout (SimCSE: 0.1; LLM2Vec uses 0.3 for decoders)"
    )


def test_a_plain_decoder_folder_loads_with_its_default_pooler(models: dict[str, Path]) -> None:
    assert load(str(models["mistral"])).pooler.kind == "avg"
    assert load(str(models["bert"])).pooler.kind == "cls_before_pooler"


def test_negative_save_minutes_names_the_value() -> None:
    with pytest.raises(ConfigError, match=r"^train.save_minutes=-3.0 must be >= 0$"):
        load_config(None, ["--train.save_minutes=-3"])
