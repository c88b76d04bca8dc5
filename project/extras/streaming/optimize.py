"""Turn a class-folder data set into LitData chunks, one folder per split, for streaming.

    python -m project optimize-data SRC OUT [--max-side N] [--workers K] [--chunk-bytes 64MB]

Past some hundred thousand images a folder of files is slow to list and open every epoch (above
all on network file systems and object stores), and every node needs the whole folder. LitData's
``optimize`` packs the images into chunk files that ``StreamingDataset`` streams to any number
of ranks and nodes (``dataset.py`` beside this file); ``data.data_dir=OUT`` then trains from them.

The splits are the ones training makes (train/val/test folders, or the seeded split of one
folder with the same ``--val-fraction``, ``--test-fraction`` and ``--split-seed``). Images are
stored encoded, as their file's bytes, so the chunks stay as small as the source and decode
with the project's decoder; ``--max-side N`` reduces images whose short side exceeds N first.
Undecodable files are named and left out. ``OUT/project.json`` (classes, split sizes and labels,
source, settings, a fingerprint of the source files) is what makes OUT an optimized data set:
everything is written into a hidden folder beside OUT and renamed at the end, so an interrupted
run leaves no OUT that looks complete, and a second run on an unchanged source is a no-op.
OUT may be ``s3://bucket/prefix``: written locally the same way, then uploaded, ``project.json`` last.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import random
import shutil
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from PIL import Image

from project.common.files import list_images, write_text
from project.common.pixels import read_rgb
from project.data.folders import STREAMING_MANIFEST, DataFolderError, discover
from project.data.images import DECODE_ERRORS
from project.errors import ConfigError
from project.extras.streaming import objects

MANIFEST = STREAMING_MANIFEST
FORMAT = 2  # 2: training images stored in a seeded random order (1 kept them class by class)
SAVE_FORMATS = {"MPO": "JPEG"}


def encode(path: str, max_side: int | None) -> bytes:
    """The bytes to store for ``path``: the file itself, or the image reduced to ``max_side``
    px of short side (upright, in its own format). Raises if the file is not a decodable image,
    as training would."""
    pixels = read_rgb(path, max_side)  # decodes every pixel: a truncated file fails here
    with Image.open(path) as img:
        fmt, size = SAVE_FORMATS.get(img.format or "", img.format or "PNG"), img.size
    if max_side is None or min(size) <= max_side:
        return Path(path).read_bytes()
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt, **({"quality": 95} if fmt in ("JPEG", "WEBP") else {}))
    return out.getvalue()


def encode_item(item: tuple[str, int], max_side: int | None, bad_dir: str) -> dict | None:
    """One chunk item; ``None`` (left out by LitData) for an undecodable file, whose path and
    reason go to a file in ``bad_dir`` (workers are other processes)."""
    path, label = item
    try:
        data = encode(path, max_side)
    except DECODE_ERRORS as err:
        name = hashlib.sha1(path.encode()).hexdigest() + ".json"
        reason = f"{type(err).__name__}: {err}".replace("\n", " ")
        Path(bad_dir, name).write_text(json.dumps({"path": path, "reason": reason}))
        return None
    # the path as bytes: LitData would read a str ending in .jpg as a file to load
    return {"image": data, "label": label, "path": path.encode()}


def fingerprint(src: Path, settings: dict) -> str:
    """Hash of every image's relative path, size and mtime, and of the settings."""
    h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for path in list_images(src):
        st = os.stat(path)
        h.update(f"{os.path.relpath(path, src)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def read_manifest(folder: str | Path) -> dict | None:
    try:
        return json.loads((Path(folder) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_split(items: list[tuple[str, int]], out: Path, max_side: int | None, workers: int,
                chunk_bytes: str) -> tuple[list[int], list[dict]]:
    """Optimize one split into ``out``: (labels in stored order, skipped files)."""
    import litdata

    bad_dir = out.parent / f".bad-{out.name}"
    bad_dir.mkdir(parents=True)
    litdata.optimize(
        fn=partial(encode_item, max_side=max_side, bad_dir=str(bad_dir)), inputs=items,
        output_dir=str(out), chunk_bytes=chunk_bytes, num_workers=max(1, min(workers, len(items))),
        keep_data_ordered=True, mode="overwrite",  # the input order: labels known without reading back
        start_method="fork" if sys.platform == "linux" else None, verbose=True)
    skipped = sorted((json.loads(p.read_text()) for p in bad_dir.iterdir()), key=lambda s: s["path"])
    shutil.rmtree(bad_dir)
    left_out = {s["path"] for s in skipped}
    return [label for path, label in items if path not in left_out], skipped


def up_to_date(manifest: dict | None, stamp: str) -> bool:
    """Written by this version from the same files and settings."""
    return manifest is not None and manifest.get("format") == FORMAT and manifest.get("fingerprint") == stamp


def run(src: Path, out: Path, settings: dict, workers: int) -> tuple[dict, bool]:
    """Optimize ``src`` into ``out`` unless ``out`` is up to date: (manifest, whether written)."""
    stamp = fingerprint(src, settings)
    before = read_manifest(out)
    if up_to_date(before, stamp):
        return before, False
    try:
        splits = discover(src, settings["val_fraction"], settings["test_fraction"], settings["split_seed"])
    except DataFolderError:
        tables = sorted(p.name for p in src.glob("*.csv"))
        if not tables:
            raise
        raise ConfigError(f"'{src}' has no class folders but a labels table ({tables[0]}): optimize-data "
                          "packs class folders only; train from the folder itself with data.labels") from None
    partial_dir = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(partial_dir, ignore_errors=True)
    try:
        manifest: dict = {"format": FORMAT, "classes": splits.classes, "source": str(src.resolve()),
                          "settings": settings, "fingerprint": stamp, "splits": {}, "skipped": []}
        for name in ("train", "val", "test"):
            items = [(s.path, s.label) for s in getattr(splits, name)]
            if not items:
                continue
            if name == "train":  # mixed classes in every chunk and every block LitData reads in turn
                random.Random(settings["split_seed"]).shuffle(items)
            print(f"optimize-data: {name}: {len(items)} images", file=sys.stderr, flush=True)
            labels, skipped = write_split(items, partial_dir / name,
                                          settings["max_side"], workers, settings["chunk_bytes"])
            manifest["splits"][name] = {"size": len(labels), "labels": labels}
            manifest["skipped"] += skipped
        if not manifest["splits"].get("train", {}).get("size"):
            raise DataFolderError(f"no decodable training image in '{src}': see the files named above")
        write_text(partial_dir / MANIFEST, json.dumps(manifest) + "\n")  # last: marks it complete
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        if out.exists():
            out.rename(old)
        partial_dir.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(partial_dir, ignore_errors=True)
    return manifest, True


def run_to_object_store(src: Path, url: str, settings: dict, workers: int) -> tuple[dict, bool]:
    """``run`` into a temporary folder, then upload it to ``url``: the old manifest is deleted
    first and the new one sent last, so a copy without ``project.json`` is never read as
    complete, and an upload stopped half-way is redone by the next run."""
    before = objects.read_json(url, MANIFEST)  # also checks the bucket and the credentials
    if up_to_date(before, fingerprint(src, settings)):
        return before, False
    if before is None:
        foreign = [k for k in objects.list_keys(url) if k.split("/")[0] not in objects.SPLITS]
        if foreign:
            raise ConfigError(f"OUT '{url}' holds other objects ({foreign[0]}, ...) and is not an "
                              f"optimized data set (no {MANIFEST}): choose a new prefix")
    with tempfile.TemporaryDirectory(prefix="optimize-data-") as tmp:
        manifest, _ = run(src, Path(tmp) / "out", settings, workers)
        if before is not None:
            objects.delete(url, MANIFEST)
        sent = objects.upload_folder(Path(tmp) / "out", url, last=MANIFEST)
    print(f"optimize-data: uploaded {sent / 2**20:.1f} MB to {url}", file=sys.stderr, flush=True)
    return manifest, True


def check_source(src: Path) -> None:
    if not src.is_dir():
        raise ConfigError(f"SRC '{src}' is not a folder: give the data folder (class folders, or "
                          "train/val/test with class folders)")


def check_paths(src: Path, out: Path) -> None:
    """Raise :class:`ConfigError` naming the path and the fix."""
    check_source(src)
    if out.resolve() == src.resolve() or src.resolve() in out.resolve().parents:
        raise ConfigError(f"OUT '{out}' is SRC or inside it, where training would list the chunks "
                          "as data: choose a folder outside SRC")
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and read_manifest(out) is None:
        raise ConfigError(f"OUT '{out}' exists and is not an optimized data set (no {MANIFEST}): "
                          "choose a new folder, or delete it")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m project optimize-data", description=__doc__.split("\n")[0])
    p.add_argument("src", metavar="SRC", help="the data folder, as data.data_dir takes it")
    p.add_argument("out", metavar="OUT",
                   help="the folder to write, or s3://BUCKET/PREFIX (then data.data_dir=OUT)")
    p.add_argument("--max-side", type=int, default=None, metavar="N",
                   help="reduce images whose short side is above N px (default: store the files as they are)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, metavar="K",
                   help="processes (default: the CPUs)")
    p.add_argument("--chunk-bytes", default="64MB", help="size of each chunk file (LitData's chunk_bytes)")
    p.add_argument("--val-fraction", type=float, default=0.15, help="as data.val_fraction")
    p.add_argument("--test-fraction", type=float, default=0.15, help="as data.test_fraction")
    p.add_argument("--split-seed", type=int, default=0, help="as data.split_seed")
    a = p.parse_args(argv)
    if a.max_side is not None and a.max_side < 1:
        p.error("--max-side must be 1 or more")
    src, out = Path(a.src), (a.out if a.out.startswith("s3://") else Path(a.out))
    settings = {"max_side": a.max_side, "chunk_bytes": a.chunk_bytes, "val_fraction": a.val_fraction,
                "test_fraction": a.test_fraction, "split_seed": a.split_seed}
    start = time.perf_counter()
    if isinstance(out, str):
        check_source(src)
        manifest, written = run_to_object_store(src, out, settings, a.workers)
    else:
        check_paths(src, out)
        manifest, written = run(src, out, settings, a.workers)
    sizes = ", ".join(f"{n} {s['size']}" for n, s in manifest["splits"].items())
    if not written:
        print(f"{out} is up to date with {src} ({sizes}): nothing to do")
        return 0
    print(f"{src} -> {out} in {time.perf_counter() - start:.1f} s: {len(manifest['classes'])} classes, "
          f"{sizes}; train with --data.data_dir={out}")
    for s in manifest["skipped"]:
        print(f"  skipped {s['path']}: {s['reason']} (remove or replace the file)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
