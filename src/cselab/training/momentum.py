"""The momentum encoder: an exponential moving average of the encoder's backbone (ESimCSE, MoCo).

ESimCSE (Wu et al. 2022, Sec. 3.2) fills its queue of negatives with sentences encoded by a
momentum encoder, ``θ_m ← m·θ_m + (1 - m)·θ``. It is model state, so it belongs to the training
layer (objectives see embeddings only): the :class:`~cselab.training.task.Task` builds one when
its objective asks for the ``momentum`` view, produces that view with it, updates it after every
optimiser step (:meth:`Task.after_step <cselab.training.task.Task.after_step>`) and hands its
weights to the checkpoint.

As in the authors' code (``caskcsg/sentemb``, ``ESimCSE/esimcse/models.py``): only the backbone
is averaged, and its output goes through the **live** pooler. Where it starts differs: the
authors' ``BertForCL.__init__`` copies the backbone before ``from_pretrained`` loads the
checkpoint, so their momentum encoder starts from the architecture's random initialisation
(their logs list every ``momentum_model.*`` weight as newly initialised); cselab copies the
pretrained backbone when the task is built (``init="pretrained"``, the default) or, with
``init="random"``, starts from a fresh random initialisation of the same architecture drawn from
the run's seed (the authors' start). The pooler is the live one (a ``cls`` MLP head is the
trained one, applied as in training), with every dropout of the backbone off and no gradient.
The authors average at the start of each step's forward pass with the weights that pass uses;
averaging right after the optimiser step with the new weights is the same sequence of averages
(the first, with the initial weights, changes nothing).

With LoRA adapters (:mod:`cselab.model.lora`) the base weights are frozen, so their average is
themselves: the momentum encoder keeps a copy of the **trainable** backbone tensors only (the
adapters) and runs the live backbone with them in place (``torch.func.functional_call``), never
a copy of the base model.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch
from torch import Tensor
from torch.func import functional_call

from ..core.errors import ConfigError
from ..model.encoder import SentenceEncoder, dropout_disabled


class MomentumEncoder:
    """A frozen copy of ``encoder``'s backbone, averaged towards it by :meth:`update`.

    Args:
        encoder: the encoder being trained (its pooler is shared, its backbone copied now).
        momentum: ``m`` in ``[0, 1]`` (the authors: 0.995); ``0`` follows the encoder exactly,
            ``1`` keeps the initial weights.
        init: ``pretrained``: start from the backbone's weights; ``random``: from a fresh random
            initialisation of its architecture (:func:`random_weights`, drawn from ``seed``).
        seed: the seed of the ``random`` start (``None``: 0).
    """

    def __init__(
        self,
        encoder: SentenceEncoder,
        momentum: float,
        *,
        init: str = "pretrained",
        seed: int | None = None,
    ) -> None:
        if init not in ("pretrained", "random"):
            raise ValueError(f"init must be 'pretrained' or 'random', not {init!r}")
        self.momentum = float(momentum)
        self.live = encoder
        params = dict(encoder.backbone.named_parameters())
        # Frozen weights (LoRA's base model) average to themselves: share them, copy the rest.
        self.shared = not all(p.requires_grad for p in params.values())
        self.averaged: dict[str, Tensor] = {}
        if self.shared:
            if init == "random":
                # a random start would need a whole second model: what LoRA exists to avoid
                raise ConfigError(
                    "objective.momentum_queue.init=random needs a full copy of the backbone; "
                    "with model.lora the momentum encoder averages only the adapters: use "
                    "init: pretrained"
                )
            self.averaged = {k: p.detach().clone() for k, p in params.items() if p.requires_grad}
            backbone = encoder.backbone
        else:
            backbone = copy.deepcopy(encoder.backbone).requires_grad_(False)
            if init == "random":
                backbone.load_state_dict(random_weights(encoder.backbone, seed or 0))
        # Not a submodule of anything: the shared pooler must not be registered twice, and the
        # copy's weights travel in the checkpoint through state_dict(), not the model's.
        self.shell = SentenceEncoder(
            backbone, encoder.tokenizer, encoder.pooler, encoder.max_seq_len, prompt=encoder.prompt
        )
        self.shell.unpad_training = encoder.unpad_training
        self.shell.unpad_inference = encoder.unpad_inference
        self.shell.pack_rows = encoder.pack_rows

    @torch.no_grad()
    def update(self) -> None:
        """``θ_m ← m·θ_m + (1 - m)·θ`` for every (trainable) backbone parameter.

        Three multi-tensor kernels over all parameters at once (``torch._foreach_*``: one
        launch per op and dtype group on a GPU, where a loop over BERT-base's 199 tensors
        launches about 600). The same products and sum as the authors' per-parameter
        ``p_m * m + p * (1 - m)``, rounded the same way, so the result is bit-identical;
        ``torch._foreach_lerp_`` would be one kernel but computes ``p_m + (1-m)(p - p_m)``,
        which rounds differently. With LoRA only the adapters are averaged.
        """
        m = self.momentum
        if self.shared:
            named = dict(self.live.backbone.named_parameters())
            mine = list(self.averaged.values())
            live = [named[k].detach() for k in self.averaged]
        else:
            mine = list(self.shell.backbone.parameters())
            live = [p.detach() for p in self.live.backbone.parameters()]
        if len(mine) != len(live):
            raise ValueError("the momentum backbone and the live one differ in parameters")
        pulled = torch._foreach_mul(live, 1.0 - m)
        torch._foreach_mul_(mine, m)
        torch._foreach_add_(mine, pulled)

    @torch.no_grad()
    def __call__(self, inputs: Mapping[str, Tensor]) -> Tensor:
        """The momentum embeddings ``(B, D)`` of ``inputs`` (dropout off, no gradient)."""
        self.shell.train(self.live.training)
        with dropout_disabled(self.shell.backbone):
            if self.shared:  # the live backbone with the averaged adapters in place
                swapped = {f"backbone.{k}": v for k, v in self.averaged.items()}
                return functional_call(self.shell, swapped, kwargs=dict(inputs), strict=False)
            return self.shell(**inputs)

    def state_dict(self) -> dict[str, Tensor]:
        if self.shared:
            return {k: v.detach() for k, v in self.averaged.items()}
        return {k: v.detach() for k, v in self.shell.backbone.state_dict().items()}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        if self.shared:
            if set(state) != set(self.averaged):
                raise ValueError("the momentum state does not hold this model's adapters")
            with torch.no_grad():
                for k, v in state.items():
                    self.averaged[k].copy_(v)
            return
        self.shell.backbone.load_state_dict(dict(state))


def random_weights(backbone: torch.nn.Module, seed: int) -> dict[str, Tensor]:
    """The weights of a fresh ``backbone`` architecture as ``transformers`` initialises it
    (``AutoModel.from_config``: BERT's normal(0, initializer_range), unit LayerNorms, zero
    biases), drawn under ``seed`` without touching the global random state, in the backbone's
    dtype. ESimCSE's momentum encoder starts from such weights in the authors' code."""
    from transformers import AutoModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        fresh = AutoModel.from_config(backbone.config)
    dtype = next(backbone.parameters()).dtype
    return {k: v.to(dtype) for k, v in fresh.state_dict().items()}
