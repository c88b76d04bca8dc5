"""A labels table of two or more word columns besides ``image`` (and ``split``): one class per
column and image. Words stay words: no column is read as numbers."""

from __future__ import annotations

from pathlib import Path

from project.data.samples import Sample
from project.data.splits import multi_hot_split, split_off
from project.tasks.labels import Labels, Row, blank, mostly_numbers, unknown_in_evaluation
from project.tasks.multioutput import SEP
from project.tasks.multioutput.answers import ClassPerColumn, clashes


class ClassColumns(Labels):
    format = "two or more columns of class names (one class per column, e.g. category,color)"

    @classmethod
    def claim(cls, columns: list[str], cells: dict[str, list[str]]) -> list[str] | None:
        if "label" in columns or "labels" in columns or len(cells) < 2:
            return None
        return list(cells) if not all(map(mostly_numbers, cells.values())) else None

    @classmethod
    def accept(cls, columns: list[str], cells: dict[str, list[str]]) -> list[str] | None:
        return list(cells) or None

    def read(self, row: dict[str, str]) -> tuple[object, str | None]:
        values = tuple("" if blank(row.get(c)) else row[c].strip() for c in self.columns)
        if not any(values):
            return None, None  # an unlabeled image
        empty = [c for c, v in zip(self.columns, values, strict=True) if not v]
        if empty:
            image = (row.get("image") or "").strip()
            return None, f"'{image}' has no class in column '{empty[0]}' (a blank or NaN cell)"
        return values, None

    def check(self, rows: list[Row]) -> list[str]:
        problems = [f"{self.path} line 1: column name '{c}' holds '{SEP}'; rename the column"
                    for c in self.columns if SEP in c]
        problems += [f"{self.path} line 1: column '{c}' would overwrite the field '{f}' of another column "
                     f"in predict's answers (each column answers in it and its "
                     f"{ClassPerColumn.fields('<column>')[1]}); rename the column (e.g. '{c}_class')"
                     for c, f in clashes(self.columns)]
        problems += unknown_in_evaluation(self, rows, self.qualified)
        train = [r.label for r in rows if r.split in (None, "train")]
        for j, column in enumerate(self.columns):
            seen = {v[j] for v in train}
            if len(seen) == 1:
                problems.append(f"{self.path}: column '{column}' holds one class ('{seen.pop()}') in every "
                                "training row: nothing to learn; drop the column or add other classes")
        return problems

    def qualified(self, label: tuple[str, ...]) -> list[str]:
        return [f"{c}{SEP}{v}" for c, v in zip(self.columns, label, strict=True)]

    def names(self, rows: list[Row]) -> list[str]:
        return [f"{c}{SEP}{v}" for j, c in enumerate(self.columns)
                for v in sorted({r.label[j] for r in rows})]

    def encode(self, label: object, names: list[str]) -> object:
        if getattr(self, "_names", None) is not names:  # each column's classes, indexed
            self._names = names
            self._index = [{n.partition(SEP)[2]: i for i, n in enumerate(
                [n for n in names if n.partition(SEP)[0] == c])} for c in self.columns]
        return tuple(index[v] for index, v in zip(self._index, label, strict=True))

    def text(self, label: object) -> str:
        return ";".join(label)

    def split(self, train: list[Sample], test: list[Sample] | None, val_fraction: float,
              test_fraction: float, seed: int, folder: Path) -> tuple[list[Sample], ...]:
        """Each image by its own draw, stable under edits: :func:`multi_hot_split` on each column's
        classes."""
        sizes = [max(s.label[j] for s in train) + 1 for j in range(len(self.columns))] if train else []
        hot = [Sample(s.path, tuple(int(s.label[j] == k) for j, n in enumerate(sizes) for k in range(n)))
               for s in train]
        original = {s.path: s for s in train}
        parts = split_off(hot, test, val_fraction, test_fraction, seed, folder, multi_hot_split)
        return tuple([original.get(s.path, s) for s in part] for part in parts)
