"""PromptBERT's ``prompt`` pooler (Jiang et al. 2022) against loops written from the authors' code.

The references follow ``kongds/Prompt-BERT``: ``train.py`` (``prepare_features``: the template's
two pieces tokenised with ``tokenizer.encode`` and cut at ``[:-1]``/``[1:]``, the sentence
tokenised alone and cut at ``max_seq_length``), ``prompt_bert/models.py`` (``cl_forward``:
``get_delta`` with ``position_ids[:, len(bs)+1:] += arange(length)``, the vector at
``input_ids == mask_token_id`` minus ``delta[attention_mask.sum(-1) - template_len]``, the MLP
after) and ``evaluation.py`` (the template's text around the sentence, tokenised whole). They
run the tiny random BERT in float64, so the comparisons are tight.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import write_corpus
from cselab.cli import main
from cselab.config import Config, load_config
from cselab.core.datakind import DataKind
from cselab.core.errors import ConfigError
from cselab.core.schema import from_dict
from cselab.evaluation.embed import call_encoder
from cselab.model.config import ModelConfig, PromptConfig
from cselab.model.loader import load
from cselab.model.prompt import PROMPTBERT, model_papers
from cselab.model.sentence_encoder import SentenceEncoder
from cselab.objectives import ObjectiveContext, build_objective, total_loss
from cselab.publish.usage import PROMPT_RECIPE, usage_snippets
from cselab.training.task import Batch, Task
from cselab.training.views import compute_views
from scaleout_helpers import (
    ALL_VARIANTS,
    PAIRS,
    SUPERVISED_VARIANTS,
    objective,
    tiny_pair_batch,
)

REPO = Path(__file__).resolve().parents[1]
T1 = 'This sentence of "[X]" means [MASK].'
T2 = 'This sentence : "[X]" means [MASK].'
# The authors' spelling of the same templates (run.sh, unsup-bert)
AUTHORS_T1 = '*cls*_This_sentence_of_"*sent_0*"_means*mask*.*sep+*'
AUTHORS_T2 = '*cls*_This_sentence_:_"*sent_0*"_means*mask*.*sep+*'
SENTENCES = [
    "a man is playing a guitar .",
    "the cat sleeps",
    "two dogs run across a wide green field while children watch them from the fence",
    "ok",
]

pytestmark = pytest.mark.usefixtures("one_thread")


def prompt_encoder(path: Path, **prompt: object) -> SentenceEncoder:
    enc = SentenceEncoder.from_pretrained(
        str(path), pooler="prompt", dropout=0.0, fast_path=False,
        prompt={"template": T1, "template2": T2, **prompt},
    )  # fmt: skip
    return enc


# ------------------------------------------------------------------- the authors' code, as loops
def authors_pieces(template: str, tokenizer) -> tuple[list[int], list[int]]:
    """``train.py``: the template's ``bs`` (with ``[CLS]``) and ``es`` (with ``[SEP]``) ids."""
    t = (
        template.replace("*mask*", tokenizer.mask_token)
        .replace("*sep+*", "")
        .replace("*cls*", "")
        .replace("*sent_0*", " ")
    )
    bs_text, es_text = t.split(" ")
    bs = tokenizer.encode(bs_text.replace("_", " "))[:-1]
    es = tokenizer.encode(es_text.replace("_", " "))[1:]
    return bs, es


def authors_features(template: str, tokenizer, sentences: list[str], max_len: int):
    """``prepare_features``: ``bs + s[:max_len] + es``, right-padded, with the attention mask."""
    bs, es = authors_pieces(template, tokenizer)
    rows = [bs + tokenizer.encode(s, add_special_tokens=False)[:max_len] + es for s in sentences]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return ids, mask


