"""One class per image: a softmax over the classes, cross-entropy or the focal loss."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torchmetrics import Metric
from torchmetrics.classification import MulticlassAccuracy

from project.tasks.base import Task
from project.tasks.single.metrics import StageMetrics, summary_metrics


def cross_entropy(task: Task, logits: torch.Tensor, target: torch.Tensor,
                  weight: torch.Tensor | None = None) -> torch.Tensor:
    return nn.functional.cross_entropy(logits, target, weight=weight,
                                       label_smoothing=task.setting("label_smoothing", 0.0))


class SingleLabel(Task):
    name = "multiclass"
    labels = "project.tasks.single.labels:OneClass"
    answers = "project.tasks.single.answers:TopClasses"
    losses = {"cross_entropy": cross_entropy, "focal": "project.tasks.single.focal:focal"}
    default_loss = "cross_entropy"
    temperature_scaling = reads_class_folders = learns_from_unlabeled = True

    @classmethod
    def summarise_labels(cls, targets: list, num_outputs: int) -> dict:
        """``class_weights: balanced``'s weights, from the training split's counts."""
        return {"balanced_weights": inverse_frequency(targets, num_outputs).tolist()} if targets else {}

    @classmethod
    def sample_weights(cls, targets: list, num_outputs: int) -> torch.Tensor:
        return inverse_frequency(targets, num_outputs)[targets]

    def check(self, hparams: dict) -> None:
        """MixUp and CutMix mix one class per image: they apply here."""

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
        """The task's own name: a subclass (an own task) is not ``multiclass``."""
        return (f"Task: {self.name} ({len(self.names)} classes, one per image): softmax, "
                f"{self.loss_name.replace('_', '-')} loss, best checkpoint by {self.monitor}")

    def outputs(self, logits: torch.Tensor, temperature: torch.Tensor | float = 1.0) -> torch.Tensor:
        return (logits.float() / temperature).softmax(-1)

    probabilities = outputs

    def export_score(self):
        def accuracy(logits: torch.Tensor, target: torch.Tensor) -> float:
            return float((logits.argmax(-1) == target).double().mean())
        return "val_acc", accuracy

    def log_views(self, writer, result, stage, step, epoch, top=5) -> None:
        from project.tasks.single.views import log_confusion

        log_confusion(writer, result[f"{stage}/confusion"], self.names, stage, step, epoch, top)

    def write_report(self, model, result, checkpoint: str, out_dir: Path, samples, dataset,
                     top: int, target_acc: float) -> None:
        from project.tasks.single.report import write_report

        write_report(result, self.names, checkpoint, out_dir, samples, dataset, float(model.temperature),
                     model.preprocessing, top, target_acc)


def inverse_frequency(targets: list[int], num_classes: int) -> torch.Tensor:
    """Per-class weights ``N / (classes x count)``: indexed by the targets, a balanced draw's."""
    counts = torch.bincount(torch.as_tensor(targets), minlength=num_classes).clamp(min=1).double()
    return counts.sum() / (num_classes * counts)
