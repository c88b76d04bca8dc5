"""How a task reads its columns of a labels table (``data.labels``): the interface each task's
``labels.py`` implements. ``project/data/tables.py`` reads the file, the image paths and the
``split`` column, and asks the tasks which one claims the other columns; the claiming task reads,
checks, names, encodes and splits its labels. Torch-free (check-data reads tables too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from project.data.samples import Sample
from project.data.splits import split_off


@dataclass
class Row:
    """One table row as read: its line, image path, label (the task's reading) and split."""

    line: int
    image: str
    label: object
    split: str | None


class Labels:
    """One task's reading of a table. ``columns``: the label columns it reads, in order."""

    format: ClassVar[str] = ""  # the columns it reads, for the hint when no task claims a table

    def __init__(self, columns: list[str], path: Path) -> None:
        self.columns, self.path = list(columns), path

    @classmethod
    def claim(cls, columns: list[str], cells: dict[str, list[str]]) -> list[str] | None:
        """The label columns it reads from a table of ``columns`` (``cells``: every column's values,
        for a look at them), or None: not a table of this task."""
        return None

    @classmethod
    def accept(cls, columns: list[str], cells: dict[str, list[str]]) -> list[str] | None:
        """Its label columns when ``data.task`` names it (it may read more than it claims)."""
        return cls.claim(columns, cells)

    def look(self, cells: dict[str, list[str]]) -> None:
        """What it decides once from whole columns before reading a row (``cells``: every column's
        values), so that every row, and every command, reads a cell the same way; nothing here."""

    def read(self, row: dict[str, str]) -> tuple[object, str | None]:
        """(the row's label, None), (None, None) for an empty label (an unlabeled image), or
        (None, what is wrong with it)."""
        raise NotImplementedError

    def check(self, rows: list[Row]) -> list[str]:
        """Problems across the rows, each naming a line or a column."""
        return []

    def names(self, rows: list[Row]) -> list[str]:
        """The model's outputs, in order (classes, labels, or the values' names)."""
        raise NotImplementedError

    def encode(self, label: object, names: list[str]) -> object:
        """The label as a :class:`Sample` holds it (what the task's ``target`` turns into a tensor)."""
        raise NotImplementedError

    def text(self, label: object) -> str:
        """The label as check-data names it."""
        return str(label)

    def split(self, train: list[Sample], test: list[Sample] | None, val_fraction: float,
              test_fraction: float, seed: int, folder: Path) -> tuple[list[Sample], ...]:
        """The seeded split of a table without a ``split`` column; stratified by class here."""
        return split_off(train, test, val_fraction, test_fraction, seed, folder)

    def problem(self, line: int, text: str) -> str:
        return f"{self.path} line {line}: {text}"


def number(cell: str) -> float | None:
    """The cell as a finite number, or None."""
    try:
        value = float(cell)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def mostly_numbers(values: list[str]) -> bool:
    """Whether most of a column's non-empty cells are numbers (a typo among them stays a number column)."""
    filled = [v for v in values if v.strip()]
    return bool(filled) and sum(number(v) is not None for v in filled) * 2 >= len(filled)


INDICATOR = {"0": 0, "1": 1, "0.0": 0, "1.0": 1}


def indicator_columns(cells: dict[str, list[str]]) -> bool:
    """Whether two or more columns hold only 0 and 1: one column per label, 1 where the image
    shows it (a multi-hot table), not numbers to regress."""
    return len(cells) >= 2 and all(v.strip() in INDICATOR for values in cells.values() for v in values)


def unknown_in_evaluation(labels: Labels, rows: list[Row], names_of) -> list[str]:
    """val/test rows with a class no training row has (``names_of(label)``: its class names)."""
    trained = {n for r in rows if r.split in (None, "train") for n in names_of(r.label)}
    problems = []
    for r in rows:
        unknown = [n for n in names_of(r.label) if n not in trained]
        if r.split in ("val", "test") and unknown:
            problems.append(labels.problem(r.line, f"label {', '.join(unknown)} of '{r.image}' is unknown: "
                                                   "no training row has it"))
    return problems


def label_separator(cells: list[str]) -> str:
    """How a column of several labels per cell separates them, decided once for the whole column
    (per cell, a row holding only ``light blue`` would read as two labels where ``light blue;circle``
    reads one): ``;`` when any cell holds one, else whitespace (``" "``)."""
    return ";" if any(";" in c for c in cells) else " "


def split_labels(cell: str, several: bool, separator: str) -> list[str]:
    """The class names in a cell: one, or several separated by ``separator`` (``;``, or ``" "``:
    any whitespace), the column's :func:`label_separator`. ``NaN`` is a missing value (a data
    frame's, written out as text), never a class."""
    if not several:
        return [] if blank(cell) else [cell.strip()]
    return [n.strip() for n in (cell.split(";") if separator == ";" else cell.split()) if not blank(n)]


def blank(cell: str | None) -> bool:
    """An empty cell, or ``NaN`` (a data frame's missing value, written out as text): never a class."""
    return (cell or "").strip().lower() in ("", "nan")
