"""Publishing a saved model folder to the Hugging Face Hub (``cselab push``, ``train.push_to_hub``).

Through ``huggingface_hub``: :meth:`~huggingface_hub.HfApi.create_repo` (``exist_ok``), then
:meth:`~huggingface_hub.HfApi.create_commit` with the folder's files (those ``upload_folder``
would send), in one commit. ``HF_TOKEN`` and ``HF_ENDPOINT`` are
read when the push happens (``huggingface_hub`` reads the endpoint once, at import). The repo id
and the token are checked before anything is sent or changed. The uploaded card's usage snippets
name the repo id; the folder's own card is changed the same way only once the upload succeeded
(:func:`cselab.publish.card.set_model_id`), so a failed push leaves the folder as it was.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..core.errors import PublishError, first_line  # noqa: F401 - re-exported
from ..core.version import __version__
from ..evaluation.names import senteval_hub_dataset
from ..model.lora import is_adapter_folder
from .card import CARD_FILE, set_model_id, with_model_id

#: Never uploaded: editor/OS leftovers and the half-written folders of an interrupted save.
IGNORE_PATTERNS = [".*", "*/.*", "*.tmp", "*.tmp/*", "__pycache__/*"]
#: A folder must hold these to be a loadable model (``SentenceEncoder.save`` writes them).
REQUIRED_FILES = ("config.json", "modules.json")


def files_to_upload(folder: str | Path) -> list[str]:
    """The paths (relative, POSIX) that :func:`push_folder` uploads from ``folder``, sorted."""
    from huggingface_hub.utils import filter_repo_objects

    root = Path(folder)
    paths = sorted(p.relative_to(root).as_posix() for p in root.glob("**/*") if p.is_file())
    return list(filter_repo_objects(paths, ignore_patterns=IGNORE_PATTERNS))


def commit_message(folder: str | Path) -> str:
    """``Upload <folder> (cselab <version>; STS-B dev <score>)``; the score from the card."""
    root = Path(folder)
    parts = [f"cselab {__version__}"]
    card = root / CARD_FILE
    if card.is_file():
        from huggingface_hub import ModelCard

        for result in ModelCard.load(card).data.eval_results or []:
            # the model-selection score, when it is STS-B dev Spearman (a Pearson one or a
            # score on your own dev file is left to the card, which names it)
            key = (result.dataset_type, result.metric_type)
            stsb_dev = key == (senteval_hub_dataset("STSBenchmark")[0], "spearman_cosine")
            if stsb_dev and result.dataset_split == "validation":
                parts.append(f"STS-B dev {result.metric_value:.2f}")
                break
    name = root.resolve().name
    return f"Upload {root.resolve().parent.name}/{name} ({'; '.join(parts)})"


def check_repo_id(repo_id: str) -> None:
    """Raise :class:`PublishError` unless ``repo_id`` is ``namespace/name`` as the Hub spells one.

    A bare ``name`` would be created under the token's user, but the card's snippets would then
    name a repo that does not exist: the namespace is required.
    """
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        reason = (str(err).strip().splitlines() or ["not a repo id"])[0]
        raise PublishError(f"repo id {repo_id!r}: {reason}") from None
    if repo_id.count("/") != 1:
        raise PublishError(f"repo id {repo_id!r}: give its namespace too, as user/name or org/name")


def find_token(token: str | None = None) -> str:
    """``token``, else ``$HF_TOKEN``, else the token saved by ``hf auth login``; a
    :class:`PublishError` saying so when there is none."""
    from huggingface_hub import get_token

    found = token or get_token()  # get_token reads $HF_TOKEN, then the saved login
    if not found:
        raise PublishError(
            "no Hugging Face token found: set HF_TOKEN or log in with `hf auth login` "
            "(`huggingface-cli login` in older huggingface_hub)"
        )
    return found


def check_push(repo_id: str) -> None:
    """What an upload at the end of a run needs, checked before it trains (no network): the
    repo id and a token (:func:`check_repo_id`, :func:`find_token`); a
    :class:`PublishError` otherwise, rather than hours later."""
    check_repo_id(repo_id)
    find_token()


def push_folder(
    folder: str | Path,
    repo_id: str,
    *,
    private: bool = False,
    token: str | None = None,
    message: str | None = None,
) -> Any:
    """Create ``repo_id`` if needed and upload ``folder`` to it in one commit.

    The folder, the repo id and the token are checked first; nothing is sent before. The
    uploaded ``README.md`` names ``repo_id`` in its usage snippets; the folder's own card is
    rewritten the same way only after the upload succeeded.

    Args:
        folder: a model folder saved by cselab (``best/``, ``last/``).
        repo_id: ``user/name`` or ``org/name`` on the Hub.
        private: create the repo private (an existing repo keeps its visibility).
        token: default ``$HF_TOKEN``, else the token saved by ``hf auth login``.
        message: the commit message (default :func:`commit_message`).

    Returns:
        ``huggingface_hub``'s ``CommitInfo`` of the upload.

    Raises:
        PublishError: ``folder`` is not a saved model, ``repo_id`` is not ``namespace/name``,
            there is no token, or the Hub refused or was unreachable (one line naming the
            endpoint and the reason).
    """
    from huggingface_hub import CommitOperationAdd, HfApi

    root = Path(folder)
    missing = [f for f in REQUIRED_FILES if not (root / f).is_file()]
    if is_adapter_folder(root):  # its base is a path on this machine: no Hub user has it
        raise PublishError(
            f"{root}: holds LoRA adapters: cselab merge it first (cselab merge {root} -o MERGED, "
            "then push MERGED), or train with train.save_merged=true"
        )
    if not root.is_dir() or missing:
        raise PublishError(
            f"{root}: not a saved model folder (missing {', '.join(missing) or 'the folder'})"
        )
    check_repo_id(repo_id)
    endpoint = os.environ.get("HF_ENDPOINT") or None
    api = HfApi(endpoint=endpoint, token=find_token(token))
    message = message or commit_message(root)
    card = root / CARD_FILE
    # upload_folder's files, with the card's text for the repo in place of the file on disk
    operations = [
        CommitOperationAdd(
            path_in_repo=name,
            path_or_fileobj=(
                with_model_id(card.read_text(encoding="utf-8"), repo_id).encode("utf-8")
                if name == CARD_FILE
                else root / name
            ),
        )
        for name in files_to_upload(root)
    ]
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        info = api.create_commit(
            repo_id=repo_id, operations=operations, commit_message=message, repo_type="model"
        )
    except Exception as err:  # the Hub client raises many types (HTTP, connection, auth, ...)
        where = api.endpoint
        reason = first_line(err)
        raise PublishError(
            f"push of {root} to {repo_id} on {where} failed: {type(err).__name__}: {reason}"
        ) from None
    set_model_id(root, repo_id)  # the upload succeeded: the local card names the repo too
    return info
