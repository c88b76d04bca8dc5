"""What each stage logs: accuracy alone hides a model that learned only the majority classes. A new
number is a line in :func:`overview_metrics`; the run summary and HPARAMS columns follow."""

import torch
from torch import nn
from torchmetrics import ClasswiseWrapper, MeanMetric, MetricCollection
from torchmetrics.classification import (
    MulticlassAccuracy,
    MulticlassConfusionMatrix,
    MulticlassF1Score,
    MulticlassPrecision,
    MulticlassRecall,
)

PER_CLASS = {"precision": MulticlassPrecision, "recall": MulticlassRecall, "f1": MulticlassF1Score}


def overview_metrics(num_classes: int) -> dict[str, nn.Module]:
    """One number each per epoch: the run summary and the HPARAMS table show these."""
    n = num_classes
    return {
        "acc": MulticlassAccuracy(n, average="micro"),
        "macro_acc": MulticlassAccuracy(n, average="macro"),  # balanced accuracy (mean recall)
        "macro_f1": MulticlassF1Score(n, average="macro"),
        # e.g. "acc_top3": MulticlassAccuracy(n, top_k=min(3, n)),  # top_k above n: refused
    }


def summary_metrics(num_classes: int) -> list[str]:
    """What the run summary prints and TensorBoard's HPARAMS table compares across runs."""
    return ["val/acc_best", *(f"val/{k}" for k in overview_metrics(num_classes)), "val/loss"]


class StageMetrics(nn.Module):
    """Everything one stage (val or test) measures; ``loss`` is the training criterion."""

    def __init__(self, stage: str, class_names: list[str]) -> None:
        super().__init__()
        self.stage, n = stage, len(class_names)
        per_class = {k: ClasswiseWrapper(m(n, average=None), labels=list(class_names),
                                         prefix=f"per_class/{k}/") for k, m in PER_CLASS.items()}
        # compute_groups off: shared counts make the per-class wrappers warn at compute()
        self.scalars = MetricCollection({**overview_metrics(n), **per_class}, prefix=f"{stage}/",
                                        compute_groups=False)
        self.loss = MeanMetric()
        self.confusion = MulticlassConfusionMatrix(n)

    def update(self, logits: torch.Tensor, target: torch.Tensor, loss: torch.Tensor) -> None:
        self.scalars.update(logits, target)
        self.confusion.update(logits, target)
        self.loss.update(loss, len(target))

    def compute(self) -> dict[str, torch.Tensor]:
        """Every value, synced across ranks (every rank calls it), then reset."""
        values = dict(self.scalars.compute())
        values[f"{self.stage}/loss"] = self.loss.compute()
        values[f"{self.stage}/confusion"] = self.confusion.compute()
        for metric in (self.scalars, self.loss, self.confusion):
            metric.reset()
        return values
