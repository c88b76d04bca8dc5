"""The learning-rate schedule: warmup + cosine, run lengths, batch scaling; ``model.scheduler`` is
any ``torch.optim.lr_scheduler`` class, built when training starts (:class:`DeferredScheduler`)."""

import functools
import inspect
import logging
import math
from collections.abc import Callable
from typing import Literal

import lightning as L
import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, LRScheduler

from project.errors import ConfigError, require, require_all

log = logging.getLogger("project")
LrScaling = Literal["none", "linear", "sqrt"]
LENGTHS = ("total_steps", "steps_per_epoch", "epochs")


def scaled_lr(lr: float, global_batch: int, base_batch: int, rule: LrScaling) -> float:
    """``lr`` tuned for ``base_batch``, for ``global_batch``: linear (SGD), sqrt (Adam) or none."""
    require(rule in ("none", "linear", "sqrt"), "model.lr_scaling", "must be none, linear or sqrt", rule)
    ratio = global_batch / base_batch
    return lr * {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[rule]


def global_batch_size(batch_size: int, devices: int, num_nodes: int, accumulate: int) -> int:
    return batch_size * devices * num_nodes * accumulate


def warmup_cosine(warmup_steps: int, total_steps: int, start_factor: float,
                  end_factor: float = 0.0, steps_per_epoch: int | None = None) -> Callable[[int], float]:
    """The LR factor at a step: linear from ``start_factor`` to 1, then a half cosine (with
    ``steps_per_epoch``: moved once an epoch, unless the run is one epoch)."""
    warmup_steps = max(0, min(warmup_steps, total_steps))

    def factor(step: int) -> float:
        if step < warmup_steps:
            return start_factor + (1.0 - start_factor) * step / warmup_steps
        if steps_per_epoch and total_steps > steps_per_epoch:  # the cosine at the epoch's start
            progress = min(1.0, (step // steps_per_epoch) / math.ceil(total_steps / steps_per_epoch))
        else:
            progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return end_factor + (1.0 - end_factor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


class WarmupCosine(LambdaLR):
    """Linear warmup over ``warmup_epochs`` (at most ``max_warmup_share`` of the run), then cosine to
    ``end_factor`` x each group's LR, every step or (``cosine_interval: epoch``) once an epoch."""

    def __init__(self, optimizer: Optimizer, warmup_epochs: float = 3.0, warmup_start_factor: float = 0.01,
                 end_factor: float = 0.0, max_warmup_share: float = 0.2,
                 cosine_interval: Literal["step", "epoch"] = "step", total_steps: int | None = None,
                 steps_per_epoch: int | None = None, last_epoch: int = -1) -> None:
        key = "model.scheduler."  # each row: (ok, the setting, the rule, its value)
        require_all(
            (0 <= warmup_epochs < math.inf, f"{key}warmup_epochs", "must be 0 or more", warmup_epochs),
            (0 <= end_factor <= 1, f"{key}end_factor", "must be in [0, 1]", end_factor),
            (0 <= max_warmup_share <= 1, f"{key}max_warmup_share", "must be in [0, 1]", max_warmup_share),
            (all(n is None or n >= 1 for n in (total_steps, steps_per_epoch)),
             f"{key}total_steps/steps_per_epoch", "must be 1 or more (null: the run's)",
             (total_steps, steps_per_epoch)),
            (0 < warmup_start_factor <= 1, f"{key}warmup_start_factor", "must be in (0, 1]",
             warmup_start_factor),
            (cosine_interval in ("step", "epoch"), f"{key}cosine_interval", "must be step or epoch",
             cosine_interval))
        if total_steps is None or steps_per_epoch is None:
            raise ConfigError("WarmupCosine needs the run's total_steps and steps_per_epoch (model.scheduler "
                              "fills them in from trainer.max_epochs or trainer.max_steps)")
        wanted = round(warmup_epochs * steps_per_epoch)
        steps = min(wanted, int(max_warmup_share * total_steps))
        if steps < wanted:
            log.info("Notice: warmup of %g epochs (%d steps) clipped to %d steps, %.0f%% of the run's "
                     "%d steps (set model.scheduler.init_args.warmup_epochs lower to silence this).",
                     warmup_epochs, wanted, steps, 100 * max_warmup_share, total_steps)
        factor = warmup_cosine(steps, total_steps, warmup_start_factor, end_factor,
                               steps_per_epoch if cosine_interval == "epoch" else None)
        super().__init__(optimizer, factor, last_epoch)


def run_lengths(trainer: L.Trainer) -> dict[str, int]:
    """Optimizer steps in the run and per epoch, and epochs, as Lightning estimates them."""
    if trainer.max_epochs in (None, -1) and trainer.max_steps == -1:
        raise ConfigError("the LR schedule needs a length: set trainer.max_epochs or trainer.max_steps")
    total = max(1, int(trainer.estimated_stepping_batches))
    batches = trainer.num_training_batches  # inf when only max_steps bounds the run
    per_epoch = math.ceil(batches / trainer.accumulate_grad_batches) if math.isfinite(batches) else total
    done, epochs = trainer.global_step, trainer.current_epoch
    if math.isfinite(batches) and trainer.max_epochs not in (None, -1) and not (
            0 <= done - epochs * per_epoch < per_epoch):  # resumed with epochs of another length
        # (a larger batch, images removed): Lightning counts every epoch at today's length and
        # would end the schedule early, at LR 0; the steps done and the epochs left instead
        total = done + (trainer.max_epochs - epochs) * per_epoch
        total = total if trainer.max_steps == -1 else min(total, trainer.max_steps)
    return {"total_steps": total, "steps_per_epoch": max(1, per_epoch),
            "epochs": max(1, math.ceil(total / max(1, per_epoch)))}


def unset_lengths(factory: Callable) -> list[str]:
    """The run lengths ``factory`` (a class, or jsonargparse's ``partial``) takes and leaves None."""
    if isinstance(factory, functools.partial):
        return [k for k in LENGTHS if k in factory.keywords and factory.keywords[k] is None]
    if inspect.isclass(factory):
        params = inspect.signature(factory).parameters
        return [k for k in LENGTHS if k in params and params[k].default is None]
    return []


def check_factories(optimizer: Callable, scheduler: Callable | None) -> None:
    """One quiet step of model.optimizer and model.scheduler on a stand-in parameter: a setting
    torch refuses is one line now, not a traceback at the first step."""
    key, quiet = "model.optimizer", logging.Filter("nothing")  # passes no record of "project"
    log.addFilter(quiet)
    try:
        param = torch.nn.Parameter(torch.zeros(1))
        opt = optimizer([param])
        param.grad = torch.ones(1)
        opt.step()
        if scheduler is not None:
            key = "model.scheduler"
            deferred = DeferredScheduler(opt, scheduler)
            deferred.build({"total_steps": 100, "steps_per_epoch": 10, "epochs": 10})
            if isinstance(deferred.inner, torch.optim.lr_scheduler.ReduceLROnPlateau):
                raise ConfigError("model.scheduler: ReduceLROnPlateau steps on a metric; the schedule here "
                                  "steps every optimiser step, by the step count alone: choose one of those "
                                  "(WarmupCosine, OneCycleLR, CosineAnnealingLR, StepLR, ...)")
    except ConfigError:
        raise
    except (ValueError, TypeError, OverflowError, ZeroDivisionError, KeyError, RuntimeError) as err:
        raise ConfigError(f"{key}: {str(err).splitlines()[0] if str(err) else type(err).__name__}") from None
    finally:
        log.removeFilter(quiet)


class DeferredScheduler(LRScheduler):
    """The configured scheduler, built once the run's lengths are known (no ``LRScheduler.__init__``:
    its first step would change the LRs)."""

    def __init__(self, optimizer: Optimizer, factory: Callable[..., LRScheduler]) -> None:
        self.optimizer, self.factory = optimizer, factory
        self.inner: LRScheduler | None = None
        self.pending: dict | None = None  # a checkpoint's state, until build

    def build(self, lengths: dict[str, int]) -> None:
        saved = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        self.inner = self.factory(self.optimizer, **{k: lengths[k] for k in unset_lengths(self.factory)})
        if self.pending is not None:  # resuming: the checkpoint's state, and its LRs and momenta
            self.inner.load_state_dict(self.pending)
            for group, values in zip(self.optimizer.param_groups, saved, strict=True):
                group.update(values)
        counted = {k: getattr(self.inner, k) for k in ("step_size", "milestones", "T_max", "T_0")
                   if hasattr(self.inner, k)}
        if counted:  # a length in epochs elsewhere: in steps here
            log.info("Notice: %s's %s count%s optimiser steps here, not epochs (an epoch is %d steps)",
                     type(self.inner).__name__,
                     ", ".join(f"{k}={sorted(v) if isinstance(v, dict) else v}" for k, v in counted.items()),
                     "" if len(counted) > 1 else "s", lengths["steps_per_epoch"])
        if getattr(self.inner, "cycle_momentum", False):
            log.info("Notice: %s also cycles the optimizer's momentum (cycle_momentum: false keeps it)",
                     type(self.inner).__name__)

    def step(self, *args, **kwargs) -> None:
        if self.inner is None:
            raise RuntimeError("DeferredScheduler.step() before build(), which on_train_start calls")
        self.inner.step(*args, **kwargs)

    def state_dict(self) -> dict:
        return self.inner.state_dict() if self.inner is not None else dict(self.pending or {})

    def load_state_dict(self, state_dict: dict) -> None:
        self.pending = state_dict  # Lightning restores before training starts, so before build

    def get_last_lr(self) -> list[float]:
        return self.inner.get_last_lr() if self.inner else [g["lr"] for g in self.optimizer.param_groups]
