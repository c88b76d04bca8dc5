"""The Dataset: decode (or read the cache), augment (new variants every epoch, drawn from the
seed the sampler hands over with each index), and survive bad files."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch.utils.data import Dataset, default_collate

from project.data.folders import Sample
from project.data.images import DECODE_ERRORS, ImageCache, decode
from project.errors import ProjectError, require


class BadImageError(ProjectError, RuntimeError):
    """An image that cannot be decoded, with ``data.on_bad_image: error``."""


class ImageDataset(Dataset):
    """``samples`` as (image, label), decoded at ``short_side`` or read from ``cache``. A key is
    an index, or ``(index, seed)`` from ``EpochSampler``. An undecodable file gives None
    (dropped by :func:`collate_skipping_bad`) and is flagged in shared memory, so that workers
    can report what they skipped."""

    def __init__(self, samples: Sequence[Sample], transform: Callable[[torch.Tensor], torch.Tensor],
                 cache: ImageCache | None = None, on_bad_image: str = "skip",
                 short_side: int | None = None) -> None:
        require(on_bad_image in ("skip", "error"), "data.on_bad_image", "must be skip or error",
                on_bad_image)
        if cache is not None and cache.short_side != short_side:
            raise ValueError(f"the cache holds images reduced to {cache.short_side} px but the "
                             f"dataset decodes at {short_side}: build both with one side")
        self.samples = list(samples)
        self.targets = [s.label for s in self.samples]
        self.transform, self.cache = transform, cache
        self.on_bad_image, self.short_side = on_bad_image, short_side
        self.bad_flags = torch.zeros(len(self.samples), dtype=torch.uint8).share_memory_()

    def __len__(self) -> int:
        return len(self.samples)

    def load(self, index: int) -> torch.Tensor:
        """The decoded uint8 image (3, H, W), from the cache when there is one."""
        image = self.cache[index] if self.cache is not None else None
        return image if image is not None else decode(self.samples[index].path, self.short_side)

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, int] | None:
        index, seed = key if isinstance(key, tuple) else (key, None)
        try:
            image = self.load(index)
        except DECODE_ERRORS as err:
            if self.on_bad_image == "error":
                raise bad_image_error(self.samples[index].path, err) from err
            self.bad_flags[index] = 1
            return None
        return seeded_transform(self.transform, image, seed), self.samples[index].label

    def skipped_paths(self) -> list[str]:
        """Images skipped so far because they could not be decoded."""
        return [self.samples[i].path for i in self.bad_flags.nonzero().flatten().tolist()]


def seeded_transform(transform: Callable[[torch.Tensor], torch.Tensor], image: torch.Tensor,
                     seed: int | None) -> torch.Tensor:
    """``transform(image)`` with the random augmentation drawn from ``seed`` (None: as it is)."""
    if seed is None:
        return transform(image)
    # Seed only the CPU generator (torch.manual_seed also seeds every accelerator's: 100x
    # slower), and put the state back so the caller's random stream is untouched.
    state = torch.get_rng_state()
    torch.default_generator.manual_seed(seed)
    try:
        return transform(image)
    finally:
        torch.set_rng_state(state)


def bad_image_error(path: str, err: Exception) -> BadImageError:
    return BadImageError(
        f"cannot decode image '{path}': {err}. Remove or replace the file, or set "
        "data.on_bad_image=skip (run `python -m project check-data` for a full scan).")


def collate_skipping_bad(batch: list):
    """``default_collate`` without the undecodable items (None when none is left)."""
    kept = [item for item in batch if item is not None]
    return default_collate(kept) if kept else None
