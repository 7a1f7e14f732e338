"""Every user error is one line (``cselab CMD: error: ...``, exit 2), found before work starts;
and SST-2 runs end to end through ``cselab evaluate``."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from conftest import needs_senteval, write_corpus
from cselab.cli import main


def one_line(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    return err.splitlines()[-1]  # lines above it, if any, are transformers' progress bars


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # fp16 runs on the CPU too (GradScaler("cpu"), to test the path); not on MPS
        (["--train.precision=fp16", "--train.device=mps"],
         "train.precision=fp16 needs a CUDA GPU or the CPU (loss scaling), not train.device=mps; "
         "use bf16 or fp32"),
        (["--train.device=gpu"],
         "train.device: 'gpu' is not a device; use auto, cpu, cuda, cuda:N, mps, xpu, hpu, mtia, "
         "xla, npu, privateuseone"),
        (["--eval.batch_size=0"], "eval.batch_size must be >= 1"),
        (["--eval.batch_size=-3"], "eval.batch_size must be >= 1"),
    ],
)  # fmt: skip
def test_train_config_errors(args: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    assert main(["train", *args]) == 2
    assert one_line(capsys) == f"cselab train: error: {message}"


def test_config_file_that_is_not_utf8(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = tmp_path / "latin1.yaml"
    config.write_bytes("train:\n  lr: 1.0e-5\n# réglages\n".encode("latin-1"))
    assert main(["train", str(config)]) == 2
    assert one_line(capsys) == (  # the readers' words, as for every other file
        f"cselab train: error: {config}:3: invalid UTF-8 at byte 3 of the line (0xe9); "
        "save the file as UTF-8"
    )


@pytest.mark.parametrize("command", ["train", "sweep"])
@pytest.mark.parametrize("case", ["folder", "gzip"])
def test_a_config_path_that_is_not_a_yaml_file_says_what_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture, command: str, case: str
) -> None:
    """A folder is not 'not found'; a compressed file is not 'not UTF-8' (the readers' words);
    a sweep's file is named as one."""
    import gzip

    config = tmp_path / "c.yaml"
    if case == "folder":
        config.mkdir()
        problem = f"{command.replace('train', 'config')} file is a folder, not a text file"
    else:
        config.write_bytes(gzip.compress(b"train:\n  lr: 1.0e-5\n"))
        problem = "a gzip-compressed file, not text; decompress it first"
    assert main([command, str(config)]) == 2
    assert one_line(capsys) == f"cselab {command}: error: {config}: {problem}"


def _tiny_train(tiny_bert: Path, tmp_path: Path, *extra: str) -> list[str]:
    return [
        "train", f"--model.name_or_path={tiny_bert}", "--model.pooler=avg",
        f"--data.train_file={write_corpus(tmp_path / 'data', 32)}",
        f"--data.cache_dir={tmp_path / 'cache'}", f"--train.output_dir={tmp_path / 'out'}",
        "--train.batch_size=8", "--train.max_steps=1", "--train.eval_steps=0", *extra,
    ]  # fmt: skip


def _only_a_cpu() -> bool:
    from cselab.model.devices import available_devices

    return available_devices() == ["cpu"]


@pytest.mark.skipif(not _only_a_cpu(), reason="needs a machine with no GPU")
@pytest.mark.parametrize("device", ["cuda:1", "mps", "hpu"])
def test_train_device_this_machine_lacks_is_one_line(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture, device: str
) -> None:
    assert main(_tiny_train(tiny_bert, tmp_path, f"--train.device={device}")) == 2
    assert one_line(capsys) == (
        f"cselab train: error: --train.device={device} is not available on this machine "
        "(available: cpu)"
    )


@pytest.mark.skipif(not _only_a_cpu(), reason="needs a machine with no GPU")
@pytest.mark.parametrize("device", ["cuda:0", "cuda", "mps", "hpu", "npu"])
def test_encode_on_a_device_this_machine_lacks_is_one_line(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture, device: str
) -> None:
    text = tmp_path / "s.txt"
    text.write_text("a sentence\n", encoding="utf-8")
    argv = ["encode", str(tiny_bert), "--input", str(text), "--output", str(tmp_path / "e.npy")]
    assert main([*argv, "--device", device]) == 2
    assert one_line(capsys) == (
        f"cselab encode: error: --device {device} is not available on this machine (available: cpu)"
    )
    assert not (tmp_path / "e.npy").exists()


@pytest.mark.skipif(not _only_a_cpu(), reason="needs a machine with no GPU")
def test_load_on_a_missing_device_names_the_keyword(tiny_bert: Path) -> None:
    from cselab.core.errors import ConfigSettingError
    from cselab.model.loader import load

    with pytest.raises(ConfigSettingError, match=r"^device='mps' is not available on this machine"):
        load(str(tiny_bert), device="mps")
    assert load(str(tiny_bert), device="cpu").device.type == "cpu"


@pytest.mark.parametrize("value", ["yes", "no", "false", 1, 0.0])
def test_bidirectional_takes_true_false_or_none_only(tiny_bert: Path, value: object) -> None:
    """A truthy string ("no") would remove a decoder's causal mask: one line naming the keyword
    and the value, from ``cselab.load`` and ``from_pretrained``."""
    import cselab
    from cselab.core.errors import ConfigSettingError, UserError
    from cselab.model.encoder import SentenceEncoder

    want = f"bidirectional={value!r}: expected True, False or None"
    for call in (cselab.load, SentenceEncoder.from_pretrained):
        with pytest.raises(ConfigSettingError) as err:
            call(str(tiny_bert), bidirectional=value)
        assert isinstance(err.value, UserError) and str(err.value).startswith(want)
        assert "\n" not in str(err.value)
    assert not cselab.load(str(tiny_bert), bidirectional=None).bidirectional


ACCEPTED = ["auto", "cpu", "cuda", "cuda:0", "cuda:1", "cuda:9999", "mps", "xpu:3", "hpu", "mtia", "xla",
            "npu", "privateuseone"]  # fmt: skip
REFUSED = ["gpu:0", "cuda:01", "cuda:00", "cuda:99999999999999999999", "cuda:10000", "cuda:-1",
           "meta", "CPU", "cpu:0:1"]  # fmt: skip


@pytest.mark.parametrize("name", ACCEPTED + REFUSED)
def test_device_flag_and_train_device_take_the_same_names(
    name: str, capsys: pytest.CaptureFixture
) -> None:
    """``--device`` and ``train.device`` share one check: the same names, the same message."""
    from cselab.config import load_config
    from cselab.core.errors import ConfigError

    argv = ["encode", "m", "--input", "x", "--output", "y.npy", "--device", name]
    if name in ACCEPTED:
        assert load_config(None, [f"train.device={name}"]).train.device == name
        from cselab.cli.options import device_name

        assert device_name(name) == name
        return
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"train.device={name}"])
    with pytest.raises(SystemExit):
        main(argv)
    words = "cpu, cuda, cuda:N, mps, xpu, hpu, mtia, xla, npu, privateuseone"
    assert str(err.value) == f"train.device: {name!r} is not a device; use auto, {words}"
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"cselab encode: error: argument --device: {name!r} is not a device; use auto, {words}"
    )