def authors_delta(backbone, template: str, tokenizer, length: int = 50) -> tuple[torch.Tensor, int]:
    """``get_delta``: the template alone, ``length`` rows, positions after ``bs`` shifted by the
    row index; returns ``delta`` ``(length, D)`` and ``template_len``."""
    bs, es = authors_pieces(template, tokenizer)
    bs_text_ids = bs[1:]  # models.py's cls.bs: without [CLS] (add_special_tokens=False)
    template_ids = tokenizer.encode(tokenizer.decode(bs[1:] + es[:-1]))
    assert template_ids == bs + es  # train.py asserts the same
    d_ids = torch.tensor([template_ids]).repeat(length, 1)
    d_pos = torch.arange(d_ids.shape[1]).unsqueeze(0).repeat(length, 1)
    d_pos[:, len(bs_text_ids) + 1 :] += torch.arange(length).unsqueeze(-1)
    # the authors' call had no mask (full attention in their transformers); since 5.25 a
    # missing mask with jumping position ids is read as packed sequences, so say it: all ones
    ones = torch.ones_like(d_ids)
    hidden = backbone(input_ids=d_ids, position_ids=d_pos, attention_mask=ones).last_hidden_state
    return hidden[d_ids == tokenizer.mask_token_id], d_ids.shape[1]


def authors_vectors(backbone, tokenizer, template: str, sentences, max_len: int, denoise: bool):
    """``cl_forward``'s pooling for one view (before the MLP)."""
    ids, mask = authors_features(template, tokenizer, sentences, max_len)
    hidden = backbone(input_ids=ids, attention_mask=mask).last_hidden_state
    out = hidden[ids == tokenizer.mask_token_id]
    if denoise:
        delta, template_len = authors_delta(backbone, template, tokenizer)
        out = out - delta[mask.sum(-1) - template_len]
    return out


# ------------------------------------------------------------------------------------- splicing
def test_splice_and_mask_position_equal_the_authors_features(tiny_bert: Path) -> None:
    enc = prompt_encoder(tiny_bert)
    tok = enc.tokenizer
    max_len = 6  # the authors cut the sentence at max_seq_length tokens (the third is longer)
    batch = enc.tokenize(SENTENCES, max_seq_len=max_len + 2)  # + [CLS] and [SEP]
    for t, (ours, authors) in enumerate([(T1, AUTHORS_T1), (T2, AUTHORS_T2)]):
        spliced = enc.prompt.splice(
            batch["input_ids"], batch["attention_mask"], torch.full((len(SENTENCES),), t)
        )
        ids, mask = authors_features(authors, tok, SENTENCES, max_len)
        assert torch.equal(spliced.input_ids, ids) and torch.equal(spliced.attention_mask, mask)
        rows, cols = (ids == tok.mask_token_id).nonzero(as_tuple=True)
        assert torch.equal(rows, torch.arange(len(SENTENCES)))
        assert torch.equal(spliced.mask_index, cols)
        # evaluation.py tokenises the template's text around the sentence: the same ids
        full = enc.tokenize(SENTENCES, max_seq_len=100)
        spliced = enc.prompt.splice(
            full["input_ids"], full["attention_mask"], torch.full((len(SENTENCES),), t)
        )
        whole = tok([ours.replace("[X]", s) for s in SENTENCES], padding=True, return_tensors="pt")
        assert torch.equal(spliced.input_ids, whole["input_ids"])


def test_splice_finds_the_mask_in_the_prefix_and_ignores_a_mask_in_the_sentence(
    tiny_bert: Path,
) -> None:
    enc = prompt_encoder(tiny_bert, template="[MASK] is what [X] means .", template2=None)
    batch = enc.tokenize(["a [MASK] b", "c"])
    spliced = enc.prompt.splice(batch["input_ids"], batch["attention_mask"])
    assert spliced.mask_index.tolist() == [1, 1]
    assert int((spliced.input_ids[0] == enc.tokenizer.mask_token_id).sum()) == 2


