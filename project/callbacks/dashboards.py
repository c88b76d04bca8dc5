"""TensorBoard: the run's logger, its learning-rate curve, sample images, the confusion matrix.

What a user sees first is laid out here. TensorBoard's Time Series sorts cards by tag, groups
them by the tag's first part and opens only the first two groups, so every chart of the default
run is in ``train/`` or ``val/``, and within ``val/`` the overview (``acc``, ``acc_best``,
``confusion_matrix``, ``loss``) sorts before ``macro_*`` and ``per_class/``. The heavier views
(PR curves, top losses, reliability) are the analysis preset's and ``evaluate``'s.
"""

from __future__ import annotations

import math

import lightning as L
import matplotlib
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only

from project.data.transforms import denormalise

matplotlib.use("Agg")  # no display needed
from matplotlib import pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402


def tensorboard(trainer: L.Trainer):
    """The run's TensorBoard ``SummaryWriter``, or None without a TensorBoardLogger."""
    return next((lg.experiment for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)), None)


class TensorBoard(TensorBoardLogger):
    """Lightning's TensorBoard logger without the ``epoch`` series Lightning adds to every write:
    as a chart it only maps steps to epochs, and it would take one of the two groups TensorBoard
    opens, leaving ``val/`` closed."""

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        super().log_metrics({k: v for k, v in metrics.items() if k != "epoch"}, step)


class LearningRate(Callback):
    """``train/lr``: the backbone's learning rate at every logged step (its top block's, with
    layer decay); the head's is ``head_lr_mult`` times it. Every group's own curve: the
    diagnose preset's LearningRateMonitor."""

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch,
                             batch_idx: int) -> None:
        groups = [g for opt in trainer.optimizers for g in opt.param_groups]
        backbone = [g["lr"] for g in groups if str(g.get("name", "")).startswith("backbone")]
        pl_module.log("train/lr", max(backbone or [g["lr"] for g in groups]), on_step=True, on_epoch=False)


class Dashboards(Callback):
    """At the start of fit: grids of augmented training images (what the model really sees) and
    of validation images. After each validation epoch and at test: the confusion matrix (Images
    tab) and the most confused class pairs (Text tab)."""

    def __init__(self, num_samples: int = 32, top_pairs: int = 5) -> None:
        self.num_samples, self.top_pairs = num_samples, top_pairs

    @rank_zero_only
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        writer, dm = tensorboard(trainer), trainer.datamodule
        if writer is None or dm is None or trainer.global_step > 0:
            return
        pre = pl_module.preprocessing
        for split, title in (("train", "training images, augmented"), ("val", "validation images")):
            dataset = getattr(dm, "datasets", {}).get(split)
            if dataset is None or not hasattr(dataset, "__len__"):
                continue
            items = []
            for i in range(min(self.num_samples, len(dataset))):
                index = (i * len(dataset)) // self.num_samples  # spread over the classes
                item = dataset[(index, i)] if split == "train" else dataset[index]
                if item is not None:
                    items.append(item)
            if items:
                images = denormalise(torch.stack([x for x, _ in items]), pre.mean, pre.std)
                labels = [pl_module.class_names[y] for _, y in items]
                writer.add_figure(f"{split}/samples", grid_figure(images, labels, title), 0)

    def log_confusion(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        writer, result = tensorboard(trainer), pl_module.results.get(stage)
        if writer is None or result is None or trainer.sanity_checking:
            return
        cm, names, step = result[f"{stage}/confusion"], pl_module.class_names, trainer.global_step
        title = f"{stage} confusion matrix (epoch {trainer.current_epoch})"
        writer.add_figure(f"{stage}/confusion_matrix", confusion_figure(cm, names, title), step)
        pairs = confused_pairs(cm, names, self.top_pairs)
        writer.add_text(f"{stage}/confused_pairs", pairs_markdown(pairs), step)

    @rank_zero_only
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.log_confusion(trainer, pl_module, "val")

    @rank_zero_only
    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.log_confusion(trainer, pl_module, "test")


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
    ax.set(xlabel="predicted", ylabel="true", title=title)
    if n <= 30:
        for i in range(n):
            for j in range(n):
                colour = "white" if share[i, j] > 0.5 else "black"
                ax.text(j, i, int(cm[i, j]), ha="center", va="center", color=colour, fontsize=8)
    fig.tight_layout()
    return fig


def grid_figure(images: torch.Tensor, titles: list[str], title: str, wrong: list[bool] | None = None,
                cols: int = 8) -> Figure:
    """Images in 0..1 (N, 3, H, W) in a grid, each with a (multi-line) title; the titles of
    ``wrong`` images in red."""
    cols = max(1, min(cols, len(images)))
    rows = max(1, math.ceil(len(images) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(2.0 * cols, 2.3 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    flags = wrong or [False] * len(images)
    for ax, image, label, bad in zip(axes.flat, images, titles, flags, strict=False):
        ax.imshow(image.permute(1, 2, 0).cpu().numpy())
        ax.set_title(label, fontsize=7, color="tab:red" if bad else "black")
    fig.suptitle(title)
    fig.tight_layout()
    return fig
