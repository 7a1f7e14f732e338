"""Hub downloads (wiki1m, SentEval's archive) go through ``huggingface_hub``: against a local
fake Hub (``HF_ENDPOINT``), an interrupted transfer leaves no file under its final name, a retry
completes it, ``HF_HUB_OFFLINE`` reads the cache or fails in one line."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from cselab.model.hub import SIMCSE_DATA_REPO, WIKI1M_FILE
from fake_hub import serve

WIKI = b"".join(f"sentence number {i} .\n".encode() for i in range(3000))
WIKI_KEY = f"datasets/{SIMCSE_DATA_REPO}/{WIKI1M_FILE}"

RESOLVE = (
    "import sys\n"
    "from cselab.model.hub import ResolveError, resolve_train_file\n"
    "try:\n"
    "    print(resolve_train_file('wiki1m'))\n"
    "except ResolveError as err:\n"
    "    print(f'ResolveError: {err}', file=sys.stderr)\n"
    "    sys.exit(3)\n"
)


def hub_env(url: str, tmp: Path, offline: bool = False) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "CSELAB_"))}
    env.update(
        HF_ENDPOINT=url,
        HF_HUB_CACHE=str(tmp / "hf"),
        HF_HUB_DISABLE_XET="1",  # the fake Hub speaks plain HTTP only
        HF_HUB_DISABLE_TELEMETRY="1",
        XDG_CACHE_HOME=str(tmp / "xdg"),
    )
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return env


def python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


def test_wiki1m_interrupted_download_leaves_no_file_and_a_retry_completes(tmp_path: Path) -> None:
    with serve({WIKI_KEY: WIKI}) as hub:
        hub.cut = True  # every body stops half-way: IncompleteRead
        proc = python(RESOLVE, hub_env(hub.url, tmp_path))
        assert proc.returncode == 3, proc.stderr[-2000:]
        err = proc.stderr.strip().splitlines()[-1]
        assert err.startswith("ResolveError: wiki1m: could not download")
        assert f"{hub.url}/datasets/{SIMCSE_DATA_REPO} ({WIKI1M_FILE})" in err
        assert "--data.train_file=PATH" in err
        assert not [p for p in tmp_path.rglob(WIKI1M_FILE)]  # nothing under the final name
        assert any(method == "GET" for method, _, _ in hub.requests)

        hub.cut = False
        proc = python(RESOLVE, hub_env(hub.url, tmp_path))
        assert proc.returncode == 0, proc.stderr[-2000:]
        path = Path(proc.stdout.strip().splitlines()[-1])
        assert path.name == WIKI1M_FILE and (tmp_path / "hf") in path.parents  # the HF cache
        assert path.read_bytes() == WIKI


def test_wiki1m_offline_uses_the_cache_or_fails_in_one_line(
    tiny_bert: Path, tmp_path: Path
) -> None:
    with serve({WIKI_KEY: WIKI}) as hub:
        # Offline with an empty cache: the CLI's one line, naming the setting and the way out.
        proc = subprocess.run(
            [sys.executable, "-m", "cselab", "-q", "train", f"--model.name_or_path={tiny_bert}",
             "--data.train_file=wiki1m", f"--train.output_dir={tmp_path / 'out'}",
             "--train.eval_steps=0"],
            env=hub_env(hub.url, tmp_path, offline=True), capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip
        assert proc.returncode == 2, proc.stderr[-3000:]
        err = proc.stderr.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err
        assert err.startswith("cselab train: error: wiki1m: could not download")
        assert "HF_HUB_OFFLINE is set and it is not in the cache" in err
        assert hub.requests == []  # offline means no request at all

        online = python(RESOLVE, hub_env(hub.url, tmp_path))
        assert online.returncode == 0, online.stderr[-2000:]
        before = len(hub.requests)
        offline = python(RESOLVE, hub_env(hub.url, tmp_path, offline=True))
        assert offline.returncode == 0, offline.stderr[-2000:]
        assert offline.stdout == online.stdout and len(hub.requests) == before


def test_wiki1m_copy_from_earlier_versions_is_still_used(tmp_path: Path) -> None:
    legacy = tmp_path / "xdg" / "cselab" / "data" / WIKI1M_FILE
    legacy.parent.mkdir(parents=True)
    legacy.write_bytes(b"cached\n")
    proc = python(RESOLVE, hub_env("http://127.0.0.1:9", tmp_path, offline=True))
    assert proc.returncode == 0 and Path(proc.stdout.strip()) == legacy


def _senteval_tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"SentEval/data/downstream/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_senteval_archive_comes_through_huggingface_hub(senteval_dir: Path, tmp_path: Path) -> None:
    """The real STS-B files, packed as SimCSE's senteval.tar, served by the fake Hub: they land
    in the data cache unchanged (no SHA-256 warning) and parse to their published counts."""
    rels = ["STS/STSBenchmark/sts-dev.csv", "STS/STSBenchmark/sts-test.csv"]
    tar = _senteval_tar({rel: (senteval_dir / rel).read_bytes() for rel in rels})
    code = (
        "import warnings\n"
        "warnings.simplefilter('error')\n"
        "from cselab.evaluation import datasets as ds\n"
        "from cselab.evaluation.download import ensure_data\n"
        "root = ensure_data(['STSBenchmark'])\n"
        "print(root)\n"
        "print(len(ds.read_stsb(root / 'STS/STSBenchmark/sts-dev.csv').scores),"
        " len(ds.read_stsb(root / 'STS/STSBenchmark/sts-test.csv').scores))\n"
    )
    with serve({f"datasets/{SIMCSE_DATA_REPO}/senteval.tar": tar}) as hub:
        proc = python(code, hub_env(hub.url, tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    root, counts = proc.stdout.strip().splitlines()[-2:]
    assert Path(root).is_relative_to(tmp_path / "xdg")
    assert counts == "1500 1379"
    assert list((tmp_path / "hf").rglob("senteval.tar"))  # the archive stays in the HF cache
    assert not list(Path(root).rglob("*.partial"))
