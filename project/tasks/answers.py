"""How a model's raw outputs become answers, the one owner of the answer policy: ``predict``
(PyTorch), ``infer.py`` (ONNX Runtime, no torch) and ``serve`` all build their rows here from
the same state (the task, temperature, thresholds, target scaling), read from a checkpoint
(``ImageClassifier.answer_state``) or from an exported file's metadata.

Torch-free on purpose: NumPy only.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from project.common.predictions import sigmoid, softmax, top_k_row, unsure
from project.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The answer options of every command that answers (one default for all of them)."""
    parser.add_argument("--top_k", type=int, default=3, help="classes listed per image")
    parser.add_argument("--min_confidence", default=None,
                        help="below it an image is answered 'unsure': a probability (0.8), or per "
                             "class with a default for the rest (cat=0.9,dog=0.7,0.5); evaluate's "
                             "report suggests one")


class Answers:
    """Rows for images from raw outputs (logits): the probabilities (``scores``) and the answer."""

    def __init__(self, names: list[str], state: dict) -> None:
        self.names, self.state = list(names), dict(state)
        self.temperature = float(state.get("temperature", 1.0))  # 1: never calibrated
        if not self.temperature > 0:
            raise ValueError(f"temperature must be above 0, got {state.get('temperature')!r}")
        self.policy(None)  # the stored policy (model.min_confidence), checked against the names

    def scores(self, logits: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def row(self, path: str, scores: np.ndarray, k: int) -> dict:
        raise NotImplementedError

    def policy(self, spec: str | None) -> np.ndarray | None:
        """Per-class minimum confidence from ``--min_confidence``, else the model's own
        (``model.min_confidence``, in the checkpoint and the ONNX metadata); None: all answered."""
        spec = self.state.get("min_confidence") if spec is None else spec
        return None if spec is None else min_confidence(spec, self.names)

    def rows(self, paths: list[str], logits: np.ndarray, top_k: int = 3,
             min_confidence: str | None = None) -> list[dict]:
        """One row per image, in the order of ``paths``."""
        return self.rows_from_scores(paths, self.scores(logits), top_k, min_confidence)

    def rows_from_scores(self, paths: list[str], scores: np.ndarray, top_k: int = 3,
                         min_confidence: str | None = None) -> list[dict]:
        """:meth:`rows` from probabilities or values already made (averaged over test-time views)."""
        floors, k = self.policy(min_confidence), min(top_k, len(self.names))
        rows = [self.row(path, s, k) for path, s in zip(paths, scores, strict=True)]
        if floors is not None:
            index = {name: i for i, name in enumerate(self.names)}
            rows = [unsure(r, floors[index[r["top1"]]]) for r in rows]
        return rows


class TopClasses(Answers):
    """One class per image: ``softmax(logits / T)``, the top ``k`` classes."""

    def scores(self, logits: np.ndarray) -> np.ndarray:
        return softmax(logits, self.temperature)

    def row(self, path: str, scores: np.ndarray, k: int) -> dict:
        return top_k_row(path, scores, self.names, k)


class LabelsAboveThresholds(Answers):
    """Several labels per image: ``sigmoid(logits / T)``; every label at its threshold."""

    def __init__(self, names: list[str], state: dict) -> None:
        super().__init__(names, state)
        self.thresholds = np.asarray(state.get("thresholds") or [0.5] * len(names), np.float64)

    def scores(self, logits: np.ndarray) -> np.ndarray:
        return sigmoid(logits, self.temperature)

    def row(self, path: str, scores: np.ndarray, k: int) -> dict:
        return top_k_row(path, scores, self.names, k, self.thresholds)


class Values(Answers):
    """Numbers per image: the network's standardised outputs back in the targets' units."""

    def __init__(self, names: list[str], state: dict) -> None:
        super().__init__(names, state)
        n = len(names)
        self.mean = np.asarray(state.get("target_mean") or [0.0] * n, np.float64)
        self.std = np.asarray(state.get("target_std") or [1.0] * n, np.float64)

    def scores(self, logits: np.ndarray) -> np.ndarray:
        return np.asarray(logits, np.float64) * self.std + self.mean

    def row(self, path: str, scores: np.ndarray, k: int) -> dict:
        values = {name: f"{v:.6f}" for name, v in zip(self.names, scores, strict=True)}
        return {"path": path, "predicted": ";".join(values.values()), **values, "error": ""}

    def policy(self, spec: str | None) -> np.ndarray | None:
        if spec is not None or self.state.get("min_confidence") is not None:
            raise ConfigError("--min_confidence (model.min_confidence) is for classifiers; a "
                              "regression model answers values, with no confidence to compare")
        return None


ANSWERS = {"multiclass": TopClasses, "multilabel": LabelsAboveThresholds, "regression": Values}


def answers(names: list[str], state: dict) -> Answers:
    """The answers of a model whose ``state["task"]`` names its task (older files: multiclass)."""
    task = state.get("task") or "multiclass"
    if task not in ANSWERS:
        raise ValueError(f"task '{task}' is not one this version answers ({', '.join(ANSWERS)})")
    return ANSWERS[task](names, state)


def to_metadata(state: dict) -> dict[str, str]:
    """The state as an ONNX file's metadata strings (:func:`from_metadata` reads them back)."""
    return {k: v if k == "task" else json.dumps(v) for k, v in state.items() if v is not None}


def from_metadata(meta: dict[str, str]) -> dict:
    state = {}
    for key in ("task", "temperature", "thresholds", "target_mean", "target_std", "min_confidence"):
        if key in meta:
            state[key] = meta[key] if key == "task" else json.loads(meta[key])
    return state


def min_confidence(spec: str | float, names: list[str]) -> np.ndarray:
    """``0.8`` or ``cat=0.9,dog=0.7,0.5`` -> each class's minimum confidence (a bare number is the
    default of the classes not named; without one they are always answered)."""
    default, named = 0.0, {}
    for part in str(spec).split(","):
        name, _, value = part.strip().rpartition("=")
        try:
            number = float(value)
        except ValueError:
            raise ConfigError(f"--min_confidence '{spec}': '{part.strip()}' is not a number or "
                              "class=number") from None
        if not 0 <= number <= 1:
            raise ConfigError(f"--min_confidence '{spec}': {number} is not a probability in [0, 1]")
        if not name:
            default = number
        elif name not in names:
            raise ConfigError(f"--min_confidence '{spec}': '{name}' is not a class of this model "
                              f"({', '.join(names)})")
        else:
            named[name] = number
    floors = {name: named.get(name, default) for name in names}
    return np.array([floors[name] for name in names], np.float64)
