"""Whether two images close in a network's embedding are one picture: their grey pixels correlated
after the best of a few small crops. A network's features say two handwritten 7s or two shots of
one beach are alike; a re-upload (resized, cropped, re-encoded) also agrees pixel by pixel once
aligned, which look-alikes do not. Embeddings find the candidates; this keeps the copies."""

from __future__ import annotations

from collections import defaultdict
from itertools import product

import numpy as np
from PIL import Image

BASE = 96  # every image as a BASE x BASE grey square first (aspect ignored: crops are shares)
SIDE = 24  # then each crop of it as SIDE x SIDE: coarse enough for JPEG noise and resampling
CUTS = (0.0, 0.02, 0.04, 0.06, 0.08)  # the share cut off each border, tried against the other whole
CROPS = list(product(CUTS, repeat=4))  # (left, top, right, bottom); the first is the whole image


def unit(pixels: np.ndarray) -> np.ndarray:
    """Centred and scaled rows: their dot product is the correlation (0 for a flat image)."""
    x = pixels.reshape(len(pixels), -1).astype(np.float32)
    x -= x.mean(axis=1, keepdims=True)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-6)


def square(path: str) -> Image.Image | None:
    """The image as a BASE x BASE grey square; None when it won't decode."""
    try:
        with Image.open(path) as img:
            img.draft("L", (2 * BASE, 2 * BASE))  # a JPEG decodes at a fraction of its size
            return img.convert("L").resize((BASE, BASE), Image.Resampling.BOX)
    except (OSError, ValueError):
        return None


def crops(grey: Image.Image, which: list[tuple[float, float, float, float]] = CROPS) -> np.ndarray:
    """``which`` crops of a square, each SIDE x SIDE, as unit rows."""
    boxes = [(x0 * BASE, y0 * BASE, (1 - x1) * BASE, (1 - y1) * BASE) for x0, y0, x1, y1 in which]
    return unit(np.stack([np.asarray(grey.resize((SIDE, SIDE), Image.Resampling.BILINEAR, box=box))
                          for box in boxes]))


def agreement(pairs: list[tuple[str, str]]) -> np.ndarray:
    """For each pair, the highest correlation of one image's crops with the other whole, either way
    round; 0 where one does not decode. Each image is decoded once and cropped once."""
    squares = {p: square(p) for p in {p for pair in pairs for p in pair}}
    whole = {p: crops(g, CROPS[:1])[0] for p, g in squares.items() if g is not None}
    best = np.zeros(len(pairs), dtype=np.float32)
    partners: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for k, (a, b) in enumerate(pairs):
        partners[a].append((k, b))
        partners[b].append((k, a))
    for path, others in partners.items():
        others = [(k, whole[other]) for k, other in others if other in whole]
        if path not in whole or not others:
            continue
        ks = np.array([k for k, _ in others])
        scores = (crops(squares[path]) @ np.stack([w for _, w in others]).T).max(axis=0)
        best[ks] = np.maximum(best[ks], scores)
    return best
