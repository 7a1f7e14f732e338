"""The forward on the real tokens only: a BERT backbone run on an unpadded (packed) batch.

A training batch is padded to its longest sentence; on the wiki corpus at ``max_seq_len`` 32
about a third of the padded positions are padding. Every linear layer, layer norm, dropout and
GELU of a BERT encoder works token by token, so they can run on the ``T`` real tokens of the
batch instead of on all ``B x L`` positions. Only attention mixes the tokens of a sentence: there
:mod:`cselab.model.attention` puts the packed queries, keys and values back on the padded grid
with the usual key-padding mask, so each token attends to exactly the tokens it attends to in
the padded batch.

The padded and the packed forward compute the same function (the outputs at real tokens agree
to float rounding); only the dropout masks are drawn differently. The encoder uses the packed
forward on the CPU, in training and inference, for single-segment batches; the padded path is
kept for GPUs, other architectures, two-segment inputs and poolers that read every layer.

This uses the ``transformers`` extension points for attention: a function registered under
:data:`ATTENTION_NAME` that behaves exactly like ``sdpa`` unless the forward call carries the
packing information (the ``cselab_unpad`` keyword, passed through the model to the attention
function). The name is cselab's own and only backbones cselab loads with the fast path on are
switched to it (:func:`enable`): registering it changes nothing for any other model, of this
architecture or another, which keeps ``sdpa`` or whatever it was loaded with
(``tests/test_fast_path.py``).

**Which architectures get the fast path** is said in the table of backbones
(:mod:`.backbones`, the ``fast_path`` column), read here as :data:`FAST_PATH_MODEL_TYPES`. The
packed forward reads BERT's attribute names
(``embeddings(position_ids=..., token_type_ids=...)``, ``encoder.layer``,
``attention.self.query``, ...) and numbers positions from 0 as BERT does; RoBERTa/XLM-R (positions
from ``padding_idx + 1``), DistilBERT (no token types) and every other family run the plain
padded forward of ``transformers``, unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from . import backbones
from .attention import PackInfo, compute_dtype, packed_attention
from .dropout import dropout

#: cselab's private attention name; only backbones switched by :func:`enable` use it.
ATTENTION_NAME = "cselab_unpad_sdpa"
#: The architectures that get the packed forward: the rows of the table of backbones
#: (:mod:`.backbones`, its one home) marked ``fast_path``. Every other architecture runs the plain
#: padded forward.
FAST_PATH_MODEL_TYPES = backbones.FAST_PATH_MODEL_TYPES

_registered = False
#: Dynamo's recompile limit for a fixed-shape compiled encoder (one graph per batch shape)
FIXED_SHAPE_RECOMPILE_LIMIT = 64


def _packed_sdpa(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    cselab_unpad: PackInfo | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """``sdpa`` for padded inputs; for packed inputs ``(1, H, T, d)``, attention per sentence."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if cselab_unpad is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    return packed_attention(query, key, value, cselab_unpad, dropout, scaling), None


def register() -> None:
    """Register :data:`ATTENTION_NAME` with ``transformers`` (idempotent).

    A new name in ``transformers``' registries; the existing names (``sdpa``, ``eager``, ...)
    are left as they are.
    """
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, _packed_sdpa)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    _registered = True


def enable(backbone: nn.Module) -> bool:
    """Switch an ``sdpa`` backbone of :data:`FAST_PATH_MODEL_TYPES` to :data:`ATTENTION_NAME`;
    ``True`` if it now can unpad.

    Only ``backbone`` changes (its own config's attention name). Other architectures and other
    attention implementations are left as they are.
    """
    config = getattr(backbone, "config", None)
    if config is None or getattr(config, "model_type", None) not in FAST_PATH_MODEL_TYPES:
        return False
    if getattr(config, "_attn_implementation", None) == ATTENTION_NAME:
        return True
    if getattr(config, "_attn_implementation", None) != "sdpa" or getattr(
        config, "is_decoder", False
    ):
        return False
    try:
        register()
        backbone.set_attn_implementation(ATTENTION_NAME)
    except (ImportError, AttributeError, ValueError, KeyError):  # older transformers
        return False
    return True


#: Architectures whose ``transformers`` forward takes a prepared 4D mask as given
#: (``masking_utils``, transformers 5): for them :func:`padded_attention_mask` hands one over.
MASK_4D_MODEL_TYPES = frozenset(t for t, row in backbones.BACKBONES.items() if row.mask_4d)
#: Attention implementations that read a boolean 4D mask (``True``: attend).
_BOOL_MASK_ATTENTION = frozenset({"sdpa", ATTENTION_NAME})


