"""TensorBoard for a multi-label run: the error co-occurrence matrix in place of the confusion
matrix (Images tab), and the labels worst first by AP with their thresholds (Text tab)."""

from __future__ import annotations

import torch
from matplotlib import pyplot as plt
from matplotlib.figure import Figure


def cooccurrence_figure(counts: torch.Tensor, names: list[str], title: str) -> Figure:
    n = len(names)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.6 * n + 2),) * 2)
    ax.imshow(counts.cpu().numpy(), cmap="Reds")
    ax.set_xticks(range(n), names, rotation=90)
    ax.set_yticks(range(n), names)
    ax.set_xlabel("wrongly predicted label")
    ax.set_ylabel("missed label")
    if n <= 30:
        for (i, j), v in zip(torch.cartesian_prod(torch.arange(n), torch.arange(n)).tolist(),
                             counts.flatten().tolist(), strict=True):
            if v:
                ax.text(j, i, str(v), ha="center", va="center", fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    return fig


def labels_markdown(result: dict[str, torch.Tensor], stage: str, names: list[str],
                    thresholds: torch.Tensor) -> str:
    """Per label: AP and threshold, worst AP first (labels absent from the split last)."""
    rows = []
    for name, t in zip(names, thresholds.tolist(), strict=True):
        ap = result.get(f"{stage}/per_class/ap/{name}")
        rows.append((float("inf") if ap is None else float(ap), name, t))
    lines = ["| label | AP | threshold |", "|---|---|---|"]
    lines += [f"| {name} | {'-' if ap == float('inf') else f'{ap:.4f}'} | {t:.2f} |"
              for ap, name, t in sorted(rows)]
    return "\n".join(lines)


def log_multilabel(writer, result: dict[str, torch.Tensor], names: list[str], thresholds: torch.Tensor,
                   stage: str, step: int, epoch: int) -> None:
    title = f"{stage}: missed label vs wrongly predicted label (epoch {epoch})"
    writer.add_figure(f"{stage}/per_class/error_cooccurrence",
                      cooccurrence_figure(result[f"{stage}/confusion"], names, title), step)
    writer.add_text(f"{stage}/labels_by_ap", labels_markdown(result, stage, names, thresholds), step)
