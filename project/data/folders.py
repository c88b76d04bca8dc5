"""Classes and images of ``<root>/{train,val,test}/<class>/`` or ``<root>/<class>/``, with errors
that say the fix."""

import logging
import os
import re
from collections import Counter
from pathlib import Path

from project.common.files import IMAGE_EXTENSIONS, is_image_file, left_out_text, list_images
from project.data.samples import FolderSplits, Sample  # noqa: F401 (their home for most readers)
from project.errors import ProjectError, require_all

log = logging.getLogger(__name__)
STREAMING_MANIFEST = "project.json"  # marks a folder that optimize-data wrote (streamed, not listed)
# a split's folder names, in any case (Roboflow's exports write valid/; some sets Training/, Testing/)
SPLIT_FOLDERS = {"train": ("train", "training"), "val": ("val", "valid", "validation"),
                 "test": ("test", "testing")}
LAYOUT_HINT = (
    "Lay the images out as <data_dir>/train/<class>/<image> (with optional val/ and test/ "
    "beside train/), or as <data_dir>/<class>/<image> to have it split for you; "
    "`make data` writes a demo set to data/demo."
)


class DataFolderError(ProjectError, ValueError):
    """A data folder that cannot be trained on; the message names the path and the fix."""


def class_folders(root: Path) -> list[str]:
    """Sorted subfolder names: the class names, and the label order (index = label). Hidden folders
    and the ``__MACOSX/`` that a zip made on a Mac unpacks beside its folders are never classes."""
    return sorted(e.name for e in os.scandir(root)
                  if e.is_dir() and not e.name.startswith(".") and e.name != "__MACOSX")


def split_of(name: str) -> str | None:
    """The split a folder or a table's split cell names (any case, or a common alias), or None."""
    return next((split for split, aliases in SPLIT_FOLDERS.items() if name.lower() in aliases), None)


def is_split_folder(folder: Path) -> bool:
    """``train/`` always; another spelling (``Train/``, ``valid/``) only when it holds class folders
    and no images of its own: a vehicles set's ``Train/`` is a class."""
    if folder.name in SPLIT_FOLDERS:
        return True
    entries = list(os.scandir(folder))
    images = any(e.is_file() and is_image_file(e.name) for e in entries)
    return any(e.is_dir() for e in entries) and not images


def split_folders(root: Path) -> dict[str, list[Path]]:
    """Each split's folders in ``root`` (more than one for a split is a structure problem)."""
    names = class_folders(root) if root.is_dir() else []
    return {split: [root / n for n in names if split_of(n) == split and is_split_folder(root / n)]
            for split in SPLIT_FOLDERS}


def layout(root: Path) -> tuple[Path, list[str], dict[str, Path]]:
    """(folder holding the training classes, class names, {split: folder}) of ``root``."""
    found = split_folders(root)
    if not found["train"]:
        return root, class_folders(root) if root.is_dir() else [], {}
    held = {split: folders[0] for split, folders in found.items() if folders and split != "train"}
    return found["train"][0], class_folders(found["train"][0]), held


def scan_split(folder: Path, classes: list[str], left_out: Counter | None = None) -> list[Sample]:
    """The images of each class folder; the other files counted in ``left_out``."""
    return [Sample(p, label) for label, c in enumerate(classes) for p in list_images(folder / c, left_out)]


def notice_left_out(left_out: dict[str, int], data_dir: str) -> None:
    """A notice when the class folders hold files training does not read (a phone's .heic photos)."""
    if left_out:
        log.warning("Notice: the class folders of '%s' hold %s: training leaves them out; convert them to "
                    "one it reads (%s), or run `python -m project check-data %s` to list them", data_dir,
                    left_out_text(left_out), " ".join(sorted(IMAGE_EXTENSIONS)), data_dir)


