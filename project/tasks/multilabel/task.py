"""Any number of labels per image: a sigmoid per label, BCE (or the asymmetric loss), mAP, and
exact match, F1, precision and recall at per-label thresholds fitted on the validation set.
The thresholds travel in the checkpoint and the ONNX metadata (``state``)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torchmetrics import Metric
from torchmetrics.classification import MultilabelExactMatch

from project.tasks.base import Task
from project.tasks.multilabel.metrics import MultilabelStageMetrics, decisions, multilabel_loss


def bce(task: Task, logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None):
    return multilabel_loss(logits, target, weight, task.setting("label_smoothing", 0.0), "bce")


def asymmetric(task: Task, logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None):
    return multilabel_loss(logits, target, weight, task.setting("label_smoothing", 0.0), "asymmetric")


class MultiLabel(Task):
    name = "multilabel"
    labels = "project.tasks.multilabel.labels:SeveralClasses"
    answers = "project.tasks.multilabel.answers:LabelsAboveThresholds"
    monitor = "val/map"  # val/acc is the exact-match ratio: harsh and bound to the thresholds
    losses = {"bce": bce, "asymmetric": asymmetric}
    default_loss = "bce"
    # BCE averages over every class's output, so each logit's gradient is a fraction of softmax's;
    # a plain loop's better LR on multi-label mosaics was twice single-label's from random weights,
    # its grid's top (3x) from ImageNet weights, where 2x scored higher still (docs/accuracy.md)
    lr_scale = 2.0

    def __init__(self, names: list[str], loss: str | None = None, settings=None,
                 label_stats: dict | None = None) -> None:
        super().__init__(names, loss, settings, label_stats)
        self.thresholds = torch.full((len(names),), 0.5)  # refitted in place by val's metrics

    @classmethod
    def summarise_labels(cls, targets: list, num_outputs: int) -> dict:
        """``class_weights: balanced``: each label's negatives per positive (BCE's ``pos_weight``)."""
        if not targets:
            return {}
        positives = torch.as_tensor(targets).double().sum(0).clamp(min=1)
        return {"balanced_weights": ((len(targets) - positives) / positives).tolist()}

    @staticmethod
    def target(label: object) -> torch.Tensor:
        return torch.tensor(label, dtype=torch.float32)  # 0/1 per label, as BCE takes it

    def train_metric(self) -> Metric:
        return MultilabelExactMatch(len(self.names))

    def stage_metrics(self, stage: str) -> nn.Module:
        return MultilabelStageMetrics(stage, self.names, self.thresholds, fit=stage == "val")

    @property
    def summary_metrics(self) -> list[str]:
        return ["val/map_best", "val/map", "val/map_micro", "val/acc", "val/f1", "val/loss"]

    def describe(self) -> str:
        loss = "asymmetric loss" if self.loss_name == "asymmetric" else "BCE"
        return (f"Task: multilabel ({len(self.names)} labels, several per image): a sigmoid per label, "
                f"{loss}, thresholds fitted on val to each label's best F1, best checkpoint by "
                f"{self.monitor}")

    def outputs(self, logits: torch.Tensor, temperature: torch.Tensor | float = 1.0) -> torch.Tensor:
        return (logits.float() / temperature).sigmoid()

    def state(self) -> dict:
        return {"thresholds": [float(t) for t in self.thresholds]}

    def load_state(self, state: dict) -> None:
        if "thresholds" in state:
            self.thresholds.copy_(torch.tensor(state["thresholds"]))

    def export_score(self):
        from project.tasks.multilabel.metrics import per_label_ap

        def mean_ap(logits: torch.Tensor, target: torch.Tensor) -> float:
            return float(per_label_ap(logits.float().sigmoid(), target).nanmean())
        return "val_map", mean_ap

    def log_views(self, writer, result, stage, step, epoch, top=5) -> None:
        from project.tasks.multilabel.views import log_multilabel

        log_multilabel(writer, result, self.names, self.thresholds, stage, step, epoch)

    def write_report(self, model, result, checkpoint: str, out_dir: Path, samples, dataset,
                     top: int, target_acc: float) -> None:
        from project.tasks.multilabel.report import write_multilabel_report

        write_multilabel_report(result, self.names, checkpoint, out_dir, samples, dataset, self.thresholds)

    def decide(self, probs: torch.Tensor) -> torch.Tensor:
        return decisions(probs, self.thresholds)
