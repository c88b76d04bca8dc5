"""Any number of labels per image: a sigmoid per label, BCE (or the asymmetric loss), mAP, and
exact match, F1, precision and recall at per-label thresholds fitted on the validation set.
The thresholds travel in the checkpoint and the ONNX metadata (``state``)."""

from __future__ import annotations

import functools
from pathlib import Path

import torch
from torch import nn
from torchmetrics import Metric
from torchmetrics.classification import MultilabelExactMatch

from project.extras.multilabel.task import MultilabelStageMetrics, decisions, multilabel_loss
from project.tasks.base import Task


def bce(task: Task, label_smoothing: float):
    return functools.partial(multilabel_loss, label_smoothing=label_smoothing, kind="bce")


def asymmetric(task: Task, label_smoothing: float):
    return functools.partial(multilabel_loss, label_smoothing=label_smoothing, kind="asymmetric")


class MultiLabel(Task):
    name = "multilabel"
    monitor = "val/map"  # val/acc is the exact-match ratio: harsh and bound to the thresholds
    losses = {"bce": bce, "asymmetric": asymmetric}
    default_loss = "bce"
    one_class_per_image = False

    def __init__(self, names: list[str], loss: str | None = None, label_smoothing: float = 0.0,
                 label_stats: dict | None = None) -> None:
        super().__init__(names, loss, label_smoothing, label_stats)
        self.thresholds = torch.full((len(names),), 0.5)  # refitted in place by val's metrics

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
        from project.extras.multilabel.task import per_label_ap

        def mean_ap(logits: torch.Tensor, target: torch.Tensor) -> float:
            return float(per_label_ap(logits.float().sigmoid(), target).nanmean())
        return "val_map", mean_ap

    def log_views(self, writer, result, stage, step, epoch, top=5) -> None:
        from project.extras.multilabel.dashboards import log_multilabel

        log_multilabel(writer, result, self.names, self.thresholds, stage, step, epoch)

    def write_report(self, model, result, checkpoint: str, out_dir: Path, samples, dataset,
                     top: int, target_acc: float) -> None:
        from project.extras.multilabel.report import write_multilabel_report

        write_multilabel_report(result, self.names, checkpoint, out_dir, samples, dataset, self.thresholds)

    def decide(self, probs: torch.Tensor) -> torch.Tensor:
        return decisions(probs, self.thresholds)
