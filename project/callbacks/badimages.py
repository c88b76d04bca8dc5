"""Report images that could not be decoded and were skipped, instead of crashing at hour three."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import lightning as L
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback

log = logging.getLogger("project")


def merge_skipped(per_rank: Iterable[Iterable[str]]) -> list[str]:
    """The sorted union of the ranks' skipped paths: a file two ranks both read (the padding of
    the training draw, or class-balanced draws with replacement) counts once."""
    return sorted({path for paths in per_rank for path in paths})


def gather_skipped(local: list[str]) -> list[list[str]]:
    """Every rank's list, on every rank. A collective: every rank must call it."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [local]
    gathered: list[list[str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    return [paths or [] for paths in gathered]


class BadImageReport(Callback):
    """At each epoch end: log ``data/skipped_images`` and name the files skipped so far.

    The datasets flag undecodable files in shared memory (workers included); with
    ``data.on_bad_image: error`` the first one stops the run instead.
    """

    def __init__(self) -> None:
        self.reported: set[str] = set()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        datasets = getattr(trainer.datamodule, "datasets", {}) if trainer.datamodule else {}
        local = [p for ds in datasets.values() for p in ds.skipped_paths()]
        # each DDP rank flags what it read, and ranks may read the same file: count unique files
        skipped = merge_skipped(gather_skipped(local))
        if not skipped:
            return
        pl_module.log("data/skipped_images", float(len(skipped)), rank_zero_only=True)
        new = [p for p in skipped if p not in self.reported]
        self.reported.update(new)
        if new and trainer.is_global_zero:
            log.warning("Skipped %d undecodable image(s) so far (%d new here): %s. Run `python -m "
                        "project check-data` for details.", len(skipped), len(new), ", ".join(new))