def check_attention(name: str | None) -> None:
    """Refuse ``model.attn_implementation=flash_attention_2`` in one line where it cannot run
    (no ``flash_attn`` package, or no CUDA GPU), before ``transformers`` is asked (which would
    otherwise fall back to eager attention silently, :meth:`SentenceEncoder.from_pretrained
    <cselab.model.sentence_encoder.SentenceEncoder.from_pretrained>`)."""
    if name != "flash_attention_2":
        return
    import importlib.util

    from ..core.errors import ConfigError

    if importlib.util.find_spec("flash_attn") is None:
        raise ConfigError(
            "model.attn_implementation=flash_attention_2 needs the flash-attn package, which "
            "is not installed (pip install flash-attn); use sdpa"
        )
    if not torch.cuda.is_available():
        raise ConfigError("model.attn_implementation=flash_attention_2 needs a CUDA GPU; use sdpa")


def padded_attention_mask(
    backbone: nn.Module, attention_mask: Tensor
) -> Tensor | dict[str, Tensor]:
    """The mask to hand ``backbone`` for a padded batch: for the architectures of
    :data:`MASK_4D_MODEL_TYPES` with SDPA attention, a prepared boolean 4D mask (``True``:
    attend); otherwise ``attention_mask`` itself.

    Why: given the 2D mask, ``transformers`` asks whether any token is padded
    (``masking_utils``' ``padding_mask.all()``; for decoders twice, in
    ``_ignore_causal_mask_sdpa``) to skip the mask, and reading that answer is a host sync in
    every forward: on a GPU the CPU waits for the queue to drain (and a CUDA graph cannot be
    captured). A 4D mask is used as given. The masks, the same attention on every real token
    (``tests/test_gpu_path.py``):

    * an encoder, or a decoder made bidirectional: the ``(B, 1, 1, L)`` key mask SDPA
      broadcasts;
    * a causal decoder: ``(B, 1, L, L)``, causal and the key mask;
    * ModernBERT: ``{"full_attention": key mask, "sliding_attention": key mask within
      |i - j| <= config.sliding_window}`` (its local layers' band, as ``transformers`` builds it).

    A padded query row whose keys are all masked (left padding under the causal mask, or far
    right of the band) attends to itself: its state is never read, and SDPA would otherwise
    give NaN there, which the next layer's ``0 * value`` would spread. A decoder whose sliding
    window is shorter than the batch keeps the 2D mask (its window is not built here), as do
    other implementations (eager adds a float mask; FlashAttention unpads from the 2D mask).
    """
    config = getattr(backbone, "config", None)
    if (
        config is None
        or getattr(config, "model_type", None) not in MASK_4D_MODEL_TYPES
        or getattr(config, "_attn_implementation", None) not in _BOOL_MASK_ATTENTION
    ):
        return attention_mask
    length = attention_mask.shape[1]
    window = getattr(config, "sliding_window", None)
    if backbones.is_decoder(config) and window is not None and length > window:
        return attention_mask
    keys = attention_mask.bool()[:, None, None, :]
    if backbones.is_decoder(config):
        if not getattr(config, "is_causal", True):  # model.bidirectional
            return keys
        rows, cols = _grid(length, attention_mask.device)
        return (keys & (rows >= cols)) | (rows == cols)
    local = "sliding_attention" in (getattr(config, "layer_types", None) or ())
    if not local or window is None or length - 1 <= window:
        return keys  # an encoder's key mask: no position tensors, a few operators per forward
    # ModernBERT's local layers: a bidirectional band |i - j| <= sliding_window
    rows, cols = _grid(length, attention_mask.device)
    band = (rows - cols).abs() <= window
    return {"full_attention": keys, "sliding_attention": (keys & band) | (rows == cols)}


