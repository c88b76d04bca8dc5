"""Extra validation sets (``data.extra_val: {name: folder}``): folders of class subfolders named
as the training classes, validated after the validation split and logged as ``val_<name>/...``
(the model's own metrics for each), never averaged into ``val/``. Loaded only when set."""

from __future__ import annotations

import re
from pathlib import Path

from project.data import folders
from project.data.datasets import ImageDataset
from project.errors import require


def check_extra_val(dm) -> list[str]:
    """The sets' names, after one-line checks of each name and folder."""
    for name, folder in dm.hparams.extra_val.items():
        folder = Path(folder)
        require(re.fullmatch(r"[A-Za-z0-9_-]+", str(name)) is not None, "data.extra_val",
                "names must be letters, digits, _ or - (they become val_<name>/...)", name)
        require(dm.task_type.reads_class_folders, "data.extra_val", "holds folders of class subfolders; "
                f"this run's data is a {dm.task} task, which they cannot hold", name)
        require(folder.is_dir(), f"data.extra_val.{name}", "must be a folder of class subfolders",
                str(folder))
        unknown = sorted(set(folders.class_folders(folder)) - set(dm.class_names))
        require(not unknown, f"data.extra_val.{name}", f"has folders of classes the training data lacks "
                f"({', '.join(unknown)}); its classes are {', '.join(dm.class_names)}", str(folder))
        require(bool(folders.scan_split(folder, dm.class_names)), f"data.extra_val.{name}",
                "has no images in class subfolders", str(folder))  # before the run folder exists
    return list(dm.hparams.extra_val)


def extra_val_dataset(dm, name: str) -> ImageDataset:
    """The set ``name`` through the evaluation transforms, as the validation split."""
    samples = folders.scan_split(Path(dm.hparams.extra_val[name]), dm.class_names)
    require(bool(samples), f"data.extra_val.{name}", "has no images in class subfolders",
            dm.hparams.extra_val[name])
    return ImageDataset(samples, dm.transform("val"), None, dm.hparams.on_bad_image,
                        short_side=dm.short_side("val"))
