"""Prediction rows and their CSV, shared by ``predict`` (torch) and ``infer.py`` (torch-free).

Torch-free on purpose: NumPy only. ``project/tasks/answers.py`` builds the rows with these.
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


def sigmoid(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Each label's ``sigmoid(logits / T)`` (multi-label), in float64."""
    return 1.0 / (1.0 + np.exp(-np.asarray(logits, dtype=np.float64) / temperature))


def top_k_row(path: str, probs: np.ndarray, class_names: list[str], k: int,
              thresholds: np.ndarray | None = None) -> dict:
    """One CSV row: the predicted class, its probability, and the top ``k`` with theirs.
    Multi-label (``thresholds`` given): ``predicted`` holds every label at or above its
    threshold, most probable first, separated by ``;`` (empty: none), and ``confidence`` the
    top label's probability."""
    order = np.argsort(-probs, kind="stable")[:k]
    predicted = class_names[order[0]]
    if thresholds is not None:
        above = [c for c in np.argsort(-probs, kind="stable") if probs[c] >= thresholds[c]]
        predicted = ";".join(class_names[c] for c in above)
    row = {"path": path, "predicted": predicted, "confidence": f"{probs[order[0]]:.6f}", "error": ""}
    for rank, c in enumerate(order, 1):
        row[f"top{rank}"] = class_names[c]
        row[f"top{rank}_prob"] = f"{probs[c]:.6f}"
    return row


def unsure(row: dict, min_confidence: float) -> dict:
    """``unsure`` True, and ``predicted`` ``unsure``, when the top probability is below ``min_confidence``."""
    # a Python bool: the server's JSON encoder refuses NumPy's
    row["unsure"] = bool(row.get("confidence")) and float(row["confidence"]) < float(min_confidence)
    if row["unsure"]:
        row["predicted"] = "unsure"
    return row


def error_row(path: str, error: str) -> dict:
    return {"path": path, "predicted": "", "confidence": "", "error": error.replace("\n", " ")}


def write_csv(rows: list[dict], output: str | Path) -> None:
    """The rows atomically, their columns in first-seen order then ``error`` (and ``unsure``):
    ``path, predicted, confidence, top1, top1_prob, ..., error`` for a classifier."""
    last = ("error", "unsure")
    fields = list(dict.fromkeys(k for r in rows for k in r if k not in last))
    fields += [k for k in last if any(k in r for r in rows)]
    with atomic_path(output) as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields, restval="")
        writer.writeheader()
        writer.writerows(rows)
