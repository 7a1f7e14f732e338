"""The momentum encoder: an exponential moving average of the encoder's backbone (ESimCSE, MoCo).

ESimCSE (Wu et al. 2022, Sec. 3.2) fills its queue of negatives with sentences encoded by a
momentum encoder, ``θ_m ← m·θ_m + (1 - m)·θ``. It is model state, so it belongs to the training
layer (objectives see embeddings only): the :class:`~cselab.training.task.Task` builds one when
its objective asks for the ``momentum`` view, produces that view with it, updates it after every
optimiser step (:meth:`Task.after_step <cselab.training.task.Task.after_step>`) and hands its
weights to the checkpoint.

As in the authors' code (``caskcsg/sentemb``, ``ESimCSE/esimcse/models.py``): only the backbone
is copied (when the task is built) and averaged; its output goes through the **live** pooler (a
``cls`` MLP head is the trained one, applied as in training), with every dropout of the backbone
off and no gradient. The authors average at the start of each step's forward pass with the
weights that pass uses; averaging right after the optimiser step with the new weights is the
same sequence of averages (the first, with the initial weights, changes nothing).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch
from torch import Tensor

from ..model.encoder import SentenceEncoder, dropout_disabled


class MomentumEncoder:
    """A frozen copy of ``encoder``'s backbone, averaged towards it by :meth:`update`.

    Args:
        encoder: the encoder being trained (its pooler is shared, its backbone copied now).
        momentum: ``m`` in ``[0, 1]`` (the authors: 0.995); ``0`` follows the encoder exactly,
            ``1`` keeps the initial weights.
    """

    def __init__(self, encoder: SentenceEncoder, momentum: float) -> None:
        self.momentum = float(momentum)
        self.live = encoder
        backbone = copy.deepcopy(encoder.backbone).requires_grad_(False)
        # Not a submodule of anything: the shared pooler must not be registered twice, and the
        # copy's weights travel in the checkpoint through state_dict(), not the model's.
        self.shell = SentenceEncoder(
            backbone, encoder.tokenizer, encoder.pooler, encoder.max_seq_len, prompt=encoder.prompt
        )
        self.shell.unpad_training = encoder.unpad_training
        self.shell.unpad_inference = encoder.unpad_inference
        self.shell.unpad_cuda = encoder.unpad_cuda

    @torch.no_grad()
    def update(self) -> None:
        """``θ_m ← m·θ_m + (1 - m)·θ`` for every backbone parameter.

        Three multi-tensor kernels over all parameters at once (``torch._foreach_*``: one
        launch per op and dtype group on a GPU, where a loop over BERT-base's 199 tensors
        launches about 600). The same products and sum as the authors' per-parameter
        ``p_m * m + p * (1 - m)``, rounded the same way, so the result is bit-identical;
        ``torch._foreach_lerp_`` would be one kernel but computes ``p_m + (1-m)(p - p_m)``,
        which rounds differently.
        """
        m = self.momentum
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
            return self.shell(**inputs)

    def state_dict(self) -> dict[str, Tensor]:
        return {k: v.detach() for k, v in self.shell.backbone.state_dict().items()}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        self.shell.backbone.load_state_dict(dict(state))
