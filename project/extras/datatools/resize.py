"""Copy an image folder with every image's short side reduced to N px (never enlarged).

    python -m project resize-data SRC OUT --side N [--workers K] [--quality 95]

Camera photos (12 MP) decode in ~150 ms each, every epoch; the model sees 224 px. Reduced once
here, they decode in a few ms and many more fit in ``data.cache``. Any layout is kept (the
relative path of every image); images are read as training reads them (EXIF orientation
applied: the output is upright, without an orientation tag; any mode to 8-bit RGB) and written
in their own format (JPEG at ``--quality``). An image already N px or smaller and upright is
copied as it is (no second JPEG compression). Non-image files are left out, as training
ignores them (a labels table too: keep ``data.labels`` at the original, with ``data.data_dir``
OUT).

Re-runnable: an output newer than its source is kept ("up to date"), so a second run is a
no-op and an interrupted one continues; a copy it made whose source is gone (moved to another
class, deleted, or now unreadable) is removed, so OUT trains as SRC does (files it did not write
are never touched). Every file is written under a temporary name and renamed, never
half-written. Undecodable files are skipped and listed with the reason.
Exit status 0 when OUT holds at least one image, else 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from pathlib import Path

from PIL import Image

from project.common.files import atomic_path, is_image_file, list_images, walk_files, write_text
from project.common.pixels import DECODE_ERRORS, read_rgb, to_rgb

MANIFEST = ".resize-data.json"  # hidden: training never lists it
ORIENTATION = 0x0112
SAVE_FORMATS = {"MPO": "JPEG"}  # a camera's multi-picture JPEG: keep the main picture as JPEG
QUALITY_FORMATS = ("JPEG", "WEBP")


def resize_file(src: str, out: str, side: int, quality: int = 95) -> str:
    """Write ``src`` reduced to ``side`` px of short side at ``out``; return "written" or
    "copied" (already small and upright: the bytes as they are). Raises if ``src`` is not a
    decodable image."""
    with Image.open(src) as img:
        fmt = img.format or ""
        upright = img.getexif().get(ORIENTATION, 1) == 1
        small = min(img.size) <= side
        if small and upright:
            img.load()  # a truncated or corrupt file fails here, as it would in training
            to_rgb(img)
    if small and upright:
        with atomic_path(out) as tmp:
            shutil.copyfile(src, tmp)
        return "copied"
    fmt = SAVE_FORMATS.get(fmt, fmt)
    params = {"quality": quality} if fmt in QUALITY_FORMATS else {}
    image = Image.fromarray(read_rgb(src, side))
    with atomic_path(out) as tmp:
        image.save(tmp, format=fmt, **params)
    return "written"


def _task(src: str, out: str, side: int, quality: int) -> tuple[str, str]:
    """(status, reason): never raises, so one bad file cannot stop the pool."""
    try:
        return resize_file(src, out, side, quality), ""
    except DECODE_ERRORS as err:
        return "skipped", f"{type(err).__name__}: {err}".replace("\n", " ")


def up_to_date(src: str, out: str) -> bool:
    """``out`` exists and is at least as new as ``src``."""
    try:
        return os.stat(out).st_mtime_ns >= os.stat(src).st_mtime_ns
    except OSError:
        return False


class Progress:
    """A line on stderr every ~5 % of the files (no dependency, readable in a log file)."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.step = total, 0, max(1, total // 20)

    def advance(self) -> None:
        self.done += 1
        if self.done % self.step == 0 or self.done == self.total:
            print(f"resize-data: {self.done}/{self.total} ({100 * self.done // self.total} %)",
                  file=sys.stderr, flush=True)


