"""One class per image (the default task): softmax over the classes, cross-entropy (or the
focal loss), accuracy, macro F1, per-class P/R/F1 and the confusion matrix."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torchmetrics import Metric
from torchmetrics.classification import MulticlassAccuracy

from project.model.metrics import StageMetrics, summary_metrics
from project.tasks.base import Task


def cross_entropy(task: Task, label_smoothing: float):
    def loss(logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        return nn.functional.cross_entropy(logits, target, weight=weight, label_smoothing=label_smoothing)
    return loss


def focal(task: Task, label_smoothing: float, gamma: float = 2.0):
    """Lin et al. (2017) over a softmax: ``-(1 - p)^gamma log p`` of the true class, so images
    already classified well weigh little; soft targets (MixUp, smoothing) weigh each class's term."""
    def loss(logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        log_p = logits.float().log_softmax(-1)
        n = logits.shape[-1]
        soft = nn.functional.one_hot(target, n).float() if target.dim() == 1 else target.float()
        if label_smoothing:
            soft = soft * (1 - label_smoothing) + label_smoothing / n
        terms = -soft * (1 - log_p.exp()) ** gamma * log_p
        if weight is not None:
            terms = terms * weight
        return terms.sum(-1).mean()
    return loss


class SingleLabel(Task):
    name = "multiclass"
    losses = {"cross_entropy": cross_entropy, "focal": focal}
    default_loss = "cross_entropy"

    learns_from_unlabeled = True

    def pseudo_labels(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        confidence, target = logits.float().softmax(-1).max(-1)
        return target, confidence

    def per_image_loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits.float(), target, reduction="none")

    def train_metric(self) -> Metric:
        return MulticlassAccuracy(len(self.names), average="micro")

    def stage_metrics(self, stage: str) -> nn.Module:
        return StageMetrics(stage, self.names)

    @property
    def summary_metrics(self) -> list[str]:
        return summary_metrics(len(self.names))

    def describe(self) -> str:
        return (f"Task: multiclass ({len(self.names)} classes, one per image): softmax, "
                f"{self.loss_name.replace('_', '-')} loss, best checkpoint by {self.monitor}")

    def outputs(self, logits: torch.Tensor, temperature: torch.Tensor | float = 1.0) -> torch.Tensor:
        return (logits.float() / temperature).softmax(-1)

    def export_score(self):
        def accuracy(logits: torch.Tensor, target: torch.Tensor) -> float:
            return float((logits.argmax(-1) == target).double().mean())
        return "val_acc", accuracy

    def log_views(self, writer, result, stage, step, epoch, top=5) -> None:
        from project.callbacks.dashboards import confused_pairs, confusion_figure, pairs_markdown

        cm = result[f"{stage}/confusion"]
        title = f"{stage} confusion matrix (epoch {epoch})"
        figure = confusion_figure(cm, self.names, title)
        writer.add_figure(f"{stage}/per_class/confusion_matrix", figure, step)
        writer.add_text(f"{stage}/confused_pairs", pairs_markdown(confused_pairs(cm, self.names, top)), step)

    def write_report(self, model, result, checkpoint: str, out_dir: Path, samples, dataset,
                     top: int, target_acc: float) -> None:
        from project.extras.analysis.report import write_report

        write_report(result, self.names, checkpoint, out_dir, samples, dataset, float(model.temperature),
                     model.preprocessing, top, target_acc)
