"""Decode image files to uint8 RGB tensors, and an optional in-memory cache of them.

One decoder for the training data, the cache, ``predict`` and ``check-data``, so that every path
sees the same pixels: EXIF orientation applied, any mode (grayscale, palette, RGBA, CMYK,
16-bit) converted to 8-bit RGB, and the image reduced once to the short side the transforms
need (:func:`decode_side`): a 12-MP photo decodes ~6x faster and takes ~50x less cache memory.
Under DDP, :func:`shared_cache` decodes once per node into a file every rank maps.
"""

from __future__ import annotations

import hashlib
import io
import logging
import math
import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from project.common.pixels import decoded_size, read_rgb
from project.data.transforms import Preprocessing

log = logging.getLogger(__name__)


def decode_side(pre: Preprocessing, crop_scale: tuple[float, float] | None = None) -> int:
    """The short side the decoder must deliver: the one rule for every path.

    Evaluation (``crop_scale`` None) resizes the short side to ``pre.resize_size`` anyway, so
    its images are resampled once, as from the full image. Training's random resized crop keeps
    an area share drawn from ``crop_scale``; the image keeps ``image_size / sqrt(min share)``
    pixels of short side, so even the smallest crop is not enlarged by area (290 px at 224 px
    and the defaults). Sized for the median crop (256 px), the smaller crops were enlarged up
    to 1.15x and came out softer than evaluation's images; a 12-MP photo takes 0.32 MB of
    cache at 290 px (0.25 MB at 256).
    """
    if crop_scale is None:
        return pre.resize_size
    need = pre.image_size / math.sqrt(crop_scale[0])
    return max(pre.resize_size, math.ceil(need - 1e-9))  # 224 / sqrt(0.25) is 448, not 449


def decode(path: str, short_side: int | None = None) -> torch.Tensor:
    """Read ``path`` as a uint8 tensor of shape (3, H, W); raises if the file is not an image.

    ``short_side``: reduce the image to that short side (never enlarged); None: full size.
    """
    return torch.from_numpy(read_rgb(path, short_side)).permute(2, 0, 1).contiguous()


def decode_bytes(data: bytes, short_side: int | None = None) -> torch.Tensor:
    """:func:`decode` for an image file's bytes, as an optimized data set stores them."""
    return torch.from_numpy(read_rgb(io.BytesIO(data), short_side)).permute(2, 0, 1).contiguous()


def decoded_bytes(path: str, short_side: int | None = None) -> int:
    """Bytes the decoded (and reduced) image takes, from the header alone (no pixel decoding)."""
    try:
        w, h = decoded_size(path, short_side)
    except Exception:
        return 0
    return 3 * w * h


class ImageCache:
    """Every image decoded once (reduced to ``short_side``) into one flat uint8 buffer.

    One buffer (not one tensor per image) means DataLoader workers forked from the main
    process read the same physical pages: nothing is copied per worker, and the per-item
    reference counting of Python objects never touches the pixels.
    """

    def __init__(self, paths: Sequence[str], threads: int | None = None,
                 short_side: int | None = None) -> None:
        decoded = list(_decode_all(paths, threads, short_side))
        shapes = [(0, 0, 0) if img is None else tuple(img.shape) for img in decoded]
        sizes = [c * h * w for c, h, w in shapes]
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        buffer = torch.empty(int(offsets[-1]), dtype=torch.uint8)
        for i, img in enumerate(decoded):
            if img is not None:
                buffer[offsets[i]: offsets[i + 1]] = img.reshape(-1)
        self._set(buffer, offsets, shapes, {i for i, img in enumerate(decoded) if img is None}, short_side)

    def _set(self, buffer: torch.Tensor, offsets: np.ndarray, shapes: Sequence, bad: set[int],
             short_side: int | None) -> None:
        self.buffer, self.offsets, self.bad, self.short_side = buffer, offsets, bad, short_side
        self.shapes = np.asarray(shapes, dtype=np.int64).reshape(-1, 3)

    def __len__(self) -> int:
        return len(self.shapes)

    def __getitem__(self, i: int) -> torch.Tensor | None:
        if i in self.bad:
            return None
        c, h, w = (int(v) for v in self.shapes[i])
        return self.buffer[self.offsets[i]: self.offsets[i + 1]].view(c, h, w)