# ------------------------------------------------------------------------------------ the values
def test_training_views_equal_the_authors_cl_forward_in_float64(tiny_bert64: Path) -> None:
    """z1 through template 1 minus its delta, z2 through template 2 minus its own, then the
    MLP (``mlp_only_train``: in training)."""
    enc = prompt_encoder(tiny_bert64).double().train()
    tok = enc.tokenizer
    batch = enc.tokenize(SENTENCES, max_seq_len=34)
    views = compute_views(enc, batch, ["z1", "z2"])
    with torch.no_grad():
        for name, template in (("z1", AUTHORS_T1), ("z2", AUTHORS_T2)):
            ref = authors_vectors(enc.backbone, tok, template, SENTENCES, 32, denoise=True)
            ref = enc.pooler.mlp(ref)
            torch.testing.assert_close(views[name].detach(), ref, rtol=0, atol=1e-10)
        # without denoising: the plain [MASK] state
        enc.prompt.config = dataclasses.replace(enc.prompt.config, denoise=False)
        plain = compute_views(enc, batch, ["z1", "z2"])["z1"]
        ref = enc.pooler.mlp(authors_vectors(enc.backbone, tok, AUTHORS_T1, SENTENCES, 32, False))
        torch.testing.assert_close(plain, ref, rtol=0, atol=1e-10)
        assert (plain - views["z1"]).abs().max() > 1e-3  # denoising changed the vectors


@pytest.mark.parametrize("denoise", [False, True])
def test_inference_vectors_equal_the_authors_evaluation(tiny_bert64: Path, denoise: bool) -> None:
    """``evaluation.py``: the [MASK] state, minus ``get_delta``'s with ``denoise_inference``;
    no MLP (``mlp_only_train``). ``encode``, the evaluation's encoder call and the forward agree."""
    enc = prompt_encoder(tiny_bert64, denoise_inference=denoise).double().eval()
    with torch.no_grad():
        ref = authors_vectors(enc.backbone, enc.tokenizer, AUTHORS_T1, SENTENCES, 100, denoise)
    encoded = enc.encode(SENTENCES, batch_size=3)
    np.testing.assert_allclose(encoded, ref.numpy(), rtol=0, atol=1e-6)  # float32 output
    np.testing.assert_array_equal(call_encoder(enc, SENTENCES, batch_size=3), encoded)


def test_two_templates_give_two_views_and_one_template_one(tiny_bert: Path) -> None:
    enc = prompt_encoder(tiny_bert).train()  # dropout 0: only the template differs
    batch = enc.tokenize(SENTENCES)
    with torch.no_grad():
        views = compute_views(enc, batch, ["z1", "z2", "off"])
        assert (views["z1"] - views["z2"]).abs().max() > 1e-4
        torch.testing.assert_close(views["off"], views["z1"])  # the anchors' template
        same = prompt_encoder(tiny_bert, template2=None).train()
        views = compute_views(same, batch, ["z1", "z2"])
        torch.testing.assert_close(views["z1"], views["z2"])


def test_pairs_read_anchors_through_template_and_the_rest_through_template2(
    tiny_bert: Path,
) -> None:
    enc = prompt_encoder(tiny_bert).train()
    batch = tiny_pair_batch(enc, 4)
    kind = DataKind(pairs=True, negatives=batch.num_negatives)
    with torch.no_grad():
        views = compute_views(enc, batch, ["z1", "z2", "neg"], kind)
        pos = batch.positives
        two = torch.ones(4, dtype=torch.long)
        torch.testing.assert_close(views["z2"], enc(**pos, template=two))
        assert (views["z2"] - enc(**pos)).abs().max() > 1e-4


