"""Prediction rows and their CSV, shared by ``predict`` (torch) and ``infer.py`` (torch-free).

Torch-free on purpose: NumPy only. :func:`softmax` is the twin of
``project.model.classifier.calibrated_probabilities``.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from project.common.files import atomic_path


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """``softmax(logits / T)`` over the last axis, in float64."""
    z = np.asarray(logits, dtype=np.float64) / temperature
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def top_k_row(path: str, probs: np.ndarray, class_names: list[str], k: int) -> dict:
    """One CSV row: the predicted class, its probability, and the top ``k`` with theirs."""
    order = np.argsort(-probs, kind="stable")[:k]
    row = {"path": path, "predicted": class_names[order[0]], "confidence": f"{probs[order[0]]:.6f}",
           "error": ""}
    for rank, c in enumerate(order, 1):
        row[f"top{rank}"] = class_names[c]
        row[f"top{rank}_prob"] = f"{probs[c]:.6f}"
    return row


def error_row(path: str, error: str) -> dict:
    return {"path": path, "predicted": "", "confidence": "", "error": error.replace("\n", " ")}


def write_csv(rows: list[dict], output: str | Path, k: int) -> None:
    """The rows (``path, predicted, confidence, top1, top1_prob, ..., error``), atomically."""
    fields = ["path", "predicted", "confidence"]
    fields += [f"top{r}{s}" for r in range(1, k + 1) for s in ("", "_prob")] + ["error"]
    with atomic_path(output) as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields, restval="")
        writer.writeheader()
        writer.writerows(rows)
