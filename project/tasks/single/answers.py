"""The answers of a one-class-per-image model, torch-free: ``softmax(logits / T)``, the top
``k`` classes, ``unsure`` below the per-class minimum confidence."""

from __future__ import annotations

import numpy as np

from project.common.predictions import softmax, top_k_row
from project.tasks.answers import Answers


class TopClasses(Answers):
    def scores(self, logits: np.ndarray) -> np.ndarray:
        return softmax(logits, self.temperature)

    def row(self, path: str, scores: np.ndarray, k: int) -> dict:
        return top_k_row(path, scores, self.names, k)
