"""The model folder on disk: a Hugging Face folder that is also a sentence-transformers folder.

Writing (:func:`write_model_folder`, behind ``SentenceEncoder.save``): ``config.json`` +
``model.safetensors`` + tokenizer (the backbone, safetensors only), ``cselab.json`` (cselab's
pooler settings), ``pooler_head.safetensors`` (the ``cls`` head, if any), and
sentence-transformers' own modules reproducing the *inference* pooler (for PromptBERT's
``prompt`` pooler and a decoder made bidirectional, which it has none for, cselab's encoder as
one module: :data:`ENCODER_MODULE`),
followed by ``Normalize`` when the base model's folder ended in one, and
``sentence_bert_config.json``; the model's named prompts go to
``config_sentence_transformers.json`` (:data:`PROMPTS_FILE`) and whether the pooler reads them to
the Pooling module's ``include_prompt``, as sentence-transformers saves them.

Reading (:func:`read_folder_settings`): what a sentence-transformers folder says about inference
besides its pooling (which :func:`cselab.model.hf_models.st_pooler_name` reads):
``max_seq_length`` and ``do_lower_case`` of ``sentence_bert_config.json``, whether the module
list ends in ``Normalize``, the prompts of ``config_sentence_transformers.json`` and the Pooling
module's ``include_prompt``. cselab honours them as sentence-transformers does, and
:func:`check_reproducible` refuses a third-party folder whose modules cselab would skip (a
``Dense`` layer, a ``WeightedLayerPooling``, ...), rather than give other vectors than its authors
meant.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from ..core.errors import ModelFormatError, ModelSettingError
from ..core.prompts import prompt_alone_length, prompt_length
from ..io.files import give_umask_mode, write_json_atomic
from .pooling import LAST_LAYER, POOLER_MEANINGS, Pooler, inference_pooler_name

log = logging.getLogger("cselab")

#: cselab's pooler settings of a saved folder (its presence makes a folder a cselab folder)
CSELAB_FILE = "cselab.json"
#: the ``cls`` pooler's MLP head
HEAD_FILE = "pooler_head.safetensors"
MODULES_FILE = "modules.json"
ST_CONFIG_FILE = "sentence_bert_config.json"
#: sentence-transformers' model settings: the named prompts and the default one
PROMPTS_FILE = "config_sentence_transformers.json"
_ST = "sentence_transformers.models."
#: sentence-transformers modules whose effect cselab reproduces in a third-party folder (the
#: backbone, the pooling of :data:`cselab.model.hf_models.ST_POOLING_MODES`, L2 normalisation)
REPRODUCED_MODULES = ("Transformer", "Pooling", "Normalize")
#: The sentence-transformers module of a folder whose pooler sentence-transformers has no module
#: of (``prompt``): cselab's encoder as one module (:class:`cselab.st.SentenceEncoderModule`).
ENCODER_MODULE = "cselab.st.SentenceEncoderModule"
#: what ``cselab.json`` and the folder's ``README.md`` say of a ``prompt`` folder
PROMPT_NOT_REPRODUCED = (
    "pooler 'prompt' (PromptBERT) has no sentence-transformers module of its own: modules.json "
    f"names cselab's ({ENCODER_MODULE}), so SentenceTransformer(folder, trust_remote_code=True) "
    "gives this model's vectors where cselab is installed (pip install cselab); without "
    "trust_remote_code sentence-transformers >= 6 refuses to load the folder, and without cselab "
    "the import of the module fails"
)

#: what ``cselab.json`` says of a decoder made bidirectional (``model.bidirectional``)
BIDIRECTIONAL_NOT_REPRODUCED = (
    "model.bidirectional: this decoder runs without its causal mask in cselab; AutoModel loads "
    "it causal, which gives other vectors, and sentence-transformers has no module without "
    f"the mask: modules.json names cselab's ({ENCODER_MODULE}), so "
    "SentenceTransformer(folder, trust_remote_code=True) gives this model's vectors where "
    "cselab is installed; without trust_remote_code sentence-transformers >= 6 refuses to load "
    "the folder"
)
#: what ``cselab.json`` says of a folder of LoRA adapters whose pooler reads several layers
ADAPTER_LAYERS_NOT_REPRODUCED = (
    "a pooler over several layers on LoRA adapters: SentenceTransformer(folder) loads the base "
    "model without its hidden states and gives other vectors; use cselab.load(folder), or merge "
    "the adapters (cselab merge) and load the merged folder"
)


@dataclass(frozen=True)
class FolderSettings:
    """What a sentence-transformers folder says about inference, besides its pooling.

    Attributes:
        max_seq_length: the truncation length its authors chose (``None``: the tokenizer's and
            the position embeddings' limit, :func:`cselab.model.hf_models.max_sequence_length`).
        do_lower_case: lowercase the text before tokenising.
        normalize: the vectors are L2-normalised (the module list ends in ``Normalize``).
        prompts, default_prompt_name: the named prompts of :data:`PROMPTS_FILE`.
        include_prompt: the Pooling module pools a prompt's tokens too.
    """

    max_seq_length: int | None = None
    do_lower_case: bool = False
    normalize: bool = False
    prompts: tuple[tuple[str, str], ...] = ()
    default_prompt_name: str | None = None
    include_prompt: bool = True


def _module_kind(module: dict[str, Any]) -> str:
    """``Pooling`` of ``sentence_transformers.models.Pooling`` (any module path)."""
    return str(module.get("type", "")).rpartition(".")[2]


def read_json(path: Path) -> Any:
    """A model folder's JSON file; a malformed one is a :class:`ModelFormatError` naming it."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelFormatError(f"{path}: not valid JSON ({err})") from None


def recorded_settings(folder: Path) -> dict[str, Any]:
    """How a folder cselab saved was trained to run, from its ``cselab.json``: ``pooler`` and
    ``bidirectional`` (``{}`` for a folder cselab did not save)."""
    path = folder / CSELAB_FILE
    if not path.is_file():
        return {}
    meta = read_json(path)
    if not isinstance(meta, dict):
        raise ModelFormatError(f"{path}: expected a JSON object, got {type(meta).__name__}")
    return {"pooler": meta.get("pooler"), "bidirectional": bool(meta.get("bidirectional", False))}


def read_modules(folder: Path) -> list[dict[str, Any]] | None:
    """The entries of ``modules.json``, or ``None`` if ``folder`` is not a sentence-transformers
    folder."""
    path = folder / MODULES_FILE
    if not path.is_file():
        return None
    modules = read_json(path)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ModelFormatError(f"{path}: expected a list of modules, got {type(modules).__name__}")
    return modules


def transformer_folder(folder: Path) -> Path:
    """The folder of a sentence-transformers folder's ``Transformer`` module: where its
    backbone's ``config.json``, weights and tokenizer are. The root for folders written since
    2021 (and for a plain Hugging Face folder); ``0_Transformer/`` in the older layout, which
    ``SentenceTransformer`` loads too. A path that leaves ``folder`` is refused."""
    modules = read_modules(folder)
    transformer = next((m for m in modules or [] if _module_kind(m) == "Transformer"), None)
    sub = str((transformer or {}).get("path", "") or "")
    if not sub:
        return folder
    inner = (folder / sub).resolve()
    if not inner.is_relative_to(folder.resolve()) or not inner.is_dir():
        raise ModelFormatError(
            f"{folder / MODULES_FILE}: the Transformer module's path {sub!r} is not a folder "
            "inside the model folder"
        )
    return inner


def read_folder_settings(folder: Path) -> FolderSettings:
    """The :class:`FolderSettings` of a model folder (the defaults for a plain HF folder).

    ``sentence_bert_config.json`` is read where sentence-transformers reads it: in the
    ``Transformer`` module's folder (the root for every folder written since 2021).
    """
    modules = read_modules(folder)
    if modules is None:
        return FolderSettings()
    transformer = next((m for m in modules if _module_kind(m) == "Transformer"), {})
    path = folder / str(transformer.get("path", "")) / ST_CONFIG_FILE
    cfg = read_json(path) if path.is_file() else {}
    if not isinstance(cfg, dict):
        raise ModelFormatError(f"{path}: expected a JSON object, got {type(cfg).__name__}")
    length = cfg.get("max_seq_length")
    whole = isinstance(length, int) and not isinstance(length, bool)
    if length is not None and not (whole and length >= 1):
        raise ModelFormatError(
            f"{path}: max_seq_length must be a whole number >= 1, got {length!r}"
        )
    lower = cfg.get("do_lower_case", False)
    if not isinstance(lower, bool):
        raise ModelFormatError(f"{path}: do_lower_case must be true or false, got {lower!r}")
    normalize = bool(modules) and _module_kind(modules[-1]) == "Normalize"
    pooling = next((m for m in modules if _module_kind(m) == "Pooling"), None)
    pool_file = folder / str((pooling or {}).get("path", "")) / "config.json"
    pool_cfg = read_json(pool_file) if pooling is not None and pool_file.is_file() else {}
    include = pool_cfg.get("include_prompt", True) if isinstance(pool_cfg, dict) else True
    prompts, default = _read_prompts(folder / PROMPTS_FILE)
    return FolderSettings(length, lower, normalize, prompts, default, include is not False)


def _read_prompts(path: Path) -> tuple[tuple[tuple[str, str], ...], str | None]:
    """The prompts and default prompt name of :data:`PROMPTS_FILE` (none without the file); a
    prompt that is not text is a :class:`ModelFormatError` naming the file and the key."""
    cfg = read_json(path) if path.is_file() else {}
    if not isinstance(cfg, dict):
        raise ModelFormatError(f"{path}: expected a JSON object, got {type(cfg).__name__}")
    prompts = cfg.get("prompts") or {}
    bad = (
        [k for k, v in prompts.items() if not isinstance(v, str)]
        if isinstance(prompts, dict)
        else ["prompts"]
    )
    if bad:
        raise ModelFormatError(f"{path}: prompts.{bad[0]} must be a string")
    default = cfg.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise ModelFormatError(f"{path}: default_prompt_name {default!r} is not one of its prompts")
    return tuple(prompts.items()), default


def check_reproducible(folder: Path) -> None:
    """Refuse a third-party sentence-transformers folder with modules cselab would skip.

    cselab computes backbone → pooler (→ L2 normalisation): a ``Dense`` layer, a
    ``WeightedLayerPooling``, a ``LayerNorm`` or any other module in the list would be left out,
    and the vectors would not be the ones its authors meant. Raises :class:`ModelFormatError`
    naming the module.
    """
    for module in read_modules(folder) or []:
        kind = _module_kind(module)
        if kind not in REPRODUCED_MODULES:
            raise ModelSettingError(
                "pooler", "NAME",
                "{file}: module {name} is {kind!r}, which cselab does not reproduce (it computes "
                "{known}); load it with sentence-transformers, or pass {setting} to use the "
                "backbone with one of cselab's poolers",
                placeholder=True, key="model.pooler", file=folder / MODULES_FILE,
                name=module.get("name", "?"), kind=module.get("type"),
                known=" + ".join(REPRODUCED_MODULES),
            )  # fmt: skip


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, data, indent=2)