def run(src: Path, out: Path, side: int, workers: int, quality: int) -> tuple[dict[str, list], dict]:
    """Resize every image below ``src`` into ``out``: the files by outcome ("written",
    "copied", "up to date", "skipped", "removed"), and the reason of each skipped file."""
    settings = {"side": side, "quality": quality}
    manifest = out / MANIFEST
    try:
        before = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        before = None
    before = before if isinstance(before, dict) else None
    same_source = before is not None and before.get("source") == str(src.resolve())
    made_before = set(before.get("made", [])) if same_source else set()  # relative paths it wrote from SRC
    before = before and {k: before.get(k) for k in settings}
    redo = before is not None and before != settings  # other settings: every output is stale
    if redo:
        print(f"{out} was made with {before}: redoing every image with {settings}")
    outcome: dict[str, list] = {"written": [], "copied": [], "up to date": [], "skipped": [], "removed": []}
    todo: list[tuple[str, str]] = []
    for path in list_images(src):
        target = str(out / os.path.relpath(path, src))
        if not redo and up_to_date(path, target):
            outcome["up to date"].append(path)
        else:
            todo.append((path, target))
    progress, reasons = Progress(len(todo)), {}

    def record(path: str, status: str, reason: str) -> None:
        outcome[status].append(path)
        if reason:
            reasons[path] = reason
        progress.advance()

    if workers <= 1 or len(todo) <= 1:
        for path, target in todo:
            record(path, *_task(path, target, side, quality))
    else:
        with ProcessPoolExecutor(min(workers, len(todo))) as pool:
            futures: dict[Future, str] = {pool.submit(_task, p, t, side, quality): p for p, t in todo}
            for future in as_completed(futures):
                record(futures[future], *future.result())
    made = {os.path.relpath(p, src) for p in outcome["up to date"] + outcome["written"] + outcome["copied"]}
    # its own copies whose source is gone (moved to another class, deleted, unreadable) would still train
    outcome["removed"] = remove_made(out, made_before - made)
    if made and (before != settings or made != made_before or not same_source):
        stamp = {**settings, "source": str(src.resolve()), "made": sorted(made)}
        write_text(manifest, json.dumps(stamp) + "\n")
    return outcome, reasons


def remove_made(out: Path, gone: set[str]) -> list[str]:
    """Delete the files at ``gone`` (paths below ``out`` this command wrote earlier), and the
    folders that leaves empty; the paths deleted."""
    removed = []
    for relative in sorted(gone):
        path = out / relative
        if not path.is_file():
            continue
        path.unlink()
        removed.append(str(path))
        folder = path.parent
        while folder != out and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
            folder = folder.parent
    return removed


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m project resize-data",
                                description=__doc__.split("\n")[0])
    p.add_argument("src", metavar="SRC", help="the data folder (any layout: class folders, train/val/test)")
    p.add_argument("out", metavar="OUT", help="the folder to write (the same layout)")
    p.add_argument("--side", type=int, required=True, metavar="N",
                   help="short side in px; training decodes at max(image_size / crop_ratio, "
                        "image_size / sqrt(min crop_scale)): 290 for 224 px with the defaults")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, metavar="K",
                   help="processes (default: the CPUs)")
    p.add_argument("--quality", type=int, default=95, help="JPEG (and WebP) quality, 1-100")
    a = p.parse_args(argv)
    src, out = Path(a.src), Path(a.out)
    if a.side < 1 or not 1 <= a.quality <= 100:
        p.error("--side must be 1 or more and --quality in 1..100")
    if not src.is_dir():
        print(f"error: SRC '{src}' is not a folder", file=sys.stderr)
        return 2
    if out.exists() and not out.is_dir():
        print(f"error: OUT '{out}' is a file: pass a folder to write to", file=sys.stderr)
        return 2
    if out.resolve() == src.resolve() or src.resolve() in out.resolve().parents:
        print(f"error: OUT '{out}' must not be SRC or inside it", file=sys.stderr)
        return 2
    if out.resolve() in src.resolve().parents:
        print(f"error: OUT '{out}' must not hold SRC: choose a folder beside it", file=sys.stderr)
        return 2
    outcome, reasons = run(src, out, a.side, a.workers, a.quality)
    others = sum(1 for f in walk_files(src) if not is_image_file(f))
    counts = ", ".join(f"{len(files)} {name}" for name, files in outcome.items())
    print(f"{src} -> {out} at {a.side} px: {counts}"
          + (f"; {others} non-image files left out" if others else ""))
    for path in sorted(outcome["skipped"]):
        print(f"  skipped {path}: {reasons[path]}")
    kept = len(outcome["written"]) + len(outcome["copied"]) + len(outcome["up to date"])
    if not kept:
        print(f"error: SRC '{src}' holds no image that could be read", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
