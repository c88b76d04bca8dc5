"""Exponential moving average of the weights (EMA), on Lightning's ``WeightAveraging``.

The averaged weights are what validation sees, what the best checkpoint holds (its
``state_dict``; the raw weights stay in ``current_model_state`` for resuming) and so what
evaluate, predict and export use. Lightning saves the average in every checkpoint, so a resumed
run continues it exactly.
"""

from __future__ import annotations

import torch
from lightning.pytorch.callbacks import WeightAveraging
from torch.optim.swa_utils import get_ema_multi_avg_fn


def ema_update(decay: float, warmup: bool):
    """``multi_avg_fn`` for ``AveragedModel``: every tensor of a dtype updated at once (torch's
    ``foreach`` EMA). With ``warmup`` the decay grows as (1 + n) / (10 + n) up to ``decay``
    (timm's ModelEmaV3), so a short run's average is not stuck near its first weights."""

    def update(averaged: list[torch.Tensor], current: list[torch.Tensor], num_averaged: torch.Tensor) -> None:
        n = float(num_averaged)
        now = min(decay, (1 + n) / (10 + n)) if warmup else decay
        get_ema_multi_avg_fn(now)(averaged, current, num_averaged)

    return update


class EMA(WeightAveraging):
    """EMA of parameters and buffers after every ``every_n_steps`` optimizer steps.

    Args:
        decay: weight of the old average per update (0.999: about the last 1000 steps).
        warmup: grow the decay from 0.1 towards ``decay`` over the first updates.
        every_n_steps: update every this many optimizer steps (a cheaper average).
    """

    def __init__(self, decay: float = 0.999, warmup: bool = True, every_n_steps: int = 1) -> None:
        if not 0 < decay < 1:
            raise ValueError(f"EMA decay must be in (0, 1), got {decay}")
        super().__init__(use_buffers=True, multi_avg_fn=ema_update(decay, warmup))
        self.every_n_steps = every_n_steps

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        return step_idx is not None and step_idx % self.every_n_steps == 0
