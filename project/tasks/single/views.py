"""TensorBoard and report views of one class per image: the confusion matrix and the most
confused class pairs."""

import matplotlib
import torch
from torchmetrics.classification import MulticlassConfusionMatrix

matplotlib.use("Agg")  # no display needed
from matplotlib import pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402


def log_confusion(writer, confusion: torch.Tensor, names: list[str], stage: str, step: int, epoch: int,
                  top: int) -> None:
    figure = confusion_figure(confusion, names, f"{stage} confusion matrix (epoch {epoch})")
    writer.add_figure(f"{stage}/per_class/confusion_matrix", figure, step)
    writer.add_text(f"{stage}/confused_pairs", pairs_markdown(confused_pairs(confusion, names, top)), step)


def confused_pairs(confusion: torch.Tensor, class_names: list[str], top: int = 5) -> list[dict]:
    """The largest off-diagonal counts: which true class is most often taken for which."""
    cm = confusion.detach().cpu().clone()
    support = cm.sum(1)
    cm.fill_diagonal_(0)
    pairs = []
    for flat in torch.argsort(cm.flatten(), descending=True)[:top].tolist():
        i, j = divmod(flat, cm.shape[1])
        if int(cm[i, j]) == 0:
            break
        pairs.append({"true": class_names[i], "predicted": class_names[j], "count": int(cm[i, j]),
                      "share_of_true": int(cm[i, j]) / max(int(support[i]), 1)})
    return pairs


def pairs_markdown(pairs: list[dict]) -> str:
    lines = ["| true | predicted as | count | share of true |", "|---|---|---|---|"]
    lines += [f"| {p['true']} | {p['predicted']} | {p['count']} | {p['share_of_true']:.1%} |" for p in pairs]
    return "\n".join(lines) if pairs else "No confusions: every image was classified correctly."


def confusion_figure(confusion: torch.Tensor, class_names: list[str], title: str) -> Figure:
    """torchmetrics' plot of the counts (in the cells up to 30 classes), sized to the classes."""
    n = len(class_names)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.6 * n + 2),) * 2)
    MulticlassConfusionMatrix(n).plot(confusion.detach().cpu(), ax=ax, add_text=n <= 30,
                                      labels=list(class_names), cmap="Blues")
    ax.set_title(title)
    fig.tight_layout()
    return fig
