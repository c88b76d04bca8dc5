"""Exponential moving average of the weights (EMA), on Lightning's ``WeightAveraging``: what
validation sees and the checkpoints' ``state_dict`` hold (so evaluate, predict and export use
it); the raw weights stay in ``current_model_state``, so a resume continues both exactly."""

import torch
from lightning.pytorch.callbacks import WeightAveraging
from torch.optim.swa_utils import get_ema_multi_avg_fn

from project.errors import ConfigError


def ema_update(decay: float, warmup: bool):
    """``multi_avg_fn`` for ``AveragedModel`` (torch's ``foreach`` EMA); with ``warmup`` the decay
    grows as (1 + n) / (10 + n) up to ``decay`` (timm's), so a short run's is not stuck near its start."""

    def update(averaged: list[torch.Tensor], current: list[torch.Tensor], num_averaged: torch.Tensor) -> None:
        n = float(num_averaged)
        now = min(decay, (1 + n) / (10 + n)) if warmup else decay
        get_ema_multi_avg_fn(now)(averaged, current, num_averaged)

    return update


class EMA(WeightAveraging):
    """EMA of parameters and buffers every ``every_n_steps`` optimizer steps; ``decay`` 0.998
    every 2 steps averages about the last 1000 steps (500 updates), as 0.999 every step would,
    at half the memory traffic; ``warmup`` grows it from 0.1 over the first updates."""

    def __init__(self, decay: float = 0.998, warmup: bool = True, every_n_steps: int = 2) -> None:
        if not 0 < decay < 1 or every_n_steps < 1:
            raise ConfigError(f"the EMA callback's decay must be in (0, 1) and every_n_steps >= 1, got "
                              f"{decay} and {every_n_steps} (trainer.callbacks in the config)")
        super().__init__(use_buffers=True, multi_avg_fn=ema_update(decay, warmup))
        self.every_n_steps = every_n_steps

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        return step_idx is not None and step_idx % self.every_n_steps == 0
