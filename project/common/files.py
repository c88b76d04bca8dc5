"""One atomic writer and one image lister for training, deployment and tools (torch-free)."""

import os
import secrets
import shutil
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from project.errors import DISK_FULL_FIX, DiskFullError, disk_full

# the formats training reads (Pillow decodes them all)
IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}
)


@contextmanager
def atomic_path(final: str | Path) -> Iterator[Path]:
    """A temporary path beside ``final``, fsynced and renamed once written: never half-written
    (a name per writer: of processes writing one file at once, the last whole one wins). A full
    disk is one line naming the folder, not the writer's own error (torch's is a C++ assertion)."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.stem}.{os.getpid()}.{secrets.token_hex(4)}.tmp{final.suffix}")
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except Exception as err:
        if disk_full(err) is None:
            raise
        tmp.unlink(missing_ok=True)
        raise DiskFullError(no_room(final)) from None
    finally:
        tmp.unlink(missing_ok=True)


def no_room(path: Path) -> str:
    """The one line for a write that found the disk full."""
    free = shutil.disk_usage(path.parent).free / 2**20 if path.parent.is_dir() else 0.0
    return (f"no space left on the disk holding {path.parent} ({free:.0f} MB free): {path.name} was not "
            f"written and nothing half-written is left; {DISK_FULL_FIX}")


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def is_image_file(name: str) -> bool:
    return Path(name).suffix.lower() in IMAGE_EXTENSIONS and not Path(name).name.startswith(".")


def walk_files(folder: str | Path) -> list[str]:
    """Every non-hidden file below ``folder``, sorted, through symlinked folders but no cycle."""
    found: list[str] = []
    seen: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:
            dirnames[:] = []
            continue
        seen.add(real)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found.extend(os.path.join(dirpath, f) for f in filenames if not f.startswith("."))
    return sorted(found)


def list_images(path: str | Path, left_out: Counter | None = None) -> list[str]:
    """Image files below the folder ``path`` (by extension), sorted; a file is itself. ``left_out``
    counts the other files by extension, for :func:`left_out_text`."""
    path = Path(path)
    if path.is_file():
        return [str(path)]
    images = []
    for f in walk_files(path):
        if is_image_file(f):
            images.append(f)
        elif left_out is not None:
            left_out[Path(f).suffix.lower() or "no extension"] += 1
    return images


def left_out_text(left_out: Mapping[str, int]) -> str:
    """The files a listing left out, most common extension first: never dropped without a word."""
    counts = ", ".join(f"{ext} {n}" for ext, n in sorted(left_out.items(), key=lambda kv: (-kv[1], kv[0])))
    total = sum(left_out.values())
    return f"{total} other {'file' if total == 1 else 'files'} ({counts}), not images by their extension"
