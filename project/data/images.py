"""Decode image files to uint8 RGB tensors, and an optional in-memory cache of them.

One decoder for the training data, the cache, ``predict`` and ``check-data``, so that every path
sees the same pixels: EXIF orientation applied, any mode (grayscale, palette, RGBA, CMYK,
16-bit) converted to 8-bit RGB.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from PIL import Image

from project.common.pixels import read_rgb


def decode(path: str) -> torch.Tensor:
    """Read ``path`` as a uint8 tensor of shape (3, H, W); raises if the file is not an image."""
    return torch.from_numpy(read_rgb(path)).permute(2, 0, 1).contiguous()


def decoded_bytes(path: str) -> int:
    """Bytes the decoded image takes, from the header alone (no pixel decoding)."""
    try:
        with Image.open(path) as img:
            w, h = img.size
    except Exception:
        return 0
    return 3 * w * h


class ImageCache:
    """Every image decoded once into one flat uint8 buffer.

    One buffer (not one tensor per image) means DataLoader workers forked from the main
    process read the same physical pages: nothing is copied per worker, and the per-item
    reference counting of Python objects never touches the pixels.
    """

    def __init__(self, paths: Sequence[str], threads: int | None = None) -> None:
        threads = threads or min(8, os.cpu_count() or 1)
        with ThreadPoolExecutor(threads) as pool:  # PIL releases the GIL while decoding
            decoded = list(pool.map(_try_decode, paths))
        shapes = [(0, 0, 0) if img is None else tuple(img.shape) for img in decoded]
        sizes = [c * h * w for c, h, w in shapes]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.shapes = np.asarray(shapes, dtype=np.int64).reshape(-1, 3)
        self.buffer = torch.empty(int(self.offsets[-1]), dtype=torch.uint8)
        for i, img in enumerate(decoded):
            if img is not None:
                self.buffer[self.offsets[i]: self.offsets[i + 1]] = img.reshape(-1)
        self.bad = {i for i, img in enumerate(decoded) if img is None}

    def __len__(self) -> int:
        return len(self.shapes)

    def __getitem__(self, i: int) -> torch.Tensor | None:
        if i in self.bad:
            return None
        c, h, w = (int(v) for v in self.shapes[i])
        return self.buffer[self.offsets[i]: self.offsets[i + 1]].view(c, h, w)


def _try_decode(path: str) -> torch.Tensor | None:
    try:
        return decode(path)
    except Exception:
        return None