def _grid(length: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Query and key positions ``(L, 1)`` and ``(1, L)``, for the masks that depend on them."""
    positions = torch.arange(length, device=device)
    return positions[:, None], positions[None, :]


def compile_encoder(encoder: nn.Module, **options: Any) -> nn.Module:
    """``torch.compile(encoder, dynamic=True, **options)`` with the packed forward in one graph.

    The packed forward's token count ``T`` comes from ``nonzero`` on the attention mask, a
    data-dependent size: Dynamo is told to capture it as a symbolic size
    (``capture_dynamic_output_shape_ops``, a process-wide setting that only turns what would be
    a graph break into a traced size) instead of breaking the graph in every forward. With
    ``dynamic=True`` the batch size and padded width are symbolic too, so batches of every shape
    share one graph: one compile, no recompiles per width (``tests/test_compile.py``). The
    attention is the custom operator ``cselab::packed_attention`` (:mod:`.attention`), which
    Dynamo and AOTAutograd trace through.
    """
    torch._dynamo.config.capture_dynamic_output_shape_ops = True
    options.setdefault("dynamic", True)  # False: the fixed-shape (CUDA graph) step
    if options["dynamic"] is False:
        # one compile per (rows, width) shape: widths of 16 tokens up to max_seq_len, times the
        # step's and GradCache's chunks' rows; past Dynamo's limit (8) it would run eagerly
        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, FIXED_SHAPE_RECOMPILE_LIMIT)
    return torch.compile(encoder, **options)


def unpadded_last_hidden(
    backbone: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    *,
    first_token_only: bool = False,
) -> Tensor:
    """The backbone's last hidden states ``(B, L, D)`` computed on the real tokens only.

    Positions at padding are zeros (the padded forward puts unused values there). Position ids
    are the column index, as in the padded forward.

    ``first_token_only``: the caller reads only the first token of the last layer (the ``cls``
    poolers). The last layer then computes its queries, attention output, feed-forward block
    and dropout for the ``B`` first tokens only; the other rows of the result are zeros. The
    first tokens' states are exactly those of the full forward: nothing else in the last layer
    feeds them: with dropout off they are equal to rounding, with dropout on they have the same
    distribution (the last layer draws masks only for the rows it computes). With SimCSE's
    ``[CLS]`` pooling this drops about 80% of the last layer's work (MiniLM-L6 at 22 tokens per
    sentence: 13% of the encoder's matrix products).
    """
    batch, width = input_ids.shape
    pack = PackInfo.from_mask(attention_mask)
    index = pack.index
    positions = torch.arange(width, device=input_ids.device).expand(batch, width).reshape(-1)[index]
    ids = input_ids.reshape(-1)[index]
    inputs = {
        "input_ids": ids.unsqueeze(0),
        "position_ids": positions.unsqueeze(0),
        "token_type_ids": torch.zeros_like(ids).unsqueeze(0),
    }
    layers = getattr(getattr(backbone, "encoder", None), "layer", None)
    if first_token_only and layers is not None:
        hidden = backbone.embeddings(**inputs)
        for layer in layers[:-1]:
            out = layer(hidden, None, cselab_unpad=pack)
            hidden = out[0] if isinstance(out, tuple) else out  # transformers 4 returns a tuple
        first = _first_token_layer(layers[-1], hidden[0], pack)  # (B, D)
        # column 0 holds the first real token where it is real (right padding: every row) and
        # zero where it is padding, as the full forward; no branch on the data, so a compiled
        # forward is one graph
        first = torch.where(pack.keep[:, :1], first, 0.0)
        grid = first.new_zeros(batch, width, first.shape[-1])
        return grid.index_copy(
            1, torch.zeros(1, dtype=torch.long, device=grid.device), first[:, None]
        )
    # A prepared 4D mask, which the packed attention ignores (it attends within each sentence
    # by ``pack``): without a mask transformers (5.25 on) reads the position ids, which restart
    # at every sentence, as packed sequences and builds a (T, T) mask of its own, with a host
    # read and, compiled, a graph break
    unused = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=ids.device)
    out = backbone(**inputs, attention_mask=unused, cselab_unpad=pack, return_dict=True)
    hidden = out.last_hidden_state[0]  # (T, D)
    grid = hidden.new_zeros(batch * width, hidden.shape[-1]).index_copy(0, index, hidden)
    return grid.view(batch, width, -1)


def _first_token_layer(layer: nn.Module, hidden: Tensor, pack: PackInfo) -> Tensor:
    """A BERT layer's output at each sentence's first token ``(B, D)``, from packed ``(T, D)``.

    The same computation as ``layer(hidden)`` restricted to the first-token rows: their queries
    attend over all keys of their sentence (attention in float32 for half inputs, as
    :mod:`cselab.model.attention` does), then the attention output block and the feed-forward
    block (``BertSelfOutput``, ``BertIntermediate``, ``BertOutput``) run on ``B`` rows.
    """
    att = layer.attention.self
    heads, head_dim = att.num_attention_heads, att.attention_head_size
    scaling = getattr(att, "scaling", head_dim**-0.5)  # transformers 4 has no attribute
    batch, width = pack.batch, pack.width
    # each sentence's first real token: its packed rows start after the earlier sentences'
    # (an empty sentence, all padding, points at a valid row; the caller zeroes its result)
    lengths = pack.keep.sum(1)
    first_rows = (lengths.cumsum(0) - lengths).clamp(max=pack.index.shape[0] - 1)
    x = hidden.index_select(0, first_rows)  # (B, D)
    q = att.query(x)
    out_dtype = q.dtype
    work = compute_dtype(out_dtype)

    def grid(rows: Tensor) -> Tensor:  # (T, H·d) -> (B, H, L, d), zeros at padding
        full = rows.new_zeros(batch * width, rows.shape[-1]).index_copy(0, pack.index, rows)
        return full.view(batch, width, heads, head_dim).transpose(1, 2).to(work)

    q = q.view(batch, heads, 1, head_dim).to(work)
    keys, values = grid(att.key(hidden)), grid(att.value(hidden))
    with torch.autocast(x.device.type, enabled=False):
        scores = q @ keys.transpose(-1, -2) * scaling + pack.key_bias.view(batch, 1, 1, width)
        probs = dropout(scores.softmax(-1), att.dropout.p, att.training)
        context = (probs @ values).reshape(batch, heads * head_dim).to(out_dtype)
    attended = layer.attention.output(context, x)
    return layer.output(layer.intermediate(attended), attended)
