"""Metrics beyond accuracy: per-class precision, recall and F1, confusion matrix, confused pairs.

Accuracy alone hides a model that only learned the majority classes; per-class recall and
the confusion matrix show it at once. torchmetrics keeps the counts and syncs them under DDP.
"""

from __future__ import annotations

import torch
from torchmetrics import MetricCollection
from torchmetrics.classification import (
    MulticlassAccuracy,
    MulticlassConfusionMatrix,
    MulticlassF1Score,
    MulticlassPrecision,
    MulticlassRecall,
)

PER_CLASS = ("precision", "recall", "f1")


def stage_metrics(num_classes: int) -> MetricCollection:
    """Everything logged for val/ and test/; one collection so the counts are shared."""
    return MetricCollection(
        {
            "acc": MulticlassAccuracy(num_classes, average="micro"),
            "acc_macro": MulticlassAccuracy(num_classes, average="macro"),
            "f1_macro": MulticlassF1Score(num_classes, average="macro"),
            "precision": MulticlassPrecision(num_classes, average=None),
            "recall": MulticlassRecall(num_classes, average=None),
            "f1": MulticlassF1Score(num_classes, average=None),
            "confusion": MulticlassConfusionMatrix(num_classes),
        },
        compute_groups=True,
    )


def flatten(values: dict[str, torch.Tensor], stage: str, class_names: list[str]) -> dict:
    """``{"recall": tensor([...])}`` -> ``{"val/recall/<class>": ...}``; drops the matrix."""
    flat = {}
    for key, value in values.items():
        if key == "confusion":
            continue
        if key in PER_CLASS:
            flat.update({f"{stage}/{key}/{c}": v for c, v in zip(class_names, value, strict=True)})
        else:
            flat[f"{stage}/{key}"] = value
    return flat


def confused_pairs(confusion: torch.Tensor, class_names: list[str], top: int = 5) -> list[dict]:
    """The largest off-diagonal counts: which true class is most often taken for which."""
    cm = confusion.detach().cpu().clone()
    support = cm.sum(1)
    cm.fill_diagonal_(0)
    pairs = []
    for flat in torch.argsort(cm.flatten(), descending=True)[:top].tolist():
        i, j = divmod(flat, cm.shape[1])
        count = int(cm[i, j])
        if count == 0:
            break
        pairs.append({"true": class_names[i], "predicted": class_names[j], "count": count,
                      "share_of_true": count / max(int(support[i]), 1)})
    return pairs


def per_class_table(values: dict[str, torch.Tensor], class_names: list[str]) -> dict:
    """Per-class precision, recall, F1 (torchmetrics' numbers) with support and averages."""
    support = values["confusion"].detach().cpu().sum(1).double()
    cols = {k: values[k].detach().cpu().double() for k in PER_CLASS}
    rows = {
        name: {**{k: float(cols[k][i]) for k in PER_CLASS}, "support": int(support[i])}
        for i, name in enumerate(class_names)
    }
    weights = support / support.sum().clamp(min=1)
    total = int(support.sum())
    averages = {
        "macro avg": {**{k: float(cols[k].mean()) for k in PER_CLASS}, "support": total},
        "weighted avg": {**{k: float((cols[k] * weights).sum()) for k in PER_CLASS},
                         "support": total},
    }
    return {"classes": rows, "averages": averages, "accuracy": float(values["acc"])}
