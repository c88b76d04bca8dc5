"""Find classes and images in a data folder and split them, with errors a user can act on.

Layouts: ``<root>/{train,val,test}/<class>/<image>`` (val and test optional), or a single
``<root>/<class>/<image>`` folder that is split here with a seeded, stratified split.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from project.common.files import IMAGE_EXTENSIONS, list_images
from project.errors import ProjectError, require

SPLIT_NAMES = ("train", "val", "test")
LAYOUT_HINT = (
    "Lay the images out as <data_dir>/train/<class>/<image> (with optional val/ and test/ "
    "beside train/), or as <data_dir>/<class>/<image> to have it split for you; "
    "`make data` writes a demo set to data/demo."
)


class DataFolderError(ProjectError, ValueError):
    """A data folder that cannot be trained on; the message names the path and the fix."""


@dataclass(frozen=True)
class Sample:
    path: str
    label: int


def class_folders(root: Path) -> list[str]:
    """Sorted subfolder names: the class names, and the label order (index = label)."""
    return sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))


def scan_split(folder: Path, classes: list[str]) -> list[Sample]:
    return [Sample(p, label) for label, c in enumerate(classes) for p in list_images(folder / c)]


def stratified_split(
    samples: list[Sample], fraction: float, seed: int
) -> tuple[list[Sample], list[Sample]]:
    """Move ``fraction`` of every class (at least one image of classes with two or more) aside."""
    rng = np.random.default_rng(seed)
    keep: list[Sample] = []
    held: list[Sample] = []
    for label in sorted({s.label for s in samples}):
        group = [s for s in samples if s.label == label]
        order = rng.permutation(len(group))
        n_held = round(len(group) * fraction)
        if fraction > 0 and len(group) >= 2:
            n_held = min(max(n_held, 1), len(group) - 1)
        held += [group[i] for i in order[:n_held]]
        keep += [group[i] for i in order[n_held:]]
    return keep, held


@dataclass
class FolderSplits:
    classes: list[str]
    train: list[Sample]
    val: list[Sample]
    test: list[Sample]


def layout(root: Path) -> tuple[Path, list[str], dict[str, Path]]:
    """(folder holding the training classes, class names, {split: folder}) of ``root``."""
    train = root / "train"
    if not train.is_dir():
        return root, class_folders(root) if root.is_dir() else [], {}
    return train, class_folders(train), {n: root / n for n in ("val", "test") if (root / n).is_dir()}


def structure_problems(data_dir: str | Path) -> list[str]:
    """Everything that stops training before it starts, each naming the path and the fix.

    Shared by training (which raises on the first list) and ``check-data`` (which prints it).
    """
    root = Path(data_dir)
    if not root.is_dir():
        what = "is a file, not a folder" if root.exists() else "does not exist"
        return [f"data.data_dir '{root}' {what}. {LAYOUT_HINT}"]
    base, classes, splits = layout(root)
    if not classes:
        return [f"no class folders in '{base}'. {LAYOUT_HINT}"]
    problems = []
    if len(classes) < 2:
        problems.append(f"only one class folder ('{classes[0]}') in '{base}': classification "
                        "needs at least two classes")
    empty = [c for c in classes if not list_images(base / c)]
    if empty:
        problems.append(
            f"class folders without images in '{base}': {', '.join(empty)}. Add images "
            f"(extensions: {', '.join(sorted(IMAGE_EXTENSIONS))}) or remove the folders")
    for folder in splits.values():
        other = class_folders(folder)
        if other != classes:
            missing = sorted(set(classes) - set(other))
            extra = sorted(set(other) - set(classes))
            problems.append(
                f"the classes of '{folder}' differ from '{base}': missing {missing or 'none'}, "
                f"extra {extra or 'none'}. Every split needs the same class folders")
    return problems


def check_fractions(val_fraction: float, test_fraction: float) -> None:
    """Each in [0, 1) and their sum below 1: the rest is the training set (test_fraction=1 used to
    divide by zero)."""
    require(0 <= val_fraction < 1, "data.val_fraction", "must be in [0, 1)", val_fraction)
    require(0 <= test_fraction < 1, "data.test_fraction", "must be in [0, 1)", test_fraction)
    require(val_fraction + test_fraction < 1, "data.val_fraction + data.test_fraction",
            "must be below 1 (the rest is the training set)", (val_fraction, test_fraction))


def discover(
    data_dir: str | Path, val_fraction: float = 0.15, test_fraction: float = 0.15, seed: int = 0
) -> FolderSplits:
    """Read the folder layout; raise :class:`DataFolderError` with the fix when it is unusable."""
    check_fractions(val_fraction, test_fraction)
    problems = structure_problems(data_dir)
    if problems:
        raise DataFolderError("; ".join(problems))
    root = Path(data_dir)
    base, classes, split_dirs = layout(root)
    has_splits = base != root
    train = scan_split(base, classes)
    held = {name: scan_split(folder, classes) for name, folder in split_dirs.items()}
    if "test" not in held and not has_splits:
        train, held["test"] = stratified_split(train, test_fraction, seed)
    if "val" not in held:
        fraction = val_fraction / (1 - test_fraction) if not has_splits else val_fraction
        train, held["val"] = stratified_split(train, fraction, seed + 1)
    return FolderSplits(classes, train, held["val"], held.get("test", []))
