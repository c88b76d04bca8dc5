"""Multi-output classification: one softmax head per column (the network's outputs, in column
order, each column's slice its own softmax), cross-entropy averaged over the columns, per-column
accuracy and macro F1, the mean of the columns' accuracies monitored (``val/acc``)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torchmetrics import MeanMetric, Metric
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix, MulticlassF1Score

from project.tasks.base import Task
from project.tasks.multioutput import groups


def cross_entropy(task: MultiOutput, logits: torch.Tensor, target: torch.Tensor,
                  weight: torch.Tensor | None = None) -> torch.Tensor:
    """The mean over the columns of each column's cross-entropy (``weight``: one per output)."""
    smoothing = task.setting("label_smoothing", 0.0)
    return torch.stack([nn.functional.cross_entropy(
        logits[:, part].float(), target[:, j], weight=None if weight is None else weight[part],
        label_smoothing=smoothing) for j, (_, part) in enumerate(task.columns)]).mean()


class MultiOutput(Task):
    name = "multioutput"
    labels = "project.tasks.multioutput.labels:ClassColumns"
    answers = "project.tasks.multioutput.answers:ClassPerColumn"
    losses = {"cross_entropy": cross_entropy}
    default_loss = "cross_entropy"

    def __init__(self, names: list[str], loss: str | None = None, settings=None,
                 label_stats: dict | None = None) -> None:
        super().__init__(names, loss, settings, label_stats)
        self.columns, start = [], 0  # (column, its slice of the outputs)
        for column, classes in groups(self.names):
            self.columns.append((column, slice(start, start + len(classes))))
            start += len(classes)

    @classmethod
    def summarise_labels(cls, targets: list, num_outputs: int) -> dict:
        """``class_weights: balanced``: each column's classes weighed as a balanced draw would."""
        if not targets:
            return {}
        columns, weights = torch.as_tensor(targets), []
        for j in range(columns.shape[1]):
            counts = torch.bincount(columns[:, j]).clamp(min=1).double()
            weights += (counts.sum() / (len(counts) * counts)).tolist()
        return {"balanced_weights": weights}

    @staticmethod
    def target(label: object) -> torch.Tensor:
        return torch.tensor(label, dtype=torch.long)  # a class index per column

    def train_metric(self) -> Metric:
        return ColumnAccuracy(self)

    def stage_metrics(self, stage: str) -> nn.Module:
        return ColumnMetrics(stage, self)

    @property
    def summary_metrics(self) -> list[str]:
        return ["val/acc_best", "val/acc", "val/macro_f1",
                *(f"val/per_column/acc/{c}" for c, _ in self.columns), "val/loss"]

    def describe(self) -> str:
        shape = ", ".join(f"{c} ({part.stop - part.start})" for c, part in self.columns)
        return (f"Task: multioutput (one class per column: {shape}): a softmax per column, cross-entropy "
                f"averaged over them, best checkpoint by {self.monitor} (the columns' mean accuracy)")

    def outputs(self, logits: torch.Tensor, temperature: torch.Tensor | float = 1.0) -> torch.Tensor:
        return torch.cat([(logits[:, part].float() / temperature).softmax(-1)
                          for _, part in self.columns], -1)

    def predicted(self, logits: torch.Tensor) -> torch.Tensor:
        """The class index of each column (images x columns)."""
        return torch.stack([logits[:, part].argmax(-1) for _, part in self.columns], -1)

    def export_score(self):
        def accuracy(logits: torch.Tensor, target: torch.Tensor) -> float:
            return float((self.predicted(logits) == target).double().mean())
        return "val_acc", accuracy

    def log_views(self, writer, result, stage, step, epoch, top=5) -> None:
        from project.tasks.single.views import confusion_figure

        for column, classes in groups(self.names):
            figure = confusion_figure(result[f"{stage}/confusion/{column}"], classes,
                                      f"{stage} {column} (epoch {epoch})")
            writer.add_figure(f"{stage}/per_column/confusion_matrix/{column}", figure, step)

    def write_report(self, model, result, checkpoint: str, out_dir: Path, samples, dataset,
                     top: int, target_acc: float) -> dict:
        from project.tasks.multioutput.report import write_report

        return write_report(self, result, checkpoint, out_dir, samples, dataset, top)


class ColumnAccuracy(Metric):
    """The mean over the columns of each column's accuracy (``train/acc``)."""

    def __init__(self, task: MultiOutput) -> None:
        super().__init__()
        self.task = task
        self.add_state("correct", torch.zeros(len(task.columns)), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros(()), dist_reduce_fx="sum")

    def update(self, logits: torch.Tensor, target: torch.Tensor) -> None:
        self.correct += (self.task.predicted(logits) == target).sum(0)
        self.total += len(target)

    def compute(self) -> torch.Tensor:
        return (self.correct / self.total.clamp(min=1)).mean()


class ColumnMetrics(nn.Module):
    """What one stage measures per column (accuracy, macro F1, confusion) and their means."""

    def __init__(self, stage: str, task: MultiOutput) -> None:
        super().__init__()
        self.stage, self.task, self.loss = stage, task, MeanMetric()
        sizes = {c: part.stop - part.start for c, part in task.columns}
        self.acc = nn.ModuleDict({c: MulticlassAccuracy(n, average="micro") for c, n in sizes.items()})
        self.f1 = nn.ModuleDict({c: MulticlassF1Score(n, average="macro") for c, n in sizes.items()})
        self.confusion = nn.ModuleDict({c: MulticlassConfusionMatrix(n) for c, n in sizes.items()})

    def update(self, logits: torch.Tensor, target: torch.Tensor, loss: torch.Tensor) -> None:
        for j, (column, part) in enumerate(self.task.columns):
            for metrics in (self.acc, self.f1, self.confusion):
                metrics[column].update(logits[:, part], target[:, j])
        self.loss.update(loss, len(target))

    def compute(self) -> dict[str, torch.Tensor]:
        s, values = self.stage, {}
        for column, _ in self.task.columns:
            values[f"{s}/per_column/acc/{column}"] = self.acc[column].compute()
            values[f"{s}/per_column/macro_f1/{column}"] = self.f1[column].compute()
            values[f"{s}/confusion/{column}"] = self.confusion[column].compute()
        for key in ("acc", "macro_f1"):  # the means over the columns
            values[f"{s}/{key}"] = torch.stack([values[f"{s}/per_column/{key}/{c}"]
                                                for c, _ in self.task.columns]).mean()
        values[f"{s}/loss"] = self.loss.compute()
        for metric in (*self.acc.values(), *self.f1.values(), *self.confusion.values(), self.loss):
            metric.reset()
        return values
