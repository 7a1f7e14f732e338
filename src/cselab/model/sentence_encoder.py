"""The sentence encoder: any Hugging Face ``AutoModel`` backbone plus a :class:`~cselab.model.pooling.Pooler`.

The architecture is whatever the checkpoint's ``config.json`` says (``AutoModel``); it is never
guessed from the model's name. Batched inference is :mod:`.inference`, the folder it saves
:mod:`.st_folder`, opening any folder :mod:`.loader`; :mod:`.encoder` gathers the public names.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..core.errors import ConfigError, ConfigSettingError, ModelFormatError
from ..core.prompts import check_prompt_count, resolve_prompt
from ..core.schema import from_dict
from . import backbones, packing, unpad
from . import lora as adapters
from .choices import BATCH_SIZE
from .config import LoRAConfig, ModelConfig, PromptConfig
from .dropout import use_fast_dropout
from .hf_models import max_sequence_length
from .hub import refuse_remote_code, resolve_model
from .inference import drop_inference_graph, encode_sentences, inference_copy
from .pooling import Pooler
from .pretrained import (
    DTYPES,
    attention_and_pooler,
    load_backbone,
    load_config,
    load_tokenizer,
    starting_defaults,
)
from .prompt import Prompt, Spliced, append_end_token, template_states
from .similarity import cosine_matrix, vectors_of
from .st_folder import (
    FolderSettings,
    read_folder_settings,
    transformer_folder,
    write_model_folder,
)

#: the files of a saved tokenizer (a plain ``peft`` adapter folder may have none: its base's)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


class SentenceEncoder(nn.Module):
    """Backbone + pooler, with tokenisation and batched inference.

    Args:
        backbone: a ``transformers`` encoder (``BertModel``, ``RobertaModel``, ...).
        tokenizer: its tokenizer.
        pooler: a :class:`Pooler`.
        max_seq_len: truncation length used by :meth:`tokenize` (training).
        prompt: the templates of the ``prompt`` pooler (:class:`~cselab.model.prompt.Prompt`);
            required by it, ignored by the others.

    Attributes:
        fast_path: whether :meth:`from_pretrained` switched the backbone to cselab's fast path
            (see ``fast_path`` there); ``unpad_training``/``unpad_inference``: whether the
            forward then runs on the real tokens only.
        folder_settings: what the model's sentence-transformers folder says about inference
            (:class:`~cselab.model.st_folder.FolderSettings`); kept when the model is saved.

    Example::

        >>> enc = SentenceEncoder.from_pretrained("sentence-transformers/all-MiniLM-L6-v2",
        ...                                       pooler="avg")  # doctest: +SKIP
        >>> enc.encode(["a man is playing a guitar ."]).shape  # doctest: +SKIP
        (1, 384)
    """

    def __init__(
        self,
        backbone: nn.Module,
        tokenizer: Any,
        pooler: Pooler,
        max_seq_len: int = ModelConfig.max_seq_len,
        prompt: Prompt | None = None,
        end_token: bool = True,
    ):
        super().__init__()
        if (pooler.meaning.token == "mask") != (prompt is not None):
            raise ValueError("a prompt goes with pooler 'prompt', and pooler 'prompt' needs one")
        self.prompt = prompt
        # the user's named prompts (docs/prompts.md; not PromptBERT's template, ``prompt``)
        self.prompts: dict[str, str] = {}
        self.default_prompt_name: str | None = None
        # how the prompts' tokens are counted where the pooling leaves them out: the count the
        # model was trained with (cselab.core.prompts.PROMPT_COUNTS)
        self.prompt_count = "row"
        self.backbone = backbone
        self.tokenizer = tokenizer
        self.pooler = pooler
        self.max_seq_len = max_seq_len
        self.source: str | None = None
        self.folder_settings = FolderSettings()
        # Forward on the real tokens only (see cselab.model.unpad); from_pretrained turns it on,
        # with fast_path, for the backbones that support it, in training and, on the CPU, for
        # inference.
        self.fast_path = False
        self.unpad_training = False
        self.unpad_inference = False
        self.pack_rows = "no"  # a decoder's packed training rows: packing.mode, from_pretrained
        self.packed_rows = False  # whether a forward has packed them
        # None: encode() runs eagerly; else the torch.compile options of the graph it runs
        # (cselab.model.inference.inference_graph)
        self.inference_compile: dict[str, Any] | None = None
        # the causal LM head, loaded only for objectives that predict tokens (MNTP)
        self.lm_head: nn.Module | None = None
        # the model the LoRA adapters sit on (what the adapter folder names as its base)
        self.lora_base: str | None = None
        # model.bidirectional: the decoder's causal mask removed (kept in the saved folder)
        self.bidirectional = False
        # the token the ``last`` pooler reads, which the tokenizer is made to append
        # (end_token=False: the last token as tokenised, as sentence-transformers reads a folder)
        self.end_id: int | None = None
        if pooler.meaning.token == "lasttoken" and end_token:
            config = getattr(backbone, "config", None)
            self.end_id = backbones.end_token_id(tokenizer, config)
            if self.end_id is None:
                raise ConfigError(
                    "model.pooler: 'last' reads the token that ends a sentence, and the "
                    "tokenizer has neither an EOS nor a SEP token"
                )
            self.tokenizer = append_end_token(tokenizer, self.end_id)
        self._takes_token_types = backbones.forward_takes(backbone, "token_type_ids")

    # ---------------------------------------------------------------------------------- building
    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        pooler: str | None = ModelConfig.pooler,
        mlp_only_train: bool = ModelConfig.mlp_only_train,
        max_seq_len: int = ModelConfig.max_seq_len,
        dropout: float | None = ModelConfig.dropout,
        attn_implementation: str | None = ModelConfig.attn_implementation,
        trust_remote_code: bool = ModelConfig.trust_remote_code,
        revision: str | None = ModelConfig.revision,
        fast_path: bool = ModelConfig.fast_path,
        pack_rows: bool | None = ModelConfig.pack_rows,
        prompt: PromptConfig | Mapping[str, Any] | None = None,
        bidirectional: bool | None = ModelConfig.bidirectional,
        dtype: str = ModelConfig.dtype,
        lora: LoRAConfig | Mapping[str, Any] | None = None,
        lm_head: bool = False,
        end_token: bool = True,
        pool_prompt: bool = ModelConfig.pool_prompt,
        prompts: Mapping[str, str] | None = None,
        default_prompt_name: str | None = None,
        prompt_count: str = "row",
    ) -> SentenceEncoder:
        """Load a backbone by Hub name or folder and attach a fresh pooler.

        The defaults are :class:`~cselab.model.config.ModelConfig`'s (SimCSE's unsupervised
        recipe).

        ``dropout`` sets every dropout probability of the architecture (its row of
        :data:`cselab.model.backbones.BACKBONES`; GS-InfoNCE's scripts use 0.2 for BERT, LLM2Vec
        0.3 for decoders) and logs the keys it set.

        ``bidirectional``: remove a decoder's causal mask
        (:func:`cselab.model.backbones.make_bidirectional`); an architecture that cannot is
        refused with :class:`~cselab.core.errors.ConfigError`. ``None`` (and ``pooler=None``):
        what a folder saved by cselab records in ``cselab.json``, else causal (and the
        architecture's default pooler); a value that differs from the record is logged
        (:func:`cselab.model.pretrained.starting_defaults`). ``dtype``: ``float32`` or
        ``bfloat16`` weights (the pooler's head stays float32).

        ``fast_path`` (default on): cselab's CPU fast path for this backbone: its plain
        ``nn.Dropout`` modules become :class:`cselab.model.dropout.Dropout` (the same
        distribution, a cheaper mask) and, for the architectures of
        :data:`cselab.model.unpad.FAST_PATH_MODEL_TYPES` with ``sdpa`` attention, its attention
        is switched to cselab's own registered name (``sdpa`` for every padded call) so the
        forward can run on the real tokens only. Only this backbone changes: other models, of
        any architecture, behave as before. ``False``: the backbone exactly as ``transformers``
        loads it.

        ``prompt``: the templates of ``pooler="prompt"`` (a
        :class:`~cselab.model.config.PromptConfig` or its mapping; default: its defaults).

        ``lora``: LoRA adapters on the backbone (a :class:`~cselab.model.config.LoRAConfig` or
        its mapping, checked as the config file's section is; off while ``r`` is 0; a rank
        above the model's width and a target matching no module are refused in one line): its
        own weights are frozen and only the adapters and
        the pooler's head train (:mod:`cselab.model.lora`). ``name_or_path`` may also be a
        folder of adapters saved by cselab: they are put back on their base model (frozen).

        ``lm_head``: load the model with its causal language-modelling head
        (``AutoModelForCausalLM``) and keep the head as :attr:`lm_head`, for objectives that
        predict tokens (MNTP, :meth:`token_logits`); the backbone is the same base model.

        ``end_token`` (pooler ``last``): make the tokenizer end each sentence with its end token
        (:func:`cselab.model.prompt.append_end_token`), the token ``last`` reads; ``False``: the
        last token as tokenised (how sentence-transformers reads a third-party folder).

        ``pool_prompt``, ``prompts``, ``default_prompt_name``: the user's prompts and whether
        the pooler reads their tokens (:class:`~cselab.model.config.ModelConfig`; checked by
        its ``validate_prompts``); ``prompt_count``: how their tokens are counted where it does
        not (:data:`~cselab.core.prompts.PROMPT_COUNTS`; ``row`` for a model trained now).

        A sentence-transformers folder's ``max_seq_length``, ``do_lower_case`` and ``Normalize``
        are read into :attr:`folder_settings`. Pickled weights (``pytorch_model.bin``) are
        loaded as tensors only; one that holds code or objects is refused with
        :class:`~cselab.core.errors.ModelFormatError` and nothing in it runs.
        """
        name_or_path = os.fspath(name_or_path)  # a Path: its text, as the folder records it
        unpad.check_attention(attn_implementation)  # one line, before any loading
        if bidirectional is not None and not isinstance(bidirectional, bool):
            # a string such as "no" is truthy: it would remove the causal mask
            raise ConfigSettingError(
                "bidirectional", bidirectional, "{setting}: expected True, False or None "
                "(what the folder records, else causal)", key="model.bidirectional",
            )  # fmt: skip
        root = resolve_model(name_or_path, revision)
        refuse_remote_code(Path(root), trust_remote_code)  # adapters: their base, below
        lora = adapters.settings_of(lora)
        pooler, bidirectional = starting_defaults(Path(root), pooler, bidirectional)
        if adapters.is_adapter_folder(Path(root)):  # saved adapters: the base, then them
            return cls._from_adapter_folder(
                Path(root), name_or_path, lora, pooler=pooler, mlp_only_train=mlp_only_train,
                max_seq_len=max_seq_len, dropout=dropout, attn_implementation=attn_implementation,
                trust_remote_code=trust_remote_code, fast_path=fast_path, pack_rows=pack_rows,
                prompt=prompt, bidirectional=bidirectional, dtype=dtype, lm_head=lm_head,
                end_token=end_token, pool_prompt=pool_prompt, prompts=prompts,
                default_prompt_name=default_prompt_name, prompt_count=prompt_count,
            )  # fmt: skip
        # the backbone of an older sentence-transformers folder sits in 0_Transformer/
        path = str(transformer_folder(Path(root)))
        config = load_config(
            path, name_or_path, trust_remote_code=trust_remote_code, lm_head=lm_head,
            dropout=dropout, dtype=dtype, lora=lora,
        )  # fmt: skip
        backbone, head_module = load_backbone(
            path, name_or_path, config, trust_remote_code=trust_remote_code,
            attn_implementation=attn_implementation, dtype=dtype, lm_head=lm_head,
        )  # fmt: skip
        tokenizer = load_tokenizer(path, trust_remote_code)
        pooler = attention_and_pooler(backbone, config, pooler, bidirectional)
        settings = ModelConfig(
            pooler=pooler, pool_prompt=pool_prompt, prompts=dict(prompts or {}),
            default_prompt_name=default_prompt_name,
        ).validate_prompts()  # fmt: skip
        head = Pooler(pooler, backbone.config.hidden_size, mlp_only_train, pool_prompt)
        # A float64 checkpoint's head computes in float64; under bf16 weights the head trains in
        # float32 (AdamW's steps would round away on bf16), MLPHead casting its input up.
        if backbone.dtype in (torch.float64, torch.float32):
            head.to(backbone.dtype)
        templates = None
        if head.meaning.token == "mask":
            if isinstance(prompt, Mapping):
                prompt = from_dict(PromptConfig, dict(prompt), prefix="model.prompt")
            templates = Prompt(prompt or PromptConfig(), tokenizer)
        encoder = cls(backbone, tokenizer, head, max_seq_len, templates, end_token=end_token)
        encoder.prompts, encoder.default_prompt_name = settings.prompts, default_prompt_name
        encoder.prompt_count = check_prompt_count(prompt_count)
        encoder.bidirectional = bool(bidirectional) and backbones.is_decoder(config)
        encoder.source = name_or_path
        encoder.folder_settings = read_folder_settings(Path(root))
        if fast_path:
            encoder.fast_path = True
            encoder.unpad_training = encoder.unpad_inference = unpad.enable(backbone)
            use_fast_dropout(backbone)
        encoder.pack_rows = packing.mode(backbone, pack_rows, fast_path, name_or_path)
        if head_module is not None:
            encoder.lm_head = head_module.requires_grad_(not (lora is not None and lora.enabled))
        if lora is not None and lora.enabled:  # last: the fast path sees the plain backbone
            local = Path(name_or_path)  # a folder: by its absolute path, found from anywhere
            base = str(local.resolve()) if local.is_dir() else name_or_path
            encoder.backbone = adapters.add_adapters(backbone, lora, base)
            encoder.lora_base = base
        return encoder

    @classmethod
    def _from_adapter_folder(
        cls, folder: Path, name_or_path: str, lora: LoRAConfig | None, **settings: Any
    ) -> SentenceEncoder:
        """A folder of LoRA adapters (cselab's, or a plain ``peft`` one): its base model loaded
        with ``settings`` (every one but the adapters and the revision applies to the base),
        then the adapters, frozen, and the folder's own tokenizer and inference settings."""
        if lora is not None and lora.enabled:
            raise ModelFormatError(adapters.merge_first(name_or_path))
        base = adapters.adapter_base(folder, loading=True)
        encoder = cls.from_pretrained(base, **settings)
        encoder.backbone = adapters.load_adapters(encoder.backbone, folder)
        encoder.lora_base = base
        encoder.source = name_or_path
        own = transformer_folder(folder)
        if any((own / name).is_file() for name in TOKENIZER_FILES):  # else the base's tokenizer
            encoder.tokenizer = load_tokenizer(str(own), settings["trust_remote_code"])
            if encoder.end_id is not None:
                encoder.tokenizer = append_end_token(encoder.tokenizer, encoder.end_id)
        encoder.folder_settings = read_folder_settings(folder)
        return encoder

    @classmethod
    def from_config(cls, model_cfg: ModelConfig, lm_head: bool = False) -> SentenceEncoder:
        """Build from the ``model`` section of a run config (``lm_head``: see
        :meth:`from_pretrained`)."""
        return cls.from_pretrained(**dataclasses.asdict(model_cfg), lm_head=lm_head)

    @property
    def has_adapters(self) -> bool:
        """Whether the backbone carries LoRA adapters (:mod:`cselab.model.lora`)."""
        return adapters.has_adapters(self.backbone)

    def merged(self) -> SentenceEncoder:
        """This encoder with its LoRA adapters folded into the backbone's weights (a plain
        ``transformers`` model; the same vectors up to float rounding); itself if it has none."""
        if self.has_adapters:
            self.backbone = adapters.merge_adapters(self.backbone)
            self.lora_base = None
        return self

    def gradient_checkpointing(self, enabled: bool = True) -> SentenceEncoder:
        """Recompute each backbone layer in the backward instead of keeping its activations
        (``train.gradient_checkpointing``); returns ``self``.

        Non-reentrant checkpoints (``use_reentrant=False``): the recomputation restores the
        random state of the forward, so dropout draws the same masks and the gradients are
        those of the plain forward. BERT's unpadded CPU forward (which calls the layers' parts
        directly) is then off; a decoder's packed rows run the model's own layers and stay.
        """
        backbones.checkpoint_layers(self.backbone, enabled)
        self.unpad_training = not enabled and self.fast_path and unpad.enable(self.backbone)
        return self

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dim(self) -> int:
        return int(self.backbone.config.hidden_size)

    @property
    def accepted_max_len(self) -> int:
        """The longest input the model accepts: the tokenizer's limit capped by the position
        embeddings (:func:`~cselab.model.hf_models.max_sequence_length`)."""
        longest = max_sequence_length(self.tokenizer, self.backbone)
        # a prompt's template adds its tokens to the sentence's (the position embeddings bound both)
        return longest - self.prompt.extra if self.prompt is not None else longest

    @property
    def inference_max_len(self) -> int:
        """Where :meth:`encode` truncates by default: the folder's ``max_seq_length`` (what its
        authors chose, as sentence-transformers truncates) capped by :attr:`accepted_max_len`;
        never the training length :attr:`max_seq_len`."""
        chosen = self.folder_settings.max_seq_length
        return min(chosen, self.accepted_max_len) if chosen else self.accepted_max_len

    # ----------------------------------------------------------------------------------- forward
    def tokenize(
        self, sentences: Sequence[str], max_seq_len: int | None = None
    ) -> dict[str, Tensor]:
        """Tokenise with truncation to ``max_seq_len`` and padding to the longest sentence
        (lowercased first if the folder says ``do_lower_case``, as sentence-transformers does)."""
        texts = list(sentences)
        if self.folder_settings.do_lower_case:
            texts = [t.lower() for t in texts]
        return dict(
            self.tokenizer(
                texts,
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
        template: Tensor | None = None,
        pool_mask: Tensor | None = None,
    ) -> Tensor:
        """Token ids ``(N, L)`` → sentence vectors ``(N, D)``; ``pool_mask``: the tokens pooled
        when a prompt's are left out (:func:`~cselab.core.prompts.exclude_prompt`).

        With the ``prompt`` pooler each row (one sentence with its special tokens) is first
        spliced into template ``template[i]`` (``(N,)``: 0 is ``model.prompt.template``, 1
        ``template2``; default all 0), and template denoising applies as
        :meth:`~cselab.model.prompt.Prompt.denoises` says for the current mode.
        """
        # the prompt pooler's [MASK] columns and offsets, or the tokens pooled without a prompt's
        extra: dict[str, Tensor] = {} if pool_mask is None else {"pool_mask": pool_mask}
        if token_type_ids is not None and not self._takes_token_types:
            token_type_ids = None  # a decoder has no segments
        if self.prompt is not None:
            spliced = self.prompt.splice(input_ids, attention_mask, template)
            if self.prompt.denoises(self.training):  # first, as the authors' cl_forward does
                extra["offset"] = self._template_states(spliced)
            extra["token_index"] = spliced.mask_index
            input_ids, attention_mask = spliced.input_ids, spliced.attention_mask
            token_type_ids = None  # one segment: the template's and the sentence's tokens
        if (
            # the CPU only: on a GPU the token index is a host sync per forward, and varlen
            # attention there was measured slower than the padded forward
            input_ids.device.type == "cpu"
            and (self.unpad_training if self.training else self.unpad_inference)
            and not self.pooler.needs_hidden_states
            # one segment; read last: on a GPU this is a host sync, never reached
            and (token_type_ids is None or not bool(token_type_ids.any()))
        ):
            last = unpad.unpadded_last_hidden(
                self.backbone,
                input_ids,
                attention_mask,
                first_token_only=self.pooler.reads_first_token_only,
            )
            return self.pooler(last, attention_mask, **extra)
        if (
            self.training
            and packing.packs_on(self.pack_rows, input_ids.device)
            and not torch.compiler.is_compiling()  # a compiled forward keeps its fixed graph
            and self.prompt is None
            and not self.pooler.needs_hidden_states
            and packing.fits(self.backbone, input_ids.shape[1])
        ):
            self.packed_rows = True  # what the run reports (results.json's packed_rows)
            pad_id = self.tokenizer.pad_token_id or 0
            last = packing.packed_last_hidden(self.backbone, input_ids, attention_mask, pad_id)
            return self.pooler(last, attention_mask, **extra)
        # a prepared 4D mask where the backbone takes one: no host sync in the forward
        mask = unpad.padded_attention_mask(self.backbone, attention_mask)
        kwargs = {
            "input_ids": input_ids,
            "attention_mask": mask,
            **backbones.no_cache(self.backbone),
        }
        if token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids
        out = self.backbone(
            **kwargs, output_hidden_states=self.pooler.needs_hidden_states, return_dict=True
        )
        return self.pooler(out.last_hidden_state, attention_mask, out.hidden_states, **extra)

    def token_logits(self, input_ids: Tensor, attention_mask: Tensor, positions: Tensor) -> Tensor:
        """The language-modelling head's logits ``(M, V)`` at ``positions`` (``(M, 2)``: row,
        token) of the backbone's last hidden states; needs :attr:`lm_head` (``lm_head=True``)."""
        if self.lm_head is None:
            raise ValueError("token_logits needs the LM head: load with lm_head=True")
        mask = unpad.padded_attention_mask(self.backbone, attention_mask)
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=mask, return_dict=True,
            **backbones.no_cache(self.backbone),
        ).last_hidden_state  # fmt: skip
        return self.lm_head(hidden[positions[:, 0], positions[:, 1]])

    def _template_states(self, spliced: Spliced) -> Tensor:
        """``(N, D)``: each row's template run alone at the row's sentence length
        (:func:`cselab.model.prompt.template_states`)."""
        assert self.prompt is not None
        return template_states(self.backbone, self.prompt, spliced, self._takes_token_types)

    @torch.inference_mode()
    def encode(
        self,
        sentences: Sequence[str],
        batch_size: int = BATCH_SIZE,
        normalize: bool = False,
        show_progress: bool = False,
        max_seq_len: int | None = None,
        precision: str = "fp32",
        dim: int | None = None,
        prompt_name: str | None = None,
        prompt: str | None = None,
    ) -> np.ndarray:
        """Encode sentences for inference; returns float32 ``(N, D)`` in input order.

        ``prompt_name``: one of the model's saved :attr:`prompts` (``"query"``), put before
        every sentence; ``prompt``: that text itself (it wins over ``prompt_name``); neither:
        the :attr:`default_prompt_name`'s, if any (sentence-transformers' rules). With
        ``model.pool_prompt: false`` its tokens are left out of the pooling.

        Sentences are sorted by length so each batch pads little; the result is put back in the
        input order. The module's train/eval state is restored afterwards.

        ``normalize``: L2-normalise each vector. A folder whose sentence-transformers modules
        end in ``Normalize`` (:attr:`folder_settings`, e.g. all-MiniLM-L6-v2 and the folders
        cselab trains from it) always gives unit vectors, the vectors
        ``SentenceTransformer(folder).encode`` gives.

        ``max_seq_len`` defaults to :attr:`inference_max_len` (the folder's ``max_seq_length``,
        else the most the model accepts: inference should not truncate at the training length);
        pass a value to truncate elsewhere (capped by what the model accepts).

        ``precision="bf16"`` encodes with a bf16 copy of the model (:meth:`inference_copy`; this
        encoder keeps its float32 weights): on CPUs with AMX or AVX512-BF16 and on recent GPUs it
        is faster (2.4x for MiniLM on a Xeon with AMX), and the vectors move by bf16 rounding
        (cosine to the fp32 vector above 0.999 in ``docs/results/encode_benchmark.md``).
        Evaluation never uses it: its numbers are fp32.

        ``dim``: the first ``dim`` coordinates of each vector, re-normalised to unit length
        (:func:`~cselab.model.similarity.truncate_rows`): a model trained with
        ``objective.matryoshka.dims`` (Kusupati et al. 2022) is meant to be used so, at one of
        those dimensions. With ``dim`` the vectors are always unit length (``normalize`` is
        implied), as a prefix is only defined up to its scale; the prefix is cut from the
        vector before any normalisation, so ``dim=`` the full width equals ``normalize=True``.
        ``None``: the full width.
        """
        text = resolve_prompt(self.prompts, self.default_prompt_name, prompt_name, prompt)
        return encode_sentences(
            self, sentences, batch_size, normalize, show_progress, max_seq_len, precision, dim,
            text,
        )  # fmt: skip

    def compile_inference(self, enabled: bool = True, **options: Any) -> SentenceEncoder:
        """Encode through a compiled graph from now on (``enabled=False``: eager again); returns
        ``self``. ``options`` go to ``torch.compile`` (e.g. ``backend="aot_eager"``).

        :meth:`encode` (and with it evaluation, ``cselab index build`` and mining) then runs the
        forward compiled by ``torch.compile`` (:func:`.inference.inference_graph`: one graph for
        every batch shape, the packed attention traced as one operator). The vectors equal the
        eager ones to float rounding. The first call pays the compile, so it pays off on large
        corpora: ``docs/results/encode_benchmark.md`` has the figures.
        """
        self.inference_compile = dict(options) if enabled else None
        drop_inference_graph(self)  # compiled with the old options, if any
        return self

    def inference_copy(self, dtype: torch.dtype) -> SentenceEncoder:
        """A copy with its weights in ``dtype``, in eval mode (:func:`.inference.inference_copy`)."""
        return inference_copy(self, dtype)

    def similarity(
        self,
        a: Sequence[str] | np.ndarray,
        b: Sequence[str] | np.ndarray,
        batch_size: int = BATCH_SIZE,
    ) -> np.ndarray:
        """Cosine similarity matrix ``(len(a), len(b))``, float32.

        Each side is a list of sentences (encoded here, in batches of ``batch_size``) or an
        ``(N, D)`` array of vectors already encoded. A zero vector has cosine 0 with everything.
        """

        return cosine_matrix(vectors_of(self, a, batch_size), vectors_of(self, b, batch_size))

    # ------------------------------------------------------------------------------------ saving
    def save(self, path: str | Path) -> None:
        """Write an HF model folder that is also a sentence-transformers folder
        (:func:`~cselab.model.st_folder.write_model_folder`).

        Files: ``config.json`` + ``model.safetensors`` + tokenizer (the backbone), ``cselab.json``
        (pooler settings), ``pooler_head.safetensors`` (the ``cls`` head, if any), and the
        sentence-transformers modules reproducing the *inference* pooler, then ``Normalize`` if
        the base model's folder had it, and ``sentence_bert_config.json`` with
        :attr:`inference_max_len` and the folder's ``do_lower_case``.
        """
        meta = {
            "pooler": self.pooler.kind,
            "mlp_only_train": self.pooler.mlp_only_train,
            "max_seq_len": self.max_seq_len,
            "source": self.source,
        }
        if self.bidirectional:
            meta["bidirectional"] = True
        weights = getattr(self.backbone, "dtype", torch.float32)
        if weights != torch.float32 and weights in DTYPES.values():
            meta["dtype"] = next(k for k, v in DTYPES.items() if v == weights)
        if self.prompt is not None:
            meta["prompt"] = dataclasses.asdict(self.prompt.config)
        if not self.pooler.include_prompt:
            meta["pool_prompt"] = False
            meta["prompt_count"] = self.prompt_count
        if self.has_adapters:
            meta["lora"] = {**adapters.adapter_settings(self.backbone), "base": self.lora_base}
        settings = dataclasses.replace(self.folder_settings, max_seq_length=self.inference_max_len)
        # the folder's config.json stays the architecture's own (causal as transformers loads
        # it); cselab.json says bidirectional and cselab.load applies it
        causal = self.backbone.config.__dict__.pop("is_causal", None)
        try:
            write_model_folder(
                Path(path),
                backbone=self.backbone,
                tokenizer=self.tokenizer,
                pooler=self.pooler,
                meta=meta,
                settings=settings,
                prompts=(self.prompts, self.default_prompt_name),
            )
        finally:
            if causal is not None:
                self.backbone.config.is_causal = causal
