"""The optimiser side of a step: AdamW, SimCSE's linear schedule, clipping, loss scaling.

:class:`Optimization` owns everything between "gradients are in ``.grad``" and "the next step
may start": the gradient average over ranks, fp16 unscaling, clipping, the AdamW update, the
schedule and zeroing. SimCSE's recipe (Gao et al. 2021, Appendix A): AdamW without weight decay,
a linear decay to 0, no warm-up; the transformers' default clipping at 1.0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from ..config import TrainConfig
from ..model.devices import has_grad_scaler
from .distributed import OverlappedReducer, average_gradients, is_distributed


def linear_schedule(warmup: int, total: int) -> Callable[[int], float]:
    """Linear warm-up to 1 over ``warmup`` steps, then linear decay to 0 at ``total``."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup  # the first update is taken at a non-zero lr
        return max(0.0, (total - step) / max(1, total - warmup))

    return factor


class Optimization:
    """AdamW + schedule + clipping (+ a ``GradScaler`` for fp16) for ``params``.

    Args:
        params: the trainable parameters.
        config: the ``train`` section (lr, weight decay, warm-up, clipping, fused AdamW).
        total_steps: the length of the schedule.
        device: where the parameters live (fused AdamW on CPU and CUDA).
        amp_dtype: the autocast dtype; ``float16`` adds loss scaling.
    """

    def __init__(
        self,
        params: Sequence[nn.Parameter],
        config: TrainConfig,
        total_steps: int,
        device: torch.device,
        amp_dtype: torch.dtype | None,
    ) -> None:
        self.params = list(params)
        self.grad_clip = config.grad_clip
        fused = config.fused_adamw and has_grad_scaler(device)
        self.optimizer = torch.optim.AdamW(
            self.params, lr=config.lr, weight_decay=config.weight_decay, fused=fused or None
        )
        warmup = config.warmup_steps or int(config.warmup_ratio * total_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, linear_schedule(warmup, total_steps)
        )
        self.scaler = torch.amp.GradScaler(device.type) if amp_dtype == torch.float16 else None
        # Under data parallelism the gradient average overlaps the backward (bucketed hooks),
        # unless GradCache runs several backward passes a step.
        self.reducer: OverlappedReducer | None = None
        if is_distributed():
            self.reducer = OverlappedReducer(self.params)
            self.reducer.enabled = config.cache_chunk_size is None
        #: fp16 steps whose gradients overflowed: no update, no schedule step, the scale halved
        self.skipped_steps = 0

    def scale(self, loss: Tensor) -> Tensor:
        """The loss to call ``backward`` on (scaled under fp16)."""
        return self.scaler.scale(loss) if self.scaler is not None else loss

    @property
    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    def step(self) -> None:
        """Average the gradients over ranks, clip, update, advance the schedule, zero.

        Under fp16 a step whose gradients hold an inf or NaN is skipped by the ``GradScaler``
        (no update, the scale halved); the schedule then does not advance either, so the
        learning rate of the next real update is the one it would have had (the transformers
        Trainer does the same). Telling needs one comparison of the scale read on the host: one
        sync per fp16 step (``tests/test_gpu_path.py``).
        """
        if self.reducer is not None:
            self.reducer.finish()  # waits for the all-reduces started during the backward
        else:
            average_gradients(self.params)
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
        skipped = False
        if self.scaler is not None:
            # the scale tensor itself (get_scale() would read it back: a second sync)
            before = self.scaler._scale.clone()  # set by scale(loss) in the backward
            self.scaler.step(self.optimizer)
            self.scaler.update()
            # update() lowers the scale exactly when this step found an inf/NaN gradient; the
            # schedule must know, so this is the fp16 step's one read from the device
            skipped = bool(self.scaler._scale < before)
        else:
            self.optimizer.step()
        if skipped:
            self.skipped_steps += 1
        else:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
