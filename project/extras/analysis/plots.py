"""Figures of the analysis: reliability diagrams, precision-recall and ROC curves (the confusion
matrix and image grids are the core dashboards')."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # no display needed; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from project.common.files import atomic_path  # noqa: E402
from project.model.classifier import calibrated_probabilities  # noqa: E402


def save(fig: Figure, path) -> None:
    """Write the figure as a PNG, atomically, and free it."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)


def _bins(probs: torch.Tensor, target: torch.Tensor, n_bins: int):
    """(bin centres, accuracy, mean confidence, count) over equal-width confidence bins."""
    conf, pred = probs.max(-1)
    correct = (pred == target).double()
    which = (conf.double() * n_bins).long().clamp(max=n_bins - 1)
    count = torch.bincount(which, minlength=n_bins).double()
    acc = torch.bincount(which, correct, minlength=n_bins) / count.clamp(min=1)
    mean_conf = torch.bincount(which, conf.double(), minlength=n_bins) / count.clamp(min=1)
    centres = (torch.arange(n_bins, dtype=torch.float64) + 0.5) / n_bins
    return centres, acc, mean_conf, count


def reliability_figure(logits: torch.Tensor, target: torch.Tensor, temperature: float = 1.0,
                       n_bins: int = 15, title: str = "reliability diagram") -> Figure:
    """Accuracy per confidence bin against the diagonal (perfect calibration), with the ECE;
    for a temperature other than 1 also after scaling, side by side."""
    from project.extras.analysis.calibration import expected_calibration_error

    panels = [("softmax(logits)", 1.0)]
    if abs(temperature - 1.0) > 1e-6:
        panels.append((f"softmax(logits / {temperature:.3g})", temperature))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.2), squeeze=False)
    width = 1.0 / n_bins
    for ax, (name, t) in zip(axes.flat, panels, strict=True):
        centres, acc, conf, count = _bins(calibrated_probabilities(logits, t), target, n_bins)
        used = count > 0
        ax.bar(centres[used], acc[used], width=width, edgecolor="black", color="tab:blue",
               label="accuracy")
        ax.bar(centres[used], (conf - acc)[used], bottom=acc[used], width=width, color="tab:red",
               alpha=0.3, label="gap to confidence")
        ax.plot([0, 1], [0, 1], "k--", linewidth=1, label="perfect calibration")
        ece = expected_calibration_error(logits, target, t, n_bins)
        ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence (top-1 probability)",
               ylabel="accuracy", title=f"{name}\nECE {ece:.4f}")
        ax.legend(loc="upper left", fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def curves_figure(probs: torch.Tensor, target: torch.Tensor, class_names: list[str],
                  title: str = "precision-recall per class") -> tuple[Figure, dict]:
    """Per-class precision-recall curves with average precision in the legend; for two classes
    also the ROC curve and AUROC. Returns the figure and ``{"ap": {...}, "auroc": ...}``."""
    from torchmetrics.functional.classification import (
        binary_auroc,
        binary_roc,
        multiclass_average_precision,
        multiclass_precision_recall_curve,
    )

    n = len(class_names)
    probs, target = probs.float(), target.long()
    precision, recall, _ = multiclass_precision_recall_curve(probs, target, n)
    ap = multiclass_average_precision(probs, target, n, average=None)
    numbers: dict = {"ap": {c: float(ap[i]) for i, c in enumerate(class_names)}}
    panels = 2 if n == 2 else 1
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4.5), squeeze=False)
    ax = axes[0, 0]
    for i, name in enumerate(class_names):
        ax.plot(recall[i].numpy(), precision[i].numpy(), label=f"{name} (AP {float(ap[i]):.3f})")
    ax.set(xlim=(0, 1), ylim=(0, 1.02), xlabel="recall", ylabel="precision", title=title)
    ax.legend(fontsize=7, loc="lower left")
    if n == 2:
        fpr, tpr, _ = binary_roc(probs[:, 1], target)
        auroc = float(binary_auroc(probs[:, 1], target))
        numbers["auroc"] = auroc
        ax = axes[0, 1]
        ax.plot(fpr.numpy(), tpr.numpy(), label=f"{class_names[1]} vs {class_names[0]} "
                                                f"(AUROC {auroc:.3f})")
        ax.plot([0, 1], [0, 1], "k--", linewidth=1)
        ax.set(xlim=(0, 1), ylim=(0, 1.02), xlabel="false positive rate",
               ylabel="true positive rate", title="ROC")
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig, numbers
