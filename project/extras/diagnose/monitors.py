"""Measurements that explain a run: gradient norms per layer, data-loader waiting, overfitting.

Not in the default run (their one-number charts would crowd TensorBoard's first screen): the
diagnose preset (``configs/presets/diagnose.yaml``) adds them, and ``make profile`` the data wait.
"""

from __future__ import annotations

import logging
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import grad_norm

from project.callbacks.dashboards import tensorboard
from project.model.layer_decay import param_blocks

log = logging.getLogger("project")


class GradNormLogger(Callback):
    """Logs gradient norms per block (``grad_norm/<block>``) and in total (``grad_norm/total``).

    The first question when a loss explodes or stalls: which part's gradients are huge or
    vanishing. Blocks (stem, stages, head; see :func:`param_blocks`) keep TensorBoard readable;
    ``per_parameter: true`` adds one chart per parameter tensor (Lightning's ``grad_norm``).
    Logged every ``every_n_steps`` steps, after AMP unscaling, before clipping.
    """

    def __init__(self, every_n_steps: int = 50, norm_type: float = 2.0,
                 per_parameter: bool = False) -> None:
        self.every_n_steps = every_n_steps
        self.norm_type = norm_type
        self.per_parameter = per_parameter
        self.blocks: dict[str, str] | None = None

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if trainer.global_step % self.every_n_steps:
            return
        if self.per_parameter:
            pl_module.log_dict(grad_norm(pl_module, norm_type=self.norm_type))
        net = getattr(pl_module, "net", pl_module)
        if self.blocks is None:
            self.blocks = param_blocks(net, getattr(pl_module, "head_name", ""))
        powers: dict[str, torch.Tensor] = {}
        for name, p in net.named_parameters():
            if p.grad is not None:
                block = self.blocks.get(name, name.split(".")[0])
                norm = p.grad.detach().float().norm(self.norm_type) ** self.norm_type
                powers[block] = powers.get(block, 0) + norm
        if powers:
            logged = {f"grad_norm/{b}": v ** (1 / self.norm_type) for b, v in powers.items()}
            logged["grad_norm/total"] = sum(powers.values()) ** (1 / self.norm_type)
            pl_module.log_dict(logged)


class DataWaitMonitor(Callback):
    """Share of training time spent waiting for the next batch: ``perf/data_wait_frac``.

    Measured between the end of one training step and the start of the next (the loader's
    work that the model could not hide). Above ``threshold`` the accelerator is starving.
    """

    clock = staticmethod(time.perf_counter)  # a test may put a fake clock here

    def __init__(self, threshold: float = 0.2, skip_first: int = 1) -> None:
        self.threshold = threshold
        self.skip_first = skip_first  # worker start-up is not a steady-state cost
        self.warned = False
        self.on_train_epoch_start(None, None)  # a run resumed mid-epoch skips that hook

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.wait = self.compute = 0.0
        self.start = 0.0
        self.last_end: float | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        now = self.clock()
        if self.last_end is not None and batch_idx >= self.skip_first:
            self.wait += now - self.last_end
        self.start = now

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        now = self.clock()
        if batch_idx >= self.skip_first:
            self.compute += now - self.start
        self.last_end = now

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        total = self.wait + self.compute
        if total <= 0:
            return
        fraction = self.wait / total
        pl_module.log("perf/data_wait_frac", fraction, sync_dist=True)  # mean over ranks
        if fraction > self.threshold and not self.warned:
            self.warned = True
            dm = trainer.datamodule
            workers = dm.workers() if hasattr(dm, "workers") else "?"
            log.warning(
                "WARNING: %.0f%% of training time was spent waiting for data (threshold %.0f%%). "
                "The loader is the bottleneck: raise data.num_workers (now %s), set "
                "data.pin_memory=true on GPU, use data.cache=memory for small data sets, or "
                "lighten the augmentation (data.augmentation.auto_augment=none).",
                100 * fraction, 100 * self.threshold, workers)


class OverfitHint(Callback):
    """Hints when train accuracy stays above validation accuracy by ``margin`` for ``patience``
    epochs: the classic 'validation far worse than training' row of the troubleshooting table."""

    def __init__(self, margin: float = 0.15, patience: int = 3) -> None:
        self.margin = margin
        self.patience = patience
        self.streak = 0
        self.hinted = False

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        train_acc = getattr(pl_module, "train_acc", None)
        val = trainer.callback_metrics.get("val/acc")
        if train_acc is None or val is None or not train_acc.update_count:
            return
        gap = float(train_acc.compute()) - float(val)  # compute() syncs: every rank calls it
        self.streak = self.streak + 1 if gap > self.margin else 0
        if self.streak >= self.patience and not self.hinted and trainer.is_global_zero:
            self.hinted = True
            hint = (f"train/acc exceeds val/acc by {gap:.2f} (> {self.margin}) for {self.streak} "
                    "epochs: the model is overfitting. Try more data or stronger augmentation "
                    "(data.augmentation.crop_scale, data.augmentation.auto_augment, "
                    "model.mixup_alpha), regularisation "
                    "(model.optimizer.init_args.weight_decay, model.label_smoothing), or fewer "
                    "epochs; and make sure evaluation runs in eval mode (Lightning does this for "
                    "validation_step).")
            log.warning("HINT: %s", hint)
            writer = tensorboard(trainer)
            if writer is not None:
                writer.add_text("hints/overfitting", hint, trainer.global_step)