def prompt_count_differences(tokenizer: Any, prompts: dict[str, str]) -> dict[str, dict[str, int]]:
    """``{name: {"sentence_transformers": n, "cselab": m}}`` for each prompt that
    sentence-transformers counts differently from cselab
    (:func:`~cselab.core.prompts.prompt_alone_length` against
    :func:`~cselab.core.prompts.prompt_length`: a subword tokenizer's trailing space); what a
    folder whose pooling leaves its prompts out records as ``cselab.json``'s ``prompt_counts``
    (its model card says it too)."""
    found = {}
    for name, text in prompts.items():
        theirs, ours = prompt_alone_length(tokenizer, text), prompt_length(tokenizer, text)
        if theirs != ours:
            found[name] = {"sentence_transformers": theirs, "cselab": ours}
    return found


def prompt_count_notes(
    differences: dict[str, dict[str, int]], prompts: dict[str, str]
) -> list[str]:
    """A note (logged as a warning too, once a process) for each of
    :func:`prompt_count_differences`: sentence-transformers' vectors with that prompt differ."""
    notes = []
    for name, counts in differences.items():
        theirs, ours = counts["sentence_transformers"], counts["cselab"]
        notes.append(
            f"sentence-transformers counts prompt {name!r} ({prompts[name]!r}) as {theirs} "
            f"tokens, the prompt tokenised alone, where a row gives it {ours}: with "
            f"include_prompt=False it leaves the text's first {theirs - ours} token(s) out "
            "of the pooling too, so its vectors with that prompt differ from cselab's"
        )
        if notes[-1] not in _WARNED:  # best/ is written again at every better score
            _WARNED.add(notes[-1])
            log.warning("%s", notes[-1])
    return notes


