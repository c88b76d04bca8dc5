"""Pixel helpers that need only Pillow and NumPy, shared by training and torch-free inference.

Keep this module free of torch: ``project/infer.py`` runs where torch is not installed.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageOps

HIGH_BIT_MODES = frozenset({"I", "I;16", "I;16B", "I;16L", "I;16N", "F"})


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


def read_rgb(path: str) -> np.ndarray:
    """The image at ``path`` as a uint8 array (H, W, 3)."""
    with Image.open(path) as img:
        img.load()
        return np.asarray(to_rgb(img)).copy()
