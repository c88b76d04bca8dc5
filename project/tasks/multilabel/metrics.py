"""The multi-label task's numbers (``task.py`` is the task): BCE or the
asymmetric loss, mAP, and metrics at per-label thresholds fitted on the validation set.

Loaded only for a multi-label model. The thresholds maximise each label's F1 on the validation
set; they travel in the checkpoint and the ONNX metadata (the task's ``state``).
"""

from __future__ import annotations

import torch
from torch import nn
from torchmetrics import CatMetric, MeanMetric
from torchmetrics.functional.classification import (
    multilabel_average_precision,
    multilabel_exact_match,
    multilabel_f1_score,
    multilabel_precision,
    multilabel_precision_recall_curve,
    multilabel_recall,
)

THRESHOLD_GRID = torch.linspace(0.02, 0.98, 49)  # a grid: robust to a small validation set


def multilabel_loss(logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None,
                    label_smoothing: float = 0.0, kind: str = "bce") -> torch.Tensor:
    """Mean binary cross-entropy over images and labels (or the asymmetric loss), the class
    weights as each label's positive weight; label smoothing moves each 0/1 target
    ``label_smoothing / 2`` towards 0.5."""
    target = target.float()
    if label_smoothing:
        target = target * (1 - label_smoothing) + label_smoothing / 2
    if kind == "asymmetric":
        return asymmetric_loss(logits, target, weight)
    return nn.functional.binary_cross_entropy_with_logits(logits.float(), target, pos_weight=weight)


def asymmetric_loss(logits: torch.Tensor, target: torch.Tensor, pos_weight: torch.Tensor | None = None,
                    gamma_neg: float = 4.0, gamma_pos: float = 0.0, clip: float = 0.05) -> torch.Tensor:
    """Ridnik et al. (2021): most labels are absent from most images; their easy negatives are
    down-weighted (focusing ``gamma_neg``) and the easiest discarded (probability margin ``clip``).
    A mean over images and labels, like BCE, so the learning rate carries over."""
    p = torch.sigmoid(logits.float())
    p_neg = (p - clip).clamp(min=0)
    positive = target * torch.log(p.clamp(min=1e-8)) * (1 - p) ** gamma_pos
    if pos_weight is not None:
        positive = positive * pos_weight
    negative = (1 - target) * torch.log((1 - p_neg).clamp(min=1e-8)) * p_neg ** gamma_neg
    return -(positive + negative).mean()


def fit_thresholds(probs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Each label's F1-maximising threshold on the grid; 0.5 for a label without positives."""
    n = probs.shape[1]
    precision, recall, grid = multilabel_precision_recall_curve(probs, targets.int(), n,
                                                                thresholds=THRESHOLD_GRID.to(probs.device))
    precision, recall = precision[:, :-1].nan_to_num(0), recall[:, :-1]
    f1 = 2 * precision * recall / (precision + recall).clamp(min=1e-12)
    best = grid[f1.argmax(1)]
    return torch.where(targets.sum(0) > 0, best, torch.full_like(best, 0.5)).cpu()


def decisions(probs: torch.Tensor, thresholds: torch.Tensor) -> torch.Tensor:
    """1 where a label's probability reaches its threshold."""
    return (probs >= thresholds.to(probs.device)).int()


def error_cooccurrence(predicted: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(labels x labels): how often label *i* was missed in an image where label *j* was wrongly
    predicted: the multi-label confusion matrix (what a missed label is taken for)."""
    missed = (targets.bool() & ~predicted.bool()).double()
    false = (predicted.bool() & ~targets.bool()).double()
    return (missed.T @ false).long()


def per_label_ap(probs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Average precision of each label; NaN for a label without positives here."""
    ap = multilabel_average_precision(probs, targets.int(), probs.shape[1], average=None)
    return torch.where(targets.sum(0) > 0, ap, torch.full_like(ap, float("nan")))


def scores(probs: torch.Tensor, targets: torch.Tensor, thresholds: torch.Tensor, prefix: str = "",
           names: list[str] | None = None) -> dict[str, torch.Tensor]:
    """mAP (macro over the labels present, and micro), and at the thresholds: exact match
    (``acc``: every label of the image right), macro F1, precision and recall; with ``names``
    also each present label's AP as ``per_class/ap/<name>``."""
    targets, n = targets.int(), probs.shape[1]
    ap = per_label_ap(probs, targets)
    binary = decisions(probs, thresholds)
    kw = {"num_labels": n, "threshold": 0.5}
    values = {f"{prefix}map": ap.nanmean(),
              f"{prefix}map_micro": multilabel_average_precision(probs, targets, n, average="micro"),
              f"{prefix}acc": multilabel_exact_match(binary, targets, **kw),
              f"{prefix}f1": multilabel_f1_score(binary, targets, average="macro", **kw),
              f"{prefix}precision": multilabel_precision(binary, targets, average="macro", **kw),
              f"{prefix}recall": multilabel_recall(binary, targets, average="macro", **kw)}
    for name, label_ap in zip(names or [], ap, strict=False):
        if not label_ap.isnan():
            values[f"{prefix}per_class/ap/{name}"] = label_ap
    return values


class MultilabelStageMetrics(nn.Module):
    """What one stage (val or test) measures, like ``StageMetrics``: the probabilities and targets
    of the whole split are kept (gathered across ranks), since thresholds and AP need all of them.
    ``thresholds`` is the model's tensor: with ``fit`` (validation) refitted in place each epoch."""

    def __init__(self, stage: str, class_names: list[str], thresholds: torch.Tensor,
                 fit: bool = False) -> None:
        super().__init__()
        self.stage, self.class_names, self.thresholds, self.fit = stage, list(class_names), thresholds, fit
        self.probs, self.targets, self.loss = CatMetric(), CatMetric(), MeanMetric()

    def update(self, logits: torch.Tensor, target: torch.Tensor, loss: torch.Tensor) -> None:
        self.probs.update(torch.sigmoid(logits.float()))
        self.targets.update(target.float())
        self.loss.update(loss, len(target))

    def compute(self) -> dict[str, torch.Tensor]:
        """Every value, synced across ranks, then reset."""
        n = len(self.class_names)
        probs = self.probs.compute().reshape(-1, n)
        targets = self.targets.compute().reshape(-1, n).int()
        if self.fit:
            self.thresholds.copy_(fit_thresholds(probs, targets))
        values = scores(probs, targets, self.thresholds, f"{self.stage}/", self.class_names)
        values[f"{self.stage}/loss"] = self.loss.compute()
        values[f"{self.stage}/confusion"] = error_cooccurrence(decisions(probs, self.thresholds), targets)
        for metric in (self.probs, self.targets, self.loss):
            metric.reset()
        return values
