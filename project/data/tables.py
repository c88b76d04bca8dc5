"""Labels from a table beside the images (``data.labels``): ``image,label`` (one class per image)
or ``image,labels`` (several, separated by ``;`` or spaces: multi-label), with an optional
``split`` column (train/val/test). Image paths are relative to ``data.data_dir``. Imported only
when ``data.labels`` is set; every problem names the table's line.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from pathlib import Path

from project.data.folders import DataFolderError, FolderSplits, Sample, check_fractions

SPLITS = ("train", "val", "test")
FORMAT_HINT = ("columns image,label (one class per image) or image,labels (several, separated "
               "by ';' or spaces), and optionally split (train, val or test)")


@dataclass
class Table:
    """A labels table as read: rows (line number, image path, label names, split or None)."""

    path: Path
    rows: list[tuple[int, str, list[str], str | None]] = field(default_factory=list)
    multilabel_column: bool = False
    problems: list[str] = field(default_factory=list)

    @property
    def classes(self) -> list[str]:
        return sorted({name for _, _, names, _ in self.rows for name in names})

    def multilabel(self, task: str) -> bool:
        """Whether the rows describe a multi-label task (``task`` auto: a row has several)."""
        if task != "auto":
            return task == "multilabel"
        return any(len(names) > 1 for _, _, names, _ in self.rows)


def split_labels(cell: str, several: bool) -> list[str]:
    if not several:
        return [cell.strip()] if cell.strip() else []
    return [n for n in re.split(r";" if ";" in cell else r"\s+", cell.strip()) if n.strip()]


def read_table(path: str | Path, data_dir: str | Path) -> Table:
    """Every row of the table with its problems (a missing image, an empty label, a repeated
    image, an unknown split, labels of val/test that no training row has)."""
    table = Table(Path(path))
    if not table.path.is_file():
        table.problems.append(f"data.labels '{path}' does not exist")
        return table
    root = Path(data_dir)
    with open(table.path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        columns = [c.strip() for c in reader.fieldnames or []]
        label_col = "labels" if "labels" in columns else "label"
        if "image" not in columns or label_col not in columns:
            table.problems.append(f"{path} line 1: columns {columns or 'none'}; expected {FORMAT_HINT}")
            return table
        table.multilabel_column = label_col == "labels"
        reader.fieldnames = columns
        first_line: dict[str, int] = {}
        for line, row in enumerate(reader, start=2):
            image, cell = (row.get("image") or "").strip(), row.get(label_col) or ""
            split = (row.get("split") or "").strip() or None
            names = split_labels(cell, table.multilabel_column)

            def problem(text: str, line=line) -> None:
                table.problems.append(f"{path} line {line}: {text}")

            if not image:
                problem("no image path")
                continue
            if image in first_line:
                problem(f"'{image}' is listed again (first on line {first_line[image]}); one row per image")
                continue
            first_line[image] = line
            if not names:
                problem(f"empty label for '{image}'")
            if split is not None and split not in SPLITS:
                problem(f"split '{split}' must be train, val or test")
            if not (root / image).is_file():
                problem(f"'{image}' not found in data.data_dir '{root}'")
            table.rows.append((line, image, names, split))
    train_names = {n for _, _, names, split in table.rows if split in (None, "train") for n in names}
    for line, image, names, split in table.rows:
        unknown = [n for n in names if n not in train_names]
        if split in ("val", "test") and unknown:
            table.problems.append(f"{path} line {line}: label {', '.join(unknown)} of '{image}' is "
                                  "unknown: no training row has it")
    if not table.rows and not table.problems:
        table.problems.append(f"{path} has no rows; expected {FORMAT_HINT}")
    return table


def unlisted_images(table: Table, data_dir: str | Path) -> list[str]:
    """Images below ``data_dir`` that no row names (check-data's warning: they are not trained on)."""
    from project.common.files import list_images

    root = Path(data_dir)
    listed = {str((root / image).resolve()) for _, image, _, _ in table.rows}
    return [p for p in list_images(root) if str(Path(p).resolve()) not in listed]


def discover_table(labels: str | Path, data_dir: str | Path, task: str = "auto",
                   val_fraction: float = 0.15, test_fraction: float = 0.15, seed: int = 0) -> FolderSplits:
    """The splits of a labels table: its ``split`` column, else the folders' seeded stratified
    split (iterative stratification for multi-label rows)."""
    check_fractions(val_fraction, test_fraction)
    if not Path(data_dir).is_dir():
        raise DataFolderError(f"data.data_dir '{data_dir}' is not a folder (the images of data.labels "
                              "are found relative to it)")
    table = read_table(labels, data_dir)
    if table.problems:
        more = len(table.problems) - 1
        tail = (f" (and {more} more: python -m project check-data {data_dir} --labels {labels} lists "
                "them)" if more else "")
        raise DataFolderError(table.problems[0] + tail)
    classes = table.classes
    if len(classes) < 2:
        raise DataFolderError(f"{labels}: only the label {classes} in the table; classification needs "
                              "at least two")
    index = {name: i for i, name in enumerate(classes)}
    multilabel = table.multilabel(task)

    def sample(image: str, names: list[str]) -> Sample:
        path = str(Path(data_dir) / image)
        if multilabel:
            return Sample(path, tuple(int(c in names) for c in classes))
        if len(names) > 1:
            raise DataFolderError(f"data.task=multiclass, but '{image}' in {labels} has several labels "
                                  f"({', '.join(names)}); set data.task=multilabel or auto")
        return Sample(path, index[names[0]])

    by_split: dict[str | None, list[Sample]] = {s: [] for s in (None, *SPLITS)}
    for _, image, names, split in table.rows:
        by_split[split].append(sample(image, names))
    if not multilabel:  # the folders' order (class, then path): the same split from the same files
        for samples in by_split.values():
            samples.sort(key=lambda s: (s.label, s.path))
    train = by_split["train"] + by_split[None]
    if by_split["val"]:
        return FolderSplits(classes, train, by_split["val"], by_split["test"], multilabel)
    from project.data.splits import split_off

    test = by_split["test"] if by_split["test"] or by_split["train"] else None
    return FolderSplits(classes, *split_off(train, test, val_fraction, test_fraction, seed,
                                            Path(data_dir)), multilabel)
