"""Models cselab did not train: .bin-only checkpoints, ``--pooler cls`` as the model's
``pooler_output``, sentence-transformers pooling modes, the saved ``max_seq_length``."""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from cselab.cli import main
from cselab.model.encoder import SentenceEncoder, load
from cselab.model.hf_models import ModelFormatError, max_sequence_length, position_limit
from cselab.model.hub import resolve_model

SENTENCES = ["a man is playing a guitar .", "the stock market fell sharply on monday"]
EPS32 = float(np.finfo(np.float32).eps)


def bin_only_copy(src: Path, dst: Path) -> Path:
    """``src``'s model re-saved as ``pytorch_model.bin`` only (as older Hub checkpoints are)."""
    # transformers 5 saves safetensors only: write the pickle as older versions did.
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, dst)
    torch.save(load_file(str(src / "model.safetensors")), dst / "pytorch_model.bin")
    return dst


def test_folder_with_only_pytorch_model_bin_loads(tiny_bert: Path, tmp_path: Path) -> None:
    folder = bin_only_copy(tiny_bert, tmp_path / "bin")
    assert (folder / "pytorch_model.bin").is_file() and not list(folder.glob("*.safetensors"))
    enc = load(str(folder), pooler="avg")
    want = load_file(str(tiny_bert / "model.safetensors"))
    got = enc.backbone.state_dict()
    for k, v in want.items():
        assert torch.equal(got[k], v), k


class Payload:
    """Unpickles to a call of ``exec``: prints and creates ``marker`` if it ever runs."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204
        code = f"print('payload ran'); open({str(self.marker)!r}, 'w').write('pwned')"
        return (exec, (code,))


def test_pickled_weights_never_run_code(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A .bin whose pickle would print and create a file when unpickled: loading refuses it
    with one line saying the file holds code or objects and was not loaded, from Python and
    from the command line, and the file is never created."""
    folder = bin_only_copy(tiny_bert, tmp_path / "evil")
    marker = tmp_path / "pwned"
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    state["embeddings.word_embeddings.weight"] = Payload(marker)
    torch.save(state, folder / "pytorch_model.bin")
    message = (
        f"{folder / 'pytorch_model.bin'}: the file holds code or objects, not only tensors, "
        "and was not loaded"
    )
    for pooler in ("avg", None):
        with pytest.raises(ModelFormatError) as err:
            load(str(folder), pooler=pooler)
        assert str(err.value) == message
    (tmp_path / "in.txt").write_text("a sentence\n", encoding="utf-8")
    args = ["encode", str(folder), "--input", str(tmp_path / "in.txt")]
    assert main([*args, "--output", str(tmp_path / "v.npy")]) == 2
    assert capsys.readouterr().err.strip() == f"cselab encode: error: {message}"
    assert not marker.exists() and not (tmp_path / "v.npy").exists()
    # The payload is real: unpickled without weights_only it runs (this test's own doing).
    torch.load(folder / "pytorch_model.bin", weights_only=False)
    assert marker.read_text() == "pwned" and "payload ran" in capsys.readouterr().out


