"""Embeddings once: the features a network's head decides on (its input), for every image of a
list, computed in batches with the network's evaluation preprocessing and kept on disk.

The cache lives in ``logs/embeddings/<key>/``: ``key`` names the network (backbone and the sha256
of its weights: a checkpoint, or the weights file or name of a config) and its preprocessing, so
the embeddings of another network are never read. Inside, each image is found by the sha1 of its
bytes: a moved file is not embedded again, a changed one is (alone). Every call that computed
something adds one ``.npz`` shard, written to a temporary name and renamed, so an interrupted
embed leaves nothing a later run would read. Files that cannot be decoded are remembered (by
content) and counted, never fatal. probe, suspects, check-data and suggest all read it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from project.common.files import atomic_path, write_text
from project.errors import ProjectError

log = logging.getLogger("project")
CACHE_ROOT = Path("logs") / "embeddings"
FORMAT = 1  # bumped when the shards change: an old cache is then rebuilt, not misread
COMPACT_AFTER = 32  # shards: past this many, they are merged into one
FORWARDED = 0  # images this process has actually embedded (a cache hit adds nothing): tests count it


class NothingDecodable(ProjectError):
    """Not one of the files given could be decoded as an image."""


@dataclass
class Network:
    """The model whose head input is the embedding, and what its embeddings depend on."""

    model: nn.Module
    identity: dict  # backbone, weights (sha256 or name), preprocessing: the cache key's content
    described: str  # for people: where the network came from
    gives_logits: bool = True  # a trained checkpoint's head; a config's new head is random

    @property
    def key(self) -> str:
        text = json.dumps({**self.identity, "format": FORMAT}, sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:16]


@dataclass
class Embedded:
    """The decodable images of a call (``paths``, in the order given), their embeddings (N, D) and
    the network's logits (N, C; None for a config's network); the files left out (``skipped``);
    ``computed``: how many of them this call embedded (the rest came from the cache)."""

    paths: list[str]
    features: np.ndarray
    logits: np.ndarray | None
    skipped: list[str]
    computed: int
    folder: Path


def identity_of(model, weights: str) -> dict:
    return {"backbone": str(model.hparams.backbone), "weights": weights,
            "preprocessing": {k: list(v) if isinstance(v, tuple) else v
                              for k, v in asdict(model.preprocessing).items()}}


def content_hash(path: str) -> str:
    """sha1 of the file's bytes: the cache's name for an image (a rename keeps it, an edit changes it)."""
    digest = hashlib.sha1()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def forward_pass(model, paths: list[str], batch_size: int = 64, device: str = "cpu",
                 num_workers: int = 0) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """(indices of the decodable ``paths``, their logits, their embeddings) from one pass of
    ``predict_dataset`` with a hook on the head's input: the same features the head decides on."""
    from project.data.datasets import ImageDataset
    from project.data.folders import Sample
    from project.data.images import needed_side
    from project.data.transforms import eval_transforms
    from project.extras.analysis.predictions import predict_dataset

    head: nn.Module = model.net.get_submodule(model.head_name)
    caught: list[torch.Tensor] = []
    hook = head.register_forward_hook(lambda _m, inputs, _out: caught.append(
        inputs[0].detach().flatten(1).float().cpu()))
    pre = model.preprocessing
    dataset = ImageDataset([Sample(p, -1) for p in paths], eval_transforms(pre), short_side=needed_side(pre))
    try:
        out = predict_dataset(model, dataset, batch_size, device, num_workers)
    except ProjectError as err:  # not one decodable image
        raise NothingDecodable(f"none of the {len(paths)} files could be decoded as an image "
                           "(python -m project check-data DIR says why)") from err
    finally:
        hook.remove()
    embeddings = torch.cat(caught)
    if len(embeddings) != len(out["index"]):
        raise ProjectError(f"the head '{model.head_name}' ran {len(embeddings)} times for "
                           f"{len(out['index'])} images: its input is not one embedding per image")
    return out["index"].tolist(), out["logits"], embeddings


def open_cache(root: Path, network: Network) -> Path:
    """The network's cache folder, made (with ``meta.json``) when missing; a folder whose
    ``meta.json`` names another network or format is emptied and rebuilt, which a notice says."""
    folder = root / network.key
    meta = {"format": FORMAT, **network.identity, "described": network.described}
    if folder.is_dir():
        try:
            stored = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            stored = None
        if stored is not None and {k: v for k, v in stored.items() if k != "described"} == \
                {k: v for k, v in meta.items() if k != "described"}:
            return folder
        log.info("Notice: the embedding cache '%s' was made with another network, preprocessing or "
                 "format: rebuilt for %s", folder, network.described)
        for shard in folder.glob("*.npz"):
            shard.unlink(missing_ok=True)
    else:
        others = [p for p in root.glob("*/meta.json")] if root.is_dir() else []
        if others:
            log.info("Notice: no embeddings of %s in '%s' yet (those there are of another network or "
                     "preprocessing, not reused): embedding into '%s'", network.described, root, folder)
    write_text(folder / "meta.json", json.dumps(meta, indent=1))
    return folder