def test_fast_path_gives_the_plain_forward_s_vectors(tiny_bert: Path) -> None:
    fast = SentenceEncoder.from_pretrained(str(tiny_bert), pooler="prompt", dropout=0.0)
    plain = prompt_encoder(
        tiny_bert, template=PromptConfig.template, template2=PromptConfig.template2
    )
    plain.pooler.mlp.load_state_dict(fast.pooler.mlp.state_dict())  # a fresh head each
    assert fast.unpad_training
    batch = fast.tokenize(SENTENCES)
    with torch.no_grad():
        fast.train(), plain.train()
        torch.testing.assert_close(fast(**batch), plain(**batch), rtol=1e-4, atol=1e-5)


# -------------------------------------------------------------------------------- training steps
@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_every_objective_trains_with_the_prompt_pooler(tiny_bert: Path, variant: str) -> None:
    enc = SentenceEncoder.from_pretrained(str(tiny_bert), pooler="prompt").train()
    kind = PAIRS if variant in SUPERVISED_VARIANTS else DataKind()
    batch = tiny_pair_batch(enc, 4) if kind.pairs else enc.tokenize(SENTENCES)
    task = Task(enc, objective(variant), ObjectiveContext(), kind=kind)
    loss = total_loss(task(Batch(0, batch)))
    loss.backward()
    assert torch.isfinite(loss)
    assert enc.pooler.mlp.dense.weight.grad is not None
    assert float(enc.backbone.embeddings.word_embeddings.weight.grad.abs().sum()) > 0


def test_cli_train_save_load_and_the_transformers_recipe(tiny_bert: Path, tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path, 40)
    out = tmp_path / "run"
    code = main([
        "train", f"--model.name_or_path={tiny_bert}", "--model.pooler=prompt",
        f"--data.train_file={corpus}", f"--data.cache_dir={tmp_path}/cache",
        f"--train.output_dir={out}", "--train.batch_size=8", "--train.max_steps=2",
        "--train.eval_steps=0", "--eval.enabled=false", "--train.device=cpu",
    ])  # fmt: skip
    assert code == 0
    folder = next(p for p in (out / "last", out / "best") if p.is_dir())
    model = load(str(folder))
    assert model.prompt is not None and model.prompt.config == PromptConfig()
    vectors = model.encode(SENTENCES)
    # the documented transformers recipe gives the same vectors
    from transformers import AutoModel, AutoTokenizer

    scope: dict = {}
    exec(PROMPT_RECIPE, scope)
    hf = AutoModel.from_pretrained(str(folder)).eval()
    tok = AutoTokenizer.from_pretrained(str(folder))
    for denoise in (False, True):
        model.prompt.config = dataclasses.replace(model.prompt.config, denoise_inference=denoise)
        got = scope["prompt_vectors"](hf, tok, SENTENCES, PromptConfig.template, denoise=denoise)
        np.testing.assert_allclose(got.numpy(), model.encode(SENTENCES), rtol=1e-4, atol=1e-5)
    assert not np.allclose(vectors, model.encode(SENTENCES))  # denoising moved them
    # the docs show the recipe as written; the folder says what sentence-transformers gives
    assert PROMPT_RECIPE in (REPO / "docs" / "objectives.md").read_text()
    assert "sentence_transformers" in (folder / "cselab.json").read_text()


def test_saved_folder_round_trip_and_sentence_transformers_loads_it(
    tiny_bert: Path, tmp_path: Path
) -> None:
    enc = prompt_encoder(tiny_bert, denoise_inference=True).eval()
    enc.save(tmp_path / "m")
    again = load(str(tmp_path / "m"), fast_path=False)  # enc's forward: the same kernels
    assert again.prompt.config == enc.prompt.config
    np.testing.assert_array_equal(again.encode(SENTENCES), enc.encode(SENTENCES))


