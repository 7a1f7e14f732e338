"""Publishing: everything up to the upload (which files, the card, the commit message, token and
endpoint), with huggingface_hub's HfApi network methods replaced by recorders. No test talks to
the real Hub."""

from __future__ import annotations

from pathlib import Path

import pytest
from huggingface_hub import HfApi, ModelCard, RepoUrl
from huggingface_hub.utils import filter_repo_objects

from cselab.cli import main
from cselab.publish.card import CARD_FILE, code_blocks
from cselab.training.run import build_trainer
from test_card import tiny_config

REPO_ID = "someone/tiny-simcse"


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict]]:
    """Record HfApi.create_repo / upload_folder calls (with the client's endpoint and token)."""
    calls: list[tuple[str, dict]] = []

    def create_repo(self, repo_id, **kwargs):  # noqa: ANN001, ANN003, ANN202
        calls.append(("create_repo", {"repo_id": repo_id, "api": self, **kwargs}))
        return RepoUrl(f"{self.endpoint}/{repo_id}", endpoint=self.endpoint)

    def upload_folder(self, **kwargs):  # noqa: ANN001, ANN003, ANN202
        root = Path(kwargs["folder_path"])
        files = sorted(p.relative_to(root).as_posix() for p in root.glob("**/*") if p.is_file())
        kwargs["uploaded"] = list(
            filter_repo_objects(
                files,
                allow_patterns=kwargs.get("allow_patterns"),
                ignore_patterns=kwargs.get("ignore_patterns"),
            )
        )
        kwargs["card"] = (root / CARD_FILE).read_text()
        calls.append(("upload_folder", {"api": self, **kwargs}))
        return None

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
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
    assert (create_name, upload_name) == ("create_repo", "upload_folder")
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
    uploads = [c for name, c in hub if name == "upload_folder"]
    assert len(uploads) == 1
    assert Path(uploads[0]["folder_path"]) == tmp_path / "out" / "best"
    assert "STS-B dev 50.00" in uploads[0]["commit_message"]
    # The card of every saved folder already names the repo in its snippets.
    assert f'model_id = "{REPO_ID}"' in (tmp_path / "out" / "last" / CARD_FILE).read_text()
