"""The decoder path as a user meets it: docs/lora.md's LLM2Vec recipe run as written, causal LMs
outside the table of backbones, LoRA settings that would silently do something else, merged
folders and their cards, and plain ``peft`` adapter folders (as LLM2Vec's authors publish)."""

from __future__ import annotations

import json
import logging
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch

from backbone_models import make_tiny_decoder, make_tiny_gpt2, tiny_run_argv
from conftest import write_corpus
from cselab.app.train import build_trainer
from cselab.cli import main as cli_main
from cselab.config import load_config
from cselab.core.errors import ConfigError, ResolveError
from cselab.model.encoder import SentenceEncoder
from cselab.model.loader import load
from cselab.model.st_folder import BIDIRECTIONAL_NOT_REPRODUCED

ROOT = Path(__file__).resolve().parents[1]
SENTENCES = ["alpha beta gamma", "a man plays a guitar .", "delta", "the cat sat on the mat"]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_decoder(tmp_path_factory.mktemp("llama"))


def recipe_commands() -> list[list[str]]:
    """The ``cselab ...`` commands of docs/lora.md's by-hand recipe, as a shell reads them."""
    text = (ROOT / "docs/lora.md").read_text(encoding="utf-8")
    section = text.split("### The unsupervised recipe as two runs", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    joined = re.sub(r"\\\n\s*", " ", block)
    return [shlex.split(line)[1:] for line in joined.splitlines() if line.startswith("cselab ")]


def test_the_documented_llm2vec_recipe_trains_bidirectional_in_both_runs(
    tiny_llama: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog, capsys
) -> None:
    """docs/lora.md's two runs, as written (a tiny random Llama for Llama-3-8B, a short run on a
    local corpus): both train bidirectional, the second because the merged MNTP folder records
    it (logged); the merged folders' cards name their folder and say what sentence-transformers
    can and cannot reproduce, and sentence-transformers refuses the folder or loads cselab's
    module; ``cselab merge`` writes the same card. No command of the recipe or the MNTP preset's
    header tells a user to run ``cselab merge`` on a run that wrote ``merged/`` already."""
    commands = recipe_commands()
    assert [c[0] for c in commands] == ["train", "train"]
    preset = (ROOT / "src/cselab/presets/llm2vec-mntp-llama3-8b.yaml").read_text()
    assert "cselab merge" not in preset and "save_merged: true" in preset
    monkeypatch.chdir(tmp_path)
    corpus = write_corpus(tmp_path, 64)
    short = [  # the test's own: a tiny run on a local corpus, no loggers
        f"--data.train_file={corpus}", f"--data.cache_dir={tmp_path / 'cache'}",
        "--train.max_steps=2", "--train.batch_size=8", "--train.report_to=[]",
        "--train.save_steps=0",
    ]  # fmt: skip
    # MNTP selects no model by default (no dev data read: none here); SimCSE is told not to
    tiny = {"meta-llama/Meta-Llama-3-8B-Instruct": str(tiny_llama), "512": "128"}  # its limit
    for argv, no_dev in zip(commands, ([], ["--train.eval_steps=0"]), strict=True):
        argv = [re.sub("|".join(tiny), lambda m: tiny[m.group()], a) for a in argv]
        with caplog.at_level(logging.INFO, logger="cselab"):
            assert cli_main([*argv, *short, *no_dev]) == 0
    mntp, simcse = tmp_path / "runs/mntp", tmp_path / "runs/simcse"
    results = json.loads((mntp / "results.json").read_text())
    assert results["best_step"] == results["steps"] == 2  # merged/ is the last step's model
    assert json.loads((mntp / "merged/cselab.json").read_text())["bidirectional"] is True
    recorded = [r.getMessage() for r in caplog.records if "records (the starting model's)" in
                r.getMessage()]  # fmt: skip
    assert recorded == [
        "model: bidirectional true, pooler avg, as runs/mntp/merged/cselab.json records (the "
        "starting model's)"
    ]
    for folder in (simcse / "best", simcse / "merged"):
        assert json.loads((folder / "cselab.json").read_text())["bidirectional"] is True
    assert "bidirectional: true" in (simcse / "config.yaml").read_text()
    for merged in (mntp / "merged", simcse / "merged"):
        card = (merged / "README.md").read_text(encoding="utf-8")
        assert f'model_id = "{merged.resolve()}"' in card and ".tmp" not in card
    card = (simcse / "merged/README.md").read_text(encoding="utf-8")
    assert BIDIRECTIONAL_NOT_REPRODUCED in card
    # the base, given as the relative runs/mntp/merged, named where the card is read too
    assert f"| base model | `{(mntp / 'merged').resolve()}` |" in card
    # a run folder where a model folder is meant: one line naming its models, merged/ first
    models = f"{Path('runs/simcse/merged')}, {Path('runs/simcse/best')}, {Path('runs/simcse/last')}"
    with pytest.raises(
        ResolveError,
        match=re.escape(f"a run folder, not a model; load one of its models: {models}"),
    ):
        load("runs/simcse")
    capsys.readouterr()
    assert cli_main(["evaluate", "runs/simcse", "--tasks", "STSBenchmark"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    # the MNTP run's adapters, where its merged folder is meant: that folder named
    with pytest.raises(
        ConfigError,
        match=re.escape(f"merged them into the weights already: train {mntp / 'merged'}"),
    ):
        build_trainer(
            load_config(
                None,
                [
                    f"--model.name_or_path={mntp / 'best'}",
                    *short,
                    "--train.output_dir=x",
                    "--train.eval_steps=0",
                ],
            )
        )
    assert cli_main(["merge", "runs/simcse", "-o", "models/final"]) == 0
    final = tmp_path / "models/final"
    card = (final / "README.md").read_text(encoding="utf-8")
    assert BIDIRECTIONAL_NOT_REPRODUCED in card and f'model_id = "{final.resolve()}"' in card
    from sentence_transformers import SentenceTransformer

    want = load(str(final)).encode(SENTENCES)
    causal = load(str(final), bidirectional=False).encode(SENTENCES)
    assert np.abs(want - causal).max() > 1e-4  # the attention matters to the vectors
    with pytest.raises(ValueError, match="trust_remote_code"):
        SentenceTransformer(str(final), device="cpu")
    st = SentenceTransformer(str(final), device="cpu", trust_remote_code=True)
    np.testing.assert_allclose(st.encode(SENTENCES), want, rtol=0, atol=1e-5)


def test_a_run_that_changes_the_recorded_attention_says_so(
    tiny_llama: Path, tmp_path: Path, caplog
) -> None:
    enc = SentenceEncoder.from_pretrained(str(tiny_llama), pooler="avg", bidirectional=True)
    enc.save(tmp_path / "bi")
    with caplog.at_level(logging.INFO, logger="cselab"):
        again = SentenceEncoder.from_pretrained(str(tmp_path / "bi"))
        assert again.bidirectional and again.pooler.kind == "avg"
        caplog.clear()
        causal = SentenceEncoder.from_pretrained(str(tmp_path / "bi"), bidirectional=False)
    assert not causal.bidirectional
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.getMessage() == (
        f"{tmp_path / 'bi/cselab.json'}: model.bidirectional=false (it records true); not how "
        "the model was trained to run"
    )


def test_a_causal_lm_outside_the_table_trains_as_a_decoder(tmp_path: Path) -> None:
    """A tiny GPT-2 (``is_decoder`` unset in its config): the default pooler is a decoder's
    (``avg``), not ``cls`` (whose vector is the same for every row), and its
    ``attn_pdrop``/``resid_pdrop``/``embd_pdrop`` are dropout (SimCSE's noise, set by
    ``model.dropout``)."""
    from cselab.model import backbones

    gpt2 = make_tiny_gpt2(tmp_path / "gpt2")
    config = SentenceEncoder.from_pretrained(str(gpt2)).backbone.config
    assert backbones.is_decoder(config)
    assert set(backbones.dropout_keys(config)) == {"attn_pdrop", "resid_pdrop", "embd_pdrop"}
    assert cli_main(["train", *tiny_run_argv(gpt2, tmp_path, rows=64)]) == 0
    assert json.loads((tmp_path / "out/best/cselab.json").read_text())["pooler"] == "avg"
    vectors = load(str(tmp_path / "out/best")).encode(SENTENCES)
    assert np.abs(vectors[0] - vectors[1:]).max() > 1e-3
    with pytest.raises(ConfigError, match="causal decoder"):
        SentenceEncoder.from_pretrained(str(gpt2), pooler="cls")
    enc = SentenceEncoder.from_pretrained(str(gpt2), dropout=0.3)
    assert enc.backbone.config.attn_pdrop == enc.backbone.config.resid_pdrop == 0.3


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (
            "--model.lora.target_modules=[q_proj,nosuch]",
            "cselab train: error: model.lora.target_modules: nosuch matches no module of this "
            "llama model; its modules: embed_tokens, layers, self_attn, q_proj, k_proj, v_proj, "
            "o_proj, mlp, gate_proj, up_proj, down_proj, act_fn, input_layernorm, "
            "post_attention_layernorm, norm, rotary_emb",
        ),
        (
            "--model.lora.target_modules=[q_proj,layers,norm]",
            "cselab train: error: model.lora.target_modules: layers (a ModuleList), norm (a "
            "LlamaRMSNorm) on this llama model: LoRA adapts linear, embedding and convolution "
            "layers only (e.g. q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)",
        ),
        (
            "--model.lora.r=100000",
            "cselab train: error: model.lora.r=100000 exceeds the width of the model (32): a rank "
            "above it adds parameters and no expressiveness; choose r <= 32 (LLM2Vec: 16)",
        ),
        (
            "--objective.mntp.mask_ratio=0.0001",
            "cselab train: error: objective.mntp.mask_ratio=0.0001 chooses 0.026 tokens per "
            "batch of train.batch_size=8 x model.max_seq_len=32 tokens, so MNTP has almost "
            "nothing to predict; use at least 0.0039 (LLM2Vec: 0.2)",
        ),
    ],
)
def test_lora_and_mntp_settings_that_would_do_nothing_are_one_line(
    option: str, message: str, tiny_llama: Path, tmp_path: Path, capsys
) -> None:
    mntp = ["--objective.mntp.enabled=true"] if "mntp" in option else ["--model.dropout=0.1"]
    argv = tiny_run_argv(tiny_llama, tmp_path, "--model.lora.r=4", *mntp, option, rows=32)
    assert cli_main(["train", *argv]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == message


def test_a_lora_mapping_from_python_is_checked_as_the_config_is(tiny_llama: Path) -> None:
    with pytest.raises(ConfigError, match=r"^model.lora.r must be >= 0 \(0: no LoRA\), got -1$"):
        SentenceEncoder.from_pretrained(str(tiny_llama), pooler="avg", lora={"r": -1})
    with pytest.raises(ConfigError, match="model.lora.dropout must be in"):
        SentenceEncoder.from_pretrained(str(tiny_llama), pooler="avg", lora={"r": 2, "dropout": 2})
    enc = SentenceEncoder.from_pretrained(
        str(tiny_llama), pooler="avg", lora={"r": 2, "target_modules": ["q_proj", "v_proj"]}
    )
    from cselab.model.lora import applied_targets

    assert applied_targets(enc.backbone) == ["q_proj", "v_proj"]


def _plain_peft_folder(base: Path, out: Path, tokenizer: bool = True) -> Path:
    """LoRA adapters saved by ``peft`` alone (no cselab.json), their B matrices random."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModel, AutoTokenizer

    torch.manual_seed(1)
    model = get_peft_model(
        AutoModel.from_pretrained(str(base)),
        LoraConfig(r=2, target_modules=["q_proj", "v_proj"], base_model_name_or_path=str(base)),
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_()
    model.save_pretrained(str(out))
    if tokenizer:
        AutoTokenizer.from_pretrained(str(base)).save_pretrained(str(out))
    merged = model.merge_and_unload()
    merged.save_pretrained(str(out.parent / f"{out.name}-merged"))
    AutoTokenizer.from_pretrained(str(base)).save_pretrained(str(out.parent / f"{out.name}-merged"))
    return out


def test_a_plain_peft_adapter_folder_loads_with_load_s_arguments(
    tiny_llama: Path, tmp_path: Path
) -> None:
    folder = _plain_peft_folder(tiny_llama, tmp_path / "adapters")
    merged = tmp_path / "adapters-merged"
    plain = load(str(folder))
    assert plain.pooler.kind == "avg" and plain.has_adapters and not plain.bidirectional
    for bidirectional in (False, True):
        got = load(str(folder), pooler="avg", bidirectional=bidirectional).encode(SENTENCES)
        want = load(str(merged), pooler="avg", bidirectional=bidirectional).encode(SENTENCES)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    with pytest.raises(ConfigError, match=r"pooler= and bidirectional= in cselab.load"):
        load(str(folder), pooler="cls_before_pooler")
    bare = _plain_peft_folder(tiny_llama, tmp_path / "bare", tokenizer=False)
    assert load(str(bare)).encode(SENTENCES).shape == (4, 32)  # the base's tokenizer


@pytest.mark.parametrize("bidirectional", [False, True])
def test_the_adapter_card_s_transformers_snippet_runs_as_written(
    bidirectional: bool, tiny_llama: Path, tmp_path: Path
) -> None:
    from cselab.config import load_config
    from cselab.publish.card import CARD_FILE, code_blocks, write_model_card

    flag = str(bidirectional).lower()
    cfg = load_config(None, tiny_run_argv(
        tiny_llama, tmp_path, "--model.pooler=avg", "--model.lora.r=2",
        f"--model.bidirectional={flag}",
    ))  # fmt: skip
    enc = SentenceEncoder.from_config(cfg.model)
    with torch.no_grad():
        for name, p in enc.named_parameters():
            if "lora_B" in name:
                p.normal_()
    folder = tmp_path / "adapters"
    enc.save(folder)
    write_model_card(folder, cfg)
    text = (folder / CARD_FILE).read_text(encoding="utf-8")
    (hf,) = [b for b in code_blocks(text) if "from transformers import" in b]
    ns: dict = {}
    exec(compile(hf, f"{folder}/README.md", "exec"), ns)  # noqa: S102 - the test's point
    want = load(str(folder)).encode(ns["sentences"])
    np.testing.assert_allclose(ns["vectors"].numpy(), want, rtol=0, atol=1e-5)
