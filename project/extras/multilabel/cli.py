"""What a multi-label run changes in the CLI's objects, said in one line at the start."""

from __future__ import annotations

import logging

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

log = logging.getLogger("project")


def use_multilabel(model: L.LightningModule, trainer: L.Trainer) -> None:
    """Checkpoints that keep the best by ``val/acc`` keep the best by ``val/map`` instead: for
    multi-label data ``val/acc`` is the exact-match ratio, a harsh and threshold-bound choice."""
    moved = 0
    for cb in trainer.checkpoint_callbacks:
        if isinstance(cb, ModelCheckpoint) and cb.monitor == "val/acc":
            cb.monitor, moved = "val/map", moved + 1
            cb.filename = (cb.filename or "").replace("acc{val/acc", "map{val/map")
    if trainer.is_global_zero:
        loss = "asymmetric loss" if model.hparams.multilabel_loss == "asymmetric" else "BCE"
        log.info("Task: multilabel (%d labels, several per image): a sigmoid per label, %s, thresholds "
                 "fitted on val to each label's best F1%s", model.hparams.num_classes, loss,
                 ", best checkpoint by val/map" if moved else "")
