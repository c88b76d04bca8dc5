"""A labels table of one class per image: ``image,label`` (or an ``image,labels`` column whose
cells hold one name each)."""

from __future__ import annotations

from project.tasks.labels import Labels, Row, label_separator, split_labels, unknown_in_evaluation


class OneClass(Labels):
    format = "label (one class per image)"

    @classmethod
    def claim(cls, columns: list[str], cells: dict[str, list[str]]) -> list[str] | None:
        if "label" in columns:
            return ["label"]
        separator = label_separator(cells.get("labels", []))
        if "labels" in columns and all(len(split_labels(c, True, separator)) <= 1 for c in cells["labels"]):
            return ["labels"]
        return None

    @classmethod
    def accept(cls, columns: list[str], cells: dict[str, list[str]]) -> list[str] | None:
        return next(([c] for c in ("label", "labels") if c in columns), None)

    separator = ";"  # the labels column's (``look``)

    def look(self, cells: dict[str, list[str]]) -> None:
        self.separator = label_separator(cells.get(self.columns[0], []))

    def read(self, row: dict[str, str]) -> tuple[object, str | None]:
        names = split_labels(row.get(self.columns[0]) or "", self.columns[0] == "labels", self.separator)
        if len(names) > 1:
            return None, (f"'{(row.get('image') or '').strip()}' has several labels ({', '.join(names)}), "
                          "but this task takes one class per image; set data.task=multilabel or auto")
        return (names[0] if names else None), None

    def check(self, rows: list[Row]) -> list[str]:
        problems = unknown_in_evaluation(self, rows, lambda label: [label])
        names = self.names(rows)
        if len(names) < 2:
            problems.append(f"{self.path}: only the label {names} in the table; classification needs at "
                            "least two")
        return problems

    def names(self, rows: list[Row]) -> list[str]:
        return sorted({r.label for r in rows})

    def encode(self, label: object, names: list[str]) -> object:
        if getattr(self, "_names", None) is not names:  # one look-up table per list of names
            self._names, self._index = names, {n: i for i, n in enumerate(names)}
        return self._index[label]
