"""Say what the run is at its start, what it skipped along the way, and what it achieved."""

import logging
from pathlib import Path

import lightning as L
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger

log = logging.getLogger("project")


def monitored_checkpoint(trainer: L.Trainer) -> ModelCheckpoint | None:  # the best's
    return next((cb for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint) and cb.monitor),
                None)


def run_hparams(trainer: L.Trainer, module: L.LightningModule) -> dict:
    """Model and data settings, and what was resolved at the start (weights, effective LR)."""
    params = {f"model/{k}": v for k, v in module.hparams.items() if k not in ("class_names", "_instantiator")}
    if trainer.datamodule is not None:
        params.update({f"data/{k}": v for k, v in trainer.datamodule.hparams.items() if k != "_instantiator"})
    lr, batch = module.run_lr() if hasattr(module, "run_lr") else (None, None)
    params.update({"pretrained": getattr(module, "pretrained", None), "effective_lr": lr,
                   "effective_head_lr_mult": getattr(module, "head_lr_mult", None),
                   "global_batch_size": batch, "precision": trainer.precision,
                   "devices": trainer.num_devices, "num_nodes": trainer.num_nodes})
    return {k: (str(v) if isinstance(v, list | tuple | dict) else v) for k, v in params.items()}


class RunSummary(Callback):
    """The settings in every logger, the undecodable images skipped, and at the end the numbers."""

    def __init__(self) -> None:
        self.reported: set[str] = set()

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" or not trainer.is_global_zero or trainer.ckpt_path:
            return
        params = run_hparams(trainer, pl_module)
        for logger in trainer.loggers:
            logger.log_hyperparams(params)
            if isinstance(logger, TensorBoardLogger):  # the HPARAMS table's metric columns
                from torch.utils.tensorboard.summary import hparams

                for summary in hparams(params, dict.fromkeys(pl_module.task.summary_metrics, 0.0)):
                    logger.experiment.file_writer.add_summary(summary)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        log_dir = trainer.log_dir  # a collective under DDP: every rank must ask
        if trainer.is_global_zero:
            log.info("Training %s (%s) on %d classes: %s. Logs: %s", pl_module.hparams.backbone,
                     pl_module.weights_note, pl_module.hparams.num_classes,
                     ", ".join(pl_module.class_names), log_dir)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        datasets = getattr(trainer.datamodule, "datasets", {})
        local = [p for ds in datasets.values() for p in ds.skipped_paths()]
        skipped = sorted({p for paths in gather(local) for p in paths})  # ranks may share a file
        if not skipped:
            return
        pl_module.log("train/skipped_images", float(len(skipped)), rank_zero_only=True)
        new = [p for p in skipped if p not in self.reported]
        self.reported.update(new)
        if new and trainer.is_global_zero:
            log.warning("Skipped %d undecodable image(s) so far (%d new here): %s. Run `python -m "
                        "project check-data` for details.", len(skipped), len(new), ", ".join(new))

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        log_dir = trainer.log_dir  # a collective under DDP: every rank must ask
        if not trainer.is_global_zero:
            return
        metrics = trainer.callback_metrics
        lines = ["", "=" * 72, f"Run finished after {trainer.current_epoch} epochs "
                 f"({trainer.global_step} steps). Logs: {log_dir}"]
        lines += [f"  {key:<14} {float(metrics[key]):.4f}"
                  for key in pl_module.task.summary_metrics if key in metrics]
        best = monitored_checkpoint(trainer)
        if best is not None and best.best_model_path:
            lines.append(f"  best checkpoint ({best.monitor}={float(best.best_model_score):.4f}): "
                         f"{best.best_model_path}")
        last = Path(best.dirpath) / "last.ckpt" if best is not None and best.dirpath else None
        if last is not None and last.is_file():
            lines.append(f"  last checkpoint (for make resume): {last}")
        if not getattr(pl_module, "pretrained", True) and pl_module.hparams.get("weights") is not None:
            lines.append(f"  WARNING: pretrained weights were NOT used ({pl_module.weights_note}); "
                         "see the warning at the start of the run for the fix.")
        print("\n".join(lines + ["=" * 72]), flush=True)


def gather(local: list[str]) -> list[list[str]]:
    """Every rank's list, on every rank. A collective: every rank must call it."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [local]
    gathered: list[list[str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    return [paths or [] for paths in gathered]
