"""FolderDataModule: a folder of class subfolders in, seeded DataLoaders out."""

from __future__ import annotations

import logging
import os
from functools import cached_property
from typing import Literal

import lightning as L
import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import DataLoader

from project.data.datasets import ImageDataset, collate_skipping_bad
from project.data.folders import FolderSplits, Sample, discover
from project.data.images import ImageCache, decoded_bytes
from project.data.samplers import EpochSampler, class_balanced_weights
from project.data.transforms import eval_transforms, train_transforms
from project.errors import ConfigError

log = logging.getLogger(__name__)


class FolderDataModule(L.LightningDataModule):
    """Images in ``data_dir/{train,val,test}/<class>/`` (or one folder split here).

    Args:
        data_dir: the data folder; classes are its sorted subfolder names.
        image_size: side of the square crop the model sees.
        batch_size: per device; the global batch is this x devices x nodes x accumulation.
        num_workers: loader processes; ``None``: 0 when training on the CPU (the model already
            uses every core, and a loader process there only competes with it: measured 10 %
            slower on 2 cores), else ``min(8, CPUs - 1)``.
        pin_memory: page-locked batches for faster GPU copies; ``None``: on when on CUDA.
        persistent_workers: keep workers alive between epochs (no restart cost per epoch).
        prefetch_factor: batches each worker loads ahead; ``None`` keeps PyTorch's default.
        augment_strength: 0 (no random augmentation) .. 1 (strong); see ``train_transforms``.
        crop_ratio: evaluation crop / resize ratio (0.875 is the ImageNet convention).
        val_fraction, test_fraction: held out per class when the split folders are missing.
        split_seed: seed of that split (kept apart from the training seed on purpose).
        balanced_sampling: draw training images with class-balanced weights
            (``WeightedRandomSampler`` semantics), for imbalanced data.
        cache: ``memory`` decodes every image once and keeps it in RAM; ``auto`` does so when
            the decoded images fit in ``cache_gb``; ``none`` reads the files every epoch.
        cache_gb: memory budget of the cache in GiB.
        on_bad_image: ``skip`` (count and report undecodable files) or ``error``.
    """

    def __init__(
        self,
        data_dir: str = "data/demo",
        image_size: int = 224,
        batch_size: int = 64,
        num_workers: int | None = None,
        pin_memory: bool | None = None,
        persistent_workers: bool = True,
        prefetch_factor: int | None = None,
        augment_strength: float = 0.5,
        crop_ratio: float = 0.875,
        val_fraction: float = 0.15,
        test_fraction: float = 0.15,
        split_seed: int = 0,
        balanced_sampling: bool = False,
        cache: Literal["none", "memory", "auto"] = "auto",
        cache_gb: float = 2.0,
        on_bad_image: Literal["skip", "error"] = "skip",
    ) -> None:
        super().__init__()
        data_dir = str(data_dir)  # a Path would make checkpoints unreadable with weights_only
        self.save_hyperparameters(logger=False)  # logged with the run summary
        self.data_dir = data_dir
        self.image_size = image_size
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers
        self.prefetch_factor = prefetch_factor
        self.augment_strength = augment_strength
        self.crop_ratio = crop_ratio
        self.val_fraction, self.test_fraction, self.split_seed = val_fraction, test_fraction, split_seed
        self.balanced_sampling = balanced_sampling
        self.cache, self.cache_gb = cache, cache_gb
        self.on_bad_image = on_bad_image
        self.train_transform = train_transforms(image_size, augment_strength)  # validates early
        self.eval_transform = eval_transforms(image_size, crop_ratio)
        self.datasets: dict[str, ImageDataset] = {}

    def workers(self) -> int:
        """``num_workers``, or the automatic choice for the accelerator in use."""
        if self.num_workers is not None:
            return self.num_workers
        on_cpu = self.trainer is None or self.trainer.accelerator.__class__.__name__ == "CPUAccelerator"
        return 0 if on_cpu else min(8, max(1, (os.cpu_count() or 2) - 1))

    @cached_property
    def splits(self) -> FolderSplits:
        return discover(self.data_dir, self.val_fraction, self.test_fraction, self.split_seed)

    @property
    def class_names(self) -> list[str]:
        return self.splits.classes

    @property
    def num_classes(self) -> int:
        return len(self.splits.classes)

    def setup(self, stage: str | None = None) -> None:
        wanted = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",)}
        for split in wanted.get(stage or "fit", ("train", "val", "test")):
            if split not in self.datasets:
                self.datasets[split] = self.make_dataset(split)

    def make_dataset(self, split: str) -> ImageDataset:
        samples: list[Sample] = getattr(self.splits, split)
        if not samples:
            raise ConfigError(
                f"the {split} split of '{self.data_dir}' is empty: add a {split}/ folder with the "
                f"same class folders as train/ (or set data.{split}_fraction above 0)"
            )
        transform = self.train_transform if split == "train" else self.eval_transform
        return ImageDataset(samples, transform, self.make_cache(samples, split), self.on_bad_image)

    def make_cache(self, samples: list[Sample], split: str) -> ImageCache | None:
        if self.cache == "none":
            return None
        need = sum(decoded_bytes(s.path) for s in samples) / 2**30
        if need > self.cache_gb:
            message = (f"the decoded {split} images need {need:.2f} GiB, more than "
                       f"data.cache_gb={self.cache_gb}")
            if self.cache == "memory":
                raise ConfigError(f"{message}: raise data.cache_gb or set data.cache=none")
            log.info("%s: not caching them", message)
            return None
        return ImageCache([s.path for s in samples])

    @property
    def train_set(self) -> ImageDataset:
        return self.datasets["train"]

    def _world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)

    def _loader(self, dataset: ImageDataset, sampler: torch.utils.data.Sampler) -> DataLoader:
        trainer = self.trainer
        on_cuda = trainer is not None and trainer.accelerator.__class__.__name__ == "CUDAAccelerator"
        workers = self.workers()
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=sampler,
            num_workers=workers,
            pin_memory=on_cuda if self.pin_memory is None else self.pin_memory,
            persistent_workers=self.persistent_workers and workers > 0,
            prefetch_factor=self.prefetch_factor if workers > 0 else None,
            collate_fn=collate_skipping_bad,
            generator=torch.Generator().manual_seed(_global_seed()),
        )

    def train_dataloader(self) -> DataLoader:
        dataset = self.train_set
        world, rank = self._world()
        overfitting = self.trainer is not None and self.trainer.overfit_batches > 0
        weights = None
        if self.balanced_sampling and not overfitting:
            weights = class_balanced_weights(dataset.targets, self.num_classes)
        sampler = EpochSampler(len(dataset), weights, shuffle=not overfitting, seed=_global_seed(),
                               num_replicas=world, rank=rank)
        if self.trainer is not None:  # a resumed run starts at its restored epoch: workers
            # prefetch as soon as the loader is iterated, before Lightning calls set_epoch
            sampler.set_epoch(self.trainer.fit_loop.epoch_progress.current.processed)
        return self._loader(dataset, sampler)

    def _eval_loader(self, split: str) -> DataLoader:
        dataset = self.datasets[split]
        world, rank = self._world()
        # Each image evaluated exactly once across ranks: no padding duplicates in the metrics.
        sampler = UnrepeatedDistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False)
        return self._loader(dataset, sampler)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")


def _global_seed() -> int:
    """The seed given to ``seed_everything`` (Lightning exports it), else 0."""
    return int(os.environ.get("PL_GLOBAL_SEED", 0))
