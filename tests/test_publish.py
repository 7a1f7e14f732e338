"""Publishing: everything up to the upload (which files, the card, the commit message, token and
endpoint), with huggingface_hub's HfApi network methods replaced by recorders; and the checks and
failures with the real client against an endpoint that cannot be reached. No test talks to the
real Hub."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from huggingface_hub import HfApi, ModelCard, RepoUrl
from huggingface_hub import constants as hf_constants

from cselab.app.train import build_trainer
from cselab.cli import main
from cselab.publish.card import CARD_FILE, code_blocks
from test_card import tiny_config

REPO_ID = "someone/tiny-simcse"


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict]]:
    """Record HfApi.create_repo / create_commit calls (with the client's endpoint and token, the
    files of the commit, the card it uploads and the card on disk at that moment)."""
    calls: list[tuple[str, dict]] = []
    monkeypatch.setenv("HF_TOKEN", "hf_recorder_token")  # a token must be found before a push

    def create_repo(self, repo_id, **kwargs):  # noqa: ANN001, ANN003, ANN202
        calls.append(("create_repo", {"repo_id": repo_id, "api": self, **kwargs}))
        return RepoUrl(f"{self.endpoint}/{repo_id}", endpoint=self.endpoint)

    def create_commit(self, repo_id, operations, **kwargs):  # noqa: ANN001, ANN003, ANN202
        ops = {op.path_in_repo: op.path_or_fileobj for op in operations}
        card = ops[CARD_FILE]
        folder = Path(ops["config.json"]).parent
        kwargs["uploaded"] = sorted(ops)
        kwargs["card"] = card.decode() if isinstance(card, bytes) else Path(card).read_text()
        kwargs["folder_path"] = str(folder)
        kwargs["card_on_disk"] = (folder / CARD_FILE).read_text()
        calls.append(("create_commit", {"repo_id": repo_id, "api": self, **kwargs}))
        return None

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "create_commit", create_commit)
    return calls


@pytest.fixture(scope="module")
def run(tiny_bert: Path, tmp_path_factory: pytest.TempPathFactory, one_thread) -> Path:
    tmp = tmp_path_factory.mktemp("push-run")
    trainer = build_trainer(tiny_config(tiny_bert, tmp))
    scores = iter([10.0, 30.0, 50.0, 40.0])
    trainer.selection.evaluator = lambda encoder: next(scores)
    trainer.train()
    return tmp / "out"


EXPECTED_FILES = {
    "README.md",
    "config.json",
    "model.safetensors",
    "modules.json",
    "sentence_bert_config.json",
    "1_Pooling/config.json",
    "cselab.json",
    "cselab_config.yaml",
    "tokenizer.json",
    "tokenizer_config.json",
}


def test_push_cli_uploads_the_folder_with_card_token_and_endpoint(
    run: Path, hub: list, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.example.org")
    (run / "best" / ".DS_Store").write_text("editor junk")  # never uploaded
    assert main(["push", str(run / "best"), REPO_ID, "--private"]) == 0
    (create_name, create), (upload_name, upload) = hub
    assert (create_name, upload_name) == ("create_repo", "create_commit")
    assert create["repo_id"] == upload["repo_id"] == REPO_ID
    assert create["private"] is True and create["exist_ok"] is True
    for call in (create, upload):
        assert call["api"].endpoint == "https://hub.example.org"
        assert call["api"].token == "hf_test_token"
    uploaded = set(upload["uploaded"])
    assert uploaded >= EXPECTED_FILES, EXPECTED_FILES - uploaded
    assert not {f for f in uploaded if f.startswith(".") or "/." in f or ".tmp" in f}
    # The commit message names the folder and the dev score of the card.
    assert upload["commit_message"] == "Upload out/best (cselab 0.1.0; STS-B dev 50.00)"
    # The uploaded card's snippets load the repo, not a local path.
    blocks = code_blocks(upload["card"])
    assert len(blocks) == 3 and all(b.startswith(f'model_id = "{REPO_ID}"\n') for b in blocks)
    assert ModelCard(upload["card"]).data.eval_results[0].metric_value == 50.0


def test_push_to_an_unreachable_endpoint_is_one_line(
    run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The real client (no recorder): HF_ENDPOINT is where it goes, and the failure is one line."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "2")
    assert main(["push", str(run / "last"), REPO_ID]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert err.startswith("cselab push: error: push of ") and "http://127.0.0.1:9" in err


def test_push_refuses_a_folder_that_is_no_model(tmp_path: Path, capsys) -> None:
    assert main(["push", str(tmp_path), REPO_ID]) == 2
    assert "not a saved model folder (missing config.json, modules.json)" in capsys.readouterr().err


def test_train_push_to_hub_uploads_best_at_the_end(
    tiny_bert: Path, tmp_path: Path, hub: list, one_thread
) -> None:
    trainer = build_trainer(tiny_config(tiny_bert, tmp_path, f"--train.push_to_hub={REPO_ID}"))
    scores = iter([10.0, 30.0, 50.0, 40.0])
    trainer.selection.evaluator = lambda encoder: next(scores)
    trainer.train()
    uploads = [c for name, c in hub if name == "create_commit"]
    assert len(uploads) == 1
    assert Path(uploads[0]["folder_path"]) == tmp_path / "out" / "best"
    assert "STS-B dev 50.00" in uploads[0]["commit_message"]
    # The card of every saved folder already names the repo in its snippets.
    assert f'model_id = "{REPO_ID}"' in (tmp_path / "out" / "last" / CARD_FILE).read_text()


def test_train_push_to_hub_checks_the_token_and_repo_before_training(
    tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_thread
) -> None:
    """Without a token, or with a repo id without its namespace, ``train.push_to_hub`` stops
    the run before its first step (not after hours of training), in one line."""
    from cselab.app.train import train
    from cselab.core.errors import PublishError
    from cselab.training.trainer import Trainer

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # no saved login either
    monkeypatch.setattr(Trainer, "train", lambda self: pytest.fail("the run trained"))
    with pytest.raises(PublishError, match="no Hugging Face token found"):
        train(tiny_config(tiny_bert, tmp_path, f"--train.push_to_hub={REPO_ID}"))
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    with pytest.raises(PublishError, match="give its namespace too"):
        train(tiny_config(tiny_bert, tmp_path, "--train.push_to_hub=model"))


# ------------------------------------------- checks and failures, with the real client (no recorder)
def folder_state(folder: Path) -> dict[str, bytes]:
    """Every file of ``folder`` and its bytes: what a failed push must leave as it was."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