class FakeSnapshots:
    """``huggingface_hub.snapshot_download`` over a local folder: copies the files that match
    ``allow_patterns`` (fnmatch, as the Hub client filters) into a fresh snapshot folder."""

    def __init__(self, repo: Path, root: Path) -> None:
        self.repo, self.root, self.calls = repo, root, []

    def __call__(self, repo_id: str, revision: str | None = None, allow_patterns=None, **_):  # noqa: ANN001
        self.calls.append(list(allow_patterns))
        out = self.root / f"snapshot{len(self.calls)}"
        for f in self.repo.rglob("*"):
            rel = f.relative_to(self.repo).as_posix()
            if f.is_file() and any(fnmatch.fnmatch(rel, p) for p in allow_patterns):
                (out / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(f, out / rel)
        return str(out)


@pytest.mark.parametrize("weights", ["bin", "safetensors"])
def test_hub_model_fetches_bin_only_when_there_is_no_safetensors(
    tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, weights: str
) -> None:
    import huggingface_hub

    repo = bin_only_copy(tiny_bert, tmp_path / "repo")
    if weights == "safetensors":
        shutil.copy(tiny_bert / "model.safetensors", repo)
    fake = FakeSnapshots(repo, tmp_path / "cache")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    folder = Path(resolve_model("princeton-nlp/unsup-simcse-bert-base-uncased"))
    assert (folder / "config.json").is_file()
    if weights == "bin":
        assert len(fake.calls) == 2 and "pytorch_model*.bin" in fake.calls[1]
        assert [f.name for f in folder.glob("*.bin")] == ["pytorch_model.bin"]
        assert load(str(folder), pooler="avg").dim == 32
    else:  # never download both copies of the weights
        assert len(fake.calls) == 1 and not list(folder.glob("*.bin"))


def test_pooler_cls_on_a_plain_model_is_its_pooler_output(tiny_bert64: Path) -> None:
    """SimCSE's evaluation: ``--pooler cls`` reads ``pooler_output`` (tanh(W h_CLS + b))."""
    from transformers import AutoModel, AutoTokenizer

    enc = load(str(tiny_bert64), pooler="cls")
    assert enc.pooler.uses_head
    ours = enc.encode(SENTENCES)
    model = AutoModel.from_pretrained(tiny_bert64).eval()
    batch = AutoTokenizer.from_pretrained(tiny_bert64)(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        theirs = model(**batch).pooler_output.numpy()
    assert np.abs(theirs - model(**batch).last_hidden_state[:, 0].detach().numpy()).max() > 0.1
    np.testing.assert_allclose(ours, theirs, rtol=EPS32, atol=1e-12)  # float64 model, float32 out


def test_pooler_cls_without_a_pooler_is_one_clear_line(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from transformers import BertModel

    no_pooler = tmp_path / "no-pooler"
    BertModel.from_pretrained(tiny_bert, add_pooling_layer=False).save_pretrained(no_pooler)
    shutil.copy(tiny_bert / "tokenizer.json", no_pooler)
    shutil.copy(tiny_bert / "tokenizer_config.json", no_pooler)
    with pytest.raises(ModelFormatError, match="no pooler weights"):
        load(str(no_pooler), pooler="cls")
    (tmp_path / "in.txt").write_text("one sentence\n")
    code = main(["encode", str(no_pooler), "--pooler", "cls", "--input", str(tmp_path / "in.txt"),
                 "--output", str(tmp_path / "v.npy")])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2 and "Traceback" not in err
    err = err.splitlines()[-1]  # above it: transformers' loading progress bar
    assert err.startswith(f"cselab encode: error: pooler 'cls' on {no_pooler}: the checkpoint")
    assert "--pooler cls_before_pooler" in err
    # `cselab train` takes the pooler as a config key: the same error names the override
    from cselab.cli import build_parser
    from cselab.cli.options import _subcommand, setting_words

    with pytest.raises(ModelFormatError) as caught:
        load(str(no_pooler), pooler="cls")
    assert "choose pooler='cls_before_pooler' or pooler='avg'" in str(caught.value)
    root = build_parser()
    said = setting_words(caught.value, _subcommand(root, ["train"]), root)
    assert "choose --model.pooler=cls_before_pooler or --model.pooler=avg" in said


def test_pooler_cls_on_an_architecture_without_pooler(tmp_path: Path, tiny_bert: Path) -> None:
    from transformers import DistilBertConfig, DistilBertModel

    cfg = DistilBertConfig(vocab_size=30522, dim=16, n_layers=1, n_heads=2, hidden_dim=32)
    DistilBertModel(cfg).save_pretrained(tmp_path / "distil")
    shutil.copy(tiny_bert / "tokenizer.json", tmp_path / "distil")
    shutil.copy(tiny_bert / "tokenizer_config.json", tmp_path / "distil")
    with pytest.raises(ModelFormatError, match="has no pooler layer"):
        load(str(tmp_path / "distil"), pooler="cls")


def st_folder(tiny_bert: Path, dst: Path, pooling: dict) -> Path:
    shutil.copytree(tiny_bert, dst)
    (dst / "1_Pooling").mkdir()
    (dst / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    (dst / "modules.json").write_text(json.dumps(modules))
    return dst


@pytest.mark.parametrize(
    ("pooling", "mode"),
    [
        ({"pooling_mode": "max"}, "max"),
        ({"pooling_mode": ["cls", "lasttoken"]}, "cls+lasttoken"),
        ({"pooling_mode": ["cls", "mean"]}, "cls+mean"),
        ({"pooling_mode_mean_sqrt_len_tokens": True}, "mean_sqrt_len_tokens"),
        ({"pooling_mode_cls_token": True, "pooling_mode_max_tokens": True}, "cls+max"),
    ],
)
def test_unsupported_sentence_transformers_pooling_is_refused(
    tiny_bert: Path, tmp_path: Path, pooling: dict, mode: str
) -> None:
    folder = st_folder(tiny_bert, tmp_path / "st", {"word_embedding_dimension": 32, **pooling})
    with pytest.raises(ModelFormatError, match=re.escape(f"pooling mode {mode} is not supported")):
        load(str(folder))
    assert load(str(folder), pooler="avg").pooler.kind == "avg"  # an explicit choice still works


@pytest.mark.parametrize(
    ("pooling", "kind"),
    [({"pooling_mode": "mean"}, "avg"), ({"pooling_mode": "cls"}, "cls_before_pooler"),
     ({"pooling_mode_cls_token": True}, "cls_before_pooler"),
     ({"pooling_mode": "lasttoken"}, "last"), ({"pooling_mode": "weightedmean"}, "weighted_mean"),
     ({"pooling_mode_weightedmean_tokens": True}, "weighted_mean")],
)  # fmt: skip
def test_supported_sentence_transformers_pooling(
    tiny_bert: Path, tmp_path: Path, pooling: dict, kind: str
) -> None:
    folder = st_folder(tiny_bert, tmp_path / "st", pooling)
    assert load(str(folder)).pooler.kind == kind


def tiny_roberta(tiny_bert: Path, dst: Path, positions: int) -> Path:
    from transformers import AutoTokenizer, RobertaConfig, RobertaModel

    torch.manual_seed(0)
    cfg = RobertaConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=positions)  # fmt: skip
    RobertaModel(cfg).save_pretrained(dst)
    tok = AutoTokenizer.from_pretrained(tiny_bert)
    tok.model_max_length = 512
    tok.save_pretrained(dst)
    return dst


def test_saved_max_seq_length_is_what_the_model_accepts(tiny_bert: Path, tmp_path: Path) -> None:
    st = pytest.importorskip("sentence_transformers")
    folder = tiny_roberta(tiny_bert, tmp_path / "roberta", positions=34)
    enc = SentenceEncoder.from_pretrained(str(folder), pooler="avg")
    assert position_limit(enc.backbone) == 32  # 34 embeddings, positions start at padding_idx+1
    enc.save(tmp_path / "out")
    saved = json.loads((tmp_path / "out" / "sentence_bert_config.json").read_text())
    assert saved["max_seq_length"] == 32
    long = [" ".join(["word"] * 100)]  # 100+ tokens: 33 positions would be out of range
    ours = enc.encode(long)
    model = st.SentenceTransformer(str(tmp_path / "out"), device="cpu")
    assert model.max_seq_length == 32
    theirs = model.encode(long)
    np.testing.assert_allclose(theirs, ours, rtol=0, atol=1e-4)  # float32, other code
    # A tokenizer that declares less than the positions hold wins.
    bert = SentenceEncoder.from_pretrained(str(tiny_bert), pooler="avg")
    bert.tokenizer.model_max_length = 16
    assert max_sequence_length(bert.tokenizer, bert.backbone) == 16
    bert.tokenizer.model_max_length = int(1e30)  # "unset" in transformers
    assert max_sequence_length(bert.tokenizer, bert.backbone) == 128


# ------------------------------------------------------------------ sentence-transformers folders


def long_text(tokenizer, tokens: int = 734) -> str:  # noqa: ANN001
    """A text of exactly ``tokens`` tokens with [CLS] and [SEP] (varied words, so that where
    it is cut changes the vector)."""
    words = ["river", "market", "guitar", "winter", "engine", "garden", "silver", "doctor"]
    text = " ".join(f"{words[i % 8]} {i}" for i in range(tokens))
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][: tokens - 2]
    text = tokenizer.decode(ids)
    assert len(tokenizer(text)["input_ids"]) == tokens
    return text


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    return (a * (b / np.linalg.norm(b, axis=1, keepdims=True))).sum(1)


def test_sentence_transformers_folder_truncates_where_its_authors_chose(minilm_path: Path) -> None:
    """all-MiniLM-L6-v2 says max_seq_length 256 (its tokenizer and positions allow 512): on a
    734-token text cselab's vectors are sentence-transformers' vectors of the same folder."""
    st = pytest.importorskip("sentence_transformers")
    enc = load(str(minilm_path))
    assert enc.folder_settings.max_seq_length == 256 and enc.folder_settings.normalize
    assert enc.accepted_max_len == 512 and enc.inference_max_len == 256
    text = long_text(enc.tokenizer)
    texts = [text, "a man is playing a guitar ."]
    theirs = st.SentenceTransformer(str(minilm_path), device="cpu").encode(texts)
    ours = enc.encode(texts)
    assert cosines(ours, theirs).min() > 0.9999
    cut_later = enc.encode(texts, max_seq_len=512)  # an explicit length still wins
    assert cosines(cut_later, theirs)[0] < 0.99


def cased_st_folder(tiny_bert: Path, dst: Path, st_config: dict) -> Path:
    """The tiny BERT with a cased tokenizer, as a sentence-transformers folder (mean pooling)."""
    from transformers import AutoTokenizer

    folder = st_folder(tiny_bert, dst, {"word_embedding_dimension": 32, "pooling_mode": "mean"})
    AutoTokenizer.from_pretrained(tiny_bert, do_lower_case=False).save_pretrained(folder)
    (folder / "sentence_bert_config.json").write_text(json.dumps(st_config))
    return folder


@pytest.mark.parametrize("lower", [True, False])
def test_sentence_transformers_do_lower_case(tiny_bert: Path, tmp_path: Path, lower: bool) -> None:
    st = pytest.importorskip("sentence_transformers")
    folder = cased_st_folder(
        tiny_bert, tmp_path / "cased", {"max_seq_length": 64, "do_lower_case": lower}
    )
    texts = ["A Man Is Playing A GUITAR .", "The Stock Market"]
    enc = load(str(folder))
    assert enc.folder_settings.do_lower_case is lower and enc.inference_max_len == 64
    got = enc.tokenize(texts)["input_ids"]
    want = enc.tokenizer([t.lower() if lower else t for t in texts], padding=True)["input_ids"]
    assert got.tolist() == want
    theirs = st.SentenceTransformer(str(folder), device="cpu").encode(texts)
    np.testing.assert_allclose(enc.encode(texts), theirs, rtol=0, atol=1e-5)


def test_a_cselab_save_keeps_the_base_models_module_list(minilm_path: Path, tmp_path: Path) -> None:
    """Trained from all-MiniLM-L6-v2 (whose folder ends in Normalize, max_seq_length 256), the
    saved folder ends in Normalize and truncates at 256 too, in sentence-transformers and in
    cselab; a base without Normalize gets none (see test_encoder's saved-folder test)."""
    st = pytest.importorskip("sentence_transformers")
    enc = SentenceEncoder.from_pretrained(str(minilm_path), pooler="cls", mlp_only_train=True)
    enc.save(tmp_path / "trained")
    modules = json.loads((tmp_path / "trained" / "modules.json").read_text())
    assert [m["type"].rpartition(".")[2] for m in modules] == [
        "Transformer",
        "Pooling",
        "Normalize",
    ]
    saved = json.loads((tmp_path / "trained" / "sentence_bert_config.json").read_text())
    assert saved == {"max_seq_length": 256, "do_lower_case": False}
    model = st.SentenceTransformer(str(tmp_path / "trained"), device="cpu")
    text = long_text(enc.tokenizer, 300)
    theirs = model.encode([text, "kids"])
    np.testing.assert_allclose(np.linalg.norm(theirs, axis=1), 1.0, rtol=1e-5)
    reloaded = load(str(tmp_path / "trained"))
    assert reloaded.folder_settings.normalize and reloaded.inference_max_len == 256
    ours = reloaded.encode([text, "kids"], normalize=True)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5)


def test_modules_cselab_does_not_reproduce_are_refused(tiny_bert: Path, tmp_path: Path) -> None:
    folder = st_folder(tiny_bert, tmp_path / "st", {"pooling_mode": "mean"})
    modules = json.loads((folder / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_Dense",
                    "type": "sentence_transformers.models.Dense"})  # fmt: skip
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ModelFormatError, match=r"module 2 is 'sentence_transformers.models.Dense'"):
        load(str(folder))
    assert load(str(folder), pooler="avg").pooler.kind == "avg"  # the backbone, as asked


@pytest.mark.parametrize(
    ("content", "message"),
    [("{", "not valid JSON"), ('{"max_seq_length": 0}', "max_seq_length must be a whole number"),
     ('{"do_lower_case": "yes"}', "do_lower_case must be true or false")],
)  # fmt: skip
def test_a_broken_sentence_bert_config_is_one_line(
    tiny_bert: Path, tmp_path: Path, content: str, message: str
) -> None:
    folder = st_folder(tiny_bert, tmp_path / "st", {"pooling_mode": "mean"})
    (folder / "sentence_bert_config.json").write_text(content)
    with pytest.raises(ModelFormatError, match=re.escape(message)) as err:
        load(str(folder))
    assert "sentence_bert_config.json" in str(err.value) and "\n" not in str(err.value)
