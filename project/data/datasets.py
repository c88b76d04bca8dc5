"""The Dataset: decode or read the cache, augment from the sampler's seed, survive bad files."""

from collections.abc import Callable, Sequence

import torch
from torch.utils.data import Dataset, default_collate

from project.data.folders import Sample
from project.data.images import DECODE_ERRORS, ImageCache, decode
from project.errors import ProjectError, require


class BadImageError(ProjectError, RuntimeError):
    """An image that cannot be decoded, with ``data.on_bad_image: error``."""


class ImageDataset(Dataset):
    """``samples`` as (image, target), by index or ``(index, seed)``; an undecodable file gives None
    (dropped in the collate), flagged in shared memory for the report."""

    def __init__(self, samples: Sequence[Sample], transform: Callable[[torch.Tensor], torch.Tensor],
                 cache: ImageCache | None = None, on_bad_image: str = "skip",
                 short_side: int | None = None, target: Callable[[object], object] | None = None) -> None:
        require(on_bad_image in ("skip", "error"), "data.on_bad_image", "must be skip or error",
                on_bad_image)
        self.samples = list(samples)
        self.targets = [s.label for s in self.samples]
        self.transform, self.cache, self.target = transform, cache, target or (lambda label: label)
        self.on_bad_image, self.short_side = on_bad_image, short_side
        self.bad_flags = torch.zeros(len(self.samples), dtype=torch.uint8).share_memory_()

    def __len__(self) -> int:
        return len(self.samples)

    def load(self, index: int) -> torch.Tensor:
        image = self.cache[index] if self.cache is not None else None
        return image if image is not None else decode(self.samples[index].path, self.short_side)

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, int | torch.Tensor] | None:
        index, seed = key if isinstance(key, tuple) else (key, None)
        try:
            image = self.load(index)
        except DECODE_ERRORS as err:
            if self.on_bad_image == "error":
                raise bad_image_error(self.samples[index].path, err) from err
            self.bad_flags[index] = 1
            return None
        return seeded_transform(self.transform, image, seed), self.target(self.samples[index].label)

    def skipped_paths(self) -> list[str]:
        return [self.samples[i].path for i in self.bad_flags.nonzero().flatten().tolist()]


def seeded_transform(transform: Callable[[torch.Tensor], torch.Tensor], image: torch.Tensor,
                     seed: int | None) -> torch.Tensor:
    """``transform(image)`` with the random augmentation drawn from ``seed`` (None: as it is)."""
    if seed is None:
        return transform(image)
    with torch.random.fork_rng(devices=[], device_type="cpu"):  # the CPU generator only: far faster
        torch.default_generator.manual_seed(seed)  # than torch.manual_seed, which seeds each GPU's too
        return transform(image)


def bad_image_error(path: str, err: Exception) -> BadImageError:
    return BadImageError(
        f"cannot decode image '{path}': {err}. Remove or replace the file, or set "
        "data.on_bad_image=skip (run `python -m project check-data` for a full scan).")


def collate_skipping_bad(batch: list):
    """``default_collate`` without the undecodable items (None when none is left)."""
    kept = [item for item in batch if item is not None]
    return default_collate(kept) if kept else None
