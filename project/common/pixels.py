"""Pixel helpers that need only Pillow and NumPy, shared by training and torch-free inference.

Keep this module free of torch: ``project/infer.py`` runs where torch is not installed.

One reader, :func:`read_rgb`, for every path (training, the cache, ``predict``, ``infer.py``,
``resize-data``): EXIF orientation applied, any mode converted to 8-bit RGB and, when a short
side is asked for, the image reduced to it. A JPEG is then decoded at 1/2, 1/4 or 1/8 scale
by the decoder itself (Pillow's draft mode, DCT scaling: a 12-MP photo in ~25 ms instead of
~150 ms), and every format is resized once more, with :data:`REDUCE_FILTER`, to the exact side.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageOps

HIGH_BIT_MODES = frozenset({"I", "I;16", "I;16B", "I;16L", "I;16N", "F"})
# The one filter that reduces decoded images: antialiased bilinear (what torchvision's
# ``Resize(antialias=True)`` computes). With ``reducing_gap`` a large reduction first takes
# ``Image.reduce()`` (box averages by an integer factor), then the filter does the last >= 3x:
# indistinguishable from the filter alone, several times faster on non-JPEG photos.
REDUCE_FILTER = Image.Resampling.BILINEAR
REDUCING_GAP = 3.0


def to_rgb(img: Image.Image) -> Image.Image:
    """Apply EXIF orientation and convert any mode (16-bit, palette, CMYK, ...) to 8-bit RGB."""
    img = ImageOps.exif_transpose(img)
    if img.mode in HIGH_BIT_MODES:  # PIL's convert("RGB") would clip 16-bit values to 255
        arr = np.asarray(img, dtype=np.float32)
        top = 65535.0 if img.mode.startswith("I;16") or arr.max() > 255 else 255.0
        img = Image.fromarray((arr * (255.0 / top)).clip(0, 255).astype(np.uint8), "L")
    if img.mode in ("P", "PA") and "transparency" in img.info or img.mode == "LA":
        img = img.convert("RGBA")  # palette transparency must go through RGBA first
    return img if img.mode == "RGB" else img.convert("RGB")


def reduced_size(size: tuple[int, int], short_side: int | None) -> tuple[int, int]:
    """(width, height) after reducing the short side of ``size`` to ``short_side``; the long
    side is truncated, as torchvision's ``Resize`` does (so its resize is then a no-op).
    Never larger than ``size``; None: ``size`` itself."""
    w, h = size
    if short_side is None or min(w, h) <= short_side:
        return w, h
    if w <= h:
        return short_side, int(short_side * h / w)
    return int(short_side * w / h), short_side


def draft(img: Image.Image, short_side: int | None) -> None:
    """Let a JPEG decoder deliver the smallest DCT scale (1/2, 1/4, 1/8) whose short side is
    still >= ``short_side``; a no-op for other formats. Call before ``load()``.

    The request is square, (side, side): Pillow keeps the largest scale s with
    ``W // side >= s`` and ``H // side >= s``, which depends on the short side alone, so the
    stored (not yet EXIF-rotated) orientation of the file does not matter.
    """
    if short_side is not None and min(img.size) > short_side:
        img.draft("RGB", (short_side, short_side))  # Image.draft: no-op unless JPEG (or MPO)


def decoded_size(path: str, short_side: int | None = None) -> tuple[int, int]:
    """(width, height) that :func:`read_rgb` returns, in stored orientation, from the header
    alone: no pixel is decoded."""
    with Image.open(path) as img:
        draft(img, short_side)
        return reduced_size(img.size, short_side)


def read_rgb(path: str, short_side: int | None = None) -> np.ndarray:
    """The image at ``path`` as a uint8 array (H, W, 3), upright (EXIF orientation applied).

    ``short_side``: reduce the image so that its short side is exactly that (JPEGs decode at
    a reduced DCT scale first); an image already that small or smaller is returned at its own
    size, never enlarged. None: full size.
    """
    with Image.open(path) as img:
        draft(img, short_side)
        img.load()
        rgb = to_rgb(img)
    size = reduced_size(rgb.size, short_side)
    if size != rgb.size:
        rgb = rgb.resize(size, REDUCE_FILTER, reducing_gap=REDUCING_GAP)
    return np.asarray(rgb).copy()