@pytest.mark.parametrize("option", ["--output", "-o", "--csv"])
@pytest.mark.parametrize("case", ["no folder", "a folder", "read-only"])
def test_evaluate_output_path_is_checked_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch,
    option: str, case: str,
) -> None:  # fmt: skip
    from cselab.cli import evaluate as ev_cli
    from cselab.evaluation import download

    def must_not_run(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("the evaluation started before the output path was checked")

    monkeypatch.setattr(download, "ensure_data", must_not_run)
    if case == "no folder":
        path, reason = (
            tmp_path / "missing" / "r.json",
            f"folder {tmp_path / 'missing'} does not exist",
        )
    elif case == "a folder":
        path, reason = tmp_path, "is a folder"
    else:  # os.access answers for root too, where chmod would not stop the write
        monkeypatch.setattr(ev_cli.os, "access", lambda *a, **k: False)
        path, reason = tmp_path / "r.json", "permission denied"
    shown = "--output" if option == "-o" else option
    assert main(["evaluate", "no/such-model", option, str(path), "--tasks", "STSBenchmark"]) == 2
    assert one_line(capsys) == (
        f"cselab evaluate: error: {shown} {path}: cannot write there ({reason})"
    )


@pytest.mark.parametrize(
    ("name", "content", "where", "problem"),
    [
        ("p.csv", b"anchor,positive\na,b\nc,d\ncaf\xe9,e\n", 4,
         "invalid UTF-8 at byte 3 of the line (0xe9); save the file as UTF-8"),
        ("p.jsonl", b'{"anchor": "a", "positive": "b"}\n{"anchor": "caf\xe9", "positive": "e"}\n', 2,
         "invalid UTF-8 at byte 15 of the line (0xe9); save the file as UTF-8"),
        ("p.csv", b"anchor,positive\na,b\n" + b"x" * 200_000 + b",y\n", 3,
         "malformed CSV (field larger than field limit (131072))"),
    ],
)  # fmt: skip
def test_malformed_pairs_file_is_one_line_naming_file_and_line(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
    name: str, content: bytes, where: int, problem: str,
) -> None:  # fmt: skip
    pairs = tmp_path / name
    pairs.write_bytes(content)
    assert main(_tiny_train(tiny_bert, tmp_path, f"--data.train_file={pairs}")) == 2
    assert one_line(capsys) == f"cselab train: error: {pairs}:{where}: {problem}"


@pytest.mark.parametrize("case", ["not safetensors", "not cselab's", "another format"])
def test_resume_from_a_bad_checkpoint_is_one_line_naming_it(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture, case: str
) -> None:
    ckpt = tmp_path / "out" / "checkpoint" / "checkpoint.safetensors"
    ckpt.parent.mkdir(parents=True)
    if case == "not safetensors":
        ckpt.write_bytes(b"not a checkpoint at all")
        reason = "unreadable ("
    elif case == "not cselab's":  # e.g. a model's weights copied there
        save_file({"w": torch.zeros(2)}, str(ckpt))
        reason = "not a cselab checkpoint (its metadata has no 'cselab' entry)"
    else:
        save_file({"w": torch.zeros(2)}, str(ckpt), {"cselab": json.dumps({"format": 1})})
        reason = "checkpoint format 1, this cselab reads format 2"
    assert main(_tiny_train(tiny_bert, tmp_path, "--train.resume=true")) == 2
    err = one_line(capsys)
    assert err.startswith(f"cselab train: error: cannot resume from {ckpt}: {reason}")
    assert err.endswith(
        "start the run again with --train.overwrite=true instead of --train.resume=true"
    )


@pytest.fixture
def mteb_must_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in for ``cselab.evaluation.mteb`` whose run fails the test: the options and the
    output path are checked before MTEB starts (and without it installed)."""

    def run_cli(args: object) -> int:
        raise AssertionError("the MTEB run started before its options were checked")

    monkeypatch.setitem(
        sys.modules, "cselab.evaluation.mteb", types.SimpleNamespace(run_cli=run_cli)
    )


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--tasks", "sts"], "--tasks"),
        (["--sts-file", "pairs.tsv"], "--sts-file"),
        (["--csv", "r.csv"], "--csv"),
        (["--update-card"], "--update-card"),
        (["--update-card", "--csv", "r.csv"], "--csv, --update-card"),
    ],
)
def test_evaluate_mteb_refuses_the_options_it_would_ignore(
    capsys: pytest.CaptureFixture, mteb_must_not_run: None, extra: list[str], named: str
) -> None:
    assert main(["evaluate", "no/such-model", "--mteb", "STS12", *extra]) == 2
    assert one_line(capsys) == (
        f"cselab evaluate: error: --mteb does not take {named} (SentEval options); drop them, "
        "or run the SentEval tasks without --mteb"
    )


def test_evaluate_mteb_checks_the_output_path_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture, mteb_must_not_run: None
) -> None:
    path = tmp_path / "missing" / "r.json"
    assert main(["evaluate", "no/such-model", "--mteb", "STS12", "-o", str(path)]) == 2
    assert one_line(capsys) == (
        f"cselab evaluate: error: --output {path}: cannot write there "
        f"(folder {tmp_path / 'missing'} does not exist)"
    )


@needs_senteval
@pytest.mark.slow  # ~3 min on 2 cores: encoding 70k phrases and SentEval's logistic regression
def test_sst2_end_to_end(tiny_bert: Path, senteval_dir: Path, tmp_path: Path) -> None:
    """``cselab evaluate --tasks SST2``: SentEval's protocol on the real SST-2 split (train on
    67,349 phrases, model selection on 872 dev sentences, test on 1,821)."""
    out = tmp_path / "r.json"
    args = ["-q", "evaluate", str(tiny_bert), "--tasks", "SST2", "--mode", "fasttest",
            "--pooler", "avg", "--data-dir", str(senteval_dir), "-o", str(out)]  # fmt: skip
    assert main(args) == 0
    res = json.loads(out.read_text())["results"]["SST2"]
    assert (res["ndev"], res["ntest"]) == (872, 1821)
    # A random 32-dim encoder is weak but not blind on sentiment: above the majority class
    # (the test split is 909 positive / 912 negative, 50.1%) and far from perfect.
    assert 50.1 < res["acc"] < 80 and 50 < res["devacc"] < 80


def test_encode_checks_its_output_before_the_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """An output ``cselab encode`` cannot write is told before the model loads and the
    sentences are encoded (the work would be lost), with the name np.save writes."""
    (tmp_path / "in.txt").write_text("a sentence\n", encoding="utf-8")
    out = tmp_path / "missing" / "v"
    assert main(["encode", "no/such-model", "--input", str(tmp_path / "in.txt"), "--output",
                 str(out)]) == 2  # fmt: skip
    assert one_line(capsys) == (
        f"cselab encode: error: --output {out}.npy: cannot write there "
        f"(folder {tmp_path / 'missing'} does not exist)"
    )


@pytest.mark.parametrize(
    ("command", "module", "function", "said"),
    [
        (["train", "--train.max_steps=1"], "cselab.cli.train", "cmd_train",
         "cselab train: interrupted; the last complete checkpoint (if one was written) is kept "
         "in the output folder's checkpoint/; continue with --train.resume=true"),
        (["evaluate", "m"], "cselab.cli.evaluate", "run_evaluate",
         "cselab evaluate: interrupted; run the command again"),
    ],
)  # fmt: skip
def test_ctrl_c_says_how_to_go_on_for_its_command(
    command: list[str], module: str, function: str, said: str,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
) -> None:  # fmt: skip
    """Only training has a checkpoint to resume from: Ctrl-C elsewhere does not point at
    ``--train.resume``."""

    def stopped(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(f"{module}.{function}", stopped)
    assert main(command) == 130
    assert capsys.readouterr().err.strip().startswith(said)


def test_a_library_s_error_is_cut_at_a_word() -> None:
    """The first line of a library's message, cut before the limit at a word (the offline
    Hub's hint was cut mid-word), marked as cut; an empty message is its type's name."""
    from cselab.core.errors import first_line

    long = OSError("We had trouble connecting; set 'HF_HUB_OFFLINE=1' to use the cache\nmore")
    assert first_line(long, 60) == "We had trouble connecting; set 'HF_HUB_OFFLINE=1' to use …"
    assert first_line(long) == "We had trouble connecting; set 'HF_HUB_OFFLINE=1' to use the cache"
    assert first_line(ValueError()) == "ValueError"
