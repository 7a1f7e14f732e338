"""Opening a model folder of any kind as a :class:`~cselab.model.sentence_encoder.SentenceEncoder`.

``cselab.load``, ``cselab encode``/``evaluate``/``index`` and the search index all open models
here: a folder cselab saved, a sentence-transformers folder, or a plain Hugging Face model (a
folder or a Hub name), each as its authors meant it to be used.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from safetensors.torch import load_file

from ..core.errors import ModelFormatError
from ..core.schema import without_removed
from ..io.readers import read_json
from . import backbones
from .config import ModelConfig
from .devices import resolve_device
from .hf_models import hf_pooler_head, st_pooler_name
from .hub import resolve_model
from .lora import adapter_base, is_adapter_folder
from .pooling import POOLERS, PROMPT_EXCLUDING
from .sentence_encoder import SentenceEncoder
from .st_folder import (
    CSELAB_FILE,
    HEAD_FILE,
    check_reproducible,
    read_folder_settings,
    transformer_folder,
)

log = logging.getLogger(__name__)


def load(
    path: str | os.PathLike[str],
    pooler: str | None = None,
    device: str | torch.device | None = None,
    *,
    fast_path: bool = ModelConfig.fast_path,
    compile_inference: bool = False,
    **kwargs: Any,
) -> SentenceEncoder:
    """Open a cselab output folder, a sentence-transformers folder or an HF model, in eval mode.

    * cselab folder (has ``cselab.json``): its pooler (and ``cls`` head, and ``prompt``
      templates) unless ``pooler`` says otherwise (another pooler does not take the saved head,
      which was trained on the saved pooler's vector);
    * sentence-transformers folder: the Pooling module's mode (``cls`` → ``cls_before_pooler``,
      ``mean`` → ``avg``; other modes are refused) unless ``pooler`` says otherwise; its
      ``max_seq_length`` and ``do_lower_case`` apply to :meth:`~SentenceEncoder.encode`. Without
      ``pooler``, a folder whose modules cselab cannot reproduce (a ``Dense`` layer, ...) is
      refused;
    * anything else: an HF backbone with ``pooler`` (default ``cls_before_pooler``, or for a
      decoder its default in the table of backbones, ``avg``; ``cls`` is the model's own
      ``pooler_output``, as in SimCSE's evaluation). A plain ``peft`` folder of LoRA adapters
      (``adapter_config.json`` naming its base model, as LLM2Vec's authors publish theirs) is
      its base model with the adapters: the base's default pooler, causal attention unless
      ``bidirectional=True`` (LLM2Vec's adapters need it).

    The folder's named prompts (``config_sentence_transformers.json``) are the model's
    :attr:`~SentenceEncoder.prompts` (``encode(prompt_name="query")``), and its ``include_prompt``
    (or ``cselab.json``'s ``pool_prompt``) says whether the pooler reads their tokens; where it
    does not, their tokens are counted as the model was trained (``cselab.json``'s
    ``prompt_count``; a sentence-transformers folder, or a cselab one saved before the count was
    recorded: the prompt tokenised alone, :data:`~cselab.core.prompts.PROMPT_COUNTS`).

    ``bidirectional``: remove a decoder's causal mask (LLM2Vec); default: what ``cselab.json``
    records, else ``False``.

    ``device``: where the model runs (``None``: the CPU; ``auto``: the GPU where there is one,
    :func:`~cselab.model.devices.resolve_device`); one this machine lacks is a
    :class:`~cselab.core.errors.ConfigSettingError`, raised before the weights are read.
    ``fast_path``: see :meth:`SentenceEncoder.from_pretrained` (``False``: the backbone exactly
    as ``transformers`` loads it). ``compile_inference``: :meth:`SentenceEncoder.encode` runs a
    compiled graph (:meth:`SentenceEncoder.compile_inference`). Other ``kwargs`` go to
    ``from_pretrained``.
    """
    path = os.fspath(path)  # a Path names the folder as its text does (cselab.json, cards)
    kwargs = without_removed(ModelConfig, kwargs, "cselab.load")
    if device is not None:
        device = resolve_device(device)
    local = Path(resolve_model(path, kwargs.pop("revision", None)))
    kwargs["fast_path"] = fast_path
    # the folder's named prompts (config_sentence_transformers.json), unless given
    settings = read_folder_settings(local)
    kwargs.setdefault("prompts", dict(settings.prompts))
    kwargs.setdefault("default_prompt_name", settings.default_prompt_name)
    meta_file = local / CSELAB_FILE
    if meta_file.is_file():
        meta = read_json(meta_file) or {}
        kind = pooler or meta["pooler"]
        # the saved head was trained on the saved pooler's vector: another pooler (--pooler
        # prompt on a cls folder) reads its own vector without it, as at inference after
        # mlp_only_train training
        mlp_only_train = bool(meta.get("mlp_only_train", False)) or kind != meta["pooler"]
        # a folder that left its prompts out before cselab counted them as rows give them
        # counted them alone: it is encoded as it was trained
        pooled = meta.get("pool_prompt", True) is not False
        kwargs.setdefault("prompt_count", meta.get("prompt_count", "row" if pooled else "alone"))
        encoder = SentenceEncoder.from_pretrained(
            str(local), pooler=kind, mlp_only_train=mlp_only_train,
            max_seq_len=int(meta.get("max_seq_len", 32)), prompt=kwargs.pop("prompt", meta.get("prompt")),
            bidirectional=kwargs.pop("bidirectional", bool(meta.get("bidirectional", False))),
            dtype=kwargs.pop("dtype", meta.get("dtype", "float32")),
            # a pooler chosen here that reads one token pools it, as for a folder of another
            # library (below): there is no prompt to leave out of one token
            pool_prompt=kwargs.pop(
                "pool_prompt", meta.get("pool_prompt", True) is not False
                or (pooler is not None and pooler not in PROMPT_EXCLUDING),
            ),
            **kwargs,
        )  # fmt: skip
        if (
            encoder.pooler.mlp is not None
            and kind == meta["pooler"]
            and (local / HEAD_FILE).is_file()
        ):
            encoder.pooler.mlp.load_state_dict(load_file(str(local / HEAD_FILE)))
        elif encoder.pooler.mlp is not None and not mlp_only_train:
            raise ModelFormatError(f"{local}: pooler 'cls' needs {HEAD_FILE}, which is missing")
    else:
        if pooler is None:
            check_reproducible(local)
        kind = pooler or st_pooler_name(local) or _plain_default_pooler(local)
        if kind not in POOLERS:
            raise ModelFormatError(f"unknown pooler {kind!r}; choose one of {', '.join(POOLERS)}")
        # a folder's lasttoken mode reads the last token as tokenised, as sentence-transformers
        kwargs.setdefault("pool_prompt", settings.include_prompt or kind not in PROMPT_EXCLUDING)
        # a sentence-transformers folder that leaves its prompts out was trained with its count
        kwargs.setdefault("prompt_count", "row" if settings.include_prompt else "alone")
        encoder = SentenceEncoder.from_pretrained(
            str(local), pooler=kind, end_token=pooler is not None, **kwargs
        )
        if kind == "cls":  # SimCSE's evaluation: the model's own pooler_output
            encoder.pooler.mlp = hf_pooler_head(encoder.backbone, transformer_folder(local), path)
            encoder.pooler.mlp_only_train = False
    encoder.source = path
    encoder.compile_inference(compile_inference)
    encoder.eval()
    if device is not None:
        encoder.to(device)
    return encoder


def _plain_default_pooler(folder: Path) -> str:
    """A plain HF folder's pooler: the raw [CLS] vector, or a decoder's default from the table
    of backbones (a causal decoder's first token has seen nothing of the sentence). A plain
    ``peft`` folder of adapters (as LLM2Vec publishes them) answers for its base model."""
    if is_adapter_folder(folder):
        base = adapter_base(folder, loading=True)
        log.info(
            "%s holds LoRA adapters without cselab.json (a plain peft folder on %s): pooler and "
            "attention are load()'s pooler= and bidirectional= (default: the base's pooler, "
            "causal; LLM2Vec's adapters were trained with bidirectional=True)",
            folder, base,
        )  # fmt: skip
        folder = Path(resolve_model(base))
    config_file = folder / "config.json"
    if config_file.is_file():
        try:
            config = read_json(config_file) or {}
        except ValueError:  # read_json's DataFormatError: the folder's load says what is wrong
            config = {}
        if isinstance(config, dict) and backbones.is_decoder(SimpleNamespace(**config)):
            row = backbones.BACKBONES.get(str(config.get("model_type")))
            return row.default_pooler if row is not None else "avg"
    return "cls_before_pooler"
