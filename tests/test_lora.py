"""LoRA adapters (model.lora): only the adapters train, the folders, cselab merge, resume."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from backbone_models import make_tiny_decoder, tiny_run_argv
from cselab.app.train import build_trainer
from cselab.cli import main as cli_main
from cselab.config import load_config
from cselab.config.plan import RunPlan
from cselab.core.errors import ConfigError, ModelFormatError
from cselab.model.encoder import SentenceEncoder
from cselab.model.loader import load
from cselab.training.checkpoint import load_checkpoint

SENTENCES = ["alpha beta gamma", "a man plays a guitar .", "delta", "the cat sat on the mat"]


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_decoder(tmp_path_factory.mktemp("tiny-llama"))


def lora_config(model: Path, out: Path, *extra: str):
    return load_config(
        None,
        tiny_run_argv(
            model, out, "--model.pooler=avg",
            "--model.dropout=0.1",  # decoders ship without dropout: SimCSE needs the noise
            "--model.lora.r=4", "--train.lr=1e-2", "--train.log_steps=1", *extra,
        ),
    )  # fmt: skip


def test_only_the_adapters_train(tiny_llama: Path, tmp_path: Path) -> None:
    trainer = build_trainer(lora_config(tiny_llama, tmp_path))
    named = dict(trainer.encoder.named_parameters())
    before = {k: v.detach().clone() for k, v in named.items()}
    held = {id(p) for group in trainer.optim.optimizer.param_groups for p in group["params"]}
    adapters = {k for k in named if ".lora_A." in k or ".lora_B." in k}
    assert adapters and held == {id(named[k]) for k in adapters}  # the optimiser: adapters only
    results = trainer.train()
    changed = {k for k, v in named.items() if not torch.equal(v.detach(), before[k])}
    assert changed == adapters  # every adapter moved (B starts at 0), nothing else did
    assert results["packed_rows"] is True  # a decoder on the CPU: rows packed (results.json)
    # best/ and last/ hold peft's adapter files and cselab's settings, not the base weights
    best = tmp_path / "out/best"
    assert (best / "adapter_config.json").is_file() and not (best / "model.safetensors").exists()
    meta = json.loads((best / "cselab.json").read_text())
    assert meta["lora"]["r"] == 4 and meta["lora"]["base"] == str(tiny_llama.resolve())
    saved = load_file(str(best / "adapter_model.safetensors"))
    assert saved and all(".lora_" in k for k in saved)
    # the checkpoint: the adapters and their AdamW moments, not the frozen base model
    tensors, _ = load_checkpoint(tmp_path / "out/checkpoint")
    model = {k.removeprefix("model.") for k in tensors if k.startswith("model.")}
    assert model == adapters
    moments = [k for k in tensors if k.startswith("optim.") and k.endswith(".exp_avg")]
    assert len(moments) == len(adapters)


def test_adapter_folder_merged_folder_and_sentence_transformers_agree(
    tiny_llama: Path, tmp_path: Path
) -> None:
    build_trainer(lora_config(tiny_llama, tmp_path, "--train.save_merged=true")).train()
    adapters = load(str(tmp_path / "out/best"))
    assert adapters.has_adapters
    want = adapters.encode(SENTENCES)
    base = load(str(tiny_llama), pooler="avg").encode(SENTENCES)
    assert np.abs(want - base).max() > 1e-3  # the adapters change the vectors
    merged_dir = tmp_path / "out/merged"  # train.save_merged
    assert (merged_dir / "model.safetensors").is_file()
    assert not (merged_dir / "adapter_config.json").exists()
    card = (tmp_path / "out/best/README.md").read_text(encoding="utf-8")
    assert f"LoRA adapters for `{tiny_llama.resolve()}`" in card and "cselab merge" in card
    assert "| LoRA | r 4, alpha 8, dropout 0.05" in card and "a 32-dimensional vector" in card
    # the modules the load put adapters on (model.lora.target_modules: null), as the plan kept
    # them: the card names them rather than "the architecture default"
    meta = json.loads((tmp_path / "out/best/cselab.json").read_text())
    targets = tuple(meta["lora"]["target_modules"])
    assert targets and RunPlan.load(tmp_path / "out").lora_targets == targets
    assert f"dropout 0.05, modules {', '.join(targets)} |" in card
    merged_card = (merged_dir / "README.md").read_text(encoding="utf-8")  # the model card
    assert "LoRA adapters for" not in merged_card and "a 32-dimensional vector" in merged_card
    assert cli_main(["merge", str(tmp_path / "out"), "-o", str(tmp_path / "cli")]) == 0
    # cselab merge of the run reads the run as train.save_merged does: the same card, its
    # own folder named (its steps, times, dev curve, LoRA modules and precision)
    cli_card = (tmp_path / "cli/README.md").read_text(encoding="utf-8")
    cli_card = cli_card.replace(str((tmp_path / "cli").resolve()), str(merged_dir.resolve()))
    differ = [
        (a, b)
        for a, b in zip(cli_card.splitlines(), merged_card.splitlines(), strict=True)
        if a != b
    ]
    # only the name the folder is given (the metadata's and the title's) differs
    assert [(a[:12], b) for a, b in differ] == [
        ("model_name: ", "model_name: out-merged"),
        ("# test_adapt", "# out-merged"),
    ]
    assert len(cli_card.splitlines()) == len(merged_card.splitlines())
    for folder in (merged_dir, tmp_path / "cli"):
        merged = load(str(folder))
        assert not merged.has_adapters
        np.testing.assert_allclose(merged.encode(SENTENCES), want, rtol=0, atol=1e-5)
    from sentence_transformers import SentenceTransformer

    for folder in (merged_dir, tmp_path / "out/best"):  # the adapter folder too, through peft
        st = SentenceTransformer(str(folder), device="cpu")
        np.testing.assert_allclose(st.encode(SENTENCES), want, rtol=0, atol=1e-5)


def test_merge_refuses_what_it_cannot_merge(tiny_bert: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelFormatError, match="holds no LoRA adapters"):
        from cselab.training.merge import merge_folder

        merge_folder(tiny_bert, tmp_path / "x")
    assert cli_main(["merge", str(tiny_bert), "-o", str(tmp_path / "y")]) == 2
    with pytest.raises(ConfigError, match="model.lora.r"):
        load_config(None, ["--model.lora.r=-1"])
    with pytest.raises(ConfigError, match="train.save_merged"):
        load_config(None, ["--train.save_merged=true"])


def test_new_adapters_on_saved_adapters_are_refused(tiny_llama: Path, tmp_path: Path) -> None:
    enc = SentenceEncoder.from_pretrained(str(tiny_llama), pooler="avg", lora={"r": 2})
    enc.save(tmp_path / "adapters")
    with pytest.raises(
        ModelFormatError, match="holds LoRA adapters; merge them into the weights first"
    ):
        SentenceEncoder.from_pretrained(str(tmp_path / "adapters"), pooler="avg", lora={"r": 2})
    again = SentenceEncoder.from_pretrained(str(tmp_path / "adapters"), pooler="avg")
    assert again.has_adapters and not any(p.requires_grad for p in again.parameters())
    with pytest.raises(ConfigError, match="holds LoRA adapters; merge them"):
        config = lora_config(tmp_path / "adapters", tmp_path / "run", "--model.lora.r=0")
        build_trainer(config)


def test_lora_on_bert_targets_its_projections(tiny_bert: Path) -> None:
    enc = SentenceEncoder.from_pretrained(str(tiny_bert), pooler="avg", lora={"r": 2})
    trainable = [k for k, p in enc.named_parameters() if p.requires_grad]
    assert any("attention.self.query.lora_A" in k for k in trainable)
    assert any("output.dense.lora_B" in k for k in trainable)
    assert all(".lora_" in k for k in trainable)
    with pytest.raises(ConfigError, match="model.lora.target_modules"):
        SentenceEncoder.from_pretrained(
            str(tiny_bert), pooler="avg", lora={"r": 2, "target_modules": ["nope"]}
        )


def test_cli_run_with_model_selection_keeps_the_best_adapters(
    tiny_llama: Path, tmp_path: Path, fresh_eval_cache: None
) -> None:
    """`cselab train` with a dev file: best/ is saved (adapters) when the score improves, and
    read back at the end for the Matryoshka table (a load of the adapter folder)."""
    rows = [("a man plays a guitar", "a man plays music", 4.5), ("a cat sleeps", "dogs run", 0.5),
            ("the sun is hot", "the sun is warm", 4.0),
        ("birds fly south", "birds migrate", 3.5), ("he eats", "a car drives", 0.2)]  # fmt: skip
    dev = tmp_path / "dev.tsv"
    dev.write_text(
        "sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in rows)
    )
    args = ["train", *tiny_run_argv(
        tiny_llama, tmp_path, "--model.pooler=avg", "--model.dropout=0.1", "--model.lora.r=4",
        "--train.max_steps=4", "--train.eval_steps=1", "--train.lr=1e-2", f"--eval.dev={dev}",
        "--objective.matryoshka.dims=[32,16]",
    )]  # fmt: skip
    assert cli_main(args) == 0
    results = json.loads((tmp_path / "out/results.json").read_text())
    assert [r["dim"] for r in results["dev_at_dims"]] == [32, 16]
    best = load(str(tmp_path / "out/best"))
    assert best.has_adapters and (tmp_path / "out/best/adapter_model.safetensors").is_file()


def test_adapter_folder_of_a_several_layer_pooler_says_sentence_transformers_differs(
    tiny_llama: Path, tmp_path: Path
) -> None:
    """sentence-transformers loads an adapter folder's base without its hidden states, so a
    pooler over several layers is not reproduced there: cselab.json says so; the merged folder
    (which has config.json with output_hidden_states) is reproduced."""
    from sentence_transformers import SentenceTransformer

    from cselab.model.st_folder import ADAPTER_LAYERS_NOT_REPRODUCED
    from cselab.training.merge import merge_folder

    enc = SentenceEncoder.from_pretrained(str(tiny_llama), pooler="avg_first_last", lora={"r": 2})
    with torch.no_grad():
        for name, p in enc.named_parameters():
            if "lora_B" in name:
                p.normal_()
    enc.save(tmp_path / "adapters")
    meta = json.loads((tmp_path / "adapters/cselab.json").read_text())
    assert meta["sentence_transformers"] == ADAPTER_LAYERS_NOT_REPRODUCED
    from cselab.publish.card import _adapters_note

    assert "sentence-transformers cannot compute its vectors" in _adapters_note(
        tmp_path / "adapters"
    )
    want = load(str(tmp_path / "adapters")).encode(SENTENCES)
    merged = merge_folder(tmp_path / "adapters", tmp_path / "merged")
    assert "sentence_transformers" not in json.loads((merged / "cselab.json").read_text())
    st = SentenceTransformer(str(merged), device="cpu")
    np.testing.assert_allclose(st.encode(SENTENCES), want, rtol=0, atol=1e-5)


def test_merge_and_push_edges_name_the_folder(tiny_llama: Path, tmp_path: Path) -> None:
    """``cselab merge`` of a missing folder says so; a user's ``OUT.tmp`` survives a merge; push
    of an adapter folder says to merge it; adapters whose base folder is gone name both."""
    import shutil

    from cselab.core.errors import PublishError
    from cselab.publish.push import push_folder
    from cselab.training.merge import merge_folder

    with pytest.raises(ModelFormatError) as err:
        merge_folder(tmp_path / "nonexistent", tmp_path / "x")
    assert (
        str(err.value)
        == f"{tmp_path / 'nonexistent'}: no such folder (a model folder of LoRA adapters)"
    )
    notes = tmp_path / "notes.txt"
    notes.write_text("a file")
    with pytest.raises(ModelFormatError, match=r"notes\.txt: is a file \(a model folder of LoRA"):
        merge_folder(notes, tmp_path / "x")
    (tmp_path / "checkpoint").mkdir()  # a folder with no model in it is not "a plain model"
    with pytest.raises(ModelFormatError) as err:
        merge_folder(tmp_path / "checkpoint", tmp_path / "x")
    assert str(err.value).endswith("nothing to merge; nor is it a model folder")
    with pytest.raises(ModelFormatError) as err:
        merge_folder(tiny_llama, tmp_path / "x")
    assert str(err.value).endswith("nothing to merge; it is a plain model folder already")
    base = shutil.copytree(tiny_llama, tmp_path / "base")
    SentenceEncoder.from_pretrained(str(base), pooler="avg", lora={"r": 2}).save(tmp_path / "ad")
    mine = tmp_path / "merged.tmp"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    merge_folder(tmp_path / "ad", tmp_path / "merged")
    assert (mine / "notes.txt").read_text() == "the user's"
    assert (tmp_path / "merged" / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    with pytest.raises(PublishError) as err:
        push_folder(tmp_path / "ad", "someone/model")
    message = str(err.value)
    assert "\n" not in message and "holds LoRA adapters: cselab merge it first" in message
    shutil.rmtree(base)
    with pytest.raises(ModelFormatError) as err:
        load(str(tmp_path / "ad"))
    message = str(err.value)
    assert "\n" not in message and message.startswith(str(tmp_path / "ad" / "adapter_config.json"))
    assert f"base_model_name_or_path {base.resolve()} does not exist" in message


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("--model.lora.alpha=32", "model.lora.alpha=32.0"),
        ("--model.lora.target_modules=[q_proj]", "model.lora.target_modules=['q_proj']"),
        ("--model.lora.dropout=0.1", "model.lora.dropout=0.1"),
    ],
)
def test_a_lora_key_set_while_lora_is_off_is_said_once(
    override: str, key: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``model.lora.r=0`` with another LoRA key changed trains without adapters: the run's plan
    says so in one line naming the key. Not refused: a sweep's ``r: [0, 16]`` on a base that
    names its modules and runs saved so load, resume and pool."""
    import logging

    from cselab.app.plan import resolve
    from cselab.training.distributed import DistInfo

    config = load_config(None, ["--model.lora.r=0", override])
    assert config.model.lora.unused() == [key] and not config.model.lora.enabled
    corpus = tmp_path / "c.txt"
    corpus.write_text("a sentence\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="cselab"):
        resolve(config, corpus, DistInfo())
    said = [r.getMessage() for r in caplog.records if "model.lora.r is 0" in r.getMessage()]
    assert said == [f"{key} set while model.lora.r is 0 (LoRA off): no effect"]
    assert load_config(None, []).model.lora.unused() == []  # every key at its default


@pytest.mark.parametrize("with_head", [False, True], ids=["base-model", "causal-lm"])
def test_merge_of_a_plain_peft_folder_gives_the_vectors_its_load_gives(
    with_head: bool, tiny_llama: Path, tmp_path: Path
) -> None:
    """A peft folder cselab did not write (``adapter_config.json`` + weights naming the base, no
    ``cselab.json``), saved on the base model or, as most fine-tuning saves it, on the model
    with its LM head (weight names under ``model.``): ``cselab merge`` records the pooler the
    load used and causal attention (the load's default), so the merged folder gives the
    adapters' vectors."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModel, AutoModelForCausalLM

    auto = AutoModelForCausalLM if with_head else AutoModel
    torch.manual_seed(1)
    model = get_peft_model(
        auto.from_pretrained(str(tiny_llama)),
        LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]),
    )
    with torch.no_grad():  # B starts at 0: make the adapters change the vectors
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    plain = tmp_path / "plain"
    model.save_pretrained(str(plain))
    assert sorted(p.name for p in plain.iterdir()) == [
        "README.md", "adapter_config.json", "adapter_model.safetensors",
    ]  # fmt: skip
    stored = load_file(str(plain / "adapter_model.safetensors"))
    assert all(k.startswith("base_model.model.model." if with_head else "base_model.model.layers")
               for k in stored)  # fmt: skip
    adapters = load(str(plain))
    want = adapters.encode(SENTENCES)
    assert adapters.has_adapters and adapters.pooler.kind == "avg" and not adapters.bidirectional
    base = load(str(tiny_llama)).encode(SENTENCES)
    assert np.abs(want - base).max() > 1e-2
    assert cli_main(["merge", str(plain), "-o", str(tmp_path / "merged")]) == 0
    meta = json.loads((tmp_path / "merged/cselab.json").read_text())
    assert meta["pooler"] == "avg" and not meta.get("bidirectional", False)
    merged = load(str(tmp_path / "merged"))
    assert not merged.has_adapters and not merged.bidirectional
    np.testing.assert_allclose(merged.encode(SENTENCES), want, rtol=0, atol=1e-5)


def test_merge_of_llm2vec_style_adapters_keeps_them_bidirectional(
    tiny_llama: Path, tmp_path: Path
) -> None:
    """Adapters trained without the causal mask (LLM2Vec's, a plain peft folder that records
    nothing of it): ``cselab merge --bidirectional`` writes a folder that records bidirectional
    attention and gives the vectors of the adapters loaded with ``bidirectional=True``; without
    the flag the merge is causal, as the load's default."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModel

    torch.manual_seed(2)
    model = get_peft_model(
        AutoModel.from_pretrained(str(tiny_llama)),
        LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]),
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    plain = tmp_path / "plain"
    model.save_pretrained(str(plain))
    want = load(str(plain), bidirectional=True).encode(SENTENCES)
    causal = load(str(plain)).encode(SENTENCES)
    assert np.abs(want - causal).max() > 1e-2  # the mask matters for these weights
    assert cli_main(["merge", str(plain), "-o", str(tmp_path / "bi"), "--bidirectional"]) == 0
    meta = json.loads((tmp_path / "bi/cselab.json").read_text())
    assert meta["bidirectional"] is True
    merged = load(str(tmp_path / "bi"))
    assert merged.bidirectional and not merged.has_adapters
    np.testing.assert_allclose(merged.encode(SENTENCES), want, rtol=0, atol=1e-5)
    assert cli_main(["merge", str(plain), "-o", str(tmp_path / "causal")]) == 0
    np.testing.assert_allclose(
        load(str(tmp_path / "causal")).encode(SENTENCES), causal, rtol=0, atol=1e-5
    )


