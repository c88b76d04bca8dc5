"""The seeded, stratified split of one folder, with byte-identical files kept together in one
split (no copy of a training image is scored in val or test). Imported only when a split is
made (one folder, or train/ without val/), by check-data and by suspects' folds.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from project.data.samples import Sample

log = logging.getLogger(__name__)


def content_groups(paths: list[str]) -> list[int]:
    """A group number per file; byte-identical files share one. Only files of equal size are
    read and hashed, so a folder without copies costs one ``stat`` per file."""
    by_size: dict[int, list[int]] = defaultdict(list)
    for i, path in enumerate(paths):
        by_size[os.path.getsize(path)].append(i)
    group = list(range(len(paths)))
    for same_size in by_size.values():
        if len(same_size) > 1:
            first_of: dict[str, int] = {}
            for i in same_size:
                with open(paths[i], "rb") as f:
                    digest = hashlib.sha1(f.read()).hexdigest()
                group[i] = first_of.setdefault(digest, i)
    return group


def units_of(count: int, groups: list[int] | None = None) -> list[list[int]]:
    """Sample indices bundled into units (a file, or a group of identical files), in order of
    first appearance."""
    units: dict[int, list[int]] = {}
    for i, g in enumerate(groups if groups is not None else range(count)):
        units.setdefault(g, []).append(i)
    return list(units.values())


def units_by_label(samples: list[Sample], groups: list[int] | None = None) -> dict[int, list[list[int]]]:
    """:func:`units_of` per label (a group goes with its first file's label)."""
    out: dict[int, list[list[int]]] = defaultdict(list)
    for members in units_of(len(samples), groups):
        out[samples[members[0]].label].append(members)
    return dict(sorted(out.items()))


def draw(key: str, seed: int) -> float:
    """A number in [0, 1) fixed by a file's key and the seed alone."""
    digest = hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def file_keys(paths: list[str]) -> list[str]:
    """Each file's name, or, where names repeat (``<id>/image.jpg``, two cameras' IMG_0001.JPG),
    the shortest tail of its path that tells it apart: a file keeps its split when others are
    added or removed, the folder is moved, or the same images are listed in a table instead."""
    parts = [Path(p).parts for p in paths]
    keys, depth = [p[-1] for p in parts], [1] * len(parts)
    while True:  # only the files whose key repeats look one folder further up
        seen = Counter(keys)
        again = [i for i, k in enumerate(keys) if seen[k] > 1 and depth[i] < len(parts[i])]
        if not again:
            return keys
        for i in again:
            depth[i] += 1
            keys[i] = "/".join(parts[i][-depth[i]:])


def stratified_split(samples: list[Sample], fraction: float, seed: int,
                     groups: list[int] | None = None) -> tuple[list[Sample], list[Sample]]:
    """Move about ``fraction`` of every class aside, whole units at a time: a unit goes aside when
    its draw is below ``fraction``, so adding images never moves a trained one into val or test.
    A class of two or more units keeps at least one on each side (its lowest draw aside); a class
    of one keeps it for training."""
    keep: list[Sample] = []
    held: list[Sample] = []
    keys = file_keys([s.path for s in samples])
    for units in units_by_label(samples, groups).values():
        # a unit's highest draw: a copy added later can move its unit only towards train
        draws = [max(draw(keys[i], seed) for i in u) for u in units]
        aside = [d < fraction and len(units) >= 2 for d in draws]  # a class of one: all for train
        if fraction > 0 and len(units) >= 2 and not any(aside):
            aside[int(np.argmin(draws))] = True
        if len(units) >= 2 and all(aside):
            aside[int(np.argmax(draws))] = False
        held += [samples[i] for u, a in zip(units, aside, strict=True) if a for i in u]
        keep += [samples[i] for u, a in zip(units, aside, strict=True) if not a for i in u]
    return keep, held


def multi_hot_split(samples: list[Sample], fraction: float, seed: int,
                    groups: list[int] | None = None) -> tuple[list[Sample], list[Sample]]:
    """The split of multi-hot labels (multi-label; multi-output as one-hot per column) by the draws
    of :func:`stratified_split`: a unit goes aside when its draw is below ``fraction``, so editing
    other rows moves no image. Then a label on two or more units none of which drew aside gives
    its lowest draw, and a label whose every unit is aside keeps its highest for training (only
    these can move when rows change). A label's share is the fraction on average, as a class's."""
    units = units_of(len(samples), groups)
    if not units:
        return [], []
    keys = file_keys([s.path for s in samples])
    draws = np.array([max(draw(keys[i], seed) for i in u) for u in units])
    has = np.array([np.max([samples[i].label for i in u], axis=0) for u in units], dtype=bool)
    aside = draws < fraction
    for label in range(has.shape[1]):
        on = np.flatnonzero(has[:, label])
        if fraction > 0 and len(on) >= 2 and not aside[on].any():
            aside[on[np.argmin(draws[on])]] = True
    for label in range(has.shape[1]):  # after: a class with no training image cannot be learned
        on = np.flatnonzero(has[:, label])
        if len(on) and aside[on].all():
            aside[on[np.argmax(draws[on])]] = False
    keep = [samples[i] for u, unit in enumerate(units) if not aside[u] for i in unit]
    held = [samples[i] for u, unit in enumerate(units) if aside[u] for i in unit]
    return keep, held


def stratified_folds(samples: list[Sample], folds: int, seed: int = 0) -> list[int]:
    """A fold number per sample: each class's units dealt round-robin after a seeded shuffle."""
    rng = np.random.default_rng(seed)
    fold_of = [0] * len(samples)
    for units in units_by_label(samples).values():
        for k, u in enumerate(rng.permutation(len(units))):
            for i in units[u]:
                fold_of[i] = k % folds
    return fold_of


def drawn_with(val_fraction: float, test_fraction: float, seed: int, test_given: bool) -> dict:
    """The settings that put each image in its drawn split: a checkpoint keeps them, and a command
    that would continue or test it with others (so with its training images) is refused."""
    return {"val_fraction": val_fraction, "split_seed": seed,
            **({} if test_given else {"test_fraction": test_fraction})}


def split_off(train: list[Sample], test: list[Sample] | None, val_fraction: float, test_fraction: float,
              seed: int, folder: Path, splitter=None) -> tuple[list[Sample], list[Sample], list[Sample]]:
    """(train, val, test): ``test`` (when None) and then val split off ``train``, stratified by
    ``splitter`` (a task's; default: by class), keeping byte-identical files in one split."""
    splitter = splitter or stratified_split
    groups = content_groups([s.path for s in train])
    if len(groups) > len(set(groups)):
        log.info("Notice: %d files in '%s' are byte-identical copies of others; the split keeps each "
                 "file with its copies (python -m project check-data lists them)",
                 len(groups) - len(set(groups)), folder)
    group_of = {s.path: g for s, g in zip(train, groups, strict=True)}
    if test is None:
        train, test = splitter(train, test_fraction, seed, groups)
        val_fraction = val_fraction / (1 - test_fraction)
    train, val = splitter(train, val_fraction, seed + 1, [group_of[s.path] for s in train])
    return train, val, test