def test_sentence_transformers_computes_the_prompt_vectors(tiny_bert: Path, tmp_path: Path) -> None:
    """modules.json names cselab's module: SentenceTransformer(folder, trust_remote_code=True)
    gives cselab.load(folder)'s vectors, denoised as the folder says; without
    trust_remote_code it refuses, and without cselab the import fails naming it."""
    import subprocess
    import sys

    st = pytest.importorskip("sentence_transformers")
    enc = prompt_encoder(tiny_bert, denoise_inference=True).eval()
    enc.save(tmp_path / "m")
    modules = json.loads((tmp_path / "m" / "modules.json").read_text())
    assert [m["type"] for m in modules] == ["cselab.st.SentenceEncoderModule"]
    model = st.SentenceTransformer(str(tmp_path / "m"), device="cpu", trust_remote_code=True)
    ours = load(str(tmp_path / "m")).encode(SENTENCES)
    np.testing.assert_allclose(model.encode(SENTENCES), ours, rtol=1e-4, atol=1e-5)
    if int(st.__version__.split(".")[0]) >= 6:  # earlier versions import local classes unasked
        with pytest.raises(
            ValueError, match=r"(?s)cselab.st.SentenceEncoderModule.*trust_remote_code=True"
        ):
            st.SentenceTransformer(str(tmp_path / "m"), device="cpu")
    code = (
        "import sys; sys.modules['cselab'] = None\n"
        "from sentence_transformers import SentenceTransformer\n"
        f"SentenceTransformer({str(tmp_path / 'm')!r}, device='cpu', trust_remote_code=True)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0 and "cselab" in proc.stderr.strip().splitlines()[-1]


# ------------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ({"template": "no slot [MASK]"}, r"model\.prompt\.template must contain \[X\]"),
        ({"template": "[X] [MASK] [MASK]"}, r"model\.prompt\.template must contain \[MASK\]"),
        ({"template2": "[X] [X] [MASK]"}, r"model\.prompt\.template2 must contain \[X\]"),
    ],
)
def test_bad_templates_are_refused_naming_the_key(prompt: dict, message: str) -> None:
    cfg = Config(model=ModelConfig(pooler="prompt", prompt=from_dict(PromptConfig, prompt)))
    with pytest.raises(ConfigError, match=message):
        cfg.validate()


def test_head_at_inference_and_a_tokenizer_without_mask_are_refused(tiny_bert: Path) -> None:
    with pytest.raises(ConfigError, match="model.mlp_only_train must be true"):
        Config(model=ModelConfig(pooler="prompt", mlp_only_train=False)).validate()
    from transformers import AutoTokenizer

    from cselab.model.prompt import Prompt

    tok = AutoTokenizer.from_pretrained(str(tiny_bert))
    tok.mask_token = None
    with pytest.raises(ConfigError, match="model.prompt.template: the tokenizer has no mask"):
        Prompt(PromptConfig(), tok)
    # other poolers ignore the section
    Config(model=ModelConfig(prompt=PromptConfig(template="anything"))).validate()


# ---------------------------------------------------------------------------- preset, card, docs
def test_preset_is_the_authors_unsupervised_bert_recipe() -> None:
    cfg = load_config(REPO / "src/cselab/presets" / "promptbert-bert-base.yaml")
    m, t = cfg.model, cfg.train
    assert (m.pooler, m.mlp_only_train, m.max_seq_len) == ("prompt", True, 34)
    assert (m.prompt.template, m.prompt.template2) == (T1, T2)
    assert m.prompt.denoise and not m.prompt.denoise_inference
    assert (t.batch_size, t.lr, t.epochs, cfg.objective.temperature) == (256, 1e-5, 1, 0.05)
    text = (REPO / "src/cselab/presets" / "promptbert-bert-base.yaml").read_text()
    assert re.search(r"Avg\.\):\n#.*78\.54$", text, re.M)
    build_objective(cfg.objective)


def test_card_cites_promptbert_and_tells_sentence_transformers_users() -> None:
    model = ModelConfig(pooler="prompt")
    assert model_papers(model) == (PROMPTBERT,) and model_papers(ModelConfig()) == ()
    text = usage_snippets("m", model)
    assert "cselab.st.SentenceEncoderModule" in text and "prompt_vectors(" in text
    assert "SentenceTransformer(model_id, trust_remote_code=True)" in text


