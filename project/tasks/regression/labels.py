"""A labels table of numbers per image: ``image,value`` and any other numeric columns instead of a
label (several columns: several outputs)."""

from __future__ import annotations

from pathlib import Path

from project.data.samples import Sample
from project.data.splits import split_off
from project.tasks.labels import Labels, Row, indicator_columns, mostly_numbers, number


class Numbers(Labels):
    format = "value (numbers: any numeric columns instead of a label)"

    @classmethod
    def claim(cls, columns: list[str], cells: dict[str, list[str]]) -> list[str] | None:
        """Every column besides image and split, when there is no label column and they hold
        numbers (one column is read as numbers whatever it holds: a typo is named by its line)."""
        if "label" in columns or "labels" in columns or not cells or indicator_columns(cells):
            return None  # 0/1 columns are labels (multilabel's); data.task=regression reads them as numbers
        return list(cells) if len(cells) == 1 or all(map(mostly_numbers, cells.values())) else None

    @classmethod
    def accept(cls, columns: list[str], cells: dict[str, list[str]]) -> list[str] | None:
        return None if "label" in columns or "labels" in columns or not cells else list(cells)

    def read(self, row: dict[str, str]) -> tuple[object, str | None]:
        values = []
        for column in self.columns:
            cell = (row.get(column) or "").strip()
            value = number(cell)
            if value is None:
                what = "is not a finite number" if _parses(cell) else "is not a number"
                return None, f"'{cell}' in column '{column}' {what}"
            values.append(value)
        return values, None

    def check(self, rows: list[Row]) -> list[str]:
        """A column with one value in training has nothing to learn (its R² is undefined)."""
        train = [r.label for r in rows if r.split in (None, "train")]
        return [f"{self.path}: column '{c}' holds one value ({train[0][j]:g}) in every training row: "
                "nothing to learn; drop the column or add varied rows"
                for j, c in enumerate(self.columns) if len(train) > 1 and len({v[j] for v in train}) == 1]

    def names(self, rows: list[Row]) -> list[str]:
        return list(self.columns)

    def encode(self, label: object, names: list[str]) -> object:
        return tuple(label)

    def text(self, label: object) -> str:
        return ";".join(f"{v:g}" for v in label)

    def split(self, train: list[Sample], test: list[Sample] | None, val_fraction: float,
              test_fraction: float, seed: int, folder: Path, bins: int = 5) -> tuple[list[Sample], ...]:
        """Stratified on quantile bins of the first value, so val and test cover its range."""
        first = sorted(s.label[0] for s in train)
        edges = [first[len(first) * k // bins] for k in range(1, bins)] if first else []
        binned = [Sample(s.path, sum(s.label[0] >= e for e in edges)) for s in train]
        original = {s.path: s for s in train}
        parts = split_off(binned, test, val_fraction, test_fraction, seed, folder)
        return tuple([original.get(s.path, s) for s in part] for part in parts)


def _parses(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True
