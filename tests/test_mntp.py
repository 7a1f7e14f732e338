"""MNTP (LLM2Vec step 2): the loss against the paper's definition, the masking, the recipe's runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from backbone_models import make_tiny, make_tiny_decoder, tiny_run_argv
from cselab.app.train import build_trainer
from cselab.config import load_config
from cselab.core.errors import ConfigError, ModelFormatError
from cselab.data.masking import IGNORE, mask_token_id, mask_tokens
from cselab.model.encoder import SentenceEncoder
from cselab.model.loader import load
from cselab.objectives import MaskedNextTokenPrediction
from cselab.training.merge import merge_folder
from cselab.training.task import Batch, Task

SENTENCES = [
    "the cat sat on the mat and looked at the door",
    "a man plays a guitar .",
    "alpha beta gamma delta epsilon zeta eta theta",
    "hi",
]


@pytest.fixture(scope="module")
def llama64(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_decoder(tmp_path_factory.mktemp("llama64"), dtype=torch.float64)


def test_mntp_loss_equals_the_papers_loop(llama64: Path) -> None:
    """L = -1/|M| Σ_{i∈M} log softmax(W h_{i-1})[x_i], with h from the full causal LM (float64),
    written as a loop over rows and positions; and transformers' own shifted LM loss."""
    from transformers import AutoModelForCausalLM

    encoder = SentenceEncoder.from_pretrained(str(llama64), pooler="avg", lm_head=True)
    encoder.eval()  # no dropout: the reference pass must see the same network
    task = Task(encoder, MaskedNextTokenPrediction(mask_ratio=0.5), seed=5)
    batch = task.prepare(Batch(step=3, inputs=encoder.tokenize(SENTENCES, max_seq_len=16)))
    loss = task.losses(task.encode(batch.inputs), batch.step)["mntp"]

    ids, labels = batch.inputs.masked.input_ids, batch.inputs.masked.labels
    mask = batch.inputs.anchors["attention_mask"]
    assert (labels != IGNORE).sum() >= 5  # enough masked tokens to mean something
    lm = AutoModelForCausalLM.from_pretrained(str(llama64)).eval()
    assert lm.dtype == torch.float64
    with torch.no_grad():
        logits = lm(input_ids=ids, attention_mask=mask).logits
    terms = []
    for b in range(ids.shape[0]):
        for i in range(1, ids.shape[1]):
            if labels[b, i] != IGNORE and mask[b, i - 1]:
                terms.append(-torch.log_softmax(logits[b, i - 1], dim=-1)[labels[b, i]])
    reference = torch.stack(terms).mean()
    torch.testing.assert_close(loss.detach(), reference, rtol=1e-10, atol=1e-12)
    with torch.no_grad():  # transformers' causal LM loss: labels shifted by one (right padding)
        shifted = lm(input_ids=ids, attention_mask=mask, labels=labels).loss  # float32 CE
    torch.testing.assert_close(loss.detach(), shifted.double(), rtol=1e-5, atol=1e-6)