@pytest.fixture
def model_copy(run: Path, tmp_path: Path) -> Path:
    """A copy of a saved model folder, whose card still loads the local path."""
    folder = tmp_path / "model"
    shutil.copytree(run / "last", folder)
    assert f'model_id = "{REPO_ID}"' not in (folder / CARD_FILE).read_text()
    return folder


@pytest.fixture
def unreachable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The real huggingface_hub pointed at a port nothing listens on, and no saved login."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "2")
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(hf_constants, "HF_TOKEN_PATH", str(tmp_path / "no-saved-token"))


def only_line(capsys: pytest.CaptureFixture) -> str:
    (line,) = capsys.readouterr().err.splitlines()
    return line


def test_push_without_a_token_says_so_and_changes_nothing(
    model_copy: Path, unreachable: None, capsys: pytest.CaptureFixture
) -> None:
    before = folder_state(model_copy)
    assert main(["push", str(model_copy), REPO_ID]) == 2
    assert only_line(capsys) == (
        "cselab push: error: no Hugging Face token found: set HF_TOKEN or log in with "
        "`hf auth login` (`huggingface-cli login` in older huggingface_hub)"
    )
    assert folder_state(model_copy) == before


@pytest.mark.parametrize(
    ("repo_id", "message"),
    [
        ("tiny-simcse", "repo id 'tiny-simcse': give its namespace too, as user/name or org/name"),
        ("me/not a name", "repo id 'me/not a name': Repo id must use alphanumeric chars"),
        ("me/x/y", "repo id 'me/x/y': Repo id must be in the form 'repo_name' or"),
    ],
)
def test_push_checks_the_repo_id_before_anything(
    model_copy: Path,
    unreachable: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    repo_id: str,
    message: str,
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    before = folder_state(model_copy)
    assert main(["push", str(model_copy), repo_id]) == 2
    assert only_line(capsys).startswith(f"cselab push: error: {message}")
    assert folder_state(model_copy) == before


def test_failed_push_leaves_the_card_as_it_was(
    model_copy: Path,
    unreachable: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    """A push that cannot reach the Hub fails with one line, and the folder's card still loads
    the local folder: its snippets do not name a repo the model never reached."""
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    before = folder_state(model_copy)
    assert main(["push", str(model_copy), REPO_ID]) == 2
    assert only_line(capsys).startswith(
        f"cselab push: error: push of {model_copy} to {REPO_ID} on http://127.0.0.1:9 failed: "
    )
    assert folder_state(model_copy) == before


def test_card_names_the_repo_only_after_the_upload(
    model_copy: Path, hub: list, capsys: pytest.CaptureFixture
) -> None:
    before = (model_copy / CARD_FILE).read_text()
    assert main(["push", str(model_copy), REPO_ID]) == 0
    (commit,) = [call for name, call in hub if name == "create_commit"]
    assert commit["card_on_disk"] == before  # unchanged while the upload ran
    assert code_blocks(commit["card"])[0].startswith(f'model_id = "{REPO_ID}"\n')
    assert (model_copy / CARD_FILE).read_text() == commit["card"]  # then the local card too
