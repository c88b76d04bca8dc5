"""What each stage logs, in one place: loss, accuracy, macro F1, per-class P/R/F1, confusion.

Accuracy alone hides a model that only learned the majority classes; per-class recall and the
confusion matrix show it at once. torchmetrics keeps the counts, syncs them under DDP and names
the per-class values (``ClasswiseWrapper``); the LightningModule only updates and logs them, and
the dashboards, the report and the HPARAMS view read the values computed here.

Logged names: ``<stage>/loss``, ``<stage>/nll``, ``<stage>/acc``, ``<stage>/acc_macro``,
``<stage>/f1_macro``, ``<stage>/{precision,recall,f1,ap}/<class>``, ``<stage>/ap_macro`` (mean
average precision), ``<stage>/ece`` (expected calibration error), ``<stage>/auroc`` (two classes
only); for validation also ``val/acc_best``; and the HPARAMS columns of :data:`HP_METRICS`.

:class:`PerSample` keeps each evaluated image's logits with its dataset index, for what needs
single images: top losses, mistakes, temperature scaling, PR curves and reliability diagrams.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torchmetrics import ClasswiseWrapper, MaxMetric, MeanMetric, MetricCollection
from torchmetrics.classification import (
    BinaryAUROC,
    MulticlassAccuracy,
    MulticlassAveragePrecision,
    MulticlassCalibrationError,
    MulticlassConfusionMatrix,
    MulticlassF1Score,
    MulticlassPrecision,
    MulticlassRecall,
)
from torchmetrics.functional.classification import multiclass_calibration_error

PER_CLASS = ("precision", "recall", "f1")
# TensorBoard's HPARAMS columns -> the logged value each one repeats.
HP_METRICS = {"hp/val_acc_best": "val/acc_best", "hp/val_f1_macro": "val/f1_macro"}
# Equal-width confidence bins of the expected calibration error (Guo et al. 2017 use 15).
ECE_BINS = 15


def expected_calibration_error(logits: torch.Tensor, target: torch.Tensor,
                               n_bins: int = ECE_BINS) -> float:
    """ECE of ``softmax(logits)``: the confidence-weighted gap between confidence and accuracy
    over equal-width bins of the top-1 probability (what ``<stage>/ece`` logs)."""
    probs = logits.detach().float().softmax(-1)
    return float(multiclass_calibration_error(probs, target, probs.shape[-1], n_bins=n_bins,
                                              norm="l1"))


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
        n = len(class_names)
        self.scalars = scalar_metrics(stage, class_names)
        self.loss, self.nll = MeanMetric(), MeanMetric()
        self.confusion = MulticlassConfusionMatrix(n)
        # These take probabilities: given logits they would guess (softmax only when a value
        # falls outside 0..1), so update() hands them softmax(logits) itself.
        self.ece = MulticlassCalibrationError(n, n_bins=ECE_BINS, norm="l1")
        self.ap = ClasswiseWrapper(MulticlassAveragePrecision(n, average=None),
                                   labels=list(class_names), prefix=f"{stage}/ap/")
        self.auroc = BinaryAUROC() if n == 2 else None

    def _metrics(self) -> list:
        return [m for m in (self.scalars, self.loss, self.nll, self.confusion, self.ece, self.ap,
                            self.auroc) if m is not None]

    def update(self, logits: torch.Tensor, target: torch.Tensor, loss: torch.Tensor) -> None:
        self.scalars.update(logits, target)
        self.confusion.update(logits, target)
        self.loss.update(loss, len(target))
        self.nll.update(nn.functional.cross_entropy(logits.float(), target), len(target))
        probs = logits.detach().float().softmax(-1)
        self.ece.update(probs, target)
        self.ap.update(probs, target)
        if self.auroc is not None:
            self.auroc.update(probs[:, 1], target)

    def compute(self) -> dict[str, torch.Tensor]:
        """Every value (synced across DDP ranks), the confusion matrix under ``<stage>/confusion``;
        then the counts restart for the next epoch."""
        values = dict(self.scalars.compute())
        values[f"{self.stage}/loss"] = self.loss.compute()
        values[f"{self.stage}/nll"] = self.nll.compute()
        values[f"{self.stage}/confusion"] = self.confusion.compute()
        values[f"{self.stage}/ece"] = self.ece.compute()
        ap = dict(self.ap.compute())
        values.update(ap)
        values[f"{self.stage}/ap_macro"] = torch.stack(list(ap.values())).nanmean()
        if self.auroc is not None:
            values[f"{self.stage}/auroc"] = self.auroc.compute()
        for metric in self._metrics():
            metric.reset()
        return values


class PerSample:
    """The logits and labels of every image of one evaluation epoch, with its dataset index.

    The index comes from the loader: its sampler's order (deterministic for evaluation) without
    the images the dataset skipped as undecodable, so no dataset needs to return indices.
    Under DDP each rank's share is gathered, so every rank holds all images (sorted by index).
    """

    def __init__(self) -> None:
        self.logits: list[torch.Tensor] = []
        self.targets: list[torch.Tensor] = []

    def update(self, logits: torch.Tensor, target: torch.Tensor) -> None:
        self.logits.append(logits.detach().float().cpu())
        self.targets.append(target.detach().cpu())

    def reset(self) -> None:
        self.logits, self.targets = [], []

    def compute(self, loader: object) -> dict[str, torch.Tensor] | None:
        """``{"index", "logits", "target"}`` of the epoch (all ranks), then restart; None when
        nothing was kept. ``index`` is -1 where the loader's order is unknown."""
        if not self.logits:
            self.reset()
            local = None
        else:
            logits, target = torch.cat(self.logits), torch.cat(self.targets)
            self.reset()
            index = loader_order(loader, len(target))
            if index is None:
                index = torch.full((len(target),), -1, dtype=torch.long)
            local = {"index": index, "logits": logits, "target": target}
        parts = [local]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            parts = [None] * dist.get_world_size()
            dist.all_gather_object(parts, local)  # a collective: every rank calls compute()
        parts = [p for p in parts if p is not None]
        if not parts:
            return None
        merged = {k: torch.cat([p[k] for p in parts]) for k in ("index", "logits", "target")}
        if (merged["index"] >= 0).all():
            order = merged["index"].argsort()
            merged = {k: v[order] for k, v in merged.items()}
        return merged