def notice_similar_classes(names: list[str]) -> None:
    """A notice when class names differ only in case, spaces or leading zeros ('Cat' and 'cat',
    '01' and '1', as a spreadsheet re-saves codes): two classes."""
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(re.sub(r"\b0+(\d)", r"\1", " ".join(name.casefold().split())), []).append(name)
    similar = [" and ".join(f"'{n}'" for n in group) for group in groups.values() if len(group) > 1]
    if similar:
        log.warning("Notice: %s are different classes; merge them if they are one", "; ".join(similar))


def structure_problems(data_dir: str | Path) -> list[str]:
    """What stops training before it starts, naming the path and the fix (check-data prints it)."""
    root = Path(data_dir)
    if not root.is_dir():
        what = "is a file, not a folder" if root.exists() else "does not exist"
        return [f"data.data_dir '{root}' {what}. {LAYOUT_HINT}"]
    base, classes, splits = layout(root)
    problems = [f"'{root}' has {len(found)} {split} folders ({', '.join(f'{f.name}/' for f in found)}): keep "
                "one" for split, found in split_folders(root).items() if len(found) > 1]
    if problems or not classes:
        return problems or [f"no class folders in '{base}'. {LAYOUT_HINT}"]
    if len(classes) < 2:
        inner = base / classes[0]  # an archive unpacked into a folder of its own
        hint = f"; if its subfolders are the classes or splits, set data.data_dir={inner}" if len(
            class_folders(inner)) > 1 else ""
        problems.append(f"only one class folder ('{classes[0]}') in '{base}': classification "
                        f"needs at least two classes{hint}")
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
    require_all((0 <= val_fraction < 1, "data.val_fraction", "must be in [0, 1)", val_fraction),
                (0 <= test_fraction < 1, "data.test_fraction", "must be in [0, 1)", test_fraction),
                (val_fraction + test_fraction < 1, "data.val_fraction + data.test_fraction",
                 "must be below 1 (the rest is the training set)", (val_fraction, test_fraction)))


def discover(data_dir: str | Path, val_fraction: float = 0.15, test_fraction: float = 0.15,
             seed: int = 0) -> FolderSplits:
    """The folder's splits; a :class:`DataFolderError` with the fix when it is unusable."""
    check_fractions(val_fraction, test_fraction)
    problems = structure_problems(data_dir)
    if problems:
        raise DataFolderError("; ".join(problems))
    root = Path(data_dir)
    base, classes, split_dirs = layout(root)
    left_out: Counter = Counter()
    train = scan_split(base, classes, left_out)
    held = {name: scan_split(folder, classes, left_out) for name, folder in split_dirs.items()}
    if base != root and "val" in held:  # the folders as they are
        return FolderSplits(classes, train, held["val"], held.get("test", []), left_out=dict(left_out))
    from project.data.splits import drawn_with, split_off

    # one folder, or train/ without val/: test (unless a test/ folder holds it), then val split off
    test = held.get("test")
    splits = split_off(train, test, val_fraction, test_fraction, seed, base)
    return FolderSplits(classes, *splits, left_out=dict(left_out),
                        drawn=drawn_with(val_fraction, test_fraction, seed, test is not None))


def empty_split_fix(data_dir: str, split: str, fraction: float = 0.0) -> str:
    """How to fill an empty split (beside train/ and val/ folders, only a test/ folder gives a test
    set); ``fraction``: the split's share asked for, when it was above 0 the classes are too small."""
    root = Path(data_dir)
    base, _, held = layout(root)
    if base == root or (split == "test" and "val" not in held):
        if split == "train":
            return "lower data.val_fraction and data.test_fraction, or add images"
        if fraction > 0:
            return (f"data.{split}_fraction is {fraction}, but the classes are too small to spare an "
                    "image for it (a class of 3 or more gives one to each of train, val and test): add "
                    f"images, or lay the data out as train/ and {split}/ folders of class folders")
        return f"set data.{split}_fraction above 0, or add images"
    if split == "test":
        return ("add a test/ folder with the same class folders as train/ (data.test_fraction "
                "splits only a folder without val/)")
    return f"add a {split}/ folder with the same class folders as train/, or raise data.{split}_fraction"
