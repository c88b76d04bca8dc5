"""What only some runs' data has, kept out of a plain run's imports: unlabeled images
(``unlabeled_stream.py``) and extra validation sets (``extra_val.py``); streamed shards are
``project/extras/streaming/``."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from torch.utils.data import DataLoader

from project.data.samples import Sample
from project.errors import require

log = logging.getLogger("project")


class RareSources:
    """The data module's unlabeled images and extra validation sets: listed, checked, loaded."""

    def __init__(self, dm) -> None:
        self.dm = dm

    @property
    def unlabeled_from_table(self) -> bool:
        """Whether ``data.unlabeled.images`` names the labels table (its rows without a label)."""
        images, labels = self.dm.unlabeled.images, self.dm.hparams.labels
        return images is not None and labels is not None and Path(images).resolve() == Path(labels).resolve()

    def unlabeled_samples(self) -> list[Sample]:
        from project.data.unlabeled_stream import unlabeled_samples

        dm = self.dm
        found = unlabeled_samples(dm.unlabeled, dm.data_dir, dm.hparams.labels, self.unlabeled_from_table)
        # the labeled images, val's and test's above all, are no pseudo-labels' to train on
        labeled = {os.path.realpath(s.path) for split in ("train", "val", "test")  # links too
                   for s in getattr(dm.splits, split)}
        kept = [s for s in found if os.path.realpath(s.path) not in labeled]
        if len(kept) < len(found):
            require(bool(kept), "data.unlabeled.images", "holds only the data set's labeled images",
                    dm.unlabeled.images)
            log.info("Notice: %d images in data.unlabeled.images are the data set's labeled ones (training, "
                     "validation or test): left out of the unlabeled images", len(found) - len(kept))
        return kept

    def extra_val_names(self) -> list[str]:
        from project.data.extra_val import check_extra_val

        return check_extra_val(self.dm)

    def setup(self, stage: str) -> None:
        """The extra validation sets for fit and validate; the unlabeled images for fit."""
        dm = self.dm
        if stage in ("fit", "validate"):
            from project.data.extra_val import extra_val_dataset

            for name in dm.extra_val_names:
                if f"val_{name}" not in dm.datasets:
                    dm.datasets[f"val_{name}"] = extra_val_dataset(dm, name)
        if stage == "fit" and dm.unlabeled_samples and "unlabeled" not in dm.datasets:
            from project.data.unlabeled_stream import unlabeled_dataset

            dm.datasets["unlabeled"] = unlabeled_dataset(dm)

    def train_loaders(self, epoch: int) -> dict[str, DataLoader]:
        from project.data.unlabeled_stream import train_loaders

        return train_loaders(self.dm, epoch)
