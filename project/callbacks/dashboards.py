"""TensorBoard: the run's logger, its learning-rate curve, the confusion matrix. Time Series
groups cards by the tag's first part and opens the first two, so the curves are ``train/``
(acc, loss, lr) and ``val/`` (acc, acc_best, loss, then ``macro_*``, ``per_class/``)."""

import lightning as L
import matplotlib
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only
from torchmetrics.classification import MulticlassConfusionMatrix

matplotlib.use("Agg")  # no display needed
from matplotlib import pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from project.errors import require  # noqa: E402


def tensorboard(trainer: L.Trainer):
    """The run's TensorBoard ``SummaryWriter``, or None without a TensorBoardLogger."""
    return next((lg.experiment for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)), None)


class TensorBoard(TensorBoardLogger):
    """Lightning's TensorBoard logger without its ``epoch`` chart, which would take one of the two
    groups TensorBoard opens, leaving ``val/`` closed."""

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        super().log_metrics({k: v for k, v in metrics.items() if k != "epoch"}, step)


class LearningRate(Callback):
    """``train/lr``: the backbone's (top block's) learning rate; the head's is ``head_lr_mult`` x
    it. Every group's curve: the diagnose preset's LearningRateMonitor."""

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch,
                             batch_idx: int) -> None:
        groups = [g for opt in trainer.optimizers for g in opt.param_groups]
        backbone = [g["lr"] for g in groups if str(g.get("name", "")).startswith("backbone")]
        pl_module.log("train/lr", max(backbone or [g["lr"] for g in groups]), on_step=True, on_epoch=False)


class Dashboards(Callback):
    """After each validation epoch and at test, the task's views: for one class per image the
    confusion matrix (Images tab) and the most confused class pairs (Text tab)."""

    def __init__(self, top_pairs: int = 5) -> None:
        require(top_pairs >= 0, "the Dashboards callback's top_pairs",
                "must be 0 or more (trainer.callbacks)", top_pairs)
        self.top_pairs = top_pairs

    def log_confusion(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        writer, result = tensorboard(trainer), pl_module.results.get(stage)
        if writer is None or result is None or trainer.sanity_checking:
            return
        pl_module.task.log_views(writer, result, stage, trainer.global_step, trainer.current_epoch,
                                 self.top_pairs)  # the task's own pictures (project/tasks/)

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
    """torchmetrics' plot of the counts (in the cells up to 30 classes), sized to the classes."""
    n = len(class_names)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.6 * n + 2),) * 2)
    MulticlassConfusionMatrix(n).plot(confusion.detach().cpu(), ax=ax, add_text=n <= 30,
                                      labels=list(class_names), cmap="Blues")
    ax.set_title(title)
    fig.tight_layout()
    return fig
