"""What each stage logs, in one place: loss, accuracy, macro F1, per-class P/R/F1, confusion.

Accuracy alone hides a model that only learned the majority classes; per-class recall and the
confusion matrix show it at once. torchmetrics keeps the counts, syncs them under DDP and names
the per-class values (``ClasswiseWrapper``); the LightningModule only updates and logs them, and
the dashboards, the report and the HPARAMS view read the values computed here.

Logged names: ``<stage>/loss``, ``<stage>/nll``, ``<stage>/acc``, ``<stage>/acc_macro``,
``<stage>/f1_macro``, ``<stage>/{precision,recall,f1}/<class>``; for validation also
``val/acc_best``; and the HPARAMS columns of :data:`HP_METRICS`.
"""

from __future__ import annotations

import torch
from torch import nn
from torchmetrics import ClasswiseWrapper, MaxMetric, MeanMetric, MetricCollection
from torchmetrics.classification import (
    MulticlassAccuracy,
    MulticlassConfusionMatrix,
    MulticlassF1Score,
    MulticlassPrecision,
    MulticlassRecall,
)

PER_CLASS = ("precision", "recall", "f1")
# TensorBoard's HPARAMS columns -> the logged value each one repeats.
HP_METRICS = {"hp/val_acc_best": "val/acc_best", "hp/val_f1_macro": "val/f1_macro"}


def scalar_metrics(stage: str, class_names: list[str]) -> MetricCollection:
    """Accuracy, macro scores and named per-class scores, as ``<stage>/...`` keys."""
    n = len(class_names)

    def per_class(metric, name: str) -> ClasswiseWrapper:
        return ClasswiseWrapper(metric(n, average=None), labels=list(class_names), prefix=f"{name}/")

    return MetricCollection(
        {
            "acc": MulticlassAccuracy(n, average="micro"),
            "acc_macro": MulticlassAccuracy(n, average="macro"),
            "f1_macro": MulticlassF1Score(n, average="macro"),
            "precision": per_class(MulticlassPrecision, "precision"),
            "recall": per_class(MulticlassRecall, "recall"),
            "f1": per_class(MulticlassF1Score, "f1"),
        },
        prefix=f"{stage}/",
        compute_groups=False,  # shared counts make the per-class wrappers warn at compute()
    )


class StageMetrics(nn.Module):
    """Everything one evaluation stage (val or test) measures, updated per batch.

    ``loss`` is the training criterion (class weights and label smoothing included), so it is
    comparable with ``train/loss``; ``nll`` is the plain cross-entropy, comparable across runs
    with other loss settings.
    """

    def __init__(self, stage: str, class_names: list[str]) -> None:
        super().__init__()
        self.stage = stage
        self.scalars = scalar_metrics(stage, class_names)
        self.loss, self.nll = MeanMetric(), MeanMetric()
        self.confusion = MulticlassConfusionMatrix(len(class_names))

    def update(self, logits: torch.Tensor, target: torch.Tensor, loss: torch.Tensor) -> None:
        self.scalars.update(logits, target)
        self.confusion.update(logits, target)
        self.loss.update(loss, len(target))
        self.nll.update(nn.functional.cross_entropy(logits.float(), target), len(target))

    def compute(self) -> dict[str, torch.Tensor]:
        """Every value (synced across DDP ranks), the confusion matrix under ``<stage>/confusion``;
        then the counts restart for the next epoch."""
        values = dict(self.scalars.compute())
        values[f"{self.stage}/loss"] = self.loss.compute()
        values[f"{self.stage}/nll"] = self.nll.compute()
        values[f"{self.stage}/confusion"] = self.confusion.compute()
        for metric in (self.scalars, self.loss, self.nll, self.confusion):
            metric.reset()
        return values


class BestSoFar(MaxMetric):
    """``val/acc_best``: saved in checkpoints, so a resumed run keeps its best-so-far."""

    def __init__(self) -> None:
        super().__init__()
        self.persistent(True)


def loggable(values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The scalar entries of ``values`` (what ``self.log_dict`` takes)."""
    return {k: v for k, v in values.items() if v.numel() == 1}


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


def per_class_table(values: dict[str, torch.Tensor], stage: str, class_names: list[str]) -> dict:
    """Per-class precision, recall, F1 (the logged values) with support and averages."""
    support = values[f"{stage}/confusion"].detach().cpu().sum(1).double()
    cols = {k: torch.stack([values[f"{stage}/{k}/{c}"].detach().cpu().double() for c in class_names])
            for k in PER_CLASS}
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
    return {"classes": rows, "averages": averages, "accuracy": float(values[f"{stage}/acc"])}
