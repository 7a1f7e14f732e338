"""The sentence encoder: any Hugging Face ``AutoModel`` backbone plus a :class:`~cselab.model.pooling.Pooler`.

The architecture is whatever the checkpoint's ``config.json`` says (``AutoModel``); it is never
guessed from the model's name. Saved models are at once a Hugging Face model folder and a
sentence-transformers folder (``modules.json``), in safetensors only.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from . import unpad
from .config import ModelConfig
from .dropout import use_fast_dropout
from .hf_models import ModelFormatError, hf_pooler_head, max_sequence_length, st_pooler_name
from .hub import resolve_model
from .pooling import LAST_LAYER, POOLER_MEANINGS, POOLERS, Pooler, inference_pooler_name
from .similarity import cosine_matrix

log = logging.getLogger(__name__)

CSELAB_FILE = "cselab.json"
#: ``encode(precision=...)``: the backbone's compute precision at inference
PRECISIONS = ("fp32", "bf16")
HEAD_FILE = "pooler_head.safetensors"


class SentenceEncoder(nn.Module):
    """Backbone + pooler, with tokenisation and batched inference.

    Args:
        backbone: a ``transformers`` encoder (``BertModel``, ``RobertaModel``, ...).
        tokenizer: its tokenizer.
        pooler: a :class:`Pooler`.
        max_seq_len: truncation length used by :meth:`tokenize`.

    Example::

        >>> enc = SentenceEncoder.from_pretrained("sentence-transformers/all-MiniLM-L6-v2",
        ...                                       pooler="avg")  # doctest: +SKIP
        >>> enc.encode(["a man is playing a guitar ."]).shape  # doctest: +SKIP
        (1, 384)
    """

    def __init__(self, backbone: nn.Module, tokenizer: Any, pooler: Pooler, max_seq_len: int = 32):
        super().__init__()
        self.backbone = backbone
        self.tokenizer = tokenizer
        self.pooler = pooler
        self.max_seq_len = max_seq_len
        # Forward on the real tokens only (see cselab.model.unpad); from_pretrained turns it on for
        # backbones that support it, in training and, on the CPU, for inference.
        self.unpad_training = False
        self.unpad_inference = False

    # ---------------------------------------------------------------------------------- building
    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        pooler: str = ModelConfig.pooler,
        mlp_only_train: bool = ModelConfig.mlp_only_train,
        max_seq_len: int = ModelConfig.max_seq_len,
        dropout: float | None = ModelConfig.dropout,
        attn_implementation: str | None = ModelConfig.attn_implementation,
        trust_remote_code: bool = ModelConfig.trust_remote_code,
        revision: str | None = ModelConfig.revision,
    ) -> SentenceEncoder:
        """Load a backbone by Hub name or folder and attach a fresh pooler.

        The defaults are :class:`~cselab.config.ModelConfig`'s (SimCSE's unsupervised recipe).

        ``dropout`` overrides the hidden and attention dropout probabilities (GS-InfoNCE's scripts
        use 0.2 for BERT).
        """
        from transformers import AutoConfig, AutoModel, AutoTokenizer

        path = resolve_model(name_or_path, revision)
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        if dropout is not None:
            for attr in ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout",
                         "attention_dropout", "hidden_dropout"):  # fmt: skip
                if hasattr(config, attr):
                    setattr(config, attr, dropout)
        kwargs: dict[str, Any] = {"config": config, "trust_remote_code": trust_remote_code}
        if attn_implementation:
            kwargs["attn_implementation"] = attn_implementation
        try:
            backbone = AutoModel.from_pretrained(path, **kwargs)
        except (ValueError, ImportError):
            if not attn_implementation:
                raise
            # Some architectures have no SDPA path; eager attention is always available.
            kwargs["attn_implementation"] = "eager"
            backbone = AutoModel.from_pretrained(path, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        head = Pooler(pooler, backbone.config.hidden_size, mlp_only_train=mlp_only_train)
        encoder = cls(backbone, tokenizer, head, max_seq_len)
        encoder.source = name_or_path
        encoder.unpad_training = encoder.unpad_inference = unpad.enable(backbone)
        use_fast_dropout(backbone)
        return encoder

    @classmethod
    def from_config(cls, model_cfg: ModelConfig) -> SentenceEncoder:
        """Build from the ``model`` section of a run config."""
        return cls.from_pretrained(**dataclasses.asdict(model_cfg))

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dim(self) -> int:
        return int(self.backbone.config.hidden_size)

    # ----------------------------------------------------------------------------------- forward
    def tokenize(
        self, sentences: Sequence[str], max_seq_len: int | None = None
    ) -> dict[str, Tensor]:
        """Tokenise with truncation to ``max_seq_len`` and padding to the longest sentence."""
        return dict(
            self.tokenizer(
                list(sentences),
                padding=True,
                truncation=True,
                max_length=max_seq_len or self.max_seq_len,
                return_tensors="pt",
            )
        )

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        """Token ids ``(N, L)`` → sentence vectors ``(N, D)``."""
        if (
            (self.unpad_training if self.training else self.unpad_inference)
            and (token_type_ids is None or not bool(token_type_ids.any()))  # one segment
            and not self.pooler.needs_hidden_states
            and input_ids.device.type == "cpu"  # on GPUs the index sync would stall the queue
        ):
            last = unpad.unpadded_last_hidden(
                self.backbone,
                input_ids,
                attention_mask,
                first_token_only=self.pooler.reads_first_token_only,
            )
            return self.pooler(last, attention_mask)
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids
        out = self.backbone(
            **kwargs, output_hidden_states=self.pooler.needs_hidden_states, return_dict=True
        )
        return self.pooler(out.last_hidden_state, attention_mask, out.hidden_states)

    @torch.inference_mode()
    def encode(
        self,
        sentences: Sequence[str],
        batch_size: int = 128,
        normalize: bool = False,
        show_progress: bool = False,
        max_seq_len: int | None = None,
        precision: str = "fp32",
    ) -> np.ndarray:
        """Encode sentences for inference; returns float32 ``(N, D)`` in input order.

        Sentences are sorted by length so each batch pads little; the result is put back in the
        input order. The module's train/eval state is restored afterwards.

        ``max_seq_len`` defaults to the backbone's maximum (inference should not truncate at the
        training length); pass a value to truncate.

        ``precision="bf16"`` encodes with a bf16 copy of the model (:meth:`inference_copy`; this
        encoder keeps its float32 weights): on CPUs with AMX or AVX512-BF16 and on recent GPUs it
        is faster (2.4x for MiniLM on a Xeon with AMX), and the vectors move by bf16 rounding
        (cosine to the fp32 vector above 0.999 in ``docs/results/encode_benchmark.md``).
        Evaluation never uses it: its numbers are fp32.
        """
        if isinstance(sentences, str):
            raise TypeError("encode() takes a list of sentences, not a single string")
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
        n = len(sentences)
        if n == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        limit = min(max_seq_len or 1 << 30, max_sequence_length(self.tokenizer, self.backbone))
        order = np.argsort([-len(s) for s in sentences], kind="stable")
        out = np.empty((n, self.dim), dtype=np.float32)
        model = self.inference_copy(torch.bfloat16) if precision == "bf16" else self
        was_training = self.training
        self.eval()
        try:
            starts = range(0, n, batch_size)
            if show_progress:
                from tqdm.auto import tqdm

                starts = tqdm(starts, desc="encode", unit="batch")
            for start in starts:
                idx = order[start : start + batch_size]
                batch = self.tokenize([sentences[i] for i in idx], max_seq_len=limit)
                batch = {k: v.to(self.device) for k, v in batch.items()}
                vec = model(**batch).float()
                if normalize:
                    vec = torch.nn.functional.normalize(vec, dim=-1)
                out[idx] = vec.cpu().numpy()
        finally:
            self.train(was_training)
        return out

    def inference_copy(self, dtype: torch.dtype) -> SentenceEncoder:
        """A copy of this encoder with its weights in ``dtype``, in eval mode (for inference).

        Inference needs no float32 master weights: with bf16 weights every operation runs in
        bf16 with no per-operation casts, which is what makes bf16 inference fast on CPUs with
        AMX/AVX512-BF16. The copy shares the tokenizer; this encoder is left as it was.
        """
        copy_ = SentenceEncoder(
            copy.deepcopy(self.backbone).to(dtype),
            self.tokenizer,
            copy.deepcopy(self.pooler).to(dtype),
            self.max_seq_len,
        )
        copy_.unpad_training, copy_.unpad_inference = self.unpad_training, self.unpad_inference
        return copy_.eval()

    def similarity(
        self, a: Sequence[str] | np.ndarray, b: Sequence[str] | np.ndarray, batch_size: int = 128
    ) -> np.ndarray:
        """Cosine similarity matrix ``(len(a), len(b))``, float32.

        Each side is a list of sentences (encoded here, in batches of ``batch_size``) or an
        ``(N, D)`` array of vectors already encoded. A zero vector has cosine 0 with everything.
        """

        def vectors(x: Sequence[str] | np.ndarray) -> np.ndarray:
            if isinstance(x, str):
                raise TypeError("similarity() takes lists of sentences, not a single string")
            if isinstance(x, np.ndarray | Tensor):
                return np.asarray(x.detach().cpu() if isinstance(x, Tensor) else x)
            return self.encode(list(x), batch_size=batch_size)

        return cosine_matrix(vectors(a), vectors(b))

    # ------------------------------------------------------------------------------------ saving
    def save(self, path: str | Path) -> None:
        """Write an HF model folder that is also a sentence-transformers folder.

        Files: ``config.json`` + ``model.safetensors`` + tokenizer (the backbone), ``cselab.json``
        (pooler settings), ``pooler_head.safetensors`` (the ``cls`` head, if any), and the
        sentence-transformers modules reproducing the *inference* pooler.
        """
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        self.backbone.save_pretrained(out, safe_serialization=True)
        self.tokenizer.save_pretrained(out)
        meta = {
            "pooler": self.pooler.kind,
            "mlp_only_train": self.pooler.mlp_only_train,
            "max_seq_len": self.max_seq_len,
            "source": getattr(self, "source", None),
        }
        (out / CSELAB_FILE).write_text(json.dumps(meta, indent=2), encoding="utf-8")
        if self.pooler.mlp is not None:
            save_file(
                {k: v.detach().cpu().contiguous() for k, v in self.pooler.mlp.state_dict().items()},
                str(out / HEAD_FILE),
            )
        _write_sentence_transformers_modules(self, out)


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")


def _write_sentence_transformers_modules(encoder: SentenceEncoder, out: Path) -> None:
    """Describe the inference pooler with sentence-transformers' own modules.

    ``cls_before_pooler`` / ``cls`` with ``mlp_only_train`` → Pooling(cls); ``cls`` → Pooling(cls)
    + Dense(tanh) with the head's weights; ``avg`` → Pooling(mean); ``avg_top2`` and
    ``avg_first_last`` → WeightedLayerPooling (weights 1 on the two layers, 0 elsewhere) +
    Pooling(mean).
    """
    kind = inference_pooler_name(encoder.pooler.kind, encoder.pooler.mlp_only_train)
    meaning = POOLER_MEANINGS[kind]
    dim = encoder.dim
    n_layers = int(encoder.backbone.config.num_hidden_layers)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}
    ]

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
        add(folder.name, "sentence_transformers.models.WeightedLayerPooling")
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
        },
    )
    add(pool_folder, "sentence_transformers.models.Pooling")
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
        head = encoder.pooler.mlp.dense
        save_file(
            {
                "linear.weight": head.weight.detach().cpu().contiguous(),
                "linear.bias": head.bias.detach().cpu().contiguous(),
            },
            str(dense_folder / "model.safetensors"),
        )
        add(dense_folder.name, "sentence_transformers.models.Dense")
    _write_json(out / "modules.json", modules)
    max_len = max_sequence_length(encoder.tokenizer, encoder.backbone)
    _write_json(
        out / "sentence_bert_config.json", {"max_seq_length": max_len, "do_lower_case": False}
    )


def load(
    path: str,
    pooler: str | None = None,
    device: str | torch.device | None = None,
    **kwargs: Any,
) -> SentenceEncoder:
    """Open a cselab output folder, a sentence-transformers folder or an HF model.

    * cselab folder (has ``cselab.json``): its pooler (and ``cls`` head) unless ``pooler`` says
      otherwise;
    * sentence-transformers folder: the Pooling module's mode (``cls`` → ``cls_before_pooler``,
      ``mean`` → ``avg``; other modes are refused) unless ``pooler`` says otherwise;
    * anything else: an HF backbone with ``pooler`` (default ``cls_before_pooler``; ``cls`` is
      the model's own ``pooler_output``, as in SimCSE's evaluation).
    """
    local = Path(resolve_model(path, kwargs.pop("revision", None)))
    meta_file = local / CSELAB_FILE
    if meta_file.is_file():
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
        kind = pooler or meta["pooler"]
        mlp_only_train = bool(meta.get("mlp_only_train", False))
        encoder = SentenceEncoder.from_pretrained(
            str(local), pooler=kind, mlp_only_train=mlp_only_train,
            max_seq_len=int(meta.get("max_seq_len", 32)), **kwargs,
        )  # fmt: skip
        if encoder.pooler.mlp is not None and (local / HEAD_FILE).is_file():
            encoder.pooler.mlp.load_state_dict(load_file(str(local / HEAD_FILE)))
        elif encoder.pooler.mlp is not None and not mlp_only_train:
            raise ModelFormatError(f"{local}: pooler 'cls' needs {HEAD_FILE}, which is missing")
    else:
        kind = pooler or st_pooler_name(local) or "cls_before_pooler"
        if kind not in POOLERS:
            raise ModelFormatError(f"unknown pooler {kind!r}; choose one of {', '.join(POOLERS)}")
        encoder = SentenceEncoder.from_pretrained(str(local), pooler=kind, **kwargs)
        if kind == "cls":  # SimCSE's evaluation: the model's own pooler_output
            encoder.pooler.mlp = hf_pooler_head(encoder.backbone, local, path)
            encoder.pooler.mlp_only_train = False
    encoder.source = path
    encoder.eval()
    if device is not None:
        encoder.to(device)
    return encoder


@contextlib.contextmanager
def dropout_disabled(module: nn.Module) -> Iterator[None]:
    """Switch every dropout in ``module`` off, then restore each submodule's exact mode.

    Sets ``training=False`` on *every* submodule rather than only on ``nn.Dropout`` instances:
    in transformers 5 attention dropout is chosen from the attention module's own ``training``
    flag (``dropout=0.0 if not self.training else p``), so switching only ``nn.Dropout`` modules
    would leave attention dropout on. Used for ImSimCSE's off-dropout view.
    """
    states = [(m, m.training) for m in module.modules()]
    try:
        for m, _ in states:
            m.training = False
        yield
    finally:
        for m, mode in states:
            m.training = mode