def shared_cache(paths: Sequence[str], short_side: int | None, tag: str, local_rank: int,
                 barrier: Callable[[], None], expected_bytes: int = 0,
                 threads: int | None = None) -> ImageCache:
    """An :class:`ImageCache` decoded once per node and mapped by every rank of it (DDP).

    Local rank 0 decodes into a file under /dev/shm (when it has room, else the temp folder),
    named by ``tag``, the side, the node, the job's rendezvous port and the files' paths, sizes
    and mtimes, and writes its index last, atomically. The other ranks wait at ``barrier``
    (every rank must call this), then all map the file copy-on-write: N ranks hold one copy of
    the pixels, not N, and decode nothing. Once all have mapped it, the file is unlinked; the
    memory goes back to the system when the last process exits. Only a crash before every rank
    has mapped it leaves ``project-cache-*`` files behind, to delete. If rank 0 fails to
    decode, the others wait at the barrier until the process group's timeout.
    """
    stem = _cache_stem(paths, short_side, tag)
    if local_rank == 0:
        folder = _cache_folder(expected_bytes)
        _write_shared(paths, short_side, folder / stem, threads)
    barrier()
    index = next((f / f"{stem}.npz" for f in _cache_folders() if (f / f"{stem}.npz").is_file()), None)
    if index is None:
        raise RuntimeError(f"the shared image cache {stem}.npz of local rank 0 is missing from "
                           f"{' and '.join(map(str, _cache_folders()))}: set data.cache=none")
    cache = _map_shared(index, short_side)
    barrier()  # every rank has mapped it: the name is no longer needed
    if local_rank == 0:
        index.unlink(missing_ok=True)
        index.with_suffix(".u8").unlink(missing_ok=True)
    return cache


def _decode_all(paths: Sequence[str], threads: int | None,
                short_side: int | None) -> Iterator[torch.Tensor | None]:
    """Decoded images (None for a bad file), in order, from a thread pool; each is released
    once consumed, so writing them out as they come never holds them all."""
    threads = threads or min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(threads) as pool:  # PIL releases the GIL while decoding
        yield from pool.map(lambda p: _try_decode(p, short_side), paths)


def _cache_stem(paths: Sequence[str], short_side: int | None, tag: str) -> str:
    h = hashlib.sha256(f"{tag}\0{short_side}\0{socket.gethostname()}\0"
                       f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}\n".encode())
    for path in paths:
        try:
            st = os.stat(path)
            h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        except OSError:
            h.update(f"{path}\0missing\n".encode())
    return f"project-cache-{tag}-{h.hexdigest()[:20]}"


def _cache_folders() -> list[Path]:
    shm = Path("/dev/shm")
    return [shm, Path(tempfile.gettempdir())] if shm.is_dir() else [Path(tempfile.gettempdir())]


def _cache_folder(expected_bytes: int) -> Path:
    """/dev/shm (RAM, what a cache wants) when it has 10 % more room than needed."""
    for folder in _cache_folders()[:-1]:
        if os.access(folder, os.W_OK) and shutil.disk_usage(folder).free > 1.1 * expected_bytes:
            return folder
    return _cache_folders()[-1]


def _write_shared(paths: Sequence[str], short_side: int | None, stem: Path, threads: int | None) -> None:
    """The pixels to ``stem.u8``, then offsets, shapes and bad indices to ``stem.npz`` (last)."""
    partial = stem.with_name(f"{stem.name}.partial-{os.getpid()}")
    shapes = []
    with open(partial, "wb") as out:
        for img in _decode_all(paths, threads, short_side):
            shapes.append((0, 0, 0) if img is None else tuple(img.shape))
            if img is not None:
                out.write(img.numpy().tobytes())
    os.replace(partial, stem.with_suffix(".u8"))
    sizes = [c * h * w for c, h, w in shapes]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    bad = np.asarray([i for i, s in enumerate(shapes) if s == (0, 0, 0)], dtype=np.int64)
    with open(partial, "wb") as out:
        np.savez(out, offsets=offsets, shapes=np.asarray(shapes, dtype=np.int64).reshape(-1, 3), bad=bad)
    os.replace(partial, stem.with_suffix(".npz"))
    log.info("decoded %d images once for every local rank into %s (%.1f MiB)", len(paths),
             stem.with_suffix(".u8"), offsets[-1] / 2**20)


def _map_shared(index: Path, short_side: int | None) -> ImageCache:
    """Copy-on-write map of the pixels: reads share the page cache, a stray write stays private."""
    with np.load(index) as arrays:
        offsets, shapes, bad = arrays["offsets"], arrays["shapes"], arrays["bad"]
    size = int(offsets[-1])
    pixels = np.memmap(index.with_suffix(".u8"), dtype=np.uint8, mode="c", shape=(size,)) if size else \
        np.zeros(0, dtype=np.uint8)
    cache = ImageCache.__new__(ImageCache)
    cache._set(torch.from_numpy(pixels), offsets, shapes, set(bad.tolist()), short_side)
    return cache


def _try_decode(path: str, short_side: int | None = None) -> torch.Tensor | None:
    try:
        return decode(path, short_side)
    except Exception:
        return None
