"""The steps of :meth:`cselab.search.index.Index.build`: a new or resumable folder, the texts'
layout, the reserved vectors and the chunked, resumable encoding."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import IndexSettingError, SearchIndexError
from ..io.files import (
    atomic_path,
    reserve,
    write_json_atomic,
)
from ..model.similarity import truncate_rows
from .layout import (
    LINES_FILE,
    META_FILE,
    OFFSETS_FILE,
    PROGRESS_FILE,
    TEXTS_FILE,
    VECTORS_FILE,
    read_lines,
    read_meta,
)


# ------------------------------------------------------------------------------- build steps
def check_new_folder(path: str | Path) -> None:
    """Refuse to write an index over texts the caller holds into a folder that holds an index
    already (:meth:`Index.from_texts` has no corpus file to resume from, so it would replace
    that index without a word); :meth:`Index.build` resumes or refuses by its own rules."""
    if (Path(path) / META_FILE).is_file():
        raise SearchIndexError(
            f"{path} holds an index already ({META_FILE}); choose a new folder or remove it"
        )


def encode_at(encoder: Any, texts: Sequence[str], batch_size: int, dim: int | None) -> np.ndarray:
    """Unit vectors of ``texts`` at prefix ``dim`` (``None``: the full width). The prefix is cut
    here (:func:`~cselab.model.similarity.truncate_rows`), so any object with
    ``encode(texts, batch_size=, normalize=)`` serves as the index's encoder."""
    vectors = encoder.encode(list(texts), batch_size=batch_size, normalize=True)
    return vectors if dim is None else truncate_rows(vectors, dim)


def _progress(path: Path, meta: dict) -> tuple[int, int]:
    total = -(-int(meta["count"]) // int(meta["chunk_size"]))
    file = path / PROGRESS_FILE
    if not file.is_file():
        return 0, total
    try:
        done = int(json.loads(file.read_text(encoding="utf-8"))["chunks_done"])
    except (ValueError, KeyError, TypeError):
        raise IndexSettingError(
            "overwrite", True, "{file}: unreadable; rebuild with {setting}", file=file
        ) from None
    return min(done, total), total


_ABSENT = object()


def _recorded(meta: dict, key: str) -> Any:
    """``meta``'s value at the dotted ``key`` (``prompts.document``), or ``_ABSENT``."""
    value: Any = meta
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return _ABSENT
        value = value[part]
    return value


def _check_resumable(out: Path, want: dict, unrecorded: dict | None = None) -> dict:
    """The ``index.json`` of ``out`` if it was built as ``want`` says (a dotted key names a
    key inside one: ``prompts.document``); ``unrecorded``: what a key stands for in an index
    written before that key was recorded."""
    unrecorded = unrecorded or {}
    try:
        meta = read_meta(out / META_FILE)
    except SearchIndexError as err:
        raise IndexSettingError(
            "overwrite", True, "{err}; pass {setting} to start over", err=err
        ) from None
    for key, value in want.items():
        had = _recorded(meta, key)
        had = unrecorded.get(key) if had is _ABSENT else had
        if had != value:
            raise IndexSettingError(
                "overwrite", True,
                "{out}: an index with {name} {had!r} is there, not {want!r}; "
                "pass {setting} or another output folder",
                out=out, name=key, had=had, want=value,
            )  # fmt: skip
    return meta


def _start(out: Path, corpus: Path, want: dict) -> dict:
    texts, numbers = read_lines(corpus)
    return _write_layout(out, texts, numbers, want)


def _write_layout(out: Path, texts: Sequence[str], numbers: Sequence[int], want: dict) -> dict:
    """Texts, offsets, line numbers and an allocated vector file; ``index.json`` written last."""
    out.mkdir(parents=True, exist_ok=True)
    for name in (PROGRESS_FILE, META_FILE):
        (out / name).unlink(missing_ok=True)  # a half-written old build must not be resumed
    for old in out.glob("faiss-*.index"):
        old.unlink()
    # the vectors first: the largest file, so a full disk stops the build before anything else
    _allocate_vectors(out / VECTORS_FILE, len(texts), int(want["dim"]))
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    # text by text, so the corpus is never held a second time as bytes (a 1M-text corpus)
    with atomic_path(out / TEXTS_FILE, "index texts") as tmp, tmp.open("wb") as fh:
        end = 0
        for i, text in enumerate(texts, start=1):
            end += fh.write(text.encode("utf-8"))
            offsets[i] = end
    with atomic_path(out / OFFSETS_FILE, "index offsets") as tmp:
        np.save(tmp, offsets)
    with atomic_path(out / LINES_FILE, "index line numbers") as tmp:
        np.save(tmp, np.asarray(numbers, dtype=np.int64))
    meta = {**want, "count": len(texts), "lines": int(numbers[-1]), "normalized": True}
    write_json_atomic(out / PROGRESS_FILE, {"chunks_done": 0}, what="index progress")
    # last: its presence means the layout is complete
    write_json_atomic(out / META_FILE, meta, indent=2, what="index")
    return meta


def _allocate_vectors(path: Path, rows: int, dim: int) -> None:
    """A zero ``(rows, dim)`` float32 ``.npy`` file with all its bytes reserved on disk
    (:func:`~cselab.io.files.reserve`): the memory map written chunk by chunk later can then
    never meet a full disk, where a write through it would be a SIGBUS without a message."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": (rows, dim)}
    )
    with atomic_path(path, "index vectors") as tmp, tmp.open("wb") as fh:
        fh.write(header.getvalue())
        fh.flush()
        reserve(fh.fileno(), len(header.getvalue()) + 4 * rows * dim, path, "index vectors")


def _chunk_texts(out: Path, meta: dict, chunk: int) -> list[str]:
    offsets = np.load(out / OFFSETS_FILE, mmap_mode="r")
    start = chunk * int(meta["chunk_size"])
    stop = min(start + int(meta["chunk_size"]), int(meta["count"]))
    blob = (out / TEXTS_FILE).open("rb")
    with blob:
        blob.seek(int(offsets[start]))
        data = blob.read(int(offsets[stop]) - int(offsets[start]))
    cuts = np.asarray(offsets[start : stop + 1]) - int(offsets[start])
    return [data[a:b].decode("utf-8") for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


def _encode_chunks(
    out: Path,
    meta: dict,
    encoder: Any,
    done: int,
    total: int,
    batch_size: int,
    show_progress: bool,
) -> None:
    vectors = np.load(out / VECTORS_FILE, mmap_mode="r+")
    size = int(meta["chunk_size"])
    bar = None
    if show_progress:
        from tqdm.auto import tqdm

        bar = tqdm(
            total=int(meta["count"]), initial=min(done * size, int(meta["count"])),
            desc="index", unit="line",
        )  # fmt: skip
    try:
        for chunk in range(done, total):
            texts = _chunk_texts(out, meta, chunk)
            start = chunk * size
            vectors[start : start + len(texts)] = encode_at(
                encoder, texts, batch_size, int(meta["dim"]) if "model_dim" in meta else None
            )
            vectors.flush()  # the rows reach the file before the progress record says so
            write_json_atomic(
                out / PROGRESS_FILE, {"chunks_done": chunk + 1}, what="index progress"
            )
            if bar is not None:
                bar.update(len(texts))
    finally:
        if bar is not None:
            bar.close()
        del vectors
