"""Image files decoded to uint8 RGB tensors at the short side the transforms need, and their cache."""

import io
import logging
import math
import os
import statistics
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from project.common.pixels import DECODE_ERRORS, decoded_size, read_rgb
from project.common.preprocessing import Preprocessing

log = logging.getLogger(__name__)
SIZE_NOTICE_FACTOR = 4  # input size and the images' median short side further apart: a notice
ASPECT_NOTICE = 2.0  # images longer than this many times their short side, on median: a notice


def aspect_notice(aspect: float, crop_ratio: float) -> str | None:
    """What the square crops keep of images ``aspect`` times as long as wide (panoramas, strips,
    receipts), or None when they are near square: training's random crops fall back to the middle."""
    if aspect <= ASPECT_NOTICE:
        return None
    return (f"the images are {aspect:.1f} times as long as wide on median (panoramas, strips?): the square "
            f"crops see the middle {100 * crop_ratio / aspect:.0f}% of each in evaluation and at most "
            f"{100 * 4 / 3 / aspect:.0f}% in training; if what matters lies off the middle, cut each into "
            "near-square pieces or pad it to a square before training")

def needed_side(pre: Preprocessing, crop_scale: tuple[float, float] | None = None) -> int:
    """The short side to decode at: evaluation's resize side, or one where no training crop is enlarged."""
    if crop_scale is None:
        return pre.resize_size
    need = pre.image_size / math.sqrt(crop_scale[0])
    return max(pre.resize_size, math.ceil(need - 1e-9))  # 224 / sqrt(0.25) is 448, not 449


def notice_size_mismatch(paths: Sequence[str], image_size: int, sample: int = 64,
                         crop_ratio: float = 0.875) -> int | None:
    """A notice when ``model.input.size`` and the training images' median short side (from a
    sample's headers) differ more than fourfold, easy to miss in a config, or when the images are
    far from square; the median, or None."""
    step = max(1, len(paths) // sample)
    sides, aspects = [], []
    for path in list(paths)[::step][:sample]:
        try:
            size = decoded_size(path)
        except DECODE_ERRORS:
            continue
        sides.append(min(size))
        aspects.append(max(size) / max(1, min(size)))
    if not sides:
        return None
    median = int(statistics.median(sides))
    shape = aspect_notice(statistics.median(aspects), crop_ratio)
    if shape:
        log.warning("Notice: %s", shape)
    if image_size > SIZE_NOTICE_FACTOR * median:
        log.warning("Notice: model.input.size=%d, but the training images' median short side is %d px: each "
                    "is enlarged %.0fx; a size nearer theirs trains faster (python -m project init "
                    "chooses one)", image_size, median, image_size / median)
    elif median > SIZE_NOTICE_FACTOR * image_size:
        log.warning("Notice: model.input.size=%d, but the training images' median short side is %d px: each "
                    "is shrunk %.0fx and fine detail is lost; raise model.input.size if it matters "
                    "(make resize-data shrinks the files once, for faster decoding)",
                    image_size, median, median / image_size)
    return median


def decode(source: str | bytes | memoryview, short_side: int | None = None) -> torch.Tensor:
    """A path (or a file's bytes) as uint8 (3, H, W), reduced to ``short_side`` (None: full)."""
    data = source if isinstance(source, str | os.PathLike) else io.BytesIO(source)
    return torch.from_numpy(read_rgb(data, short_side)).permute(2, 0, 1).contiguous()


def decoded_bytes(path: str, short_side: int | None = None) -> int:
    """Bytes the decoded image takes, from the header alone; 0 for an undecodable file."""
    try:
        w, h = decoded_size(path, short_side)
    except DECODE_ERRORS:
        return 0
    return 3 * w * h


def try_decode(path: str, short_side: int | None = None) -> torch.Tensor | None:
    try:
        return decode(path, short_side)
    except DECODE_ERRORS:
        return None


def decode_all(paths: Sequence[str], short_side: int | None, threads: int | None = None
               ) -> Iterator[torch.Tensor | None]:
    """Decoded images (None for a bad file), in order, from threads (Pillow releases the GIL)."""
    with ThreadPoolExecutor(threads or min(8, os.cpu_count() or 1)) as pool:
        yield from pool.map(lambda p: try_decode(p, short_side), paths)


def offsets_of(shapes: Sequence[tuple[int, int, int]]) -> np.ndarray:
    """Start of each image in a flat buffer, and the end of the last (len + 1 entries)."""
    sizes = [c * h * w for c, h, w in shapes]
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


class ImageCache:
    """Decoded images in one flat uint8 buffer that forked workers share (no refcount touches it)."""

    def __init__(self, buffer: torch.Tensor, shapes: Sequence, short_side: int | None) -> None:
        self.buffer, self.short_side = buffer, short_side
        self.shapes = np.asarray(shapes, dtype=np.int64).reshape(-1, 3)
        self.offsets = offsets_of([tuple(s) for s in self.shapes])

    @classmethod
    def decode(cls, paths: Sequence[str], short_side: int | None = None,
               threads: int | None = None) -> "ImageCache":
        images = list(decode_all(paths, short_side, threads))
        shapes = [(0, 0, 0) if img is None else tuple(img.shape) for img in images]
        cache = cls(torch.empty(int(offsets_of(shapes)[-1]), dtype=torch.uint8), shapes, short_side)
        for i, img in enumerate(images):
            if img is not None:
                cache.buffer[cache.offsets[i]: cache.offsets[i + 1]] = img.reshape(-1)
        return cache

    def __len__(self) -> int:
        return len(self.shapes)

    def __getitem__(self, i: int) -> torch.Tensor | None:
        """The image, or None for a file that could not be decoded (shape 0)."""
        c, h, w = (int(v) for v in self.shapes[i])
        if c == 0:
            return None
        return self.buffer[self.offsets[i]: self.offsets[i + 1]].view(c, h, w)