def read_shards(folder: Path) -> tuple[dict[str, tuple[np.ndarray, np.ndarray | None]], set[str], list[Path]]:
    """({content hash: (embedding, logits)}, hashes of undecodable files, the shard files)."""
    known: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
    bad: set[str] = set()
    shards = sorted(p for p in folder.glob("*.npz") if not p.name.startswith("."))
    for shard in shards:
        try:
            with np.load(shard, allow_pickle=False) as z:  # each z[name] reads the whole array again:
                hashes, features = z["hashes"].tolist(), z["features"]  # once per shard, never per row
                logits = z["logits"] if "logits" in z.files else None
                bad.update(z["bad"].tolist())
            for i, h in enumerate(hashes):
                known[h] = (features[i], None if logits is None else logits[i])
        except (OSError, ValueError, KeyError) as err:  # not written by this code: never trusted
            log.info("Notice: embedding shard '%s' is unreadable (%s): ignored; its images are embedded "
                     "again", shard, type(err).__name__)
    return known, bad, shards


def write_shard(folder: Path, hashes: list[str], features: np.ndarray, logits: np.ndarray | None,
                bad: list[str]) -> Path:
    """One shard, atomically (a half-written one never has the name a reader looks for)."""
    path = folder / f"{time.time_ns()}-{os.getpid()}.npz"
    arrays = {"hashes": np.array(hashes, dtype="U40"), "features": features.astype(np.float32),
              "bad": np.array(bad, dtype="U40")}
    if logits is not None:
        arrays["logits"] = logits.astype(np.float32)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)
    return path


def compact(folder: Path, known: dict, bad: set[str], shards: list[Path]) -> None:
    """Many shards become one (written first, then the old ones removed: a reader meanwhile sees
    each entry once or twice, never none)."""
    hashes = list(known)
    features = np.stack([known[h][0] for h in hashes]) if hashes else np.zeros((0, 0), np.float32)
    with_logits = hashes and all(known[h][1] is not None for h in hashes)
    logits = np.stack([known[h][1] for h in hashes]) if with_logits else None
    write_shard(folder, hashes, features, logits, sorted(bad))
    for shard in shards:
        shard.unlink(missing_ok=True)


def process_group() -> tuple[int, int]:
    """(rank, world size) of the process group this runs in (torchrun); (0, 1) alone."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def embed(paths: list[str], network: Network, cache: str | Path = CACHE_ROOT, batch_size: int = 64,
          device: str | None = None, num_workers: int = 0) -> Embedded:
    """The embeddings of ``paths``: those the cache holds read, the others computed once and added.
    Unreadable or undecodable files are left out and listed in ``skipped``."""
    global FORWARDED
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    folder = open_cache(Path(cache), network)
    rank, world = process_group()
    if world > 1:  # every rank reads the cache as it was before any of them adds to it
        import torch.distributed as dist

        dist.barrier()
    known, bad, shards = read_shards(folder)
    hashes: list[str | None] = []
    for p in paths:
        try:
            hashes.append(content_hash(p))
        except OSError:  # missing or not readable: skipped, never cached
            hashes.append(None)
    todo: dict[str, str] = {}  # hash -> a path with that content, not yet embedded
    for p, h in zip(paths, hashes, strict=True):
        if h is not None and h not in known and h not in bad:
            todo.setdefault(h, p)
    computed = 0
    if world > 1:  # each rank embeds its share of what is missing; all read everyone's shards after
        todo = dict(sorted(todo.items())[rank::world])
    if todo:
        todo_hashes, todo_paths = list(todo), list(todo.values())
        try:
            index, logits, features = forward_pass(network.model, todo_paths, batch_size, device, num_workers)
        except NothingDecodable:
            index, logits, features = [], torch.zeros(0, 0), torch.zeros(0, 0)
        computed = len(index)
        FORWARDED += computed
        done = [todo_hashes[i] for i in index]
        failed = sorted(set(todo_hashes) - set(done))
        keep_logits = logits.numpy() if network.gives_logits and computed else None
        write_shard(folder, done, features.numpy(), keep_logits, failed)
        for k, h in enumerate(done):
            known[h] = (features[k].numpy(), None if keep_logits is None else keep_logits[k])
        bad.update(failed)
    if world > 1:
        total = torch.tensor([computed])
        dist.all_reduce(total)  # also waits for every rank's shard
        known, bad, shards = read_shards(folder)
    if computed and rank == 0 and len(shards) + 1 > COMPACT_AFTER:
        compact(folder, known, bad, sorted(p for p in folder.glob("*.npz") if not p.name.startswith(".")))
    kept = [i for i, h in enumerate(hashes) if h is not None and h in known]
    skipped = [paths[i] for i, h in enumerate(hashes) if h is None or h not in known]
    rows = [known[hashes[i]] for i in kept]
    features = np.stack([r[0] for r in rows]) if rows else np.zeros((0, 0), np.float32)
    with_logits = network.gives_logits and rows and all(r[1] is not None for r in rows)
    logits = np.stack([r[1] for r in rows]) if with_logits else None
    computed = int(total) if world > 1 else computed  # by every rank
    return Embedded([paths[i] for i in kept], features, logits, skipped, computed, folder)
