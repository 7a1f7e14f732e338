"""Hostile inputs a user meets, run through the real commands: a resume with nothing to resume,
an output folder that holds the user's files, damaged adapter folders, a cache under a file, a
missing dev set. Each is one line (``cselab CMD: error: ...``, exit 2) and loses nothing."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import write_corpus
from cselab.cli import main
from cselab.io.runfolder import RunFolder

TESTS = Path(__file__).parent
SRC = TESTS.parent / "src"


def one_line(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


def tree_digest(folder: Path) -> dict[str, str]:
    """Each file under ``folder`` and the SHA-256 of its bytes."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def train_args(tiny_bert: Path, tmp_path: Path, *extra: str) -> list[str]:
    data = tmp_path / "data"
    return [
        "-q", "train", f"--model.name_or_path={tiny_bert}", "--model.max_seq_len=16",
        f"--data.train_file={write_corpus(data, 32)}", f"--data.cache_dir={data / 'cache'}",
        f"--train.output_dir={tmp_path / 'out'}", "--train.batch_size=8", "--train.max_steps=2",
        "--train.eval_steps=0", "--train.report_to=[]", "--train.device=cpu", *extra,
    ]  # fmt: skip


def test_resume_without_a_checkpoint_never_starts_over(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A finished run whose checkpoint is gone: ``--train.resume=true`` (even with another lr)
    is one line, and best/, last/ and metrics.csv are left as they were."""
    import shutil

    argv = train_args(tiny_bert, tmp_path)
    assert main(argv) == 0
    run = RunFolder(tmp_path / "out")
    shutil.rmtree(run.checkpoint_file.parent)
    before = tree_digest(run.path)
    capsys.readouterr()
    assert main([*argv, "--train.resume=true", "--train.lr=1e-3"]) == 2
    message = one_line(capsys)
    assert message.startswith(f"cselab train: error: train.resume: {run.path} holds a run (")
    assert "but no checkpoint" in message and "--train.overwrite=true" in message
    assert tree_digest(run.path) == before


def test_resume_in_an_empty_folder_starts_the_run(tiny_bert: Path, tmp_path: Path) -> None:
    """Nothing to continue and nothing to lose: a resume starts the run."""
    assert main([*train_args(tiny_bert, tmp_path), "--train.resume=true"]) == 0
    assert RunFolder(tmp_path / "out").results.is_file()


def test_collection_never_writes_into_a_folder_that_holds_files(
    senteval_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A user's BEIR folder given to ``cselab collection``: refused, every file as it was."""
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text('{"_id": "d0", "title": "", "text": "mine"}\n')
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td0\t1\n")
    before = tree_digest(beir)
    argv = ["collection", str(beir), "--data-dir", str(senteval_dir), "--no-download"]
    assert main(argv) == 2
    assert one_line(capsys) == (
        f"cselab collection: error: {beir}: is not empty; write the collection into a new or "
        "empty folder (nothing of a folder that holds files is replaced)"
    )
    assert tree_digest(beir) == before
    (beir / "qrels" / "test.tsv").unlink()
    (beir / "corpus.jsonl").unlink()
    (beir / "qrels").rmdir()
    assert main(argv) == 0  # an empty folder is written into
    assert sorted(tree_digest(beir)) == ["corpus.jsonl", "qrels/dev.tsv", "queries.jsonl"]


def test_collection_under_a_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    blocker = tmp_path / "notes.txt"
    blocker.write_text("a file, not a folder")
    assert main(["collection", str(blocker / "beir"), "--no-download"]) == 2
    assert one_line(capsys) == (
        f"cselab collection: error: {blocker / 'beir'} is under {blocker}, which is a file, not "
        "a folder"
    )  # the words of every setting that names a folder


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_collection_threshold_that_is_not_a_number(
    tmp_path: Path, capsys: pytest.CaptureFixture, value: str
) -> None:
    assert main(["collection", str(tmp_path / "c"), "--threshold", value, "--no-download"]) == 2
    assert one_line(capsys) == (
        f"cselab collection: error: --threshold {float(value)} is refused: the least gold "
        "score must be a finite number"
    )
    assert not (tmp_path / "c").exists()


def test_train_cache_dir_under_a_file_is_one_line(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    blocker = tmp_path / "notes.txt"
    blocker.write_text("a file, not a folder")
    argv = train_args(tiny_bert, tmp_path)
    argv = [a for a in argv if not a.startswith("--data.cache_dir=")]
    assert main([*argv, f"--data.cache_dir={blocker / 'sub'}"]) == 2
    assert one_line(capsys) == (
        f"cselab train: error: data.cache_dir={blocker / 'sub'} is under {blocker}, which is a "
        "file, not a folder"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("under", [False, True])
def test_train_output_dir_that_is_or_is_under_a_file_is_one_line(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture, under: bool
) -> None:
    blocker = tmp_path / "notes.txt"
    blocker.write_text("a file, not a folder")
    out = blocker / "sub" if under else blocker
    assert main([*train_args(tiny_bert, tmp_path), f"--train.output_dir={out}"]) == 2
    where = f" is under {blocker}, which" if under else ""
    assert one_line(capsys) == f"cselab train: error: {out}{where} is a file, not a folder"
    assert blocker.read_text() == "a file, not a folder"


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--train.lr", "1e-5"],
        ["train", "demo-minilm", "--train.lr", "1e-5"],
    ],
)
def test_override_written_with_a_space_names_the_equals_form(
    capsys: pytest.CaptureFixture, argv: list[str]
) -> None:
    assert main(argv) == 2
    assert one_line(capsys) == (
        "cselab train: error: override --train.lr 1e-5: a config override takes its value "
        "after '=': write --train.lr=1e-5"
    )


def test_missing_dev_data_offline_fails_at_once_with_the_form_the_parser_takes(
    tiny_bert: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No network (the Hub's name does not resolve) and no STS-B dev in the cache: no retries
    with backoff before the error, and the hint is an override ``cselab train`` accepts."""
    import socket

    from huggingface_hub import constants

    def no_network(*args: object, **kwargs: object) -> None:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("CSELAB_CACHE", str(tmp_path / "cselab-cache"))
    monkeypatch.delenv("CSELAB_DATA", raising=False)
    for proxy in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.delenv(proxy, raising=False)
    argv = [a for a in train_args(tiny_bert, tmp_path) if not a.startswith("--train.eval_steps")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    last = err.splitlines()[-1]
    assert last.startswith("cselab train: error: SentEval data missing in ")
    assert last.endswith("then pass --eval.data_dir=DIR or set $CSELAB_DATA.")
    assert not [r for r in caplog.records if "Retrying" in r.getMessage()]
    # the hint, followed: the parser takes it (and names the folder given)
    assert main([*argv, f"--eval.data_dir={tmp_path / 'senteval'}"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"cselab train: error: SentEval data missing in {tmp_path / 'senteval'}")


# ------------------------------------------------------------ damaged adapter folders


@pytest.fixture(scope="module")
def adapter_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama and a folder of LoRA adapters saved on it."""
    from backbone_models import make_tiny_decoder
    from cselab.model.encoder import SentenceEncoder

    root = tmp_path_factory.mktemp("adapters")
    base = make_tiny_decoder(root / "base")
    SentenceEncoder.from_pretrained(str(base), pooler="avg", lora={"r": 2}).save(root / "good")
    return root / "good"


def _truncate(folder: Path) -> Path:
    weights = folder / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return weights


def _garbage(folder: Path) -> Path:
    weights = folder / "adapter_model.safetensors"
    weights.write_bytes(bytes(range(256)) * 12)
    return weights


def _no_weights(folder: Path) -> Path:
    (folder / "adapter_model.safetensors").unlink()
    return folder / "adapter_model.safetensors"


def _no_config(folder: Path) -> Path:
    (folder / "adapter_config.json").unlink()
    return folder / "adapter_config.json"


class _Planted:
    """Unpickling it would run ``touch``: a file that must never appear."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        import os

        return os.system, (f"touch {self.marker}",)


def _pickle(folder: Path) -> Path:
    import pickle

    (folder / "adapter_model.safetensors").unlink()
    target = folder / "adapter_model.bin"
    target.write_bytes(pickle.dumps({"x": _Planted(folder.parent / "RAN")}))
    return target


def _remote_code_base(folder: Path) -> Path:
    """The adapters' base becomes a model of a type transformers does not know, whose
    config.json names code of its own (auto_map)."""
    import json
    import shutil

    config = json.loads((folder / "adapter_config.json").read_text())
    base = shutil.copytree(config["base_model_name_or_path"], folder.parent / "remote-base")
    model = json.loads((base / "config.json").read_text())
    model.update(model_type="plantedmodel", auto_map={"AutoConfig": "x.C", "AutoModel": "x.M"})
    (base / "config.json").write_text(json.dumps(model))
    config["base_model_name_or_path"] = str(base)
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return base / "config.json"


def _edit_config(folder: Path, **values: object) -> Path:
    import json

    path = folder / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **values}))
    return path


def _other_targets(folder: Path) -> Path:
    """The config names adapters the weights do not hold: peft would start them at B = 0."""
    _edit_config(folder, target_modules=["embed_tokens"])
    return folder / "adapter_model.safetensors"


def _fewer_targets(folder: Path) -> Path:
    """The config names fewer modules than the weights hold: peft would drop the others."""
    _edit_config(folder, target_modules=["q_proj"])
    return folder / "adapter_model.safetensors"


def _other_rank(folder: Path) -> Path:
    _edit_config(folder, r=4)
    return folder / "adapter_model.safetensors"


def _other_base(folder: Path) -> Path:
    from conftest import make_tiny_bert

    return _edit_config(folder, base_model_name_or_path=str(make_tiny_bert(folder.parent / "bert")))


DAMAGE = {
    "other targets": (
        _other_targets,
        "{file}: holds no weights for some of the adapters {folder}/adapter_config.json names "
        "(target_modules ['embed_tokens']): the two files do not belong together",
    ),
    "fewer targets": (
        _fewer_targets,
        "{file}: holds adapters for more modules than {folder}/adapter_config.json names "
        "(target_modules ['q_proj']): the two files do not belong together",
    ),
    "other rank": (
        _other_rank,
        "{file}: its tensors' shapes differ from what {folder}/adapter_config.json (r 4) and the "
        "base model ",
    ),
    "other base": (
        _other_base,
        "{file}: target_modules ['down_proj', 'gate_proj', 'k_proj', 'o_proj', 'q_proj', "
        "'up_proj', 'v_proj'] match no module of the base model {folder.parent}/bert (bert): the "
        "adapters belong to another model",
    ),
    "truncated": (
        _truncate,
        "{file}: not a complete safetensors file (Error while deserializing header: incomplete "
        "metadata, file not fully covered); the adapters cannot be loaded",
    ),
    "garbage": (_garbage, "{file}: not a complete safetensors file (Error while deserializing "),
    "no weights": (
        _no_weights,
        "{file}: missing; {folder} holds the adapters' config (adapter_config.json) but not "
        "their weights, so they cannot be loaded",
    ),
    "no config": (
        _no_config,
        "{file}: missing; {folder} holds LoRA adapter weights (adapter_model.safetensors) but "
        "not their config, so they cannot be put on a model",
    ),
    "pickle": (_pickle, "{file}: the file holds code or objects, not only tensors, and was not "),
    "remote code": (
        _remote_code_base,
        "{file}: model_type 'plantedmodel' is not one transformers knows, and its auto_map names "
        "code of the folder's own, which cselab does not run; trust it",
    ),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_adapter_folder_is_one_line_naming_the_file(
    adapter_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture, damage: str
) -> None:
    """``cselab merge``, ``cselab encode`` and ``cselab.load`` of a damaged adapter folder:
    one line naming the file (never peft's fallback to the Hub, a SafetensorError, an
    UnpicklingError, transformers' trust_remote_code error, or "a plain model folder")."""
    import shutil

    import cselab
    from cselab.core.errors import ModelFormatError

    make, message = DAMAGE[damage]
    folder = shutil.copytree(adapter_folder, tmp_path / "adapters")
    file = make(folder)
    want = message.format(file=file, folder=folder)
    (tmp_path / "in.txt").write_text("one sentence\n")
    assert main(["merge", str(folder), "-o", str(tmp_path / "merged")]) == 2
    assert one_line(capsys).startswith(f"cselab merge: error: {want}")
    argv = ["encode", str(folder), "--input", str(tmp_path / "in.txt"), "--output"]
    assert main([*argv, str(tmp_path / "v.npy")]) == 2
    assert one_line(capsys).startswith(f"cselab encode: error: {want}")
    with pytest.raises(ModelFormatError) as err:
        cselab.load(str(folder))
    assert str(err.value).startswith(want)
    assert not (tmp_path / "merged").exists() and not (tmp_path / "v.npy").exists()
    assert not (tmp_path / "RAN").exists()


def test_merge_into_a_folder_under_a_file_is_one_line(
    adapter_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Not a NotADirectoryError naming the hidden working folder beside the output."""
    blocker = tmp_path / "notes.txt"
    blocker.write_text("a file, not a folder")
    assert main(["merge", str(adapter_folder), "-o", str(blocker / "merged")]) == 2
    assert one_line(capsys) == (
        f"cselab merge: error: {blocker / 'merged'} is under {blocker}, which is a file, not a "
        "folder"
    )


def test_merge_into_the_model_folder_it_reads_is_one_line(
    adapter_folder: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An output inside the run's best/ or last/ (or best/ itself) would put the merge's working
    folder and the merged model among the model's files: refused, naming both, nothing written."""
    import shutil

    run = tmp_path / "run"
    best = shutil.copytree(adapter_folder, run / "best")
    last = shutil.copytree(adapter_folder, run / "last")
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    for out, model, where in (
        (best / "sub", best, "is inside"),
        (best, best, "is"),
        (last / "merged", last, "is inside"),
    ):
        assert main(["merge", str(run), "-o", str(out)]) == 2
        merged = " (the one being merged)" if model == best else ""
        assert one_line(capsys) == (
            f"cselab merge: error: {out} {where} the model folder {model}{merged}; choose an "
            "output folder outside it"
        )
    assert main(["merge", str(best), "-o", str(best / "deeper" / "sub")]) == 2
    assert f"is inside the model folder {best} (the one being merged)" in one_line(capsys)
    # the source as `.` from inside best/, and a link to best/: the folders as followed
    link = tmp_path / "link"
    link.symlink_to(best)
    monkeypatch.chdir(best)
    for source in (".", str(link)):
        assert main(["merge", source, "-o", str(last / "m")]) == 2
        assert f"{last / 'm'} is inside the model folder {last}" in one_line(capsys)
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before


# ------------------------------------------------------------------ what a user sees


def run_cselab(*argv: str, code: str | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m cselab ARGV`` (or ``python -c CODE``) as a user runs it, from this checkout."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=f"{SRC}{os.pathsep}{TESTS}")
    env.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
    args = ["-c", code] if code is not None else ["-m", "cselab", *argv]
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_merge_of_adapters_on_a_causal_lm_checkpoint_shows_no_library_noise(
    adapter_folder: Path, tmp_path: Path
) -> None:
    """The base is a causal-LM checkpoint (an LM head cselab leaves unused, as MNTP's base):
    no load report of that head, no peft FutureWarning, no weight-loading bars."""
    proc = run_cselab("merge", str(adapter_folder), "-o", str(tmp_path / "merged"))
    assert proc.returncode == 0, proc.stderr
    for noise in ("LOAD REPORT", "FutureWarning", "Loading weights", "Writing model shards"):
        assert noise not in proc.stderr, proc.stderr
    # cselab's own lines only, naming the folder as the user will find it
    lines = proc.stderr.strip().splitlines()
    assert all(" INFO " in line for line in lines), proc.stderr
    assert ".cselab-merge" not in proc.stderr


def test_a_load_report_of_an_unexpected_key_is_kept(adapter_folder: Path, tmp_path: Path) -> None:
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    base = json.loads((adapter_folder / "adapter_config.json").read_text())
    model = shutil.copytree(base["base_model_name_or_path"], tmp_path / "model")
    weights = load_file(model / "model.safetensors")
    weights["model.planted.weight"] = weights["lm_head.weight"][:2].clone()
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "in.txt").write_text("one\n")
    proc = run_cselab("encode", str(model), "--input", str(tmp_path / "in.txt"),
                      "--output", str(tmp_path / "v.npy"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "LOAD REPORT" in proc.stderr and "planted.weight" in proc.stderr


def test_help_lists_every_command_without_markup() -> None:
    from cselab.cli import build_parser

    parser = build_parser()
    text = parser.format_help()
    assert "``" not in text
    (commands,) = [a for a in parser._actions if isinstance(a.choices, dict)]
    described = text.split("positional arguments:")[1]
    assert all(f"    {name} " in described for name in commands.choices)
    assert "collection" in commands.choices


def test_encode_shows_its_progress(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "in.txt").write_text("".join(f"sentence number {i}\n" for i in range(12)))
    argv = ["encode", str(tiny_bert), "--input", str(tmp_path / "in.txt"), "--output",
            str(tmp_path / "v.npy"), "--batch-size", "4", "--pooler", "avg"]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "encode" in err and "3/3" in err
    assert main(["-q", *argv]) == 0  # -q: warnings and errors only
    assert "3/3" not in capsys.readouterr().err


TRAIN_FROM_PYTHON = """
import sys
import cselab
config = cselab.load_config(None, sys.argv[1:])
cselab.train(config)
"""


def test_train_from_python_shows_its_step_log(tiny_bert: Path, tmp_path: Path) -> None:
    """``cselab.train`` in a program that set no logging up logs its steps as the CLI does."""
    overrides = [a for a in train_args(tiny_bert, tmp_path) if a.startswith("--")]
    overrides.append("--train.log_steps=1")
    proc = subprocess.run(
        [sys.executable, "-c", TRAIN_FROM_PYTHON, *overrides],
        capture_output=True, text=True, timeout=300,
        env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(SRC)),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert " INFO step 2/2 loss=" in proc.stderr


# --------------------------------------------------- what a SIGKILL leaves, a later run removes

KILLED_WHILE_TOKENISING = """
import os, signal, sys
from pathlib import Path
from cselab.data import cache

class KilledWhileWriting:
    @classmethod
    def build(cls, stream, tokenizer, max_seq_len, out_dir=None):
        (Path(out_dir) / "input_ids.partial").write_bytes(b"\\0" * 4096)
        os.kill(os.getpid(), signal.SIGKILL)

cache.TokenizedCorpus = KilledWhileWriting
from cselab.cli import main
main(sys.argv[1:])
"""

KILLED_WHILE_MERGING = """
import os, signal, sys
from pathlib import Path
from cselab.model.sentence_encoder import SentenceEncoder

def killed_while_saving(self, folder, *args, **kwargs):
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / "model.safetensors").write_bytes(b"\\0" * 4096)
    os.kill(os.getpid(), signal.SIGKILL)

SentenceEncoder.save = killed_while_saving
from cselab.cli import main
main(sys.argv[1:])
"""


def hidden_folders(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.startswith(".") and p.is_dir())


def killed(code: str, *argv: str) -> None:
    """Run ``cselab ARGV`` in a process that ``code`` kills with SIGKILL mid-write."""
    import signal

    proc = run_cselab(code=code.replace("main(sys.argv[1:])", f"main({list(argv)!r})"))
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def test_a_later_run_removes_what_a_run_killed_while_tokenising_left(
    tiny_bert: Path, tmp_path: Path
) -> None:
    argv = train_args(tiny_bert, tmp_path)
    killed(KILLED_WHILE_TOKENISING, *argv)
    tokens = tmp_path / "data" / "cache" / "tokens"
    (left,) = hidden_folders(tokens)
    assert any(left.rglob("input_ids.partial"))
    assert main([*argv, "--train.overwrite=true"]) == 0
    assert not left.exists() and hidden_folders(tokens) == []


def test_a_later_merge_removes_what_a_killed_merge_left(
    adapter_folder: Path, tmp_path: Path
) -> None:
    out = tmp_path / "merged"
    killed(KILLED_WHILE_MERGING, "merge", str(adapter_folder), "-o", str(out))
    (left,) = hidden_folders(tmp_path)
    assert not out.exists()
    assert main(["merge", str(adapter_folder), "-o", str(out)]) == 0
    assert not left.exists() and hidden_folders(tmp_path) == []
    assert (out / "model.safetensors").stat().st_size > 4096


def test_an_mntp_models_card_does_not_offer_it_as_a_sentence_encoder(tmp_path: Path) -> None:
    from backbone_models import make_tiny_decoder, tiny_run_argv

    llama = make_tiny_decoder(tmp_path / "llama")
    argv = tiny_run_argv(llama, tmp_path / "run", "--objective.mntp.enabled=true",
                         "--model.lora.r=2", "--train.max_steps=1", rows=16)  # fmt: skip
    assert main(["-q", "train", *argv]) == 0
    card = (tmp_path / "run" / "out" / "best" / "README.md").read_text()
    use = card.split("## Intended use")[1].split("\n## ")[0].strip()
    assert use.startswith("Not a sentence encoder yet: masked next-token prediction")
    assert "Sentence similarity" not in use and "llm2vec-simcse-llama3-8b" in use


#: words of the work, not the product: a tracker's issue numbers, branch or worktree names,
#: the rounds of work (an upstream project's issue, "princeton-nlp/SimCSE issues #122", is a
#: citation and stays)
WORK_WORDS = re.compile(
    r"(?<!SimCSE )\bissues?[ -]\d+|\bbranch `|\bwt-[a-z]+\b|\bwave\b|helper sessions?"
)


def test_docs_speak_of_the_product_not_of_the_work() -> None:
    root = TESTS.parent
    found = [
        f"{path.relative_to(root)}:{n}: {line.strip()}"
        for path in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if WORK_WORDS.search(line)
    ]
    assert found == []


def test_a_folder_that_is_no_readable_model_is_one_line(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A folder of other files, a config.json of no model type or not JSON, weights missing
    or cut: one line naming the folder from every command that loads a model, no traceback."""
    import shutil

    from cselab.cli import main

    (tmp_path / "in.txt").write_text("a sentence\n", encoding="utf-8")
    cases: dict[str, str] = {}
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("x", encoding="utf-8")
    cases["other"] = "not a model folder (no config.json)"
    untyped = tmp_path / "untyped"
    untyped.mkdir()
    (untyped / "config.json").write_text('{"hidden_size": 8}', encoding="utf-8")
    cases["untyped"] = "not a model transformers can read (ValueError: Unrecognized model"
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json", encoding="utf-8")
    cases["broken"] = "not a model transformers can read (OSError:"
    for name, cut in (("noweights", 0), ("cut", 100)):
        folder = tmp_path / name
        shutil.copytree(tiny_bert, folder)
        weights = folder / "model.safetensors"
        if cut:
            weights.write_bytes(weights.read_bytes()[:cut])
        else:
            weights.unlink()
        cases[name] = "not a model transformers can read ("
    for name, said in cases.items():
        folder = tmp_path / name
        for argv in (
            ["encode", str(folder), "--input", str(tmp_path / "in.txt"), "--output", "v.npy"],
            ["index", "build", str(tmp_path / "in.txt"), "--model", str(folder), "-o",
             str(tmp_path / f"{name}.index")],
        ):  # fmt: skip
            assert main(argv) == 2, (name, argv)
            err = capsys.readouterr().err
            assert f"{folder}: {said}" in err and err.count("\n") == 1, err
