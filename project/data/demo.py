"""Make the demo data set: coloured shapes on cluttered, unevenly lit backgrounds.

The default run must work offline with no data of the user's, so the project draws its own.
Each image is a shape with random colour, size, position and rotation over a random gradient
with noise, clutter and a light spot, so the task needs real features and augmentation helps,
like a photo set gathered from many sources.

    python -m project.data.demo data/demo --train-per-class 500 --image-size 48
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

SHAPES = ("circle", "cross", "square", "star", "triangle")
PATTERNS = ("checker", "dots", "stripes")
CLASSES = tuple(sorted(SHAPES + PATTERNS))
SPLITS = ("train", "val", "test")
SUPERSAMPLE = 4  # draw large, then downsample: smooth edges like a photo


def _circle(n: int = 48, r: float = 1.0, cx: float = 0.0) -> np.ndarray:
    t = np.linspace(0, 2 * math.pi, n, endpoint=False)
    return np.stack([cx + r * np.cos(t), r * np.sin(t)], 1)


def _regular(k: int, r: float = 1.0, phase: float = 0.0) -> np.ndarray:
    t = phase + np.arange(k) * 2 * math.pi / k
    return np.stack([r * np.cos(t), r * np.sin(t)], 1)


def _shape(name: str, rng: np.random.Generator) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Polygons (filled, holes) in unit coordinates, before rotation and scaling."""
    if name == "circle":
        return [_circle() * [1.0, rng.uniform(0.85, 1.0)]], []
    if name == "ring":
        return [_circle()], [_circle(r=rng.uniform(0.45, 0.65))]
    if name == "crescent":
        return [_circle()], [_circle(r=rng.uniform(0.75, 0.9), cx=rng.uniform(0.35, 0.55))]
    if name == "square":
        return [_regular(4, 1.2, math.pi / 4) * [1.0, rng.uniform(0.8, 1.0)]], []
    if name == "triangle":
        return [_regular(3, 1.1, math.pi / 2) + rng.normal(0, 0.05, (3, 2))], []
    if name == "star":
        outer, inner = _regular(5, 1.1, math.pi / 2), _regular(5, rng.uniform(0.4, 0.5), 0.7 * math.pi)
        return [np.stack([outer, inner], 1).reshape(-1, 2)], []
    if name == "cross":
        w = rng.uniform(0.28, 0.38)
        return [np.array([[-1, -w], [1, -w], [1, w], [-1, w]]),
                np.array([[-w, -1], [w, -1], [w, 1], [-w, 1]])], []
    if name == "heart":
        t = np.linspace(0, 2 * math.pi, 64, endpoint=False)
        x = 16 * np.sin(t) ** 3
        y = 13 * np.cos(t) - 5 * np.cos(2 * t) - 2 * np.cos(3 * t) - np.cos(4 * t)
        return [np.stack([x, -y - 2], 1) / 16.0], []
    raise ValueError(f"unknown demo class {name!r}")


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    """A two-colour gradient at a random angle, with sensor noise: float RGB in 0..255."""
    c0 = rng.uniform(0, 255, 3)
    c1 = np.clip(c0 + rng.uniform(-80, 80, 3), 0, 255)
    angle = rng.uniform(0, 2 * math.pi)
    yy, xx = np.mgrid[0:size, 0:size] / max(size - 1, 1)
    ramp = (np.cos(angle) * xx + np.sin(angle) * yy)
    ramp = (ramp - ramp.min()) / (np.ptp(ramp) + 1e-6)
    img = c0 + (c1 - c0) * ramp[..., None]
    return img + rng.normal(0, rng.uniform(2, 10), img.shape)


def _clutter(draw: ImageDraw.ImageDraw, rng: np.random.Generator, big: int) -> None:
    """Thin lines and dots that are not the object: the model must learn to ignore them."""
    for _ in range(rng.integers(0, 3)):
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        x0, y0, x1, y1 = (int(v) for v in rng.integers(0, big, 4))
        draw.line([(x0, y0), (x1, y1)], fill=colour, width=SUPERSAMPLE)
    for _ in range(rng.integers(0, 4)):
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        x, y, r = int(rng.integers(0, big)), int(rng.integers(0, big)), big // 40 + 1
        draw.ellipse([x - r, y - r, x + r, y + r], fill=colour)


