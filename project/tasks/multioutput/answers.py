"""The answers of a multi-output model, torch-free: a softmax per column; the top class of each
column, its probability, and ``unsure`` when any column's is below its class's minimum."""

from __future__ import annotations

import functools

import numpy as np

from project.common.predictions import softmax
from project.tasks.answers import Answers
from project.tasks.multioutput import groups


class ClassPerColumn(Answers):
    def __init__(self, names: list[str], state: dict) -> None:
        super().__init__(names, state)
        self.columns, start = [], 0
        for column, classes in groups(self.names):
            self.columns.append((column, classes, slice(start, start + len(classes))))
            start += len(classes)

    def scores(self, logits: np.ndarray) -> np.ndarray:
        logits = np.asarray(logits, np.float64)
        parts = [softmax(logits[..., part], self.temperature) for _, _, part in self.columns]
        return np.concatenate(parts, -1)

    @staticmethod
    def fields(column: str) -> tuple[str, str]:
        """A column's fields in a row: its class, and that class's probability. A column named as a
        row's own field (path, confidence, ...) answers under ``<column>_class``: neither is lost."""
        return f"{column}_class" if column in own_fields() else column, f"{column}_prob"

    def row(self, path: str, scores: np.ndarray, k: int) -> dict:
        row = {"path": path, "predicted": "", "confidence": ""}
        answers, lowest = [], 1.0
        for column, classes, part in self.columns:
            best = int(np.argmax(scores[part]))
            answers.append(classes[best])
            name, prob = self.fields(column)
            row[name], row[prob] = classes[best], f"{scores[part][best]:.6f}"
            lowest = min(lowest, float(scores[part][best]))
        row.update(predicted=";".join(answers), confidence=f"{lowest:.6f}", error="")
        return row

    def rows_from_scores(self, paths: list[str], scores: np.ndarray, top_k: int = 3,
                         min_confidence: str | None = None) -> list[dict]:
        floors = self.policy(min_confidence)
        rows = [self.row(path, s, top_k) for path, s in zip(paths, scores, strict=True)]
        if floors is None:
            return rows
        index = {name: i for i, name in enumerate(self.names)}
        for r in rows:  # unsure when any column's class is below its own minimum
            r["unsure"] = any(float(r[self.fields(c)[1]]) < floors[index[f"{c}={r[self.fields(c)[0]]}"]]
                              for c, _, _ in self.columns)
            if r["unsure"]:
                r["predicted"] = "unsure"
        return rows

    def explained(self, scores: np.ndarray) -> int | None:
        return int(np.argmax(scores[self.columns[0][2]]))  # the first column's class


@functools.cache
def own_fields() -> tuple[str, ...]:
    """The fields of every row besides the columns', read off a row without columns (path,
    predicted, ...), and ``cam``: serve's heat map, added to a row after the answers."""
    return (*ClassPerColumn([], {}).rows_from_scores(["x"], np.zeros((1, 0)), 1, "0")[0], "cam")


def clashes(columns: list[str]) -> list[tuple[str, str]]:
    """(column, field) for each column whose fields in predict's, infer.py's and serve's rows
    (:meth:`ClassPerColumn.fields`) another would overwrite: an earlier column's (``shape_prob``
    beside ``shape``)."""
    taken, found = set(own_fields()), []
    for column in columns:
        fields = ClassPerColumn.fields(column)
        found += [(column, f) for f in fields if f in taken][:1]
        taken.update(fields)
    return found
