"""Under DDP: one decoded image cache per node, mapped by every rank of it (imported only then).

Local rank 0 decodes into a file under /dev/shm (when it has room, else the temp folder), named
by a hash of the split, the side, the node, the job's rendezvous and the files' paths, sizes and
mtimes, and writes its index last, atomically. The other ranks wait at a barrier, then all map
the file copy-on-write: N ranks hold one copy of the pixels and decode nothing. Once all have
mapped it the file is unlinked; the memory returns when the last process exits. Only a crash
before every rank has mapped it leaves ``project-cache-*`` files behind, to delete.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from project.data.images import ImageCache, decode_all, offsets_of

log = logging.getLogger(__name__)


def shared_cache(paths: Sequence[str], short_side: int | None, tag: str, local_rank: int,
                 barrier: Callable[[], None], expected_bytes: int = 0) -> ImageCache:
    """The node's cache of ``paths``; every rank must call it (it waits at ``barrier`` twice).
    If rank 0 fails to decode, the others wait until the process group's timeout."""
    stem = _stem(paths, short_side, tag)
    if local_rank == 0:
        _write(paths, short_side, _folder(expected_bytes) / stem)
    barrier()
    index = next((f / f"{stem}.npz" for f in _folders() if (f / f"{stem}.npz").is_file()), None)
    if index is None:
        raise RuntimeError(f"the shared image cache {stem}.npz of local rank 0 is missing from "
                           f"{' and '.join(map(str, _folders()))}: set data.cache=none")
    with np.load(index) as arrays:
        shapes = arrays["shapes"]
    size = int(offsets_of([tuple(s) for s in shapes])[-1])
    # copy-on-write: reads share the page cache, a stray write stays private
    pixels = np.memmap(index.with_suffix(".u8"), dtype=np.uint8, mode="c", shape=(size,)) if size \
        else np.zeros(0, dtype=np.uint8)
    cache = ImageCache(torch.from_numpy(pixels), shapes, short_side)
    barrier()  # every rank has mapped it: the name is no longer needed
    if local_rank == 0:
        index.unlink(missing_ok=True)
        index.with_suffix(".u8").unlink(missing_ok=True)
    return cache


def _stem(paths: Sequence[str], short_side: int | None, tag: str) -> str:
    h = hashlib.sha256(f"{tag}\0{short_side}\0{socket.gethostname()}\0"
                       f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}\n".encode())
    for path in paths:
        try:
            st = os.stat(path)
            h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        except OSError:
            h.update(f"{path}\0missing\n".encode())
    return f"project-cache-{tag}-{h.hexdigest()[:20]}"


def _folders() -> list[Path]:
    shm = Path("/dev/shm")
    return [shm, Path(tempfile.gettempdir())] if shm.is_dir() else [Path(tempfile.gettempdir())]


def _folder(expected_bytes: int) -> Path:
    """/dev/shm (RAM, what a cache wants) when it has 10 % more room than needed."""
    for folder in _folders()[:-1]:
        if os.access(folder, os.W_OK) and shutil.disk_usage(folder).free > 1.1 * expected_bytes:
            return folder
    return _folders()[-1]


def _write(paths: Sequence[str], short_side: int | None, stem: Path) -> None:
    """The pixels to ``stem.u8``, then the shapes to ``stem.npz`` (last: marks it complete)."""
    partial = stem.with_name(f"{stem.name}.partial-{os.getpid()}")
    shapes = []
    with open(partial, "wb") as out:
        for img in decode_all(paths, short_side):
            shapes.append((0, 0, 0) if img is None else tuple(img.shape))
            if img is not None:
                out.write(img.numpy().tobytes())
    os.replace(partial, stem.with_suffix(".u8"))
    with open(partial, "wb") as out:
        np.savez(out, shapes=np.asarray(shapes, dtype=np.int64).reshape(-1, 3))
    os.replace(partial, stem.with_suffix(".npz"))
    log.info("decoded %d images once for every local rank into %s (%.1f MiB)", len(paths),
             stem.with_suffix(".u8"), offsets_of(shapes)[-1] / 2**20)
