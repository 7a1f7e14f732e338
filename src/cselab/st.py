"""cselab's objectives as sentence-transformers losses, for ``SentenceTransformerTrainer``.

Every loss here is :class:`CSELoss`: it embeds the batch's columns with the
``SentenceTransformer`` and hands the embeddings to the objective that
:func:`cselab.objectives.build_objective` builds from an
:class:`~cselab.objectives.ObjectiveConfig`, the same modules ``cselab train`` uses (no second
implementation). The named classes only fill in the config:

=======================  ==========================================================  ===========
loss                     objective                                                   paper
=======================  ==========================================================  ===========
:class:`CSELoss`         any ``ObjectiveConfig`` (default: SimCSE's InfoNCE)          Gao et al. 2021
:class:`FocalInfoNCELoss` Focal scores ``s²`` / ``s(s+m)``                           Hou & Li 2023, Eq. 2
:class:`GSInfoNCELoss`   Gaussian noise vectors as extra negatives                   Wu et al. 2022, Eq. 5
:class:`MixCSELoss`      mixed hard negatives, stop-gradient                         Zhang et al. 2022
:class:`DCLLoss`         InfoNCE + λ · dimension-wise contrastive term               Xu et al. 2023, Eq. 5
:class:`ImSimCSELoss`    off-dropout negatives + λ · DCL                             Xu et al. 2023, Eq. 6
=======================  ==========================================================  ===========

Data: two or three text columns. ``(sentence, sentence)`` — the same text twice — is the
unsupervised recipe: the two columns are embedded in **one** forward pass (sentence-transformers'
``embed_columns`` merges them), so each copy gets its own dropout mask, exactly as cselab's
trainer stacks the batch twice (:func:`cselab.training.views.compute_views`). ``(anchor, positive)``
pairs work the same way with different texts. ``(anchor, positive, negative)`` is supervised
SimCSE's data (Gao et al. 2021, Sec. 4): the third column is each pair's hard negative, passed to
the objective as cselab's trainer passes the negative column of a pairs file (the ``neg`` view,
:class:`~cselab.objectives.hard_negatives.HardNegatives` with ``hard_negative_weight``), so every
objective composes with it as in ``cselab train``.

The model is used as it is given: the losses never change its modules (cselab's own encoder has
a CPU fast path, ``model.fast_path``; a ``SentenceTransformer`` runs its own forward, with
``nn.Dropout``'s masks).

Off-dropout (:class:`ImSimCSELoss`, ``off_dropout.enabled``) needs the batch encoded once more with
the backbone's dropout switched off (:func:`cselab.model.dropout.dropout_disabled` on the first module,
the transformer): one more forward of ``B`` rows (half the dropout pass's ``2B``) and its backward,
about +50% compute and activation memory per step. It is defined for ``(sentence, sentence)``
data only (the negatives compare off-dropout vectors of the batch's sentences).

Matryoshka dimensions (Kusupati et al. 2022) are a key of the config like any other:
``CSELoss(model, ObjectiveConfig(matryoshka=MatryoshkaConfig(dims=[384, 128, 64])))`` is cselab's
objective at each prefix, summed (the same loss as sentence-transformers' ``MatryoshkaLoss``
around ``MultipleNegativesRankingLoss``; tested); the dimensions are checked against the model's
width when the loss is built.

GradCache-style caching (sentence-transformers' ``CachedMultipleNegativesRankingLoss``) is not
offered: pass ``mini_batch_size`` and the loss says so. cselab's own trainer has it
(``train.cache_chunk_size``).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn

from .config import TrainConfig
from .core.datakind import DataKind
from .core.errors import ConfigError
from .data import shard_bounds
from .model.dropout import dropout_disabled
from .objectives import (
    VIEW_ANCHOR,
    VIEW_HARD_NEGATIVE,
    VIEW_MOMENTUM,
    VIEW_OFF_DROPOUT,
    VIEW_POSITIVE,
    VIEW_TOKEN_LOGITS,
    ObjectiveConfig,
    ObjectiveContext,
    build_objective,
    objective_papers,
    total_loss,
)
from .training.distributed import gather_with_grad, is_distributed
from .training.task import Task

_TAU = ObjectiveConfig.temperature  # one home for the defaults: the config dataclasses
_SEED = TrainConfig.seed


def _embed(model: nn.Module, features: list[dict[str, Tensor]]) -> list[Tensor]:
    """One merged forward over all columns where sentence-transformers can merge them."""
    try:
        from sentence_transformers.base.losses.merged_forward import embed_columns
    except ImportError:  # sentence-transformers < 6: one forward per column
        return [model(f)["sentence_embedding"] for f in features]
    return embed_columns(model, features, separate_first=False)


def _width(model: nn.Module) -> int | None:
    """The model's output width, where it says (``get_sentence_embedding_dimension`` before
    sentence-transformers 6); ``None``: not known."""
    for name in ("get_embedding_dimension", "get_sentence_embedding_dimension"):
        if hasattr(model, name):
            return getattr(model, name)()
    return None


class CSELoss(nn.Module):
    """Any cselab objective as a sentence-transformers loss.

    Args:
        model: the ``SentenceTransformer`` being trained.
        objective_config: the objective (default: unsupervised SimCSE, τ = 0.05); validated.
        seed: seeds the generator of generated negatives (Gaussian vectors, MixCSE partners,
            noise), re-seeded from ``(seed, call number)`` on every call as cselab's trainer does
            per step.
        mini_batch_size: not supported (GradCache-style caching); anything but ``None`` is an
            error saying what to use instead.

    Inputs (from ``SentenceTransformerTrainer``): two columns of texts, ``(sentence, sentence)``
    or ``(anchor, positive)``, or three, ``(anchor, positive, negative)`` with a hard negative
    per pair; labels are ignored.

    Example::

        >>> from sentence_transformers import SentenceTransformer  # doctest: +SKIP
        >>> from cselab.objectives import ObjectiveConfig, FocalConfig
        >>> loss = CSELoss(model, ObjectiveConfig(focal=FocalConfig(enabled=True)))  # doctest: +SKIP
    """

    def __init__(
        self,
        model: nn.Module,
        objective_config: ObjectiveConfig | None = None,
        *,
        seed: int = _SEED,
        mini_batch_size: int | None = None,
    ) -> None:
        super().__init__()
        if mini_batch_size is not None:
            raise NotImplementedError(
                "cselab.st losses do not cache embeddings GradCache-style (sentence-transformers' "
                "CachedMultipleNegativesRankingLoss does so for its own InfoNCE only); train with "
                "a batch that fits, or use `cselab train --train.cache_chunk_size=N`, which "
                "caches every cselab objective with replayed dropout masks"
            )
        self.model = model  # used as given: nothing here changes its modules
        self.config = objective_config or ObjectiveConfig()
        # Validates the config (objective.matryoshka.dims against the model's width too).
        self.width = _width(model)
        self.objective = build_objective(self.config, width=self.width)
        for key, on in (
            ("word_repetition", self.objective.added_tokens()[0] > 0),
            ("momentum_queue", VIEW_MOMENTUM in self.objective.required_views),
            ("mntp", VIEW_TOKEN_LOGITS in self.objective.required_views),
        ):
            if on:  # ESimCSE's parts and MNTP need cselab's own step (token ids, LM head, ...)
                raise ConfigError(
                    f"objective.{key} is not available as a sentence-transformers loss (it needs "
                    "cselab's training step: the batch's token ids, the momentum encoder updated "
                    "after each optimiser step, the queue in the checkpoint, the LM head); train "
                    "with `cselab train` instead"
                )
        # cselab's step: the objective on the views, its generator re-seeded per call.
        self.task = Task(model, self.objective, seed=seed)
        # Three columns: the objective of cselab's pairs task with hard negatives, built at the
        # first such batch (a config that cannot take hard negatives is refused there).
        self.hard_negative_task: Task | None = None
        self.seed = seed
        self.calls = 0
        self.last_terms: dict[str, Tensor] = {}  # the named terms of the last call (detached)
        self._generator: torch.Generator | None = None

    @property
    def needs_off_view(self) -> bool:
        return VIEW_OFF_DROPOUT in self.objective.required_views

    def _context(self, batch: int, device: torch.device) -> ObjectiveContext:
        if self._generator is None or self._generator.device != device:
            self._generator = torch.Generator(device=device)
        if not is_distributed():
            return ObjectiveContext(generator=self._generator)
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        return ObjectiveContext(
            gather=gather_with_grad,
            rank=rank,
            world_size=world,
            offset=shard_bounds(batch * world, rank, world)[0],
            generator=self._generator,
        )

    def _check_columns(self, columns: int) -> None:
        if columns not in (2, 3):
            raise ValueError(
                f"{type(self).__name__} takes two or three text columns, (sentence, sentence), "
                f"(anchor, positive) or (anchor, positive, negative); got {columns}"
            )

    def task_for(self, columns: int) -> Task:
        """The task of a batch of ``columns`` text columns (three: with hard negatives)."""
        self._check_columns(columns)
        if columns == 2:
            w = self.config.hard_negative_weight
            if w != 0:
                raise ConfigError(
                    f"objective.hard_negative_weight={w} weights given hard negatives, but the "
                    "batch has two columns; pass (anchor, positive, negative) columns"
                )
            return self.task
        if self.hard_negative_task is None:
            kind = DataKind(pairs=True, negatives=1)
            objective = build_objective(self.config, kind, self.width)
            self.hard_negative_task = Task(self.model, objective, seed=self.seed, kind=kind)
        return self.hard_negative_task

    def views(self, sentence_features: Iterable[dict[str, Tensor]]) -> dict[str, Tensor]:
        """The views cselab's objectives read: ``z1``, ``z2``, ``neg`` ``(B, 1, D)`` with a third
        column, and ``off`` when the objective needs it."""
        features = list(sentence_features)
        self._check_columns(len(features))
        # One merged forward over all columns, as cselab's pairs task stacks anchors, positives
        # and negatives into one forward.
        embedded = _embed(self.model, features)
        views = {VIEW_ANCHOR: embedded[0], VIEW_POSITIVE: embedded[1]}
        if len(features) == 3:
            views[VIEW_HARD_NEGATIVE] = embedded[2].unsqueeze(1)  # one hard negative per pair
            return views
        if self.needs_off_view:
            a, b = features[0]["input_ids"], features[1]["input_ids"]
            if a.shape != b.shape or not torch.equal(a, b):
                raise ValueError(
                    f"{type(self).__name__}: off-dropout negatives are defined for "
                    "(sentence, sentence) data (the same text in both columns); this batch's "
                    "columns differ"
                )
            # The backbone (first module) without dropout; pooling and heads stay as they are,
            # as cselab.training.views does with the encoder's backbone.
            with dropout_disabled(self.model[0]):
                views[VIEW_OFF_DROPOUT] = self.model(dict(features[0]))["sentence_embedding"]
        return views

    def forward(
        self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor | None = None
    ) -> Tensor:
        features = list(sentence_features)
        task = self.task_for(len(features))  # checks the columns before any forward
        views = self.views(features)
        z1 = views[VIEW_ANCHOR]
        task.ctx = self._context(z1.shape[0], z1.device)
        terms = task.losses(views, self.calls)
        self.calls += 1
        self.last_terms = {k: v.detach() for k, v in terms.items()}
        return total_loss(terms)

    # sentence-transformers reads these for the model card it writes.
    def get_config_dict(self) -> dict[str, Any]:
        return {"objective": dataclasses.asdict(self.config), "seed": self.seed}

    @property
    def citation(self) -> str:
        return "\n\n".join(p.bibtex for p in objective_papers(self.objective))


def paper_loss(name: str, summary: str, *keys: str) -> type[CSELoss]:
    """A :class:`CSELoss` that switches on the ``objective:`` sub-sections ``keys`` and takes
    their fields as keyword arguments, generated from the sections so that a parameter's name,
    default and words live once (in ``cselab/objectives/sections/``).

    The first section's fields keep their names (``hardness``, ``mix_ratio``); a field whose
    name the ``objective:`` section itself has (DCL's ``temperature`` beside InfoNCE's τ) and
    every field of a further section is spelled ``<key>_<field>``, the key path flattened
    (``objective.dcl.temperature`` → ``dcl_temperature``). ``temperature`` is InfoNCE's τ.
    """
    top = {f.name for f in dataclasses.fields(ObjectiveConfig)}
    kinds = {f.name: f.default_factory for f in dataclasses.fields(ObjectiveConfig)}
    #: keyword -> (section key, field name, default)
    params: dict[str, tuple[str, str, Any]] = {}
    for i, key in enumerate(keys):
        for f in dataclasses.fields(kinds[key]()):
            if f.name == "enabled":
                continue
            word = f.name if i == 0 and f.name not in top else f"{key}_{f.name}"
            params[word] = (key, f.name, f.default)

    def __init__(
        self: CSELoss, model: nn.Module, temperature: float = _TAU, *extra: Any, **kwargs: Any
    ) -> None:
        if extra:  # the keywords were once positional too: name them in their order
            raise TypeError(
                f"{name}() takes model and temperature by position and the rest by keyword "
                f"({', '.join(f'{w}=' for w in params)}); got {len(extra)} more by position"
            )
        values: dict[str, dict[str, Any]] = {key: {"enabled": True} for key in keys}
        for word in [w for w in kwargs if w in params]:
            key, field_name, _ = params[word]
            values[key][field_name] = kwargs.pop(word)
        unknown = [w for w in kwargs if w not in ("seed", "mini_batch_size")]
        if unknown:
            raise TypeError(
                f"{name}() got an unexpected keyword argument {unknown[0]!r}; it takes "
                f"{', '.join(['temperature', *params])}, seed, mini_batch_size"
            )
        sections = {key: kinds[key](**v) for key, v in values.items()}
        CSELoss.__init__(
            self, model, ObjectiveConfig(temperature=temperature, **sections), **kwargs
        )

    __init__.__qualname__ = f"{name}.__init__"  # Python's own TypeErrors name the class
    kw = inspect.Parameter.KEYWORD_ONLY
    __init__.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
            inspect.Parameter("model", inspect.Parameter.POSITIONAL_OR_KEYWORD),
            inspect.Parameter("temperature", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=_TAU),
            *(inspect.Parameter(w, kw, default=d) for w, (_, _, d) in params.items()),
            inspect.Parameter("seed", kw, default=_SEED),
            inspect.Parameter("mini_batch_size", kw, default=None),
        ]
    )
    args = ", ".join(
        f"``{w}`` (``objective.{k}.{f}``, default ``{d!r}``)" for w, (k, f, d) in params.items()
    )
    doc = f"{summary}\n\nKeyword arguments: ``temperature`` (τ), {args}; see :func:`paper_loss`."
    cls = type(name, (CSELoss,), {"__init__": __init__, "__doc__": doc, "__module__": __name__})
    cls.sections = keys  # type: ignore[attr-defined]
    return cls


#: the named paper losses: each switches on its sections; their keywords are the sections' fields
FocalInfoNCELoss = paper_loss(
    "FocalInfoNCELoss",
    "Focal-InfoNCE (Hou & Li 2023, Eq. 2): positives score ``s²``, negatives ``s(s+m)``.",
    "focal",
)
GSInfoNCELoss = paper_loss(
    "GSInfoNCELoss",
    "GS-InfoNCE (Wu et al. 2022, Eq. 5): Gaussian vectors as extra negatives with weight λ "
    "(``num`` = ``M`` per step; ``None``: ``batch_multiple`` × the batch size, paper: 3).",
    "gaussian",
)
MixCSELoss = paper_loss(
    "MixCSELoss",
    "MixCSE (Zhang et al. 2022): mixed hard negatives ``normalize(λh'_i + (1-λ)h'_j)``.",
    "mixcse",
)
DCLLoss = paper_loss(
    "DCLLoss",
    "InfoNCE plus ImSimCSE's dimension-wise contrastive term (Xu et al. 2023, Eq. 5).",
    "dcl",
)
ImSimCSELoss = paper_loss(
    "ImSimCSELoss",
    "ImSimCSE (Xu et al. 2023, Eq. 6): off-dropout negatives (Eq. 3) + λ · DCL (Eq. 5). Costs "
    "one more forward and backward of the batch without dropout (see the module docstring); "
    "needs ``(sentence, sentence)`` data.",
    "off_dropout",
    "dcl",
)


class SentenceEncoderModule(nn.Module):
    """A cselab model folder as one sentence-transformers module: tokeniser, backbone and
    cselab's pooler, for the poolers sentence-transformers has no module of (PromptBERT's
    ``prompt``: the ``[MASK]`` state of a template around the sentence, Jiang et al. 2022).

    A saved ``prompt`` folder's ``modules.json`` names this class
    (:data:`cselab.model.st_folder.ENCODER_MODULE`), so
    ``SentenceTransformer(folder, trust_remote_code=True)`` computes the vectors
    ``cselab.load(folder).encode`` does where cselab is installed (a ``Normalize`` module after
    it, as the folder says). sentence-transformers >= 6 asks for ``trust_remote_code=True``
    before it imports a class of another package; without cselab the import fails, naming it.
    """

    #: sentence-transformers >= 6 asks the input module what it reads
    modalities = ("text",)

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    @staticmethod
    def load(input_path: str) -> SentenceEncoderModule:
        """The module of the cselab folder ``input_path`` (sentence-transformers' one-argument
        ``load``, which every version calls with the module's local folder)."""
        from .model.loader import load

        return SentenceEncoderModule(load(input_path))

    def save(self, output_path: str, *args: Any, **kwargs: Any) -> None:
        """Write the cselab folder (sentence-transformers then writes its ``modules.json``)."""
        self.encoder.save(output_path)

    def preprocess(
        self, inputs: Iterable[str], prompt: str | None = None, **kwargs: Any
    ) -> dict[str, Tensor]:
        """Token ids of each sentence (the ``prompt`` pooler splices it into its template), after
        ``prompt``; where the model leaves its prompts out of the pooling, a ``pool_mask``
        without the prompt's tokens, counted as ``encode`` counts them."""
        from .core.prompts import exclude_prompt
        from .model.inference import prompt_tokens

        texts = [(prompt or "") + t for t in inputs]
        features = self.encoder.tokenize(texts, self.encoder.inference_max_len)
        if prompt and not self.encoder.pooler.include_prompt:
            skip = prompt_tokens(self.encoder, prompt)
            features["pool_mask"] = exclude_prompt(features["attention_mask"], skip)
        return features

    def tokenize(self, texts: Iterable[str], **kwargs: Any) -> dict[str, Tensor]:
        """:meth:`preprocess` under the name sentence-transformers < 6 calls."""
        return self.preprocess(texts)

    def forward(self, features: dict[str, Tensor], **kwargs: Any) -> dict[str, Tensor]:
        features["sentence_embedding"] = self.encoder(
            features["input_ids"],
            features["attention_mask"],
            features.get("token_type_ids"),
            pool_mask=features.get("pool_mask"),
        )
        return features

    def get_sentence_embedding_dimension(self) -> int:
        return int(self.encoder.dim)

    get_embedding_dimension = get_sentence_embedding_dimension

    def get_max_seq_length(self) -> int:
        return int(self.encoder.inference_max_len)

    @property
    def max_seq_length(self) -> int:
        return self.get_max_seq_length()


__all__ = [
    "CSELoss",
    "DCLLoss",
    "FocalInfoNCELoss",
    "GSInfoNCELoss",
    "ImSimCSELoss",
    "MixCSELoss",
    "SentenceEncoderModule",
]
