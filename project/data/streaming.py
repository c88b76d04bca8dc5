"""Train from an optimized data set (``optimize-data``) with LitData's streaming loader.

``data.data_dir`` naming a folder with ``project.json`` (or a URL such as ``s3://bucket/set``
that LitData reads) switches ``FolderDataModule`` to this path; nothing else changes. Each
rank streams a disjoint share of the chunks (``StreamingDataset`` splits them by rank and
worker), and ``StreamingDataLoader`` has a ``state_dict`` that Lightning stores in every
checkpoint, so a run stopped mid-epoch resumes at the next unseen sample.

The stored bytes are decoded with the project's decoder and transformed like the folder path's
images; the augmentation of a sample is drawn from (seed, epoch, sample index), so it does not
depend on the number of workers or ranks, nor on an interruption.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from litdata import StreamingDataLoader, StreamingDataset
from litdata.streaming.sampler import ChunkedIndex
from torch.utils.data import Dataset

from project.data.datasets import bad_image_error, collate_skipping_bad, seeded_transform
from project.data.images import decode_bytes
from project.data.optimize import FORMAT, MANIFEST, read_manifest
from project.data.samplers import SEED_RANGE
from project.errors import ConfigError


class _DropLastNotice(logging.Filter):
    """Evaluation keeps every image under DDP on purpose (``drop_last=False``); LitData warns
    about it because unequal shares would hang training, not evaluation."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "disabled the `drop_last` option" not in record.getMessage()


logging.getLogger("litdata.streaming.dataset").addFilter(_DropLastNotice())


def load_manifest(data_dir: str) -> dict:
    """``project.json`` of an optimized data set, local or at a URL LitData can read."""
    if "://" not in data_dir:
        manifest = read_manifest(data_dir)
    else:
        from litdata.streaming.fs_provider import _get_fs_provider

        with tempfile.TemporaryDirectory() as tmp:
            local = Path(tmp) / MANIFEST
            try:
                _get_fs_provider(data_dir).download_file(f"{data_dir.rstrip('/')}/{MANIFEST}", str(local))
            except Exception as err:
                raise ConfigError(f"cannot read '{data_dir}/{MANIFEST}' ({type(err).__name__}: {err}): "
                                  "check the URL and the storage credentials") from err
            manifest = read_manifest(tmp)
    if manifest is None or manifest.get("format") != FORMAT:
        raise ConfigError(f"'{data_dir}' is not a data set written by `python -m project optimize-data` "
                          f"(its {MANIFEST} is missing or of another version): run optimize-data again")
    return manifest


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The augmentation seed of sample ``index`` in ``epoch``: fixed by the three alone."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + epoch) * 1_000_003 + index)
    return int(torch.randint(0, SEED_RANGE, (1,), generator=g))


class StreamingImages(StreamingDataset):
    """One split's chunks as (image, label): decoded, then transformed with a per-sample seed.

    Keys: LitData's own (when streamed), an int, or an ``(index, seed)`` pair from
    ``EpochSampler`` (class-balanced draws by random access, see :class:`RandomAccess`).
    """

    def __init__(self, input_dir: str, transform: Callable[[torch.Tensor], torch.Tensor],
                 labels: list[int], short_side: int | None, shuffle: bool, drop_last: bool,
                 seed: int, augment: bool, on_bad_image: str = "skip") -> None:
        super().__init__(input_dir, shuffle=shuffle, drop_last=drop_last, seed=seed)
        self.image_transform = transform  # not `transform`: StreamingDataset applies that to the raw item
        self.targets = labels
        self.short_side = short_side
        self.augment_seed = seed if augment else None
        self.on_bad_image = on_bad_image
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
            image = decode_bytes(item["image"], self.short_side)
        except Exception as err:
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
        self.dataset = dataset
        self.targets = dataset.targets

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, key):  # noqa: ANN001 - an int or (int, seed)
        return self.dataset[key]

    def skipped_paths(self) -> list[str]:
        return self.dataset.skipped_paths()


def streaming_dataset(data_dir: str, manifest: dict, split: str, transform: Callable, short_side: int | None,
                      train: bool, distributed: bool, seed: int, augment: bool,
                      on_bad_image: str) -> StreamingImages:
    """Training shuffles (LitData's chunk-then-item shuffle) and, under DDP, drops the remainder
    that would give ranks unequal batch counts; evaluation keeps every image, in order."""
    return StreamingImages(f"{data_dir.rstrip('/')}/{split}", transform, manifest["splits"][split]["labels"],
                           short_side, shuffle=train, drop_last=train and distributed, seed=seed,
                           augment=train and augment, on_bad_image=on_bad_image)


def streaming_loader(dataset: StreamingImages, batch_size: int, workers: int, pin_memory: bool,
                     prefetch_factor: int | None) -> StreamingDataLoader:
    """No persistent workers: LitData starts each epoch's workers with the new epoch's plan."""
    return StreamingDataLoader(dataset, batch_size=batch_size, num_workers=workers, pin_memory=pin_memory,
                               prefetch_factor=prefetch_factor if workers > 0 else None,
                               collate_fn=collate_skipping_bad)

