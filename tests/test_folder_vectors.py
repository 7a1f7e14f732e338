"""A sentence-transformers folder gives in cselab the vectors ``SentenceTransformer`` gives:
the ``Normalize`` module is applied, and the older layout with the backbone in
``0_Transformer/`` loads (issue 31)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from cselab.cli import main

SENTENCES = [
    "A man is playing a guitar.",
    "Someone is playing music on a stage tonight.",
    "The cat sleeps.",
    "Stock markets fell sharply on Monday after the announcement.",
]
#: float32 unit vectors of MiniLM computed two ways (cselab's packed attention, ST's padded
#: one): entries differ by float32 rounding of a 6-layer forward, far below this
ATOL = 1e-4


def _st_vectors(folder: Path) -> np.ndarray:
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(str(folder), device="cpu")
    return model.encode(SENTENCES, convert_to_numpy=True)


def _cli_encode(folder: Path, tmp_path: Path, *extra: str) -> np.ndarray:
    inp = tmp_path / "in.txt"
    inp.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    out = tmp_path / f"out{len(list(tmp_path.glob('out*.npy')))}.npy"
    assert (
        main(["-q", "encode", str(folder), "--input", str(inp), "--output", str(out), *extra]) == 0
    )
    return np.load(out)


def test_a_folder_ending_in_normalize_gives_sentence_transformers_vectors(
    minilm_path: Path, tmp_path: Path
) -> None:
    from cselab.model.encoder import load

    reference = _st_vectors(minilm_path)
    np.testing.assert_allclose(np.linalg.norm(reference, axis=1), 1.0, atol=1e-5)
    plain = _cli_encode(minilm_path, tmp_path)
    np.testing.assert_allclose(plain, reference, atol=ATOL)
    # the full-width prefix and the plain call agree: both are the unit vectors
    full = _cli_encode(minilm_path, tmp_path, "--dim", "384")
    np.testing.assert_allclose(full, plain, atol=1e-6)
    encoder = load(str(minilm_path))
    np.testing.assert_allclose(encoder.encode(SENTENCES), reference, atol=ATOL)
    # a Matryoshka prefix is cut from the pooled vector, then normalised once
    raw = encoder.encode(SENTENCES, dim=384)
    np.testing.assert_allclose(encoder.encode(SENTENCES, dim=64), _unit(raw[:, :64]), atol=1e-6)


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_a_run_trained_from_minilm_gives_sentence_transformers_vectors(
    minilm_path: Path, tmp_path: Path
) -> None:
    import cselab
    from conftest import write_corpus

    out = tmp_path / "run"
    argv = ["-q", "train", f"--model.name_or_path={minilm_path}", "--model.pooler=avg",
            f"--data.train_file={write_corpus(tmp_path / 'data', 32)}",
            f"--data.cache_dir={tmp_path / 'cache'}", f"--train.output_dir={out}",
            "--train.batch_size=8", "--train.max_steps=4", "--train.eval_steps=0",
            "--train.device=cpu", "--model.max_seq_len=16"]  # fmt: skip
    assert main(argv) == 0
    folder = out / "last"
    modules = json.loads((folder / "modules.json").read_text())
    assert modules[-1]["type"].endswith("Normalize")
    np.testing.assert_allclose(
        cselab.load(str(folder)).encode(SENTENCES), _st_vectors(folder), atol=ATOL
    )


def _old_layout(minilm_path: Path, root: Path) -> Path:
    """all-MiniLM-L6-v2 rewritten in the layout of sentence-transformers before 2021: the
    backbone, tokenizer and sentence_bert_config.json in 0_Transformer/."""
    inner = root / "0_Transformer"
    inner.mkdir(parents=True)
    for f in minilm_path.iterdir():
        if f.is_file() and f.name not in ("modules.json", "README.md", "data_config.json"):
            target = inner if f.name != "config_sentence_transformers.json" else root
            (target / f.name).symlink_to(f)
    shutil.copytree(minilm_path / "1_Pooling", root / "1_Pooling")
    modules = json.loads((minilm_path / "modules.json").read_text())
    modules[0]["path"] = "0_Transformer"
    (root / "modules.json").write_text(json.dumps(modules))
    return root


def test_the_older_layout_with_0_transformer_loads_in_every_command(
    minilm_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder = _old_layout(minilm_path, tmp_path / "old-st")
    reference = _st_vectors(folder)
    np.testing.assert_allclose(_cli_encode(folder, tmp_path), reference, atol=ATOL)

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    index = tmp_path / "old.index"
    assert (
        main(["-q", "index", "build", str(corpus), "--model", str(folder), "-o", str(index)]) == 0
    )
    capsys.readouterr()
    assert main(["search", str(index), SENTENCES[2], "-k", "1", "--json"]) == 0
    found = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert json.dumps(found).count(SENTENCES[2]) >= 1

    sts = tmp_path / "pairs.tsv"
    sts.write_text(
        "sentence1\tsentence2\tscore\n"
        + "".join(
            f"{a}\t{b}\t{i + j}\n"
            for i, a in enumerate(SENTENCES)
            for j, b in enumerate(SENTENCES)
            if i < j
        )
    )
    result = tmp_path / "eval.json"
    assert main(["-q", "evaluate", str(folder), "--sts-file", str(sts), "-o", str(result)]) == 0
    assert result.is_file()


def test_a_transformer_path_outside_the_folder_is_refused(
    minilm_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder = _old_layout(minilm_path, tmp_path / "old-st")
    modules = json.loads((folder / "modules.json").read_text())
    modules[0]["path"] = "../elsewhere"
    (folder / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "elsewhere").mkdir()
    inp = tmp_path / "in.txt"
    inp.write_text("a\n")
    assert main(["encode", str(folder), "--input", str(inp), "--output", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"cselab encode: error: {folder / 'modules.json'}: the Transformer module's path "
        "'../elsewhere' is not a folder inside the model folder"
    )
