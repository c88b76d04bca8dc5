"""Figures for TensorBoard and reports: confusion matrix, labelled image grids, LR finder."""

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
