"""Say what the run is at its start and what it achieved at its end, in the log and TensorBoard."""

from __future__ import annotations

import logging

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger

from project.model.metrics import HP_METRICS

log = logging.getLogger("project")

def monitored_checkpoint(trainer: L.Trainer) -> ModelCheckpoint | None:
    """The checkpoint callback that monitors a metric (the 'best' one), if any."""
    for cb in trainer.checkpoint_callbacks:
        if isinstance(cb, ModelCheckpoint) and cb.monitor:
            return cb
    return None


def last_checkpoint_path(trainer: L.Trainer) -> str:
    """Where ``last.ckpt`` was written (by save_last, or a ModelCheckpoint named 'last')."""
    for cb in trainer.checkpoint_callbacks:
        if isinstance(cb, ModelCheckpoint):
            if cb.last_model_path:
                return cb.last_model_path
            if cb.filename == "last" and cb.best_model_path:
                return cb.best_model_path
    return ""


def run_hparams(trainer: L.Trainer, module: L.LightningModule) -> dict:
    """Model and data settings plus what was resolved at start (weights, effective LR)."""
    params = {f"model/{k}": v for k, v in module.hparams.items() if k != "class_names"}
    if trainer.datamodule is not None:
        params.update({f"data/{k}": v for k, v in trainer.datamodule.hparams.items()})
    params.update({
        "pretrained": getattr(module, "pretrained", None),
        "effective_lr": getattr(module, "effective_lr", None),
        "effective_head_lr_mult": getattr(module, "head_lr_mult", None),
        "global_batch_size": getattr(module, "global_batch", None),
        "precision": trainer.precision,
        "devices": trainer.num_devices,
        "num_nodes": trainer.num_nodes,
    })
    return {k: (str(v) if isinstance(v, list | tuple | dict) else v) for k, v in params.items()}


class RunSummary(Callback):
    """Logs the hyperparameters for TensorBoard's HPARAMS tab and prints an end-of-fit summary.

    The ``hp/`` metrics are declared here with a placeholder and updated by every validation
    epoch (Lightning's documented pattern), so the HPARAMS table compares finished runs.
    """

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        log_dir = trainer.log_dir  # a collective under DDP: every rank must ask
        if not trainer.is_global_zero:
            return
        if trainer.global_step == 0:
            params = run_hparams(trainer, pl_module)
            for logger in trainer.loggers:  # only TensorBoard's HPARAMS tab takes metrics
                if isinstance(logger, TensorBoardLogger):
                    logger.log_hyperparams(params, dict.fromkeys(HP_METRICS, 0.0))
                else:
                    logger.log_hyperparams(params)
        log.info("Training %s (%s) on %d classes: %s. Logs: %s",
                 pl_module.hparams.backbone, pl_module.weights_note, pl_module.hparams.num_classes,
                 ", ".join(pl_module.class_names), log_dir)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        log_dir = trainer.log_dir  # a collective under DDP: every rank must ask
        if not trainer.is_global_zero:
            return
        metrics = trainer.callback_metrics
        lines = ["", "=" * 72, f"Run finished after {trainer.current_epoch} epochs "
                 f"({trainer.global_step} steps). Logs: {log_dir}"]
        for key in ("val/acc", "val/acc_best", "val/f1_macro", "val/loss"):
            if key in metrics:
                lines.append(f"  {key:<14} {float(metrics[key]):.4f}")
        best = monitored_checkpoint(trainer)
        if best is not None and best.best_model_path:
            lines.append(f"  best checkpoint ({best.monitor}={float(best.best_model_score):.4f}): "
                         f"{best.best_model_path}")
        last = last_checkpoint_path(trainer)
        if last:
            lines.append(f"  last checkpoint (for make resume): {last}")
        if not pl_module.pretrained and pl_module.hparams.weights is not None:
            lines.append(f"  WARNING: pretrained weights were NOT used ({pl_module.weights_note}); "
                         "see the warning at the start of the run for the fix.")
        lines.append("=" * 72)
        print("\n".join(lines), flush=True)