#: the notes :func:`prompt_count_notes` has logged in this process
_WARNED: set[str] = set()


def write_model_folder(
    out: Path,
    *,
    backbone: nn.Module,
    tokenizer: Any,
    pooler: Pooler,
    meta: dict[str, Any],
    settings: FolderSettings,
    prompts: tuple[dict[str, str], str | None] = ({}, None),
) -> None:
    """Write the folder described in the module docstring.

    ``meta`` is the content of ``cselab.json``; ``settings.max_seq_length`` is the inference
    truncation length written to ``sentence_bert_config.json`` (so sentence-transformers
    truncates where cselab does); ``prompts``: the named prompts and the default prompt name.
    """
    out.mkdir(parents=True, exist_ok=True)
    backbone.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    notes = [PROMPT_NOT_REPRODUCED] if pooler.meaning.token == "mask" else []
    if meta.get("bidirectional"):
        notes.append(BIDIRECTIONAL_NOT_REPRODUCED)
    layers = POOLER_MEANINGS[inference_pooler_name(pooler.kind, pooler.mlp_only_train)].layers
    if layers != LAST_LAYER and not (out / "config.json").is_file():  # adapters: no config.json
        notes.append(ADAPTER_LAYERS_NOT_REPRODUCED)
    # sentence-transformers' Pooling leaves the prompts out by its own count: said where that
    # differs ("alone" is that count; the last token is unaffected, and cselab's own module,
    # a bidirectional model's, counts as cselab does)
    st_pooling = pooler.meaning.token in ("mean", "weightedmean") and not meta.get("bidirectional")
    if st_pooling and not pooler.include_prompt and meta.get("prompt_count", "row") == "row":
        differences = prompt_count_differences(tokenizer, prompts[0])
        if differences:
            meta = {**meta, "prompt_counts": differences}
            notes += prompt_count_notes(differences, prompts[0])
    if notes:
        meta = {**meta, "sentence_transformers": "; ".join(notes)}
    _write_json(out / CSELAB_FILE, meta)
    if pooler.mlp is not None:
        save_file(
            {k: v.detach().cpu().contiguous() for k, v in pooler.mlp.state_dict().items()},
            str(out / HEAD_FILE),
        )
    if pooler.meaning.token == "mask" or meta.get("bidirectional"):
        # sentence-transformers has no [MASK]-of-a-template pooling and no decoder without its
        # causal mask: cselab's whole encoder is the one module, so no loader gives the vector
        # of the bare sentence or of the causal model instead
        modules = [{"idx": 0, "name": "0", "path": "", "type": ENCODER_MODULE}]
    else:
        modules = _write_pooling_modules(out, backbone, pooler)
    if settings.normalize:  # the base model's folder ended in Normalize: keep it (no files)
        n = len(modules)
        modules.append(
            {"idx": n, "name": str(n), "path": f"{n}_Normalize", "type": _ST + "Normalize"}
        )
    _write_json(out / MODULES_FILE, modules)
    _write_json(
        out / ST_CONFIG_FILE,
        {"max_seq_length": settings.max_seq_length, "do_lower_case": settings.do_lower_case},
    )
    named, default = prompts
    _write_json(
        out / PROMPTS_FILE,
        {"prompts": dict(named), "default_prompt_name": default},
    )
    # the weights' files this save wrote (the backbone's or adapters', the head's, a Dense
    # module's), readable as the folder's other files are: safetensors writes them 0600
    folders = [out, *(out / m["path"] for m in modules if m.get("path"))]
    give_umask_mode(p for folder in folders for p in folder.glob("*.safetensors"))


