"""The CPU fast path is a model setting: explicit, scoped to the model cselab loaded, and only for
the architectures of ``unpad.FAST_PATH_MODEL_TYPES``; every other model runs as transformers
runs it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import cselab
from conftest import float_tolerance
from cselab.model import dropout, unpad
from cselab.model.config import ModelConfig
from cselab.model.encoder import SentenceEncoder

SENTENCES = ["a man is playing a guitar .", "kids", "the stock market fell sharply on monday"]


def plain(folder: Path) -> nn.Module:
    """The backbone as transformers loads it."""
    from transformers import AutoModel

    return AutoModel.from_pretrained(str(folder), attn_implementation="sdpa")


def module_types(model: nn.Module) -> list[tuple[str, type]]:
    return [(name, type(m)) for name, m in model.named_modules()]


def train_forward(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The last hidden states in training mode (dropout on), with a fixed seed."""
    model.train()
    torch.manual_seed(11)
    with torch.no_grad():
        return model(**batch).last_hidden_state


def test_the_setting_defaults_on_for_training_and_a_run_can_turn_it_off(tiny_bert: Path) -> None:
    from cselab.config import load_config

    assert ModelConfig().fast_path is True  # also the default of from_pretrained and load
    config = load_config(None, [f"model.name_or_path={tiny_bert}", "model.fast_path=false"])
    assert config.model.fast_path is False
    enc = SentenceEncoder.from_config(config.model)  # as app/train.py builds the encoder
    assert not enc.fast_path and not enc.unpad_training
    assert module_types(enc.backbone) == module_types(plain(tiny_bert))
    assert SentenceEncoder.from_config(ModelConfig(name_or_path=str(tiny_bert))).unpad_training


def test_fast_path_off_is_the_backbone_as_transformers_loads_it(tiny_bert: Path) -> None:
    enc = SentenceEncoder.from_pretrained(str(tiny_bert), pooler="avg", fast_path=False)
    reference = plain(tiny_bert)
    assert module_types(enc.backbone) == module_types(reference)
    assert enc.backbone.config._attn_implementation == "sdpa"
    assert not (enc.fast_path or enc.unpad_training or enc.unpad_inference)
    batch = enc.tokenize(SENTENCES)
    # The same modules draw the same dropout masks: bit for bit the same forward.
    assert torch.equal(train_forward(enc.backbone, batch), train_forward(reference, batch))
    loaded = cselab.load(str(tiny_bert), pooler="avg", fast_path=False)
    assert module_types(loaded.backbone) == module_types(reference)
    assert not loaded.unpad_inference


def test_fast_path_on_changes_this_backbone_only(tiny_bert: Path) -> None:
    """The backbone cselab loads gets cselab's dropout and attention name; a model of the same
    architecture loaded before or after, by transformers, is untouched and computes what it
    computed before cselab loaded anything."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    before_model = plain(tiny_bert)
    sdpa_before = ALL_ATTENTION_FUNCTIONS["sdpa"]
    tokens = SentenceEncoder.from_pretrained(str(tiny_bert), fast_path=False).tokenize(SENTENCES)
    expected = train_forward(before_model, tokens)

    enc = SentenceEncoder.from_pretrained(str(tiny_bert), pooler="avg")
    assert enc.fast_path and enc.unpad_training and enc.unpad_inference
    assert enc.backbone.config._attn_implementation == unpad.ATTENTION_NAME
    drops = [m for m in enc.backbone.modules() if isinstance(m, nn.Dropout)]
    assert drops and all(type(m) is dropout.Dropout for m in drops)

    after_model = plain(tiny_bert)
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is sdpa_before
    for other in (before_model, after_model):
        assert other.config._attn_implementation == "sdpa"
        assert module_types(other) == module_types(plain(tiny_bert))
        assert all(type(m) is nn.Dropout for m in other.modules() if isinstance(m, nn.Dropout))
        assert torch.equal(train_forward(other, tokens), expected)


def test_the_table_decides_which_architectures_unpad(
    tiny_bert: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert frozenset({"bert"}) == unpad.FAST_PATH_MODEL_TYPES
    monkeypatch.setattr(unpad, "FAST_PATH_MODEL_TYPES", frozenset())
    enc = SentenceEncoder.from_pretrained(str(tiny_bert), pooler="avg")
    assert not enc.unpad_training and enc.backbone.config._attn_implementation == "sdpa"


def tiny_roberta(tiny_bert: Path, folder: Path) -> Path:
    """XLM-R/RoBERTa family: positions counted from ``padding_idx + 1``."""
    from transformers import RobertaConfig, RobertaModel

    torch.manual_seed(0)
    cfg = RobertaConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=130,
                        pad_token_id=0)  # fmt: skip
    RobertaModel(cfg).save_pretrained(folder)
    return folder


def tiny_distilbert(tiny_bert: Path, folder: Path) -> Path:
    """DistilBERT: no token types, other attribute names."""
    from transformers import DistilBertConfig, DistilBertModel

    torch.manual_seed(0)
    cfg = DistilBertConfig(vocab_size=30522, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                           max_position_embeddings=128)  # fmt: skip
    DistilBertModel(cfg).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("make", [tiny_roberta, tiny_distilbert], ids=["roberta", "distilbert"])
def test_other_architectures_run_the_plain_forward(tiny_bert: Path, tmp_path: Path, make) -> None:  # noqa: ANN001
    """An architecture outside the table keeps transformers' attention and padded forward, and
    its vectors are those of plain transformers (mean pooling over the real tokens)."""
    from transformers import AutoTokenizer

    folder = make(tiny_bert, tmp_path / "model")
    inputs = ["input_ids", "attention_mask"]  # as these families' own tokenizers: no token types
    AutoTokenizer.from_pretrained(tiny_bert, model_input_names=inputs).save_pretrained(folder)
    enc = SentenceEncoder.from_pretrained(str(folder), pooler="avg")
    assert enc.backbone.config.model_type not in unpad.FAST_PATH_MODEL_TYPES
    assert not enc.unpad_training and not enc.unpad_inference
    assert enc.backbone.config._attn_implementation != unpad.ATTENTION_NAME
    ours = enc.encode(SENTENCES, batch_size=len(SENTENCES))
    reference = plain(folder).eval()
    batch = enc.tokenize(SENTENCES, max_seq_len=128)
    assert sorted(batch) == sorted(inputs)
    with torch.no_grad():
        hidden = reference(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    want = ((hidden * mask).sum(1) / mask.sum(1)).numpy()
    mag = max(1.0, float(np.abs(want).max()))
    tol = float_tolerance(torch.float32, 2 * (32 + 16 + 64), mag)  # 2 layers, 32 wide, FFN 64
    np.testing.assert_allclose(ours, want, rtol=0, atol=tol)
    # In training mode too: the dropout masks differ (cselab's cheaper mask), the function not.
    enc.train()
    with torch.no_grad(), dropout_off(enc):
        z = enc(**batch)
    np.testing.assert_allclose(z.numpy(), want, rtol=0, atol=tol)


def dropout_off(enc: SentenceEncoder):  # noqa: ANN201
    from cselab.model.dropout import dropout_disabled

    return dropout_disabled(enc.backbone)