def test_card_snippets_run_give_cselab_s_vectors_and_cite_promptbert(
    tiny_bert: Path, tmp_path: Path
) -> None:
    from cselab.publish.card import write_model_card
    from test_card import CARD_FILE, code_blocks, tiny_config

    config = tiny_config(tiny_bert, tmp_path, "--model.pooler=prompt")
    SentenceEncoder.from_config(config.model).save(tmp_path / "model")
    write_model_card(tmp_path / "model", config)
    text = (tmp_path / "model" / CARD_FILE).read_text()
    assert "@inproceedings{jiang2022promptbert" in text and "- promptbert" in text
    assert "SentenceTransformer(model_id, trust_remote_code=True)" in text
    spaces = []
    for block in code_blocks(text):
        ns: dict = {}
        exec(compile(block, "README.md", "exec"), ns)  # noqa: S102 - the test's point
        spaces.append(ns)
    assert len(spaces) == 3  # sentence-transformers, cselab, transformers
    st, cs, hf = spaces[0]["embeddings"][:2], spaces[1]["vectors"], spaces[2]["vectors"].numpy()[:2]
    np.testing.assert_allclose(hf, cs, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(st, cs, rtol=1e-4, atol=1e-5)


def test_the_device_splice_equals_the_row_by_row_one(tiny_bert: Path) -> None:
    """``Prompt.splice_tensors`` (what a GPU runs: no host sync) puts every row where the
    row-by-row splice puts it, for each template and for a doubled batch of both (the views'
    layout); its extra columns, if any, are masked padding."""
    enc = prompt_encoder(tiny_bert)
    batch = enc.tokenize([*SENTENCES, "x"], max_seq_len=12)
    n = batch["input_ids"].shape[0]
    cases = [
        torch.full((n,), 0),
        torch.full((n,), 1),
        torch.tensor([0, 1] * (n // 2) + [1] * (n % 2)),
    ]
    for which in cases:
        rows = enc.prompt.splice(batch["input_ids"], batch["attention_mask"], which)
        cols = enc.prompt.splice_tensors(batch["input_ids"], batch["attention_mask"], which)
        w = rows.input_ids.shape[1]
        assert torch.equal(cols.input_ids[:, :w], rows.input_ids)
        assert torch.equal(cols.attention_mask[:, :w], rows.attention_mask)
        assert not cols.attention_mask[:, w:].any()
        assert bool((cols.input_ids[:, w:] == enc.prompt.pad_id).all())
        for name in ("mask_index", "length", "template"):
            assert torch.equal(getattr(cols, name), getattr(rows, name)), name


def test_the_device_template_states_equal_the_grouped_ones(tiny_bert64: Path) -> None:
    """Denoising's template-alone states as a GPU computes them (every template for every row,
    no host sync) equal the grouped passes the CPU runs (float64, dropout off)."""
    enc = prompt_encoder(tiny_bert64).double().eval()
    batch = enc.tokenize([*SENTENCES, "x"], max_seq_len=12)
    n = batch["input_ids"].shape[0]
    which = torch.tensor([0, 1] * (n // 2) + [1] * (n % 2))
    spliced = enc.prompt.splice(batch["input_ids"], batch["attention_mask"], which)
    from cselab.model.prompt import template_states_on_device
    from test_gpu_path import SyncCounter

    with torch.no_grad():
        grouped = enc._template_states(spliced)
        with SyncCounter() as counter:  # what a GPU runs reads nothing back
            cols = enc.prompt.splice_tensors(batch["input_ids"], batch["attention_mask"], which)
            on_device = template_states_on_device(enc.backbone, enc.prompt, cols, True)
    assert counter.syncs == []
    torch.testing.assert_close(on_device, grouped, rtol=0, atol=1e-12)