def _write_pooling_modules(out: Path, backbone: nn.Module, pooler: Pooler) -> list[dict[str, Any]]:
    """Describe the inference pooler with sentence-transformers' own modules; returns the module
    list (Transformer first).

    ``cls_before_pooler`` / ``cls`` with ``mlp_only_train`` → Pooling(cls); ``cls`` → Pooling(cls)
    + Dense(tanh) with the head's weights; ``avg`` → Pooling(mean); ``avg_top2`` and
    ``avg_first_last`` → WeightedLayerPooling (weights 1 on the two layers, 0 elsewhere) +
    Pooling(mean). (``prompt`` has no sentence-transformers equivalent: its folder names
    :data:`ENCODER_MODULE` instead.)
    """
    kind = inference_pooler_name(pooler.kind, pooler.mlp_only_train)
    meaning = POOLER_MEANINGS[kind]
    dim = int(backbone.config.hidden_size)
    n_layers = int(backbone.config.num_hidden_layers)
    modules = [{"idx": 0, "name": "0", "path": "", "type": _ST + "Transformer"}]

    def add(path: str, kind_: str) -> None:
        modules.append(
            {"idx": len(modules), "name": str(len(modules)), "path": path, "type": kind_}
        )

    if meaning.layers != LAST_LAYER:
        # hidden_states has n_layers + 1 entries; start at layer 1 and weight the ones we need.
        weights = torch.zeros(n_layers)
        for i in meaning.layers:
            weights[i - 1 if i > 0 else i] = 1.0
        folder = out / "1_WeightedLayerPooling"
        _write_json(
            folder / "config.json",
            {"embedding_dimension": dim, "layer_start": 1, "num_hidden_layers": n_layers},
        )
        save_file({"layer_weights": weights}, str(folder / "model.safetensors"))
        add(folder.name, _ST + "WeightedLayerPooling")
        if (out / "config.json").is_file():  # an adapter folder has none: its base's config
            cfg = json.loads((out / "config.json").read_text(encoding="utf-8"))
            cfg["output_hidden_states"] = True  # so the Transformer module returns every layer
            _write_json(out / "config.json", cfg)
    pooling_mode = meaning.token
    pool_folder = f"{len(modules)}_Pooling"
    _write_json(
        out / pool_folder / "config.json",
        {
            "word_embedding_dimension": dim,
            "pooling_mode_cls_token": pooling_mode == "cls",
            "pooling_mode_mean_tokens": pooling_mode == "mean",
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
            "pooling_mode_weightedmean_tokens": pooling_mode == "weightedmean",
            "pooling_mode_lasttoken": pooling_mode == "lasttoken",
            "include_prompt": pooler.include_prompt,
        },
    )
    add(pool_folder, _ST + "Pooling")
    if meaning.head:
        dense_folder = out / f"{len(modules)}_Dense"
        _write_json(
            dense_folder / "config.json",
            {
                "in_features": dim,
                "out_features": dim,
                "bias": True,
                "activation_function": "torch.nn.modules.activation.Tanh",
            },
        )
        head = pooler.mlp.dense
        save_file(
            {
                "linear.weight": head.weight.detach().cpu().contiguous(),
                "linear.bias": head.bias.detach().cpu().contiguous(),
            },
            str(dense_folder / "model.safetensors"),
        )
        add(dense_folder.name, _ST + "Dense")
    return modules
