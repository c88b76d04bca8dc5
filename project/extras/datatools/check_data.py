"""Scan a data folder and report every problem with its path, before a run meets it at hour three.

    python -m project check-data DIR [--labels labels.csv]   (exit 0: training can proceed; 1: it cannot)
        [--ckpt_path CKPT|RUN | --config FILE] [--near 0.97] [--out DIR] [--drop-leaks]

Severities: ``error`` stops training (class structure); ``skipped`` files are left out by
training (``data.on_bad_image: skip``); ``converted`` files work but are changed on load;
``warning`` is worth a look (ignored files, duplicates across splits, huge images).
With a network (``--ckpt_path``, ``--config``, or else the newest run's), it also lists the pairs of
images whose embeddings are nearly the same (copies the byte check misses), the images least like
their class and the classes most alike (``project/extras/embeddings/check.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from project.common.files import is_image_file, walk_files
from project.common.pixels import DECODE_ERRORS, HIGH_BIT_MODES, to_rgb
from project.data.folders import layout, structure_problems
from project.data.splits import content_groups
from project.errors import ProjectError

SEVERITIES = ("error", "skipped", "converted", "warning")
MODE_NAMES = {"L": "grayscale", "LA": "grayscale with alpha", "P": "palette", "PA": "palette with alpha",
              "RGBA": "RGBA (alpha dropped)", "CMYK": "CMYK", "1": "1-bit", "YCbCr": "YCbCr"}
EXTENSION_FORMATS = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".bmp": "BMP", ".gif": "GIF",
                     ".tif": "TIFF", ".tiff": "TIFF", ".webp": "WEBP", ".ppm": "PPM", ".pgm": "PPM"}


@dataclass(frozen=True)
class Finding:
    severity: str
    path: str
    reason: str


def inspect_file(path: str, max_pixels: float) -> list[Finding]:
    """What training will make of one file."""
    def found(severity: str, reason: str) -> list[Finding]:
        return [Finding(severity, path, reason)]

    if os.path.islink(path) and not os.path.exists(path):
        return found("skipped", f"broken symbolic link (to {os.readlink(path)})")
    if not os.access(path, os.R_OK):
        return found("skipped", "not readable (permissions)")
    if os.path.getsize(path) == 0:
        return found("skipped" if is_image_file(path) else "warning", "empty file (0 bytes)")
    ext = Path(path).suffix.lower()
    try:
        with Image.open(path) as img:
            fmt, mode, size = img.format, img.mode, img.size
            orientation = img.getexif().get(0x0112, 1)
            img.load()
            to_rgb(img)
    except DECODE_ERRORS as err:
        if not is_image_file(path):
            return found("warning", f"not an image ({ext or 'no extension'}): training ignores it")
        return found("skipped", f"cannot be decoded ({type(err).__name__}: {err})")
    out: list[Finding] = []
    if not is_image_file(path):
        return found("warning", f"a {fmt} image with extension '{ext or 'none'}': training ignores "
                     "it; rename it to an image extension")
    if EXTENSION_FORMATS.get(ext) not in (None, fmt):
        out += found("warning", f"extension '{ext}' but the content is {fmt} (it loads anyway)")
    if mode in HIGH_BIT_MODES:
        out += found("converted", f"high bit depth ({mode}) scaled to 8-bit RGB")
    elif mode != "RGB":
        out += found("converted", f"mode {mode} ({MODE_NAMES.get(mode, mode)}) converted to RGB")
    if orientation not in (1, None):
        out += found("converted", f"EXIF orientation {orientation}: rotated upright on load")
    if size[0] * size[1] > max_pixels:
        out += found("warning", f"very large ({size[0]}x{size[1]}): slow to decode every epoch; "
                     "resize it or use data.cache")
    return out


def scan(data_dir: str | Path, max_pixels: float = 40e6) -> list[Finding]:
    root = Path(data_dir)
    findings = [Finding("error", str(root), p) for p in structure_problems(root)]
    if not root.is_dir():
        return findings
    base, classes, splits = layout(root)
    images: list[tuple[str, str, str]] = []  # (split, class, path) of every decodable image
    for split, folder in {"train": base, **splits}.items():
        for cls in classes:
            files = walk_files(folder / cls) if (folder / cls).is_dir() else []
            decodable = 0
            for path in files:
                problems = inspect_file(path, max_pixels)
                findings += problems
                if is_image_file(path) and not any(f.severity == "skipped" for f in problems):
                    decodable += 1
                    images.append((split, cls, path))
            if split == "train" and files and decodable == 0:
                findings.append(Finding("error", str(folder / cls),
                                        "no decodable image in this class folder"))
            elif split != "train" and (folder / cls).is_dir() and decodable == 0:
                findings.append(Finding("warning", str(folder / cls), f"no image of {cls} in the {split} "
                                        "split: its scores leave the class out"))
    return findings + copies(images, automatic_split=not splits and base == root)


def scan_table(data_dir: str | Path, labels: str | Path, max_pixels: float = 40e6) -> list[Finding]:
    """A labels table and the images it names: each problem of the table with its line (errors),
    every listed file inspected, images no row names (warnings: not trained on), and copies."""
    from project.data.tables import read_table, unlisted_images

    table = read_table(labels, data_dir)
    findings = [Finding("error", str(labels), p.removeprefix(f"{labels} ")) for p in table.problems]
    images: list[tuple[str, str, str]] = []
    for row in table.rows:
        path = str(Path(data_dir) / row.image)
        if not Path(path).is_file():
            continue
        problems = inspect_file(path, max_pixels)
        findings += problems
        if not any(f.severity == "skipped" for f in problems):
            images.append((row.split or "train", table.labels.text(row.label), path))
    findings += [Finding("warning", path, f"not in {labels}: training leaves it out")
                 for path in (unlisted_images(table, data_dir) if table.rows else [])]  # a table unread
    has_split = any(row.split for row in table.rows)
    return findings + copies(images, automatic_split=not has_split)


def copies(images: list[tuple[str, str, str]], automatic_split: bool) -> list[Finding]:
    """A warning for every image that is a byte-identical copy of an earlier one (train before
    val before test), saying what the copy does to training or to the scores."""
    found = []
    groups = content_groups([path for _, _, path in images])
    for (split, cls, path), first in zip(images, groups, strict=True):
        split0, cls0, path0 = images[first]
        if path0 == path:
            continue
        if cls0 != cls:
            reason = f"identical to '{path0}' of class {cls0}: one image with two labels"
        elif split0 != split:
            reason = f"identical to '{path0}' ({split} repeats {split0}): its score measures memory"
        elif automatic_split:
            reason = f"identical to '{path0}': the automatic split keeps the copies in one split"
        else:
            reason = f"identical to '{path0}': one image counted twice in {split}"
        found.append(Finding("warning", path, reason))
    return found


def report(findings: list[Finding]) -> str:
    lines = []
    for severity in SEVERITIES:
        group = [f for f in findings if f.severity == severity]
        if group:
            lines.append(f"{severity.upper()} ({len(group)}):")
            lines += [f"  {f.path}: {f.reason}" for f in group]
    counts = ", ".join(f"{sum(f.severity == s for f in findings)} {s}" for s in SEVERITIES)
    ok = not any(f.severity == "error" for f in findings)
    verdict = "training can proceed" if ok else "training cannot start: fix the errors above"
    lines.append(f"Summary: {counts}. {verdict}.")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m project check-data",
                                description=__doc__.split("\n")[0])
    p.add_argument("data_dir", nargs="?", default="data/demo")
    p.add_argument("--labels", help="a labels table (image,label[s][,split]), as data.labels")
    p.add_argument("--max_megapixels", type=float, default=40.0)
    from project.extras.embeddings import check

    check.add_args(p)
    a = p.parse_args(argv)
    check.check_args(a)
    if not Path(a.data_dir).is_dir():  # not a report of the data: a wrong argument
        raise ProjectError(f"'{a.data_dir}' is not a folder: pass the data folder, as data.data_dir")
    if a.labels and not Path(a.labels).is_file():
        raise ProjectError(f"--labels '{a.labels}' is not a file: pass the labels table, as data.labels")
    if a.labels:
        findings = scan_table(a.data_dir, a.labels, a.max_megapixels * 1e6)
    else:
        findings = scan(a.data_dir, a.max_megapixels * 1e6)
    print(report(findings))
    if check.wanted(a):
        section = check.report(a)
        if section:
            print(section)
    return 1 if any(f.severity == "error" for f in findings) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
