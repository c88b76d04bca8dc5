"""The unlabeled images of a run: listed and checked once, two views of each, and a stream
that follows the labeled batches. Each epoch deals every unlabeled image to one rank, drawn
from (seed, epoch) alone, so a resumed run sees the same images with the same augmentations.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from project.data.datasets import ImageDataset
from project.data.samplers import SEED_RANGE, EpochSampler, epoch_seed
from project.data.samples import Sample
from project.data.transforms import Augmentation, train_transforms
from project.data.unlabeled import Unlabeled
from project.errors import ConfigError, require

log = logging.getLogger(__name__)
UNLABELED = -1  # the label of an image nobody labeled
SEED_SALT = 7_919  # the unlabeled stream's draws differ from the labeled one's


def unlabeled_samples(settings: Unlabeled, data_dir: str, labels: str | None,
                      from_table: bool) -> list[Sample]:
    """The unlabeled images, checked now: a missing folder, an empty one, or a table without
    empty-label rows fails in one line. ``from_table``: ``images`` names ``labels``."""
    from project.common.files import list_images

    where = Path(settings.images)
    if where.is_file():
        require(from_table, "data.unlabeled.images",
                "is a file: only the labels table (data.labels) can name unlabeled images, by rows "
                "with an empty label; else give a folder of images", settings.images)
        from project.data.tables import read_table

        table = read_table(labels, data_dir, unlabeled_ok=True)
        if table.problems:
            raise ConfigError(table.problems[0])
        paths = [str(Path(data_dir) / image) for image in table.unlabeled]
        require(bool(paths), "data.unlabeled.images", "names the labels table, but no row of it has an "
                "empty label", settings.images)
    else:
        require(where.is_dir(), "data.unlabeled.images", "does not exist: give a folder of images (any "
                "layout) or the labels table", settings.images)
        paths = list_images(where)
        require(bool(paths), "data.unlabeled.images", "holds no image files", settings.images)
    return [Sample(p, UNLABELED) for p in paths]


Views = tuple[torch.Tensor, torch.Tensor]


def two_views(weak: Callable, strong: Callable) -> Callable[[torch.Tensor], Views]:
    """One decoded image in, its (weak, strong) augmentations out, both drawn from the item's seed."""
    def transform(image: torch.Tensor) -> Views:
        return weak(image), strong(image)
    return transform


def view_transforms(pre, aug: Augmentation | None):
    """FixMatch's views: the labeled images' augmentation (weak) and the same plus RandAugment
    and a cut-out (strong)."""
    base = aug or Augmentation()
    strong = replace(base, auto_augment="randaugment", random_erasing=1.0)
    return two_views(train_transforms(pre, aug), train_transforms(pre, strong))


class UnlabeledSampler(EpochSampler):
    """``draws`` items per rank each epoch: rank r takes its own share of a seeded permutation of
    the unlabeled images (so no image goes to two ranks in one epoch), cycled when the epoch needs
    more than the share holds (``train_loaders`` sizes an epoch)."""

    def __init__(self, num_items: int, draws: int, seed: int = 0, num_replicas: int = 1,
                 rank: int = 0) -> None:
        if num_items < num_replicas:
            raise ConfigError(f"data.unlabeled.images: {num_items} unlabeled image(s) for {num_replicas} "
                              "processes; each process needs at least one")
        super().__init__(num_items, seed=seed + SEED_SALT, num_replicas=num_replicas, rank=rank)
        self.num_samples, self.total_size = draws, draws * num_replicas

    def global_draw(self) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(epoch_seed(self.seed, self.epoch))
        order = torch.randperm(self.num_items, generator=g)
        per_rank = []
        for r in range(self.num_replicas):
            share = order[r::self.num_replicas]
            per_rank.append(share.repeat(math.ceil(self.num_samples / len(share)))[: self.num_samples])
        indices = torch.stack(per_rank, 1).flatten()  # position k * R + r is rank r's k-th
        return indices, torch.randint(0, SEED_RANGE, (self.total_size,), generator=g)




def unlabeled_dataset(dm) -> ImageDataset:
    """The data module's unlabeled images with their two views, decoded (and cached) as its
    training images are; the run says so in one line."""
    samples, side = dm.unlabeled_samples, dm.short_side("train")
    dataset = ImageDataset(samples, view_transforms(dm.preprocessing, dm.augmentation),
                           dm.make_cache(samples, "unlabeled", side), dm.hparams.on_bad_image,
                           short_side=side)
    if dm.world()[1] == 0:
        u = dm.unlabeled
        log.info("Unlabeled: %d images from %s; %s with %d per labeled image, threshold %g, weight %g "
                 "(TensorBoard: train/unlabeled_above_threshold, train/pseudo_labels/*)",
                 len(samples), u.images, u.method, u.ratio, u.threshold, u.weight)
    return dataset


def train_loaders(dm, epoch: int) -> dict[str, DataLoader]:
    """The labeled and unlabeled loaders of a step each. An epoch is one pass over the unlabeled
    images (``ratio x data.batch_size`` a step), or over the labeled ones if those take more
    batches; the shorter side is cycled to as many."""
    world, rank = dm.world()
    batch = dm.batch_size * dm.unlabeled.ratio
    unlabeled = dm.datasets["unlabeled"]
    per_rank = (math.ceil(len(d) / world) for d in (dm.train_set, unlabeled))
    steps = max(math.ceil(n / b) for n, b in zip(per_rank, (dm.batch_size, batch), strict=True))
    sampler = UnlabeledSampler(len(unlabeled), steps * batch, dm.run_seed(), world, rank)
    sampler.set_epoch(epoch)
    return {"labeled": dm.labeled_loader(steps * dm.batch_size),
            "unlabeled": dm.loader(unlabeled, sampler, batch)}
