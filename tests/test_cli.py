"""Command line: one-line user errors with exit status 2, encode round trip, train end to end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cselab.cli import main
from cselab.model.encoder import SentenceEncoder


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cselab", *args], capture_output=True, text=True)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["train", "--train.nosuch=1"], "unknown config key 'train.nosuch'"),
        (["train", "missing.yaml"], "config file not found: missing.yaml"),
        (["train", "--train.batch_size=x"], "train.batch_size: expected an integer"),
        (["train", "--model.unpad_cuda=true"], "model.unpad_cuda was removed: varlen attention"),
    ],
)
def test_train_config_errors_are_one_line(
    args: list[str], needle: str, capsys: pytest.CaptureFixture
) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_train_missing_corpus_is_one_line(tiny_bert: Path, tmp_path: Path) -> None:
    proc = run("train", f"--model.name_or_path={tiny_bert}", f"--data.train_file={tmp_path}/none.txt",
               "--train.eval_steps=0", f"--train.output_dir={tmp_path}/out")  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith("none.txt: training file not found")
    assert "Traceback" not in proc.stderr


def test_train_cache_dir_that_is_a_file_is_one_line(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    corpus, cache = tmp_path / "c.txt", tmp_path / "cache"
    corpus.write_text("one\ntwo\nthree\n")
    cache.write_text("not a folder")
    code = main(["train", f"--model.name_or_path={tiny_bert}", f"--data.train_file={corpus}",
                 f"--data.cache_dir={cache}", "--train.eval_steps=0",
                 f"--train.output_dir={tmp_path}/out"])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"data.cache_dir={cache} is a file, not a folder")
    assert len(err.splitlines()) == 1 and not (tmp_path / "out").exists()


def test_train_too_small_corpus(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text("one\ntwo\nthree\n")
    code = main(["train", f"--model.name_or_path={tiny_bert}", f"--data.train_file={corpus}",
                 f"--data.cache_dir={tmp_path}/cache", "--train.eval_steps=0",
                 f"--train.output_dir={tmp_path}/out"])  # fmt: skip
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"cselab train: error: {corpus}: the training data has 3 sentences, fewer than one "
        "batch of 64 (train.batch_size)"
    )


# `cselab encode` and SentenceEncoder.encode run the same float64 model (float64: their batches
# may sum in different orders) and both return float32: equal up to one float32 rounding.
EPS32 = float(np.finfo(np.float32).eps)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_encode_round_trip(tiny_bert64: Path, tmp_path: Path, precision: str) -> None:
    enc = SentenceEncoder.from_pretrained(str(tiny_bert64), pooler="avg")
    enc.save(tmp_path / "model")
    sentences = ["a first sentence .", "and a second , longer one ."]
    (tmp_path / "in.txt").write_text("\n".join(sentences) + "\n")
    args = ["encode", str(tmp_path / "model"), "--input", str(tmp_path / "in.txt"),
            "--output", str(tmp_path / "v.npy"), "--precision", precision]  # fmt: skip
    assert main(args) == 0
    np.testing.assert_allclose(
        np.load(tmp_path / "v.npy"),
        enc.encode(sentences, precision=precision),
        rtol=EPS32,
        atol=1e-12,
    )
    with pytest.raises(SystemExit):  # argparse: not one of the choices
        main([*args[:-1], "fp16"])


def test_encode_gives_one_vector_per_line(
    tiny_bert64: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Only "\\n" ends a line: a U+2028 or a form feed inside a line, CRLF endings and a blank
    line must not change the count (str.splitlines() would give 7 vectors here, not 5)."""
    enc = SentenceEncoder.from_pretrained(str(tiny_bert64), pooler="avg")
    enc.save(tmp_path / "model")
    lines = ["one\u2028still one", "two\x0cstill two", "", "four", "five"]
    (tmp_path / "in.txt").write_bytes(("\r\n".join(lines) + "\r\n").encode("utf-8"))
    # an output named without ".npy" gets it (np.save's rule), and the message names that file
    assert main(["encode", str(tmp_path / "model"), "--input", str(tmp_path / "in.txt"),
                 "--output", str(tmp_path / "v")]) == 0  # fmt: skip
    assert capsys.readouterr().out.strip().endswith(f"float32 to {tmp_path / 'v.npy'}")
    vectors = np.load(tmp_path / "v.npy")
    assert vectors.shape[0] == 5
    np.testing.assert_allclose(vectors, enc.encode(lines), rtol=EPS32, atol=1e-12)


def test_override_values_with_spaces_reach_the_config(tiny_bert: Path, tmp_path: Path) -> None:
    """argparse takes an argument holding a space for a positional one (the config file): the
    overrides are taken out before it parses (issue 31)."""
    import yaml

    from conftest import write_corpus

    corpus = write_corpus(tmp_path / "with space", 32)
    out = tmp_path / "a b"
    template = 'The sentence "[X]" means [MASK].'
    proc = run(
        "-q", "train", f"--model.name_or_path={tiny_bert}", "--model.pooler=prompt",
        f"--model.prompt.template={template}", "--model.prompt.template2=null",
        f"--data.train_file={corpus}", f"--data.cache_dir={tmp_path / 'cache'}",
        f"--train.output_dir={out}", "--train.batch_size=8", "--train.max_steps=1",
        "--train.eval_steps=0", "--train.device=cpu",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    saved = yaml.safe_load((out / "config.yaml").read_text(encoding="utf-8"))
    assert saved["model"]["prompt"]["template"] == template
    assert saved["data"]["train_file"] == str(corpus)
    # other commands take no overrides, with or without spaces
    with pytest.raises(SystemExit, match="2"):
        main(["encode", str(tiny_bert), "--input", "x", "--output", "y", "--a.b=c d"])


def test_train_on_a_float64_checkpoint(tiny_bert64: Path, tmp_path: Path) -> None:
    """The ``cls`` head was float32 beside a float64 backbone: ``mat1 and mat2 must have the
    same dtype`` (issue 31). The head follows the backbone's dtype."""
    from safetensors.torch import load_file

    from conftest import write_corpus

    out = tmp_path / "run"
    argv = ["-q", "train", f"--model.name_or_path={tiny_bert64}", "--model.pooler=cls",
            f"--data.train_file={write_corpus(tmp_path / 'data', 32)}",
            f"--data.cache_dir={tmp_path / 'cache'}", f"--train.output_dir={out}",
            "--train.batch_size=8", "--train.max_steps=2", "--train.eval_steps=0",
            "--train.device=cpu"]  # fmt: skip
    assert main(argv) == 0
    head = load_file(str(out / "last" / "pooler_head.safetensors"))
    assert {str(t.dtype) for t in head.values()} == {"torch.float64"}
    vectors = SentenceEncoder.from_pretrained(str(out / "last"), pooler="cls").encode(["a b c"])
    assert vectors.shape == (1, 32) and np.isfinite(vectors).all()
