"""Learning-rate arithmetic: warmup + cosine per step, and scaling with the global batch."""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from typing import Literal

from project.errors import ConfigError

log = logging.getLogger("project")
LrScaling = Literal["none", "linear", "sqrt"]
MAX_WARMUP_SHARE = 0.2  # the largest share of a run that warmup may take


def scaled_lr(lr: float, global_batch: int, base_batch: int, rule: LrScaling) -> float:
    """``lr`` tuned for ``base_batch``, adapted to ``global_batch``.

    linear: lr x global/base (Goyal et al., for SGD); sqrt: lr x sqrt(global/base) (common for
    Adam-style optimisers); none: unchanged. More devices without scaling is the classic cause
    of multi-GPU runs that do worse than the single-GPU one.
    """
    if global_batch < 1 or base_batch < 1:
        raise ConfigError("batch sizes must be positive")
    ratio = global_batch / base_batch
    if rule == "linear":
        return lr * ratio
    if rule == "sqrt":
        return lr * math.sqrt(ratio)
    if rule == "none":
        return lr
    raise ConfigError(f"model.lr_scaling must be none, linear or sqrt, got {rule!r}")


def global_batch_size(batch_size: int, devices: int, num_nodes: int, accumulate: int) -> int:
    return batch_size * devices * num_nodes * accumulate


def warmup_cosine(
    warmup_steps: int, total_steps: int, start_factor: float, end_factor: float = 0.0
) -> Callable[[int], float]:
    """LR multiplier at optimizer step ``step``: linear from ``start_factor`` to 1 over
    ``warmup_steps``, then half a cosine down to ``end_factor`` at ``total_steps``."""
    warmup_steps = max(0, min(warmup_steps, total_steps))

    def factor(step: int) -> float:
        if step < warmup_steps:
            return start_factor + (1.0 - start_factor) * step / warmup_steps
        decay_steps = max(1, total_steps - warmup_steps)
        progress = min(1.0, (step - warmup_steps) / decay_steps)
        return end_factor + (1.0 - end_factor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def frozen_until(steps: int, inner: Callable[[int], float]) -> Callable[[int], float]:
    """Multiplier 0 for the first ``steps`` steps (a frozen backbone), then ``inner``."""

    def factor(step: int) -> float:
        return 0.0 if step < steps else inner(step)

    return factor


def warmup_steps(warmup_epochs: float, per_epoch: int, total: int,
                 max_share: float = MAX_WARMUP_SHARE) -> int:
    """Warmup length in steps, at most ``max_share`` of the run: a 3-epoch warmup must not eat
    a 3-epoch run whole. Says so in one line when it clips."""
    wanted = round(warmup_epochs * per_epoch)
    cap = int(max_share * total)
    if wanted > cap:
        _clip_notice(warmup_epochs, wanted, cap, total, max_share)
        return cap
    return wanted


@functools.lru_cache(maxsize=8)  # once per run, not once per parameter group
def _clip_notice(warmup_epochs: float, wanted: int, cap: int, total: int, share: float) -> None:
    log.info("Notice: warmup of %g epochs (%d steps) clipped to %d steps, %.0f%% of the run's "
             "%d steps (set model.warmup_epochs lower to silence this).",
             warmup_epochs, wanted, cap, 100 * share, total)


def step_schedule(
    lengths: Callable[[], tuple[int, int]],
    warmup_epochs: float,
    start_factor: float,
    end_factor: float = 0.0,
    frozen_epochs: float = 0.0,
) -> Callable[[int], float]:
    """The LR multiplier of each optimizer step for ``LambdaLR``: frozen, warmup, then cosine.

    ``lengths()`` returns (steps per epoch, total steps). It is asked at the first real step,
    not when the scheduler is built: asking earlier makes Lightning load the train loader before
    a resumed run has restored its epoch, and its first epoch would replay epoch 0's order.
    ``LambdaLR`` evaluates step 0 at construction, and step 0 needs no lengths.
    """
    resolved: list[Callable[[int], float]] = []

    def factor(step: int) -> float:
        if not resolved:
            if step == 0:
                return 0.0 if frozen_epochs > 0 else (start_factor if warmup_epochs > 0 else 1.0)
            per_epoch, total = lengths()
            inner = warmup_cosine(warmup_steps(warmup_epochs, per_epoch, total), total,
                                  start_factor, end_factor)
            resolved.append(frozen_until(round(frozen_epochs * per_epoch), inner))
        return resolved[0](step)

    return factor