def test_adapters_trained_on_a_relative_path_load_from_any_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A base model named by a relative path: the saved adapters name it by its absolute path
    (peft would write the relative one, found only from the training's working directory), so
    the folder loads from anywhere."""
    import json

    from backbone_models import make_tiny_decoder
    from cselab import load

    make_tiny_decoder(tmp_path / "work" / "llama")
    monkeypatch.chdir(tmp_path / "work")
    build_trainer(lora_config(Path("llama"), Path("."), "--train.max_steps=1")).train()
    best = (tmp_path / "work" / "out" / "best").resolve()
    saved = json.loads((best / "adapter_config.json").read_text())
    assert saved["base_model_name_or_path"] == str((tmp_path / "work" / "llama").resolve())
    monkeypatch.chdir(tmp_path)
    assert load(str(best)).encode(["alpha beta"]).shape[0] == 1
    # the folder's settings reach its base: model.pack_rows too
    assert load(str(best)).pack_rows == "cpu" and load(str(best), pack_rows=False).pack_rows == "no"


def test_cselab_train_names_the_merged_folder_it_wrote(
    tiny_llama: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """With ``train.save_merged`` the command's summary names ``merged/`` beside ``best/``."""
    from backbone_models import tiny_run_argv
    from cselab.cli import main

    argv = tiny_run_argv(tiny_llama, tmp_path, "--model.pooler=avg", "--model.dropout=0.1",
                         "--model.lora.r=4", "--train.max_steps=1", "--train.save_merged=true")  # fmt: skip
    assert main(["-q", "train", *argv]) == 0
    out = capsys.readouterr().out
    assert f"best model: {tmp_path / 'out' / 'best'}" in out
    assert f"merged (the adapters folded into the weights): {tmp_path / 'out' / 'merged'}" in out