def _lighting(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Global exposure plus a soft light spot: the 'varied lighting' of real photos."""
    size = img.shape[0]
    yy, xx = np.mgrid[0:size, 0:size] / size
    cx, cy = rng.uniform(0, 1, 2)
    spot = np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * rng.uniform(0.1, 0.4) ** 2))
    gain = rng.uniform(0.65, 1.1) + rng.uniform(0.0, 0.4) * spot
    tint = rng.uniform(0.85, 1.15, 3)
    return img * gain[..., None] * tint


def _pattern(name: str, rng: np.random.Generator, big: int, centre: np.ndarray,
             radius: float, angle: float) -> np.ndarray:
    """Boolean mask of a textured disc: the pattern's 'on' pixels inside a random circle."""
    yy, xx = np.mgrid[0:big, 0:big].astype(np.float32)
    dx, dy = xx - centre[0], yy - centre[1]
    u = (np.cos(angle) * dx + np.sin(angle) * dy) / radius
    v = (-np.sin(angle) * dx + np.cos(angle) * dy) / radius
    freq = rng.uniform(2.5, 4.0)  # periods across the radius
    if name == "stripes":
        on = np.sin(2 * math.pi * freq * u) > 0
    elif name == "checker":
        on = (np.floor(freq * u) + np.floor(freq * v)) % 2 == 0
    else:  # dots on a lattice
        fu, fv = freq * u - np.round(freq * u), freq * v - np.round(freq * v)
        on = fu**2 + fv**2 < rng.uniform(0.07, 0.12)
    return on & (dx**2 + dy**2 < radius**2)


def render(name: str, rng: np.random.Generator, size: int = 64) -> Image.Image:
    """Draw one image of class ``name``; the same generator state gives the same pixels."""
    big = size * SUPERSAMPLE
    background = _background(rng, big // SUPERSAMPLE)
    canvas = Image.fromarray(np.clip(background, 0, 255).astype(np.uint8)).resize((big, big))
    _clutter(ImageDraw.Draw(canvas), rng, big)

    scale = rng.uniform(0.22, 0.38) * big
    angle = rng.uniform(0, 2 * math.pi)
    centre = big / 2 + rng.uniform(-0.15, 0.15, 2) * big
    if name in PATTERNS:
        on = _pattern(name, rng, big, centre, scale * 1.15, angle)
        mask = Image.fromarray(on.astype(np.uint8) * 255)
    else:
        rot = np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
        filled, holes = _shape(name, rng)
        mask = Image.new("L", (big, big), 0)
        mdraw = ImageDraw.Draw(mask)
        for polys, value in ((filled, 255), (holes, 0)):
            for poly in polys:
                pts = (poly @ rot.T) * scale + centre
                mdraw.polygon([tuple(p) for p in pts], fill=value)

    bg_mean = np.asarray(canvas, dtype=float).mean((0, 1))
    colour = rng.uniform(0, 255, 3)
    while np.linalg.norm(colour - bg_mean) < 120:  # keep the object visible
        colour = rng.uniform(0, 255, 3)
    fill = Image.new("RGB", (big, big), tuple(int(c) for c in colour))
    canvas.paste(fill, (0, 0), mask.filter(ImageFilter.GaussianBlur(SUPERSAMPLE / 2)))

    small = np.asarray(canvas.resize((size, size), Image.Resampling.LANCZOS), dtype=float)
    lit = _lighting(small, rng) + rng.normal(0, 3, small.shape)
    return Image.fromarray(np.clip(lit, 0, 255).astype(np.uint8))


def class_counts(per_class: int, num_classes: int, imbalance: float) -> list[int]:
    """Geometric decay from ``per_class`` down to ``per_class * imbalance`` (1.0: balanced)."""
    if num_classes == 1:
        return [per_class]
    return [max(1, round(per_class * imbalance ** (k / (num_classes - 1))))
            for k in range(num_classes)]


def _write_folder(folder: Path, name: str, key: list[int], count: int, size: int) -> None:
    """One class folder of one split; each image has its own seed, so order does not matter."""
    folder.mkdir(parents=True)
    for i in range(count):
        render(name, np.random.default_rng([*key, i]), size).save(folder / f"{name}_{i:04d}.png")


def make_demo(
    out_dir: str | Path,
    train_per_class: int = 500,
    val_per_class: int = 60,
    test_per_class: int = 60,
    image_size: int = 48,
    imbalance: float = 1.0,
    num_classes: int = len(CLASSES),
    seed: int = 0,
    force: bool = False,
) -> Path:
    """Write ``out_dir/{train,val,test}/<class>/*.png``; built in a temporary folder, then renamed.

    ``imbalance`` shrinks the training counts of later classes (val and test stay balanced, so
    per-class recall stays comparable).
    """
    out = Path(out_dir)
    if not 1 <= num_classes <= len(CLASSES):
        raise ValueError(f"num_classes must be 1..{len(CLASSES)}, got {num_classes}")
    if not 0 < imbalance <= 1:
        raise ValueError(f"imbalance must be in (0, 1], got {imbalance}")
    if out.exists() and any(out.iterdir()) and not force:
        raise FileExistsError(f"{out} already exists and is not empty (use --force to replace it)")
    names = CLASSES[:num_classes]
    counts = {
        "train": class_counts(train_per_class, num_classes, imbalance),
        "val": [val_per_class] * num_classes,
        "test": [test_per_class] * num_classes,
    }
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    jobs = [(tmp / split / name, name, [seed, s, c], counts[split][c], image_size)
            for s, split in enumerate(SPLITS) for c, name in enumerate(names)]
    with ProcessPoolExecutor(max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
        list(pool.map(_write_folder, *zip(*jobs, strict=True)))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m project.data.demo", description=__doc__.split("\n")[0])
    p.add_argument("out_dir", help="folder to create, e.g. data/demo")
    p.add_argument("--train-per-class", type=int, default=500)
    p.add_argument("--val-per-class", type=int, default=60)
    p.add_argument("--test-per-class", type=int, default=60)
    p.add_argument("--image-size", type=int, default=48, help="side of the square PNGs in pixels")
    p.add_argument("--imbalance", type=float, default=1.0,
                   help="smallest/largest training class size, e.g. 0.1 (default 1: balanced)")
    p.add_argument("--num-classes", type=int, default=len(CLASSES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help="replace an existing folder")
    a = p.parse_args(argv)
    try:
        out = make_demo(a.out_dir, a.train_per_class, a.val_per_class, a.test_per_class,
                        a.image_size, a.imbalance, a.num_classes, a.seed, a.force)
    except (ValueError, FileExistsError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    total = sum(1 for _ in out.rglob("*.png"))
    print(f"wrote {total} images of {a.num_classes} classes to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
