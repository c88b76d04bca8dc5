"""Figures of the analysis: image grids, reliability diagrams, precision-recall and ROC curves
(the confusion matrix is the core dashboards')."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")  # no display needed; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from project.common.files import atomic_path  # noqa: E402
from project.common.preprocessing import IMAGENET_MEAN, IMAGENET_STD  # noqa: E402
from project.extras.analysis.predictions import calibrated_probabilities  # noqa: E402


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


def grid_figure(images: torch.Tensor, titles: list[str], title: str, wrong: list[bool] | None = None,
                cols: int = 8) -> Figure:
    """Images in 0..1 (N, 3, H, W) on one canvas, each under its (one- or two-line) title, the
    titles of ``wrong`` images in red. One image, not an axes each: a 32-image grid in a
    fraction of the time."""
    n, (h, w), gap = len(images), images.shape[-2:], max(2, images.shape[-1] // 16)
    cols = max(1, min(cols, n))
    band, rows = max(h // 3, 8), math.ceil(n / cols)  # room for the titles above each row
    canvas = torch.ones(3, rows * (band + h + gap), cols * (w + gap))
    for i, image in enumerate(images):
        top, left = (i // cols) * (band + h + gap) + band, (i % cols) * (w + gap)
        canvas[:, top:top + h, left:left + w] = image.float().cpu()
    fig, ax = plt.subplots(figsize=(1.6 * cols, 1.9 * rows + 0.4))
    ax.imshow(canvas.permute(1, 2, 0).numpy(), interpolation="nearest")
    ax.axis("off")
    for i, label in enumerate(titles):
        x, y = (i % cols) * (w + gap) + w / 2, (i // cols) * (band + h + gap) + band - 1
        colour = "tab:red" if wrong and wrong[i] else "black"
        ax.text(x, y, label, ha="center", va="bottom", fontsize=7, color=colour)
    ax.set_title(title)
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.01, top=0.93)
    return fig


def denormalise(batch: torch.Tensor, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> torch.Tensor:
    """Undo the normalisation for display: float images in 0..1."""
    m = torch.tensor(mean, device=batch.device).view(-1, 1, 1)
    s = torch.tensor(std, device=batch.device).view(-1, 1, 1)
    return (batch.float() * s + m).clamp(0, 1)
