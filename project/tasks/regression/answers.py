"""The answers of a regression model, torch-free: the network's standardised outputs back in the
targets' units (the scaling is kept in the checkpoint and the ONNX metadata)."""

from __future__ import annotations

import functools

import numpy as np

from project.errors import ConfigError
from project.tasks.answers import Answers


class Values(Answers):
    def __init__(self, names: list[str], state: dict) -> None:
        super().__init__(names, state)
        n = len(names)
        self.mean = np.asarray(state.get("target_mean") or [0.0] * n, np.float64)
        self.std = np.asarray(state.get("target_std") or [1.0] * n, np.float64)

    def scores(self, logits: np.ndarray) -> np.ndarray:
        return np.asarray(logits, np.float64) * self.std + self.mean

    def row(self, path: str, scores: np.ndarray, k: int) -> dict:
        values = {field(name): f"{v:.6f}" for name, v in zip(self.names, scores, strict=True)}
        return {"path": path, "predicted": ";".join(values.values()), **values, "error": ""}

    def policy(self, spec: str | None) -> np.ndarray | None:
        if spec is not None or self.state.get("min_confidence") is not None:
            raise ConfigError("--min_confidence (model.min_confidence) is for classifiers; a "
                              "regression model answers values, with no confidence to compare")
        return None

    def explained(self, scores: np.ndarray) -> int | None:
        return None  # no class to explain


@functools.cache
def own_fields() -> tuple[str, ...]:
    """The fields of every row besides the values' (path, predicted, error), read off a row
    without values."""
    return tuple(Values([], {}).row("x", np.zeros(0), 1))


def field(name: str) -> str:
    """A value column's field in a row: its name, or ``<name>_value`` where a row's own field
    (``error``, ``path``, ...) has it, so neither is lost."""
    return f"{name}_value" if name in own_fields() else name
