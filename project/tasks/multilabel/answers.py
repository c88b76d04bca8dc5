"""The answers of a multi-label model, torch-free: ``sigmoid(logits / T)``; every label at or
above its threshold (fitted on the validation set, kept in the checkpoint and ONNX metadata)."""

from __future__ import annotations

import numpy as np

from project.common.predictions import sigmoid, top_k_row
from project.tasks.answers import Answers


class LabelsAboveThresholds(Answers):
    def __init__(self, names: list[str], state: dict) -> None:
        super().__init__(names, state)
        self.thresholds = np.asarray(state.get("thresholds") or [0.5] * len(names), np.float64)

    def scores(self, logits: np.ndarray) -> np.ndarray:
        return sigmoid(logits, self.temperature)

    def row(self, path: str, scores: np.ndarray, k: int) -> dict:
        return top_k_row(path, scores, self.names, k, self.thresholds)
