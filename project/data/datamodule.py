"""FolderDataModule: a folder of class subfolders in, seeded DataLoaders out."""

import logging
import os
from functools import cached_property
from pathlib import Path
from typing import Literal

import lightning as L
import torch
from lightning.pytorch.accelerators import CUDAAccelerator
from torch.utils.data import DataLoader

from project import tasks
from project.common.preprocessing import Preprocessing, from_plain, plain
from project.data import folders
from project.data.datasets import ImageDataset, collate_skipping_bad
from project.data.folders import FolderSplits, Sample
from project.data.images import ImageCache, decoded_bytes, needed_side, notice_size_mismatch
from project.data.samplers import EpochSampler, ShardSampler
from project.data.transforms import Augmentation, check_scale_agreement, eval_transforms, train_transforms
from project.data.unlabeled import Unlabeled
from project.errors import ConfigError, require_all

log = logging.getLogger(__name__)


class FolderDataModule(L.LightningDataModule):
    """Images in ``data_dir/{train,val,test}/<class>/`` (or one folder, split here), a ``labels``
    table, or optimized shards; ``preprocessing`` is the model's (the CLI links it)."""

    def __init__(
        self,
        data_dir: str = "data/demo",
        labels: str | None = None,
        task: str = "auto",
        batch_size: int = 64,
        num_workers: int | None = None,
        pin_memory: bool | None = None,
        persistent_workers: bool = True,
        prefetch_factor: int | None = None,
        augmentation: Augmentation | None = Augmentation(),
        val_fraction: float = 0.15,
        test_fraction: float = 0.15,
        split_seed: int = 0,
        seed: int | None = None,
        balanced_sampling: bool = False,
        cache: Literal["none", "memory", "auto"] = "auto",
        cache_gb: float = 2.0,
        decode_side: int | Literal["auto", "full"] = "auto",
        on_bad_image: Literal["skip", "error"] = "skip",
        extra_val: dict[str, str] | None = None,
        unlabeled: Unlabeled | str | None = Unlabeled(),
        preprocessing: Preprocessing | dict | None = None,
    ) -> None:
        super().__init__()
        require_all(
            (batch_size >= 1, "data.batch_size", "must be an integer >= 1", batch_size),
            (0 <= (num_workers or 0) <= 256, "data.num_workers", "must be >= 0 and <= 256 or null",
             num_workers),
            (prefetch_factor is None or prefetch_factor >= 1, "data.prefetch_factor", "must be >= 1 or null",
             prefetch_factor),
            (cache_gb > 0, "data.cache_gb", "must be above 0 (data.cache=none turns it off)", cache_gb),
            (decode_side in ("auto", "full") or (isinstance(decode_side, int) and decode_side > 0),
             "data.decode_side", "must be auto, full or a number of pixels", decode_side))
        folders.check_fractions(val_fraction, test_fraction)
        augmentation = from_plain(Augmentation, augmentation, "data.augmentation")
        if augmentation is not None:
            augmentation.check()
        if isinstance(unlabeled, str):  # data.unlabeled: DIR, short for data.unlabeled.images
            unlabeled = Unlabeled(images=unlabeled)
        self.unlabeled = (from_plain(Unlabeled, unlabeled, "data.unlabeled") or Unlabeled()).check()
        self.save_hyperparameters(logger=False)  # the run summary logs them with the model's
        data_dir = str(data_dir)  # a Path would not load with weights_only
        if data_dir.startswith("~"):  # the shell leaves ~ alone in --data.data_dir=~/photos
            data_dir = os.path.expanduser(data_dir)
        self.preprocessing = from_plain(Preprocessing, preprocessing, "data.preprocessing") or Preprocessing()
        self.hparams.update(data_dir=data_dir, augmentation=augmentation and plain(augmentation),
                            unlabeled=plain(self.unlabeled), preprocessing=plain(self.preprocessing),
                            labels=None if labels is None else str(labels))
        self.data_dir, self.batch_size, self.num_workers = data_dir, batch_size, num_workers
        self.augmentation, self.seed, self.cache = augmentation, seed, cache
        self.datasets: dict[str, ImageDataset] = {}
        self.streaming = "://" in data_dir or (Path(data_dir) / folders.STREAMING_MANIFEST).is_file()
        require_all(
            (task == "auto" or labels is not None or tasks.task_class(task).reads_class_folders, "data.task",
             "of a task that class folders do not hold needs data.labels (a table)", task),
            (labels is None or not self.streaming, "data.labels", "is not for streamed shards", labels),
            (self.unlabeled.images is None or not self.streaming, "data.unlabeled.images",
             "is not for streamed shards: give data.data_dir as a folder", self.unlabeled.images))

    @cached_property
    def splits(self) -> FolderSplits:
        hp = self.hparams
        if hp.labels is not None:  # a table of image,label[s] rows
            from project.data.tables import discover_table

            return discover_table(hp.labels, self.data_dir, hp.task, hp.val_fraction, hp.test_fraction,
                                  hp.split_seed, unlabeled_ok=self.unlabeled.images is not None
                                  and self.rare.unlabeled_from_table)
        return folders.discover(self.data_dir, hp.val_fraction, hp.test_fraction, hp.split_seed)

    @cached_property
    def rare(self):
        """Unlabeled images and extra validation sets, loaded only by a run that has them."""
        from project.data.rare_sources import RareSources

        return RareSources(self)

    @property
    def class_names(self) -> list[str]:
        return list(self.streamed.manifest["classes"]) if self.streaming else self.splits.classes

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def task(self) -> str:
        """The task the labels describe: class folders' default, or a labels table's own."""
        task = tasks.check_name(None if self.streaming else self.splits.task)
        if self.hparams.balanced_sampling:  # read when the CLI links it: before any run folder
            self.task_type.sample_weights(self.train_targets, self.num_classes)
        return task

    @cached_property
    def task_type(self):
        """The task's class: what turns labels into targets, draw weights and statistics."""
        return tasks.task_class(None if self.streaming else self.splits.task)

    @property
    def train_targets(self) -> list:
        if self.streaming:
            return list(self.streamed.manifest["splits"]["train"]["labels"])
        return [s.label for s in self.splits.train]

    @cached_property
    def extra_val_names(self) -> list[str]:
        """The extra validation sets' names, checked before any run folder exists."""
        return self.rare.extra_val_names() if self.hparams.extra_val else []

    @cached_property
    def unlabeled_samples(self) -> list[Sample]:
        """The unlabeled images, listed and checked once, before any run folder."""
        return self.rare.unlabeled_samples() if self.unlabeled.images is not None else []

    @property
    def unlabeled_objective(self) -> dict | None:
        """The semi-supervised objective's settings (the CLI links them into model.unlabeled)."""
        self.unlabeled_samples  # noqa: B018 (a missing or empty folder fails now, in one line)
        return self.unlabeled.objective()

    @property
    def label_stats(self) -> dict:
        """What the model needs of the training labels (the CLI links it into model.label_stats)."""
        return self.task_type.summarise_labels(self.train_targets, self.num_classes)

    @cached_property
    def streamed(self):  # the streaming extra: datasets and loaders of an optimized data set
        from project.extras.streaming.dataset import Streamed

        return Streamed(self)

    @property
    def train_set(self) -> ImageDataset:
        return self.datasets["train"]

    def short_side(self, split: str) -> int | None:
        """The short side the images of ``split`` are decoded at (None: full size)."""
        pre, side = self.preprocessing, self.hparams.decode_side
        if split != "train" or self.augmentation is None:
            return needed_side(pre)
        if side == "full":
            return None
        if side == "auto":
            return needed_side(pre, self.augmentation.crop_scale)
        return max(side, pre.resize_size)

    def transform(self, split: str):
        pre = self.preprocessing
        return train_transforms(pre, self.augmentation) if split == "train" else eval_transforms(pre)

    def setup(self, stage: str | None = None) -> None:
        if self.augmentation is not None:
            check_scale_agreement(self.preprocessing, self.augmentation)
        wanted = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",)}
        for split in wanted.get(stage or "fit", ("train", "val", "test")):
            if split not in self.datasets:
                self.datasets[split] = self.make_dataset(split)
        if self.extra_val_names or stage in (None, "fit") and self.unlabeled_samples:
            self.rare.setup(stage or "fit")

    def state_dict(self) -> dict:
        """In every checkpoint: the settings its split was drawn with (checkpoints.refuse_split_changes)."""
        return {"split": {} if self.streaming else self.splits.drawn}

    def make_dataset(self, split: str) -> ImageDataset:
        if self.streaming:
            return self.streamed.dataset(split)
        samples: list[Sample] = getattr(self.splits, split)
        if not samples:
            fix = folders.empty_split_fix(self.data_dir, split, self.hparams.get(f"{split}_fraction", 0.0))
            raise ConfigError(f"the {split} split of '{self.data_dir}' is empty: {fix}")
        if split == "train" and self.world()[1] == 0:  # once a run: input size against the images'
            notice_size_mismatch([s.path for s in samples], self.preprocessing.image_size,
                                 crop_ratio=self.preprocessing.crop_ratio)
            folders.notice_left_out(self.splits.left_out, self.data_dir)
            folders.notice_similar_classes(self.class_names)
        side = self.short_side(split)
        return ImageDataset(samples, self.transform(split), self.make_cache(samples, split, side),
                            self.hparams.on_bad_image, short_side=side, target=self.task_type.target)

    def make_cache(self, samples: list[Sample], split: str, side: int | None) -> ImageCache | None:
        if self.cache == "none":
            return None
        need_bytes = sum(decoded_bytes(s.path, side) for s in samples)
        if need_bytes / 2**30 > self.hparams.cache_gb:
            message = (f"the decoded {split} images need {need_bytes / 2**30:.2f} GiB, more than "
                       f"data.cache_gb={self.hparams.cache_gb}")
            if self.cache == "memory":
                raise ConfigError(f"{message}: raise data.cache_gb or set data.cache=none")
            log.info("%s: not caching them", message)
            return None
        paths = [s.path for s in samples]
        if self.world()[0] > 1:  # one copy per node, mapped by every rank
            from project.data.shared_cache import shared_cache

            return shared_cache(paths, side, f"{split}-{side}", self.trainer.local_rank,
                                self.trainer.strategy.barrier, need_bytes)
        return ImageCache.decode(paths, side)

    def world(self) -> tuple[int, int]:
        return (self.trainer.world_size, self.trainer.global_rank) if self.trainer else (1, 0)

    def on_cuda(self) -> bool:
        return self.trainer is not None and isinstance(self.trainer.accelerator, CUDAAccelerator)

    def workers(self) -> int:
        """``num_workers``; null: none on a CPU (they would compete with the model), else up to 8."""
        if self.num_workers is not None:
            return self.num_workers
        return min(8, max(1, (os.cpu_count() or 2) - 1)) if self.on_cuda() else 0

    def pin_memory(self) -> bool:
        return self.on_cuda() if self.hparams.pin_memory is None else self.hparams.pin_memory

    def run_seed(self) -> int:
        return self.seed if self.seed is not None else torch.initial_seed() % 2**31

    def loader(self, dataset, sampler=None, batch_size: int | None = None) -> DataLoader:
        workers, hp = self.workers(), self.hparams
        return DataLoader(
            dataset, batch_size=batch_size or self.batch_size, sampler=sampler, num_workers=workers,
            pin_memory=self.pin_memory(),
            persistent_workers=hp.persistent_workers and workers > 0,
            prefetch_factor=hp.prefetch_factor if workers > 0 else None,
            collate_fn=collate_skipping_bad, generator=torch.Generator().manual_seed(self.run_seed()))

    def train_dataloader(self) -> DataLoader | dict[str, DataLoader]:
        if "unlabeled" in self.datasets:
            return self.rare.train_loaders(epoch_to_start(self.trainer))
        return self.labeled_loader()

    def labeled_loader(self, draws: int | None = None) -> DataLoader:
        """The labeled images' loader: each once an epoch, or ``draws`` of them per rank (cycled)."""
        if self.streaming:
            return self.streamed.train_loader()
        world, rank = self.world()
        overfitting = self.trainer is not None and self.trainer.overfit_batches > 0
        weights = None
        if self.hparams.balanced_sampling and not overfitting:
            weights = self.task_type.sample_weights(self.train_set.targets, self.num_classes)
        sampler = EpochSampler(len(self.train_set), weights, shuffle=not overfitting,
                               seed=self.run_seed(), num_replicas=world, rank=rank, draws=draws)
        sampler.set_epoch(epoch_to_start(self.trainer))
        return self.loader(self.train_set, sampler)

    def eval_loader(self, split: str) -> DataLoader:
        if self.streaming and split in ("val", "test"):
            return self.streamed.eval_loader(split)
        world, rank = self.world()
        return self.loader(self.datasets[split], ShardSampler(len(self.datasets[split]), world, rank))

    def val_dataloader(self) -> DataLoader | list[DataLoader]:
        loaders = [self.eval_loader(split) for split in ("val", *(f"val_{n}" for n in self.extra_val_names))]
        return loaders if self.extra_val_names else loaders[0]

    def test_dataloader(self) -> DataLoader:
        return self.eval_loader("test")


def epoch_to_start(trainer: L.Trainer | None) -> int:
    """The epoch a fit is about to run when its loader is made: Lightning's ``set_epoch`` comes
    after the first batches are drawn, and no public counter holds it yet."""
    if trainer is None:
        return 0
    return trainer.fit_loop.epoch_progress.current.processed
