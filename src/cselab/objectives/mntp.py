"""Masked next-token prediction (MNTP): LLM2Vec's step 2 (BehnamGhader et al. 2024, Sec. 2.2).

A decoder made bidirectional has never been trained to use the tokens after a position. MNTP
adapts it: a fraction of the input tokens is masked, and each masked token at position ``i`` is
predicted by the language-modelling head from the **previous** position's state ``h_{i-1}``
(the position a causal LM already predicts the next token from)::

    L = - 1/|M| Σ_{i ∈ M} log softmax(W_lm h_{i-1})[x_i]

``M`` the masked positions of the batch (a masked first token has no previous position and is
not scored). The unsupervised recipe is then three steps, two cselab runs: bidirectional
attention + MNTP (this objective), then SimCSE on the merged result.

What the authors' code does (``McGill-NLP/llm2vec``, ``experiments/run_mntp.py`` and
``train_configs/mntp``), read for facts: the masking is ``transformers``'
``DataCollatorForLanguageModeling`` (``data_collator_type: default``): a token that is not a
special token is chosen with probability ``mlm_probability`` (0.2 for Llama-2, Llama-3 and
Sheared-LLaMA, 0.8 for Mistral); a chosen token is replaced by the mask token 80% of the time, by
a random token 10%, kept 10%; the loss is ``LlamaForCausalLM``'s (labels shifted by one, mean
over the chosen tokens). A tokenizer without a mask token takes ``_`` (``mask_token_type:
blank``). LoRA r 16 on the base model only (the LM head stays frozen), 1,000 steps, batch 32.

The objective makes its token-level view itself, on the host: :meth:`~MaskedNextTokenPrediction.setup`
finds the mask token once, :meth:`~MaskedNextTokenPrediction.prepare` masks the batch once per
step (:mod:`cselab.data.masking`, each row from its own seed). The training layer encodes the
masked copy and hands over the ``token_logits`` view (the LM head's logits at the position
before each chosen token) and the ``token_labels`` view (the chosen tokens' ids).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..core.datakind import SENTENCES, DataKind
from ..data.inputs import MaskedCopy, StepInputs
from ..data.masking import mask_token_id, mask_tokens
from .assembly import Assembly
from .base import VIEW_TOKEN_LABELS, VIEW_TOKEN_LOGITS, LossTerms, Objective, upcast
from .context import ObjectiveContext, PrepareContext
from .papers import Paper
from .sections.mntp import MNTPConfig

LLM2VEC = Paper(
    key="behnamghader2024llm2vec",
    name="LLM2Vec",
    summary="decoder LLMs as text encoders: bidirectional attention, masked next-token "
    "prediction, unsupervised SimCSE",
    bibtex="""@inproceedings{behnamghader2024llm2vec,
  title     = {{LLM2Vec}: Large Language Models Are Secretly Powerful Text Encoders},
  author    = {BehnamGhader, Parishad and Adlakha, Vaibhav and Mosbach, Marius and Bahdanau, Dzmitry and Chapados, Nicolas and Reddy, Siva},
  booktitle = {First Conference on Language Modeling},
  year      = {2024}
}""",
)

#: What a model trained by MNTP alone is for (its model card's intended use): LLM2Vec's step 2
#: adapts the decoder; step 3 (contrastive) makes the encoder.
MODEL_USE = (
    "Not a sentence encoder yet: masked next-token prediction (LLM2Vec's MNTP) adapts a decoder "
    "to attention in both directions; its vectors were not trained for similarity. Train the "
    "merged model (`merged/`, or `cselab merge`) with a contrastive objective, e.g. the preset "
    "`llm2vec-simcse-llama3-8b` with `--model.name_or_path=MERGED_FOLDER`: that model is the "
    "sentence encoder."
)


def masking_seed(step_seed: int, row: int) -> int:
    """Seed of the token-masking draw of global row ``row`` at the step of ``step_seed``,
    independent of ranks, GradCache and resumes, and a stream of its own (not ESimCSE's)."""
    return (step_seed * 999_983 + row * 15_485_863 + 0x3A5) % (2**63 - 1)


def build(section: MNTPConfig, parts: Assembly) -> None:
    """``objective.mntp``: the MNTP loss replaces the InfoNCE the other keys would assemble
    (validated: they are all off)."""
    if section.enabled:
        parts.replacement = MaskedNextTokenPrediction(section.mask_ratio, section.mask_token)


class MaskedNextTokenPrediction(Objective):
    """``{"mntp": L}``: cross-entropy of the masked tokens under the logits of the position
    before each (see the module docstring).

    Args:
        mask_ratio: the probability that a (non-special) token is chosen.
        mask_token: the replacing token (``None``: the tokenizer's, else ``_``).
    """

    papers = (LLM2VEC,)
    tags = ("llm2vec", "mntp")
    required_views = frozenset({VIEW_TOKEN_LOGITS, VIEW_TOKEN_LABELS})

    def __init__(self, mask_ratio: float = 0.2, mask_token: str | None = None) -> None:
        super().__init__()
        self.mask_ratio = float(mask_ratio)
        self.mask_token = mask_token
        self.tokenizer: Any = None  # set by setup
        self.mask_id: int | None = None

    def setup(self, tokenizer: Any) -> None:
        """The tokenizer's mask token (or ``mask_token``), checked once, before any step."""
        self.tokenizer = tokenizer
        self.mask_id = mask_token_id(tokenizer, self.mask_token)

    def prepare(self, inputs: StepInputs, ctx: PrepareContext) -> StepInputs:
        """The masked copy of the anchors, drawn per global row from the step's seed (a batch
        that has one already passes unchanged)."""
        if inputs.masked is not None:
            return inputs
        if self.mask_id is None:
            raise RuntimeError("MaskedNextTokenPrediction.setup(tokenizer) was not called")
        gens = [
            torch.Generator().manual_seed(masking_seed(ctx.step_seed, ctx.offset + i))
            for i in range(len(inputs))
        ]
        tokenizer, mask = self.tokenizer, inputs.anchors["attention_mask"]
        ids, labels = mask_tokens(
            inputs.anchors["input_ids"], mask, self.mask_ratio, self.mask_id, len(tokenizer),
            tokenizer.all_special_ids, gens,
        )  # fmt: skip
        return inputs.replace(masked=MaskedCopy.of(ids, labels, mask.cpu()))

    def forward(
        self, views: Mapping[str, Tensor], ctx: ObjectiveContext | None = None
    ) -> LossTerms:
        logits, labels = upcast(views[VIEW_TOKEN_LOGITS]), views[VIEW_TOKEN_LABELS]
        if labels.numel() == 0:  # no token chosen in this batch: nothing to learn, no NaN
            return {"mntp": logits.sum() * 0.0}
        # the mean over the scored tokens (padding labels are ignore_index, -100), read without
        # a host sync; a GradCache chunk or batch with none scores 0, not NaN
        total = F.cross_entropy(logits, labels, reduction="sum")
        return {"mntp": total / (labels >= 0).sum().clamp_min(1)}

    def describe(self, kind: DataKind = SENTENCES) -> str:
        token = f"`{self.mask_token}`" if self.mask_token else "the tokenizer's mask token (or `_`)"
        return (
            "**Masked next-token prediction** (LLM2Vec): each token is chosen with probability "
            f"{self.mask_ratio:g} and replaced by {token} (80%), a random token (10%) or "
            "kept (10%); it is predicted by the LM head from the previous position's state"
        )