def test_masking_follows_bert_split_and_skips_special_tokens(tiny_bert: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_bert))
    batch = tok(SENTENCES * 50, padding=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    gens = [torch.Generator().manual_seed(i) for i in range(ids.shape[0])]
    mask_id = mask_token_id(tok)
    masked, labels = mask_tokens(ids, mask, 0.3, mask_id, len(tok), tok.all_special_ids, gens)
    chosen = labels != IGNORE
    special = torch.isin(ids, torch.tensor(tok.all_special_ids)) | ~mask.bool()
    assert not (chosen & special).any()  # [CLS], [SEP] and padding are never chosen
    assert torch.equal(masked[~chosen], ids[~chosen]) and torch.equal(labels[chosen], ids[chosen])
    n = int(chosen.sum())
    assert abs(n / int((~special).sum()) - 0.3) < 0.05
    as_mask = float((masked[chosen] == mask_id).float().mean())
    kept = float((masked[chosen] == ids[chosen]).float().mean())
    assert abs(as_mask - 0.8) < 0.05 and 0.05 < kept < 0.15  # 80% mask, ~10% kept, ~10% random
    # a row's draw depends on its own tokens and generator, not on the batch's padding
    one = tok(SENTENCES[1:2], return_tensors="pt")
    again, lab1 = mask_tokens(one["input_ids"], one["attention_mask"], 0.3, mask_id, len(tok),
                              tok.all_special_ids, [torch.Generator().manual_seed(1)])  # fmt: skip
    width = one["input_ids"].shape[1]
    assert torch.equal(again[0], masked[1, :width]) and torch.equal(lab1[0], labels[1, :width])
    with pytest.raises(ConfigError, match="objective.mntp.mask_token"):
        mask_token_id(tok, "no-such-token-here")


def recipe_config(model: Path, out: Path, *extra: str):
    return load_config(
        None,
        tiny_run_argv(
            model, out, "--model.pooler=avg", "--model.lora.r=4", "--train.lr=1e-2",
            "--train.log_steps=1", *extra,
        ),
    )  # fmt: skip


def test_the_unsupervised_recipe_runs_as_two_runs(tmp_path: Path) -> None:
    """LLM2Vec's recipe: a bidirectional decoder, MNTP with LoRA and gradient checkpointing
    (only the adapters move, the LM head stays), merge, then SimCSE + LoRA on the merged model,
    still bidirectional."""
    llama = make_tiny_decoder(tmp_path / "llama")
    bidirectional = "--model.bidirectional=true"
    trainer = build_trainer(
        recipe_config(
            llama,
            tmp_path / "mntp",
            "--objective.mntp.enabled=true",
            bidirectional,
            "--train.gradient_checkpointing=true",
        )
    )
    assert trainer.encoder.bidirectional
    head = trainer.encoder.lm_head.weight.detach().clone()
    results = trainer.train()
    assert results["steps"] == 3
    assert torch.equal(trainer.encoder.lm_head.weight, head)
    header = (tmp_path / "mntp/out/metrics.csv").read_text().splitlines()[0].split(",")
    assert "mntp" in header and "infonce" not in header
    merged = merge_folder(tmp_path / "mntp/out", tmp_path / "mntp-merged")
    step2 = recipe_config(merged, tmp_path / "simcse", "--model.dropout=0.1", bidirectional)
    assert build_trainer(step2).train()["steps"] == 3
    adapters = load_file(str(tmp_path / "simcse/out/best/adapter_model.safetensors"))
    encoder = load(str(tmp_path / "simcse/out/best"))
    assert adapters and encoder.bidirectional  # the folder keeps the setting
    assert encoder.encode(["a b"]).shape == (1, 32)


def test_mntp_without_lora_trains_every_weight_and_the_head(tmp_path: Path) -> None:
    llama = make_tiny_decoder(tmp_path / "llama", family="qwen2")
    config = recipe_config(
        llama, tmp_path / "run", "--model.lora.r=0", "--objective.mntp.enabled=true"
    )
    trainer = build_trainer(config)
    head = trainer.encoder.lm_head.weight.detach().clone()
    held = {id(p) for g in trainer.optim.optimizer.param_groups for p in g["params"]}
    assert id(trainer.encoder.lm_head.weight) in held
    trainer.train()
    assert not torch.equal(trainer.encoder.lm_head.weight, head)
    assert (tmp_path / "run/out/best/model.safetensors").is_file()  # the base model, no head


def test_mntp_refuses_what_does_not_compose(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="objective.focal"):
        load_config(None, ["--objective.mntp.enabled=true", "--objective.focal.enabled=true"])
    with pytest.raises(ConfigError, match="train.cache_chunk_size"):
        load_config(None, ["--objective.mntp.enabled=true", "--train.cache_chunk_size=4"])
    with pytest.raises(ConfigError, match="objective.mntp.mask_ratio"):
        load_config(None, ["--objective.mntp.enabled=true", "--objective.mntp.mask_ratio=0"])


@pytest.mark.parametrize("ratio", ["-0.1", "0.0", "1.5"])
def test_a_mask_ratio_out_of_range_is_refused_as_one(ratio: str) -> None:
    """The range comes first: a negative ratio is not "a ratio that chooses -26 tokens"."""
    with pytest.raises(ConfigError) as err:
        load_config(None, ["--objective.mntp.enabled=true", f"--objective.mntp.mask_ratio={ratio}"])
    assert str(err.value) == f"objective.mntp.mask_ratio must be in (0, 1], got {ratio}"


def test_mntp_is_not_a_sentence_transformers_loss(minilm_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    from cselab.objectives import ObjectiveConfig
    from cselab.objectives.mntp import MNTPConfig
    from cselab.st import CSELoss

    model = SentenceTransformer(str(minilm_path), device="cpu")
    with pytest.raises(ConfigError, match="objective.mntp is not available"):
        CSELoss(model, ObjectiveConfig(mntp=MNTPConfig(enabled=True)))


def test_mntp_refuses_a_decoder_saved_without_its_lm_head(tmp_path: Path) -> None:
    """A Llama saved as its base model alone (untied head): AutoModelForCausalLM reports the
    head missing, and MNTP would train a random one; a tied head (Gemma 2) is the embeddings."""
    bare = make_tiny("llama", tmp_path / "bare")
    with pytest.raises(ModelFormatError) as err:
        SentenceEncoder.from_pretrained(str(bare), pooler="avg", lm_head=True)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{bare}: the folder holds no weights")
    assert "lm_head" in message
    tied = make_tiny("gemma2", tmp_path / "tied")
    assert (
        SentenceEncoder.from_pretrained(str(tied), pooler="avg", lm_head=True).lm_head is not None
    )


def test_mntp_refuses_an_encoder(tmp_path: Path) -> None:
    bert = make_tiny("bert", tmp_path / "bert")
    with pytest.raises(ConfigError) as err:
        SentenceEncoder.from_pretrained(str(bert), pooler="avg", lm_head=True)
    message = str(err.value)
    assert "\n" not in message and "MNTP predicts the next token: a decoder" in message
