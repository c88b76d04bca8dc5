"""The one torch-free image reader, :func:`read_rgb`: upright, 8-bit RGB, reduced to a short side
when asked (a JPEG in the decoder itself)."""

import struct

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

HIGH_BIT_MODES = frozenset({"I", "I;16", "I;16B", "I;16L", "I;16N", "F"})
# as torchvision's antialiased bilinear
REDUCE_FILTER = Image.Resampling.BILINEAR
REDUCING_GAP = 3.0
# what reading a file that is not a decodable image raises
DECODE_ERRORS = (OSError, UnidentifiedImageError, ValueError, SyntaxError, EOFError, struct.error,
                 Image.DecompressionBombError)


def to_rgb(img: Image.Image) -> Image.Image:
    """Apply EXIF orientation and convert any mode (16-bit, palette, CMYK, ...) to 8-bit RGB."""
    img = ImageOps.exif_transpose(img)
    if img.mode in HIGH_BIT_MODES:  # PIL's convert("RGB") would clip 16-bit values to 255
        arr = np.asarray(img, dtype=np.float32)
        # 16-bit, else 8-bit values in a wider mode; a float image within [0, 1] is scaled so
        top = (65535.0 if img.mode.startswith("I;16") or arr.max() > 255 else
               1.0 if img.mode == "F" and arr.size and arr.min() >= 0 and arr.max() <= 1 else 255.0)
        img = Image.fromarray((arr * (255.0 / top)).clip(0, 255).astype(np.uint8), "L")
    if img.mode in ("P", "PA") and "transparency" in img.info or img.mode == "LA":
        img = img.convert("RGBA")  # palette transparency must go through RGBA first
    return img if img.mode == "RGB" else img.convert("RGB")


def reduced_size(size: tuple[int, int], short_side: int | None) -> tuple[int, int]:
    """(width, height) with the short side reduced to ``short_side``, as torchvision's ``Resize``."""
    w, h = size
    if short_side is None or min(w, h) <= short_side:
        return w, h
    if w <= h:
        return short_side, int(short_side * h / w)
    return int(short_side * w / h), short_side


def draft(img: Image.Image, short_side: int | None) -> None:
    """Let a JPEG decode at the smallest scale whose short side is >= ``short_side``."""
    if short_side is not None and min(img.size) > short_side:
        img.draft("RGB", (short_side, short_side))  # Image.draft: no-op unless JPEG (or MPO)


def decoded_size(path: str, short_side: int | None = None) -> tuple[int, int]:
    """(width, height) :func:`read_rgb` returns (stored orientation), from the header alone."""
    with Image.open(path) as img:
        draft(img, short_side)
        return reduced_size(img.size, short_side)


def read_rgb(path: str, short_side: int | None = None) -> np.ndarray:
    """The image as an upright uint8 (H, W, 3) array, its short side reduced to ``short_side``."""
    with Image.open(path) as img:
        draft(img, short_side)
        img.load()
        rgb = to_rgb(img)
    size = reduced_size(rgb.size, short_side)
    if size != rgb.size:
        rgb = rgb.resize(size, REDUCE_FILTER, reducing_gap=REDUCING_GAP)
    return np.asarray(rgb).copy()
