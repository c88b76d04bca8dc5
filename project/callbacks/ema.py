"""Exponential moving average of the weights (EMA), on Lightning's ``WeightAveraging``.

The averaged weights are what validation sees, what the best checkpoint holds (its
``state_dict``; the raw weights stay in ``current_model_state`` for resuming) and so what
evaluate, predict and export use. Lightning saves the average in every checkpoint, so a resumed
run continues it exactly.
"""

from __future__ import annotations

import torch
from lightning.pytorch.callbacks import WeightAveraging


def ema_update(decay: float, warmup: bool):
    """``avg_fn`` for ``AveragedModel``: with ``warmup`` the decay grows as (1 + n) / (10 + n)
    up to ``decay`` (timm's ModelEmaV3), so the average of a short run is not stuck near the
    first steps' weights."""

    def update(averaged: torch.Tensor, current: torch.Tensor, num_averaged: torch.Tensor):
        d = min(decay, (1 + float(num_averaged)) / (10 + float(num_averaged))) if warmup else decay
        return averaged + (current - averaged) * (1 - d)

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
        super().__init__(use_buffers=True, avg_fn=ema_update(decay, warmup))
        self.every_n_steps = every_n_steps

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        return step_idx is not None and step_idx % self.every_n_steps == 0
