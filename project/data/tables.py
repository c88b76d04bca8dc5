"""Labels from a table beside the images (``data.labels``): ``image,label`` (one class per image),
``image,labels`` (several, separated by ``;`` or spaces: multi-label), or ``image,value`` and any
other numeric columns instead of a label (numbers per image: regression), with an optional
``split`` column (train/val/test). Image paths are relative to ``data.data_dir``. Imported only
when ``data.labels`` is set; every problem names the table's line. The table decides the task.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from project import tasks
from project.data.folders import DataFolderError, FolderSplits, Sample, check_fractions
from project.data.splits import split_off

SPLITS = ("train", "val", "test")
FORMAT_HINT = ("columns image,label (one class per image), image,labels (several, separated "
               "by ';' or spaces) or image,value (numbers: any numeric columns instead of a label), "
               "and optionally split (train, val or test)")


@dataclass
class Table:
    """A labels table as read: rows (line number, image path, label names, split or None)."""

    path: Path
    rows: list[tuple[int, str, list, str | None]] = field(default_factory=list)  # labels or numbers
    multilabel_column: bool = False
    value_columns: list[str] = field(default_factory=list)  # regression: the numbers' columns
    unlabeled: list[str] = field(default_factory=list)  # images of empty-label rows, when allowed
    problems: list[str] = field(default_factory=list)

    @property
    def classes(self) -> list[str]:
        """The class names, or the names of the values (the model's outputs, in order)."""
        if self.value_columns:
            return list(self.value_columns)
        return sorted({name for _, _, names, _ in self.rows for name in names})

    def task(self, task: str = "auto") -> str:
        """The task the rows describe: numbers are a regression, a row with several labels a
        multi-label task (``task``: data.task, auto or one the table can hold)."""
        found = (tasks.REGRESSION if self.value_columns else
                 tasks.MULTI_LABEL if any(len(names) > 1 for _, _, names, _ in self.rows) else tasks.DEFAULT)
        if task == "auto" or task == found:
            return found
        if tasks.REGRESSION in (task, found):
            raise DataFolderError(f"data.task={task}, but {self.path} holds "
                                  f"{'numbers' if self.value_columns else 'labels'}; set data.task=auto")
        if found == tasks.MULTI_LABEL and task == tasks.DEFAULT:
            line, image, names, _ = next(r for r in self.rows if len(r[2]) > 1)
            raise DataFolderError(f"data.task={task}, but '{image}' on line {line} of {self.path} has "
                                  f"several labels ({', '.join(names)}); set data.task=multilabel or auto")
        return task


def split_labels(cell: str, several: bool) -> list[str]:
    if not several:
        return [cell.strip()] if cell.strip() else []
    return [n for n in re.split(r";" if ";" in cell else r"\s+", cell.strip()) if n.strip()]


def read_table(path: str | Path, data_dir: str | Path, unlabeled_ok: bool = False) -> Table:
    """Every row of the table with its problems (a missing image, an empty label, a repeated
    image, an unknown split, labels of val/test that no training row has). ``unlabeled_ok``:
    rows with an empty label are unlabeled images (``data.unlabeled.images`` names the table)."""
    table = Table(Path(path))
    if not table.path.is_file():
        table.problems.append(f"data.labels '{path}' does not exist")
        return table
    root = Path(data_dir)
    try:
        with open(table.path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            columns = [c.strip() for c in reader.fieldnames or []]
            label_col = "labels" if "labels" in columns else "label"
            if label_col not in columns:  # numbers instead of a label: a regression
                table.value_columns = [c for c in columns if c not in ("image", "split") and c]
            if "image" not in columns or not (label_col in columns or table.value_columns):
                table.problems.append(f"{path} line 1: columns {columns or 'none'}; expected {FORMAT_HINT}")
                return table
            table.multilabel_column = label_col == "labels"
            reader.fieldnames = columns
            first_line: dict[str, int] = {}
            for line, row in enumerate(reader, start=2):
                image, cell = (row.get("image") or "").strip(), row.get(label_col) or ""
                split = (row.get("split") or "").strip() or None
                if table.value_columns:
                    names, bad = numbers(row, table.value_columns)
                    if bad:
                        table.problems.append(f"{path} line {line}: {bad}")
                        continue
                else:
                    names = split_labels(cell, table.multilabel_column)

                def problem(text: str, line=line) -> None:
                    table.problems.append(f"{path} line {line}: {text}")

                if not image:
                    problem("no image path")
                    continue
                if image in first_line:
                    problem(f"'{image}' is listed again (first on line {first_line[image]}); "
                            "one row per image")
                    continue
                first_line[image] = line
                if not names and unlabeled_ok and not table.value_columns and split in (None, "train"):
                    if not (root / image).is_file():
                        problem(f"'{image}' not found in data.data_dir '{root}'")
                    table.unlabeled.append(image)
                    continue
                if not names:
                    problem(f"empty label for '{image}' (data.unlabeled.images={path} makes such rows "
                            "unlabeled images)")
                if split is not None and split not in SPLITS:
                    problem(f"split '{split}' must be train, val or test")
                if not (root / image).is_file():
                    problem(f"'{image}' not found in data.data_dir '{root}'")
                table.rows.append((line, image, names, split))
    except UnicodeDecodeError as err:  # a binary file, or another encoding
        table.problems.append(f"{path} is not a text table in UTF-8 ({err.reason} at byte {err.start}); "
                              "save it as CSV in UTF-8")
        return table
    train_names = {n for _, _, names, split in table.rows if split in (None, "train") for n in names}
    for line, image, names, split in table.rows:
        unknown = [n for n in names if n not in train_names and not table.value_columns]
        if split in ("val", "test") and unknown:
            table.problems.append(f"{path} line {line}: label {', '.join(unknown)} of '{image}' is "
                                  "unknown: no training row has it")
    if not table.rows and not table.problems:
        table.problems.append(f"{path} has no rows; expected {FORMAT_HINT}")
    return table


def numbers(row: dict, columns: list[str]) -> tuple[list[float], str | None]:
    """The row's values of ``columns`` as floats, or what is wrong with the first that is not one."""
    values = []
    for column in columns:
        cell = (row.get(column) or "").strip()
        try:
            value = float(cell)
        except ValueError:
            return [], f"'{cell}' in column '{column}' is not a number"
        if not math.isfinite(value):
            return [], f"'{cell}' in column '{column}' is not a finite number"
        values.append(value)
    return values, None


def unlisted_images(table: Table, data_dir: str | Path) -> list[str]:
    """Images below ``data_dir`` that no row names (check-data's warning: they are not trained on)."""
    from project.common.files import list_images

    root = Path(data_dir)
    listed = {str((root / image).resolve()) for _, image, _, _ in table.rows}
    return [p for p in list_images(root) if str(Path(p).resolve()) not in listed]


def discover_table(labels: str | Path, data_dir: str | Path, task: str = "auto",
                   val_fraction: float = 0.15, test_fraction: float = 0.15, seed: int = 0,
                   unlabeled_ok: bool = False) -> FolderSplits:
    """The splits of a labels table: its ``split`` column, else the folders' seeded stratified
    split (iterative stratification for multi-label rows)."""
    check_fractions(val_fraction, test_fraction)
    if not Path(data_dir).is_dir():
        raise DataFolderError(f"data.data_dir '{data_dir}' is not a folder (the images of data.labels "
                              "are found relative to it)")
    table = read_table(labels, data_dir, unlabeled_ok)
    if table.problems:
        more = len(table.problems) - 1
        tail = (f" (and {more} more: python -m project check-data {data_dir} --labels {labels} lists "
                "them)" if more else "")
        raise DataFolderError(table.problems[0] + tail)
    classes, kind = table.classes, table.task(task)
    if len(classes) < 2 and not table.value_columns:
        raise DataFolderError(f"{labels}: only the label {classes} in the table; classification needs "
                              "at least two")
    index = {name: i for i, name in enumerate(classes)}

    def sample(image: str, names: list) -> Sample:
        path = str(Path(data_dir) / image)
        if table.value_columns:
            return Sample(path, tuple(names))
        if kind == tasks.MULTI_LABEL:
            return Sample(path, tuple(int(c in names) for c in classes))
        return Sample(path, index[names[0]])

    by_split: dict[str | None, list[Sample]] = {s: [] for s in (None, *SPLITS)}
    for _, image, names, split in table.rows:
        by_split[split].append(sample(image, names))
    if kind == tasks.DEFAULT:  # the folders' order (class, then path): the same split from the same files
        for samples in by_split.values():
            samples.sort(key=lambda s: (s.label, s.path))
    train = by_split["train"] + by_split[None]
    if by_split["val"]:
        return FolderSplits(classes, train, by_split["val"], by_split["test"], kind)
    test = by_split["test"] if by_split["test"] or by_split["train"] else None
    split = split_by_value if table.value_columns else split_off
    return FolderSplits(classes, *split(train, test, val_fraction, test_fraction, seed, Path(data_dir)), kind)


def split_by_value(train: list[Sample], test: list[Sample] | None, val_fraction: float,
                   test_fraction: float, seed: int, folder: Path, bins: int = 5):
    """The seeded split of numbers: stratified on quantile bins of the first value, so val and
    test cover its range as training does."""
    from project.data.splits import split_off

    first = sorted(s.label[0] for s in train)
    edges = [first[len(first) * k // bins] for k in range(1, bins)] if first else []
    binned = [Sample(s.path, sum(s.label[0] >= e for e in edges)) for s in train]
    original = {s.path: s for s in train}
    parts = split_off(binned, test, val_fraction, test_fraction, seed, folder)
    return tuple([original.get(s.path, s) for s in part] for part in parts)
