"""Figures for TensorBoard and reports: confusion matrix, image grids, reliability, PR and ROC."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")  # no display needed; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from project.common.files import atomic_path  # noqa: E402
from project.data.transforms import denormalise  # noqa: E402


def confusion_figure(confusion: torch.Tensor, class_names: list[str], title: str) -> Figure:
    """Counts in the cells; colour by row share, so a poorly recalled class stands out."""
    cm = confusion.detach().cpu().double()
    share = cm / cm.sum(1, keepdim=True).clamp(min=1)
    n = len(class_names)
    side = max(4.0, 0.6 * n + 2)
    fig, ax = plt.subplots(figsize=(side, side * 0.9))
    im = ax.imshow(share.numpy(), cmap="Blues", vmin=0, vmax=1)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="share of the true class")
    ax.set_xticks(range(n), class_names, rotation=45, ha="right")
    ax.set_yticks(range(n), class_names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title)
    if n <= 30:
        for i in range(n):
            for j in range(n):
                colour = "white" if share[i, j] > 0.5 else "black"
                ax.text(j, i, int(cm[i, j]), ha="center", va="center", color=colour, fontsize=8)
    fig.tight_layout()
    return fig


def image_grid_figure(images: torch.Tensor, labels: list[str], title: str) -> Figure:
    """Normalised images (N, 3, H, W), as the transforms give them, in a grid with labels."""
    shown = denormalise(images)
    cols = min(8, len(shown))
    rows = math.ceil(len(shown) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(1.6 * cols, 1.8 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, image, label in zip(axes.flat, shown, labels, strict=False):
        ax.imshow(image.permute(1, 2, 0).cpu().numpy())
        ax.set_title(label, fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def save(fig: Figure, path) -> None:
    """Write the figure as a PNG, atomically, and free it."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)


def titled_grid_figure(images: torch.Tensor, titles: list[str], title: str, mean, std,
                       wrong: list[bool] | None = None, cols: int = 6) -> Figure:
    """Normalised images (N, 3, H, W) with a (multi-line) title each, de-normalised with the
    run's ``mean``/``std``; titles of ``wrong`` images in red."""
    shown = denormalise(images, mean, std)
    cols = max(1, min(cols, len(shown)))
    rows = max(1, math.ceil(len(shown) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(2.2 * cols, 2.8 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    flags = wrong or [False] * len(shown)
    for ax, image, label, bad in zip(axes.flat, shown, titles, flags, strict=False):
        ax.imshow(image.permute(1, 2, 0).cpu().numpy())
        ax.set_title(label, fontsize=7, color="tab:red" if bad else "black")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


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
    from project.model.metrics import expected_calibration_error

    panels = [("softmax(logits)", 1.0)]
    if abs(temperature - 1.0) > 1e-6:
        panels.append((f"softmax(logits / {temperature:.3g})", temperature))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.2), squeeze=False)
    width = 1.0 / n_bins
    for ax, (name, t) in zip(axes.flat, panels, strict=True):
        scaled = logits.float() / t
        centres, acc, conf, count = _bins(scaled.softmax(-1), target, n_bins)
        used = count > 0
        ax.bar(centres[used], acc[used], width=width, edgecolor="black", color="tab:blue",
               label="accuracy")
        ax.bar(centres[used], (conf - acc)[used], bottom=acc[used], width=width, color="tab:red",
               alpha=0.3, label="gap to confidence")
        ax.plot([0, 1], [0, 1], "k--", linewidth=1, label="perfect calibration")
        ece = expected_calibration_error(scaled, target, n_bins)
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
