"""Token masking for masked next-token prediction (MNTP, LLM2Vec, BehnamGhader et al. 2024).

Each real token that is not a special token is chosen with probability ``rate``; a chosen token
is replaced by the mask token with probability 0.8, by a uniformly drawn token of the vocabulary
with 0.1, and kept with 0.1 (BERT's split, Devlin et al. 2019, Sec. 3.1, which the authors' MNTP
runs take from ``transformers``' ``DataCollatorForLanguageModeling``). The labels hold the
original id of each chosen token and :data:`IGNORE` elsewhere.

The draws of a row come from a generator seeded by the training layer from ``(seed, step,
global row)`` and run over the row's real tokens only, so a row's mask does not depend on the
batch's padding, the number of ranks or GradCache, and a resumed run draws what an
uninterrupted one would.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from ..core.errors import ConfigError

#: the label of a token that is not predicted
IGNORE = -100
#: where a chosen token's replacement is decided: below 0.8 the mask token, below 0.9 a random
#: token, else the token itself
MASK_BELOW, RANDOM_BELOW = 0.8, 0.9
#: the mask token of a tokenizer without one (LLM2Vec's ``mask_token_type: blank``)
BLANK = "_"


def mask_token_id(tokenizer: Any, token: str | None = None) -> int:
    """The id of ``token``, or of the tokenizer's mask token, or of ``_`` when it has none.

    Raises:
        ConfigError: the token is not in the vocabulary (it would be the unknown token).
    """
    name = token or tokenizer.mask_token or BLANK
    ids = tokenizer.convert_tokens_to_ids([name])
    unk = getattr(tokenizer, "unk_token_id", None)
    if not ids or ids[0] is None or (ids[0] == unk and name != tokenizer.unk_token):
        raise ConfigError(f"objective.mntp.mask_token: {name!r} is not a token of the tokenizer")
    return int(ids[0])


def mask_tokens(
    input_ids: Tensor,
    attention_mask: Tensor,
    rate: float,
    mask_id: int,
    vocab_size: int,
    special_ids: Iterable[int],
    generators: Sequence[torch.Generator],
) -> tuple[Tensor, Tensor]:
    """``(masked input_ids, labels)`` of a batch ``(B, L)``; row ``i`` draws from
    ``generators[i]`` (a CPU generator), over its real tokens."""
    ids = input_ids.cpu()
    masked, labels = ids.clone(), torch.full_like(ids, IGNORE)
    special = torch.tensor(sorted(set(special_ids)), dtype=ids.dtype)
    lengths = attention_mask.cpu().bool()
    for i, gen in enumerate(generators):
        real = lengths[i].nonzero().squeeze(1)  # right or left padding alike
        row = ids[i, real]
        choose = (torch.rand(real.numel(), generator=gen) < rate) & ~torch.isin(row, special)
        how = torch.rand(real.numel(), generator=gen)
        random_ids = torch.randint(vocab_size, (real.numel(),), generator=gen, dtype=ids.dtype)
        new = torch.where(how < MASK_BELOW, torch.full_like(row, mask_id), row)
        new = torch.where((how >= MASK_BELOW) & (how < RANDOM_BELOW), random_ids, new)
        masked[i, real] = torch.where(choose, new, row)
        labels[i, real] = torch.where(choose, row, torch.full_like(row, IGNORE))
    return masked.to(input_ids.device), labels.to(input_ids.device)


def scored_positions(labels: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
    """``(positions, targets)``, each ``(B, K)``: per row, the positions ``i - 1`` whose state
    predicts a chosen token ``i`` (MNTP reads the previous real position), and that token;
    ``K`` is the most a row has, and shorter rows are padded with position 0 and target
    :data:`IGNORE`. Made on the host before the batch's device copy, so the step needs no
    data-dependent size (``nonzero``, a host sync on a GPU); one row per row keeps GradCache's
    chunks by rows valid."""
    scored = (labels[:, 1:] != IGNORE) & attention_mask[:, :-1].bool()  # label i+1 from i
    width = scored.shape[1]
    count = int(scored.sum(1).max()) if scored.numel() else 0
    columns = torch.arange(width, device=labels.device).expand_as(scored)
    # the scored columns first, in order (a stable sort of "not scored")
    order = torch.sort((~scored).to(torch.int8), dim=1, stable=True).indices[:, :count]
    real = scored.gather(1, order)
    positions = torch.where(real, columns.gather(1, order), torch.zeros_like(order))
    targets = torch.where(real, labels[:, 1:].gather(1, order), torch.full_like(order, IGNORE))
    return positions, targets
