"""FolderDataModule: a folder of class subfolders in, seeded DataLoaders out."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Literal

import lightning as L
import torch
from lightning.pytorch.accelerators import CPUAccelerator, CUDAAccelerator
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler  # no public export
from torch.utils.data import DataLoader

from project.data.datasets import ImageDataset, collate_skipping_bad
from project.data.folders import FolderSplits, Sample, check_fractions, discover
from project.data.images import ImageCache, decode_side, decoded_bytes, shared_cache
from project.data.optimize import is_streaming
from project.data.samplers import EpochSampler, class_balanced_weights
from project.data.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Augmentation,
    AutoAugment,
    Interpolation,
    Preprocessing,
    check_scale_agreement,
    eval_transforms,
    train_transforms,
)
from project.errors import ConfigError, require

log = logging.getLogger(__name__)


class FolderDataModule(L.LightningDataModule):
    """Images in ``data_dir/{train,val,test}/<class>/`` (or one folder split here), or the
    chunks ``optimize-data`` made of such a folder, streamed (``streaming.py``).

    Args:
        data_dir: the data folder; classes are its sorted subfolder names. An optimized folder
            (with ``project.json``) or a URL of one streams it with LitData instead; the split
            settings and the cache then do not apply (they were fixed when it was optimized).
        image_size: side of the square crop the model sees.
        batch_size: per device; the global batch is this x devices x nodes x accumulation.
        num_workers: loader processes; ``None``: 0 when training on the CPU (the model already
            uses every core, and a loader process there only competes with it: measured 10 %
            slower on 2 cores), else ``min(8, CPUs - 1)``.
        pin_memory: page-locked batches for faster GPU copies; ``None``: on when on CUDA.
        persistent_workers: keep workers alive between epochs (no restart cost per epoch).
        prefetch_factor: batches each worker loads ahead; ``None`` keeps PyTorch's default.
        augment: false turns every random augmentation off (the overfit check uses this).
        hflip, vflip, crop_scale, color_jitter, auto_augment, random_erasing: the training
            augmentation (see ``transforms.Augmentation``; README "Your own data" says what
            suits photos, characters, medical and satellite images).
        crop_ratio, interpolation, mean, std: evaluation preprocessing; null: that of the
            model's pretrained weights (the CLI fills them in), else ImageNet's convention.
        val_fraction, test_fraction: held out per class when the split folders are missing.
        split_seed: seed of that split (kept apart from the training seed on purpose).
        balanced_sampling: draw training images with class-balanced weights
            (``WeightedRandomSampler`` semantics), for imbalanced data.
        cache: ``memory`` decodes every image once and keeps it in RAM; ``auto`` does so when
            the decoded images fit in ``cache_gb``; ``none`` reads the files every epoch. Under
            DDP, local rank 0 decodes and the node's ranks map its copy (``images.shared_cache``).
        cache_gb: memory budget of the cache in GiB.
        decode_side: short side training images are decoded at (once, before the cache):
            ``auto`` the smallest random crop's need (``images.decode_side``: 290 px at 224);
            a number of pixels (more keeps finer detail in the crops, and costs cache memory);
            ``full`` no reduction. Evaluation always decodes at the resize it needs.
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
        augment: bool = True,
        hflip: float = 0.5,
        vflip: float = 0.0,
        crop_scale: tuple[float, float] = (0.6, 1.0),
        color_jitter: float = 0.2,
        auto_augment: AutoAugment = "none",
        random_erasing: float = 0.0,
        crop_ratio: float | None = None,
        interpolation: Interpolation | None = None,
        mean: list[float] | None = None,
        std: list[float] | None = None,
        val_fraction: float = 0.15,
        test_fraction: float = 0.15,
        split_seed: int = 0,
        balanced_sampling: bool = False,
        cache: Literal["none", "memory", "auto"] = "auto",
        cache_gb: float = 2.0,
        decode_side: int | Literal["auto", "full"] = "auto",
        on_bad_image: Literal["skip", "error"] = "skip",
    ) -> None:
        super().__init__()
        check_ranges(image_size=image_size, batch_size=batch_size, num_workers=num_workers,
                     prefetch_factor=prefetch_factor, cache_gb=cache_gb)
        check_fractions(val_fraction, test_fraction)
        data_dir = str(data_dir)  # a Path would make checkpoints unreadable with weights_only
        self.save_hyperparameters(logger=False)  # logged with the run summary
        self.data_dir = data_dir
        self.image_size = image_size
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers
        self.prefetch_factor = prefetch_factor
        self.val_fraction, self.test_fraction, self.split_seed = val_fraction, test_fraction, split_seed
        self.balanced_sampling = balanced_sampling
        self.cache, self.cache_gb = cache, cache_gb
        require(decode_side in ("auto", "full") or (isinstance(decode_side, int) and decode_side > 0),
                "data.decode_side", "must be auto, full or a number of pixels", decode_side)
        self.train_decode_side = decode_side
        self.on_bad_image = on_bad_image
        self.preprocessing = Preprocessing(  # validates early, before any work
            image_size, 0.875 if crop_ratio is None else crop_ratio, interpolation or "bilinear",
            tuple(mean or IMAGENET_MEAN), tuple(std or IMAGENET_STD))
        self.augmentation = Augmentation(hflip, vflip, tuple(crop_scale), color_jitter, auto_augment,
                                         random_erasing) if augment else None
        if self.augmentation is not None:
            check_scale_agreement(self.preprocessing, self.augmentation)
        self.train_transform = train_transforms(self.preprocessing, self.augmentation)
        self.eval_transform = eval_transforms(self.preprocessing)
        self.datasets: dict[str, ImageDataset] = {}
        self.streaming = is_streaming(data_dir)

    def workers(self) -> int:
        """``num_workers``, or the automatic choice for the accelerator in use."""
        if self.num_workers is not None:
            return self.num_workers
        on_cpu = self.trainer is None or isinstance(self.trainer.accelerator, CPUAccelerator)
        return 0 if on_cpu else min(8, max(1, (os.cpu_count() or 2) - 1))

    @cached_property
    def splits(self) -> FolderSplits:
        return discover(self.data_dir, self.val_fraction, self.test_fraction, self.split_seed)

    @cached_property
    def manifest(self) -> dict:
        """What ``optimize-data`` recorded: classes, split sizes and labels, source."""
        from project.data.streaming import load_manifest  # litdata: imported only when streaming

        return load_manifest(self.data_dir)

    @property
    def class_names(self) -> list[str]:
        return list(self.manifest["classes"]) if self.streaming else self.splits.classes

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def setup(self, stage: str | None = None) -> None:
        wanted = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",)}
        for split in wanted.get(stage or "fit", ("train", "val", "test")):
            if split not in self.datasets:
                self.datasets[split] = self.make_dataset(split)

    def make_dataset(self, split: str) -> ImageDataset:
        if self.streaming:
            return self.make_streaming_dataset(split)
        samples: list[Sample] = getattr(self.splits, split)
        if not samples:
            raise ConfigError(f"the {split} split of '{self.data_dir}' is empty: "
                              f"{self.empty_split_fix(split)}")
        transform = self.train_transform if split == "train" else self.eval_transform
        side = self.decode_side(split)
        return ImageDataset(samples, transform, self.make_cache(samples, split, side), self.on_bad_image,
                            short_side=side)

    def make_streaming_dataset(self, split: str):  # -> streaming.StreamingImages
        if not self.manifest["splits"].get(split, {}).get("size"):
            raise ConfigError(f"the {split} split of '{self.data_dir}' is empty: optimize a source "
                              f"that has {split} images (python -m project optimize-data SRC OUT)")
        from project.data.streaming import streaming_dataset

        train = split == "train"
        return streaming_dataset(self.data_dir, self.manifest, split,
                                 self.train_transform if train else self.eval_transform,
                                 self.decode_side(split), train, self._world()[0] > 1, _global_seed(),
                                 self.augmentation is not None, self.on_bad_image)

    def decode_side(self, split: str) -> int | None:
        """The short side the images of ``split`` are decoded at: large photos are reduced
        once, on decode, to what the transforms need (``images.decode_side``); None: full size."""
        if split != "train" or self.augmentation is None:
            return decode_side(self.preprocessing)
        if self.train_decode_side == "full":
            return None
        if self.train_decode_side == "auto":
            return decode_side(self.preprocessing, self.augmentation.crop_scale)
        return max(self.train_decode_side, self.preprocessing.resize_size)

    def empty_split_fix(self, split: str) -> str:
        """With a train/ folder no test set is ever split off: only a test/ folder gives one."""
        if not (Path(self.data_dir) / "train").is_dir():
            if split == "train":
                return "lower data.val_fraction and data.test_fraction, or add images"
            return f"set data.{split}_fraction above 0, or add images"
        if split == "test":
            return ("add a test/ folder with the same class folders as train/ (data.test_fraction "
                    "applies only to a folder without train/)")
        return f"add a {split}/ folder with the same class folders as train/, or raise data.{split}_fraction"

    def make_cache(self, samples: list[Sample], split: str, side: int | None = None) -> ImageCache | None:
        if self.cache == "none":
            return None
        need_bytes = sum(decoded_bytes(s.path, side) for s in samples)
        need = need_bytes / 2**30
        if need > self.cache_gb:
            message = (f"the decoded {split} images need {need:.2f} GiB, more than "
                       f"data.cache_gb={self.cache_gb}")
            if self.cache == "memory":
                raise ConfigError(f"{message}: raise data.cache_gb or set data.cache=none")
            log.info("%s: not caching them", message)
            return None
        paths = [s.path for s in samples]
        if self._world()[0] > 1:  # one copy per node, mapped by every rank, not one per rank
            return shared_cache(paths, side, f"{split}-{side}", self.trainer.local_rank,
                                self.trainer.strategy.barrier, need_bytes)
        return ImageCache(paths, short_side=side)

    @property
    def train_set(self) -> ImageDataset:
        return self.datasets["train"]

    def _world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)

    def _loader(self, dataset: ImageDataset, sampler: torch.utils.data.Sampler | None) -> DataLoader:
        trainer = self.trainer
        on_cuda = trainer is not None and isinstance(trainer.accelerator, CUDAAccelerator)
        workers = self.workers()
        pin = on_cuda if self.pin_memory is None else self.pin_memory
        if sampler is None:  # an optimized data set: LitData shares it out by rank and worker
            from project.data.streaming import streaming_loader

            return streaming_loader(dataset, self.batch_size, workers, pin, self.prefetch_factor)
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=sampler,
            num_workers=workers,
            pin_memory=pin,
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
            if self.streaming:  # drawn by random access: the chunks are read out of order
                from project.data.streaming import RandomAccess

                dataset = RandomAccess(dataset)
        elif self.streaming:
            return self._loader(dataset, None)
        sampler = EpochSampler(len(dataset), weights, shuffle=not overfitting, seed=_global_seed(),
                               num_replicas=world, rank=rank)
        if self.trainer is not None:  # a resumed run starts at its restored epoch: workers
            # prefetch as soon as the loader is iterated, before Lightning calls set_epoch
            sampler.set_epoch(self.trainer.fit_loop.epoch_progress.current.processed)
        return self._loader(dataset, sampler)

    def _eval_loader(self, split: str) -> DataLoader:
        dataset = self.datasets[split]
        if self.streaming:
            return self._loader(dataset, None)
        world, rank = self._world()
        # Each image evaluated exactly once across ranks: no padding duplicates in the metrics.
        sampler = UnrepeatedDistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False)
        return self._loader(dataset, sampler)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")


# What each numeric setting allows; checked in __init__, so a bad value fails before any work.
RANGES: dict[str, tuple[str, Callable[[float], bool]]] = {
    "image_size": ("an integer >= 1", lambda v: v >= 1),
    "batch_size": ("an integer >= 1", lambda v: v >= 1),
    "num_workers": ("an integer >= 0 (or null: automatic)", lambda v: v >= 0),
    "prefetch_factor": ("an integer >= 1 (or null: PyTorch's default)", lambda v: v >= 1),
    "cache_gb": ("above 0 (data.cache=none turns the cache off)", lambda v: v > 0),
}


def check_ranges(**values: float | None) -> None:
    """Raise :class:`ConfigError` naming the first out-of-range setting, instead of a torch
    error at the first batch (jsonargparse's own range types would print the whole usage and
    store their own classes in the checkpoints, which ``weights_only`` loading refuses)."""
    for key, value in values.items():
        allowed, ok = RANGES[key]
        require(value is None or ok(value), f"data.{key}", f"must be {allowed}", value)


def _global_seed() -> int:
    """The seed given to ``seed_everything`` (Lightning exports it), else 0."""
    return int(os.environ.get("PL_GLOBAL_SEED", 0))
