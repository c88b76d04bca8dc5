"""Train from an optimized data set (``optimize-data``) with LitData's streaming loader.

``data.data_dir`` naming a folder with ``project.json`` (or an ``s3://`` URL of one) makes
``FolderDataModule`` hand its datasets and loaders to :class:`Streamed`; nothing else changes.
Each rank streams a disjoint share of the chunks, and ``StreamingDataLoader``'s ``state_dict`` is
stored in every checkpoint, so a run stopped mid-epoch resumes at the next unseen sample. The
augmentation of a sample is drawn from (seed, epoch, sample index): it does not depend on the
number of workers or ranks, nor on an interruption.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from lightning.pytorch.utilities import rank_zero_only
from litdata import StreamingDataLoader, StreamingDataset
from litdata.streaming.sampler import ChunkedIndex
from torch.utils.data import Dataset

from project.data.datasets import bad_image_error, collate_skipping_bad, seeded_transform
from project.data.images import DECODE_ERRORS, decode
from project.data.samplers import SEED_RANGE, EpochSampler, epoch_seed
from project.errors import ConfigError
from project.extras.streaming import objects
from project.extras.streaming.optimize import FORMAT, MANIFEST, read_manifest

SPLIT_SETTINGS = ("val_fraction", "test_fraction", "split_seed")  # optimize-data's, fixed in the shards
log = logging.getLogger("project")


class _DropLastNotice(logging.Filter):
    """Evaluation keeps every image under DDP on purpose (``drop_last=False``); LitData warns
    about it because unequal shares would hang training, not evaluation."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "disabled the `drop_last` option" not in record.getMessage()


logging.getLogger("litdata.streaming.dataset").addFilter(_DropLastNotice())


def load_manifest(data_dir: str) -> dict:
    """``project.json`` of an optimized data set: a local folder, or ``s3://bucket/prefix`` (the
    endpoint and credentials from the usual AWS variables, as LitData uses); any problem
    reaching it is one line, before training starts."""
    if "://" not in data_dir:
        manifest = read_manifest(data_dir)
    elif data_dir.startswith("s3://"):
        manifest = objects.read_json(data_dir, MANIFEST)
        objects.route_compatible_stores()
    else:
        raise ConfigError(f"data.data_dir '{data_dir}': only local folders and s3:// URLs are streamed")
    if manifest is None or manifest.get("format") != FORMAT:
        raise ConfigError(f"'{data_dir}' is not a data set written by `python -m project optimize-data` "
                          f"(its {MANIFEST} is missing or of another version): run optimize-data again")
    return manifest


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The augmentation seed of sample ``index`` in ``epoch``: fixed by the three alone."""
    g = torch.Generator().manual_seed(epoch_seed(epoch_seed(seed, epoch), index))  # the same mixing rule
    return int(torch.randint(0, SEED_RANGE, (1,), generator=g))


class StreamingImages(StreamingDataset):
    """One split's chunks as (image, label): decoded, then transformed with a per-sample seed.
    Keys: LitData's own (when streamed), an int, or ``(index, seed)`` from ``EpochSampler``."""

    def __init__(self, input_dir: str, transform: Callable[[torch.Tensor], torch.Tensor],
                 labels: list[int], short_side: int | None, shuffle: bool, drop_last: bool,
                 seed: int, augment: bool, on_bad_image: str = "skip") -> None:
        # "full": every epoch a full permutation within each chunk; LitData's default shuffles
        # blocks of 256 consecutive items, which keeps images stored side by side together
        super().__init__(input_dir, shuffle=shuffle, drop_last=drop_last, seed=seed,
                         item_shuffle_window="full")
        self.image_transform = transform  # not `transform`: StreamingDataset applies that to the raw item
        self.targets, self.short_side, self.on_bad_image = labels, short_side, on_bad_image
        self.augment_seed = seed if augment else None
        self.bad_flags = torch.zeros(len(labels), dtype=torch.uint8).share_memory_()

    def __getitem__(self, key):  # noqa: ANN001 - LitData's ChunkedIndex, an int or (int, seed)
        seed = None
        if isinstance(key, tuple) and not isinstance(key, ChunkedIndex):
            key, seed = key
        item = super().__getitem__(key)
        index = key.index if isinstance(key, ChunkedIndex) else int(key)
        if seed is None and self.augment_seed is not None:
            seed = sample_seed(self.augment_seed, self.current_epoch, index)
        try:
            image = decode(item["image"], self.short_side)
        except DECODE_ERRORS as err:
            if self.on_bad_image == "error":
                raise bad_image_error(item["path"].decode(), err) from err
            self.bad_flags[index] = 1
            return None
        return seeded_transform(self.image_transform, image, seed), item["label"]

    def skipped_paths(self) -> list[str]:
        """Stored images that could not be decoded (``optimize-data`` leaves such files out)."""
        return [StreamingDataset.__getitem__(self, i)["path"].decode()
                for i in self.bad_flags.nonzero().flatten().tolist()]


