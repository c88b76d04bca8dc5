"""How a model's raw outputs become answers, the one owner of the answer policy: ``predict``
(PyTorch), ``infer.py`` (ONNX Runtime, no torch) and ``serve`` all build their rows with the
task's :class:`Answers` (``project/tasks/<name>/answers.py``) from the same state (the answers
class, temperature, the task's own: thresholds, target scaling), read from a checkpoint
(``ImageClassifier.answer_state``) or from an exported file's metadata.

Torch-free on purpose: NumPy only.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from project.common.options import positive_int
from project.common.predictions import unsure
from project.errors import ConfigError
from project.tasks import load


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The answer options of every command that answers (one default for all of them)."""
    parser.add_argument("--top_k", type=positive_int, default=3, help="classes listed per image")
    parser.add_argument("--min_confidence", default=None,
                        help="below it an image is answered 'unsure': a probability (0.8), or per "
                             "class with a default for the rest (cat=0.9,dog=0.7,0.5); evaluate's "
                             "report suggests one")


def check_min_confidence(names: list[str], state: dict) -> None:
    """``model.min_confidence`` checked against the classes when the model is built."""
    try:
        answers(names, state)
    except ConfigError as err:
        raise ConfigError(f"model.min_confidence: {err}") from None


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

    def explained(self, scores: np.ndarray) -> int | None:
        """The output a heat map explains (serve's page): the top class; None without classes."""
        return int(np.argmax(scores))

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


def answers(names: list[str], state: dict) -> Answers:
    """The answers of a model whose ``state["answers"]`` names its answers class (the task's, as
    ``package.module:Class``: torch-free, so ``infer.py`` runs without torch)."""
    spec = state.get("answers")
    if not spec:
        raise ValueError("holds no answers class (exported by an older version: export it again)")
    try:
        cls = load(spec, "answers")
    except ConfigError as err:
        raise ValueError(str(err)) from None
    if not (isinstance(cls, type) and issubclass(cls, Answers)):
        raise ValueError(f"answers '{spec}' is not an Answers class")
    return cls(names, state)


def to_metadata(state: dict) -> dict[str, str]:
    """The state as an ONNX file's metadata strings, each key as JSON (strings as they are), and
    their names in ``answer_keys`` (:func:`from_metadata` reads them back)."""
    kept = {k: v for k, v in state.items() if v is not None}
    meta = {k: v if isinstance(v, str) else json.dumps(v) for k, v in kept.items()}
    return {**meta, "answer_keys": json.dumps(sorted(kept))}


def from_metadata(meta: dict[str, str]) -> dict:
    state = {}
    for key in json.loads(meta.get("answer_keys", "[]")):
        try:
            state[key] = json.loads(meta[key])
        except ValueError:  # a string kept as it is (the task, the answers class)
            state[key] = meta[key]
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
