"""Report images that could not be decoded and were skipped, instead of crashing at hour three."""

from __future__ import annotations

import logging

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

log = logging.getLogger("project")


class BadImageReport(Callback):
    """At each epoch end: log ``data/skipped_images`` and name the files skipped so far.

    The datasets flag undecodable files in shared memory (workers included); with
    ``data.on_bad_image: error`` the first one stops the run instead.
    """

    def __init__(self) -> None:
        self.reported: set[str] = set()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        datasets = getattr(trainer.datamodule, "datasets", {}) if trainer.datamodule else {}
        skipped = [p for ds in datasets.values() for p in ds.skipped_paths()]
        # each DDP rank reads its own share of the files: add the counts up
        count = torch.tensor(float(len(skipped)), device=pl_module.device)
        total = int(trainer.strategy.reduce(count, reduce_op="sum"))
        if total == 0:
            return
        pl_module.log("data/skipped_images", float(total), rank_zero_only=True)
        new = [p for p in skipped if p not in self.reported]
        if new and trainer.is_global_zero:
            self.reported.update(new)
            log.warning("Skipped %d undecodable image(s) so far (%d new here): %s. Run `python -m "
                        "project check-data` for details.", total, len(new), ", ".join(new))