def loader_order(loader: object, count: int) -> torch.Tensor | None:
    """Dataset indices of the first ``count`` images an evaluation loader yields, or None when
    its order cannot be known (no sampler or dataset, fewer indices than images)."""
    sampler, dataset = getattr(loader, "sampler", None), getattr(loader, "dataset", None)
    if sampler is None or dataset is None or not hasattr(sampler, "__len__"):
        return None  # e.g. a streaming (iterable) data set: its sampler never ends
    order = list(iter(sampler))
    bad = getattr(dataset, "bad_flags", None)  # images skipped as undecodable
    if bad is not None:
        order = [i for i in order if not bad[i]]
    if len(order) < count or not all(isinstance(i, int) for i in order[:count]):
        return None
    return torch.tensor(order[:count], dtype=torch.long)


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
    """Per-class precision, recall, F1, average precision (the logged values) with support and
    averages (AP only where it was logged)."""
    support = values[f"{stage}/confusion"].detach().cpu().sum(1).double()
    kinds = PER_CLASS + (("ap",) if f"{stage}/ap/{class_names[0]}" in values else ())
    cols = {k: torch.stack([values[f"{stage}/{k}/{c}"].detach().cpu().double() for c in class_names])
            for k in kinds}
    rows = {
        name: {**{k: float(cols[k][i]) for k in kinds}, "support": int(support[i])}
        for i, name in enumerate(class_names)
    }
    weights = support / support.sum().clamp(min=1)
    total = int(support.sum())
    averages = {
        "macro avg": {**{k: float(cols[k].nanmean()) for k in kinds}, "support": total},
        "weighted avg": {**{k: float((cols[k].nan_to_num() * weights).sum()) for k in kinds},
                         "support": total},
    }
    return {"classes": rows, "averages": averages, "accuracy": float(values[f"{stage}/acc"])}