class RandomAccess(Dataset):
    """A map-style view of :class:`StreamingImages` for a sampler (class-balanced draws)."""

    def __init__(self, dataset: StreamingImages) -> None:
        self.dataset, self.targets = dataset, dataset.targets

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, key):  # noqa: ANN001 - an int or (int, seed)
        return self.dataset[key]

    def skipped_paths(self) -> list[str]:
        return self.dataset.skipped_paths()


class Streamed:
    """The streaming side of a ``FolderDataModule`` whose ``data_dir`` is an optimized set."""

    def __init__(self, dm) -> None:
        self.dm = dm
        self.manifest = load_manifest(dm.data_dir)
        self.follow_shards_split()

    def follow_shards_split(self) -> None:
        """The shards hold optimize-data's split: other data.* split settings cannot apply, so the
        run says so and records the shards' values (hparams.yaml, TensorBoard's HPARAMS)."""
        made = self.manifest.get("settings", {})
        hp = self.dm.hparams
        other = {k: (hp[k], made[k]) for k in SPLIT_SETTINGS if k in made and hp.get(k) != made[k]}
        if other and rank_zero_only.rank == 0:
            asked = ", ".join(f"data.{k}={a} (the shards': {b})" for k, (a, b) in other.items())
            again = " ".join(f"--{k.replace('_', '-')} {a}" for k, (a, _) in other.items())
            log.warning("Notice: %s not applied: '%s' holds the split optimize-data made; make the shards "
                        "again with %s to change it", asked, self.dm.data_dir, again)
        hp.update({k: b for k, (_, b) in other.items()})

    def dataset(self, split: str) -> StreamingImages:
        """Training shuffles (LitData's chunk-then-item shuffle) and, under DDP, drops the
        remainder that would give ranks unequal batch counts; evaluation keeps every image."""
        dm = self.dm
        if not self.manifest["splits"].get(split, {}).get("size"):
            raise ConfigError(f"the {split} split of '{dm.data_dir}' is empty: optimize a source that "
                              f"has {split} images (python -m project optimize-data SRC OUT)")
        train = split == "train"
        return StreamingImages(f"{dm.data_dir.rstrip('/')}/{split}", dm.transform(split),
                               self.manifest["splits"][split]["labels"], dm.short_side(split),
                               shuffle=train, drop_last=train and dm.world()[0] > 1, seed=dm.run_seed(),
                               augment=train and dm.augmentation is not None,
                               on_bad_image=dm.hparams.on_bad_image)

    def loader(self, dataset) -> StreamingDataLoader:
        """No persistent workers: LitData starts each epoch's workers with the new epoch's plan."""
        dm, workers = self.dm, self.dm.workers()
        return StreamingDataLoader(dataset, batch_size=dm.batch_size, num_workers=workers,
                                   pin_memory=dm.pin_memory(),
                                   prefetch_factor=dm.hparams.prefetch_factor if workers > 0 else None,
                                   collate_fn=collate_skipping_bad)

    def train_loader(self):
        dm = self.dm
        if not dm.hparams.balanced_sampling:
            return self.loader(dm.train_set)
        world, rank = dm.world()  # drawn by random access: the chunks are read out of order
        targets = dm.train_set.targets
        sampler = EpochSampler(len(targets), dm.task_type.sample_weights(targets, dm.num_classes),
                               seed=dm.run_seed(), num_replicas=world, rank=rank)
        return dm.loader(RandomAccess(dm.train_set), sampler)

    def eval_loader(self, split: str) -> StreamingDataLoader:
        return self.loader(self.dm.datasets[split])
