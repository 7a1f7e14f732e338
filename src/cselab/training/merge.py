"""``cselab merge`` and ``train.save_merged``: a model folder with LoRA adapters → a plain one.

The adapters are folded into the base weights (``W₀ + (α/r)·BA``, Hu et al. 2022, Sec. 4.1: "no
additional inference latency"), and the folder is written as any cselab model folder: a
Hugging Face and sentence-transformers folder that needs neither ``peft`` nor the base model.
``cselab.load`` gives the same vectors from both folders (float rounding of the merge apart).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from ..core.errors import ModelFormatError
from ..io.files import refuse_file_in_the_way
from ..io.runfolder import RunFolder, work_folder
from ..model.lora import is_adapter_folder
from ..model.st_folder import CSELAB_FILE
from .checkpoint import publish_folder, publishing

#: the working folder of a merge, beside its output
MERGE_WORK_PREFIX = ".cselab-merge-"


def adapter_source(source: str | Path) -> Path:
    """The adapter folder meant by ``source``: a model folder, or a run folder (its ``best/``).

    Raises:
        ModelFormatError: naming the folder when it holds no adapters.
    """
    path = Path(source)
    if not path.is_dir():
        what = "is a file" if path.exists() else "no such folder"
        raise ModelFormatError(f"{path}: {what} (a model folder of LoRA adapters)")
    if not (path / CSELAB_FILE).is_file() and RunFolder(path).best.is_dir():
        path = RunFolder(path).best
    if not is_adapter_folder(path):
        plain = (path / "config.json").is_file()  # what transformers reads first in a model
        raise ModelFormatError(
            f"{path}: holds no LoRA adapters (no adapter_config.json), so there is nothing to "
            "merge; "
            + ("it is a plain model folder already" if plain else "nor is it a model folder")
        )
    return path


def refuse_output_in_model(folder: Path, target: Path) -> None:
    """Refuse a merge's output ``target`` that is the adapter ``folder`` it reads, or inside it
    or inside the run's other model folder (``best/``, ``last/``): the merge would write into a
    model folder (its working folder, then the output, beside the model's own files).

    Raises:
        ModelFormatError: one line naming both paths, before anything is written.
    """
    source = folder.resolve()  # `.`, `..` and links as the merge would follow them
    models = {source}
    if source.name in (RunFolder.BEST, RunFolder.LAST):  # a run's model: its sibling too
        run = RunFolder(source.parent)
        models |= {run.best.resolve(), run.last.resolve()}
    out = target.resolve()
    for model in sorted(models, key=lambda m: m != source):  # the one being merged first
        if out.is_relative_to(model):
            where = "is" if out == model else "is inside"
            raise ModelFormatError(
                f"{out} {where} the model folder {model}"
                + (" (the one being merged)" if model == source else "")
                + "; choose an output folder outside it"
            )


def merge_folder(
    source: str | Path,
    out: str | Path,
    describe: Callable[[Path], object] | None = None,
    bidirectional: bool | None = None,
) -> Path:
    """Write ``out``: ``source``'s model (see :func:`adapter_source`) with its adapters merged.

    ``out`` is published atomically and must not exist yet (nothing of the user's is replaced);
    the source's run config (``cselab_config.yaml``) is copied along; ``describe(tmp)`` adds
    files (the model card) before the folder is published. ``bidirectional``: a decoder's
    attention, as :func:`~cselab.model.loader.load` takes it (``None``: what the folder
    records, else causal); the merged folder records it.
    """
    from ..model.loader import load

    folder, target = adapter_source(source), Path(out)
    refuse_output_in_model(folder, target)
    if target.exists():
        raise ModelFormatError(f"{target} exists; choose a new folder for the merged model")
    refuse_file_in_the_way(target)  # before the model loads, naming OUT and the file above it
    attention = {} if bidirectional is None else {"bidirectional": bidirectional}
    encoder = load(str(folder), fast_path=False, **attention).merged()
    # a held working folder beside OUT (same disk for the rename), never a folder of the
    # user's; one a killed merge left is removed by the next (io.runfolder.work_folder)
    with work_folder(target.parent, MERGE_WORK_PREFIX) as work:
        tmp = work / target.name
        with publishing(target, "merged model folder", tmp):
            encoder.save(tmp)
            config = folder / RunFolder.MODEL_CONFIG
            if config.is_file():
                shutil.copy2(config, tmp / RunFolder.MODEL_CONFIG)
            if describe is not None:
                describe(tmp)
            publish_folder(tmp, target)
    return target
