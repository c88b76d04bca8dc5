"""A labels table of several labels per image: ``image,labels`` with names separated by ``;``
(or spaces) in a cell, or a 0/1 column per label (``image,cat,dog``); with
``data.task=multilabel``, a ``label`` column too."""

from __future__ import annotations

import logging

from project.data.samples import Sample
from project.data.splits import multi_hot_split, split_off
from project.tasks.labels import (
    INDICATOR,
    Labels,
    Row,
    indicator_columns,
    label_separator,
    split_labels,
    unknown_in_evaluation,
)

log = logging.getLogger("project")


class SeveralClasses(Labels):
    format = "labels (several per image, separated by ';' or spaces), or a 0/1 column per label"

    @classmethod
    def claim(cls, columns: list[str], cells: dict[str, list[str]]) -> list[str] | None:
        if "label" not in columns and "labels" not in columns and indicator_columns(cells):
            return list(cells)  # image,cat,dog with 0 and 1
        separator = label_separator(cells.get("labels", []))
        several = "labels" in columns and any(len(split_labels(c, True, separator)) > 1
                                              for c in cells["labels"])
        return ["labels"] if several else None

    @classmethod
    def accept(cls, columns: list[str], cells: dict[str, list[str]]) -> list[str] | None:
        return next(([c] for c in ("labels", "label") if c in columns), list(cells) or None)

    separator = ";"  # the labels column's (``look``)

    def look(self, cells: dict[str, list[str]]) -> None:
        column = cells.get(self.columns[0], [])
        self.separator = label_separator(column)
        spaced = [c.strip() for c in column if self.separator == ";" and ";" not in c and " " in c.strip()]
        if spaced and self.columns[0] == "labels":  # 'cat dog' where other cells write 'cat;bird'
            log.warning("Notice: %s: %d cells of column labels without ';' hold spaces (e.g. '%s'), each "
                        "read as one label, as ';' separates this column's labels: write '%s' where they "
                        "are several", self.path, len(spaced), spaced[0], ";".join(spaced[0].split()))

    @property
    def indicators(self) -> bool:
        return self.columns[0] not in ("labels", "label")

    def read(self, row: dict[str, str]) -> tuple[object, str | None]:
        if self.indicators:
            cells = {c: (row.get(c) or "").strip() for c in self.columns}
            wrong = next((c for c, v in cells.items() if v not in INDICATOR), None)
            if wrong is not None:
                return None, f"'{cells[wrong]}' in label column '{wrong}' is not 0 or 1"
            return [c for c, v in cells.items() if INDICATOR[v]], None  # all 0: none of them, a label too
        names = split_labels(row.get(self.columns[0]) or "", self.columns[0] == "labels", self.separator)
        return (names or None), None

    def check(self, rows: list[Row]) -> list[str]:
        """Also a label on every image: it teaches nothing, and its score reads perfect."""
        everywhere = set.intersection(*(set(r.label) for r in rows)) if len(rows) > 1 else set()
        problems = [f"{self.path}: label '{name}' is on every image, so there is nothing to learn about "
                    "it and its score would read perfect; drop it from the table, or add images without "
                    "it" for name in sorted(everywhere)]
        return problems + unknown_in_evaluation(self, rows, lambda label: label)

    def names(self, rows: list[Row]) -> list[str]:
        present = {n for r in rows for n in r.label}
        return [c for c in self.columns if c in present] if self.indicators else sorted(present)

    def encode(self, label: object, names: list[str]) -> object:
        return tuple(int(n in label) for n in names)

    def text(self, label: object) -> str:
        return ";".join(sorted(label))

    def split(self, train: list[Sample], test: list[Sample] | None, val_fraction: float,
              test_fraction: float, seed: int, folder) -> tuple[list[Sample], ...]:
        """Each image by its own draw, stable under edits (:func:`multi_hot_split`)."""
        return split_off(train, test, val_fraction, test_fraction, seed, folder, multi_hot_split)
