"""TensorBoard: the run's logger, its learning-rate curve, and the task's views; its first screen
opens two groups of curves: ``train/`` and ``val/``."""

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only

from project.errors import require


def tensorboard(trainer: L.Trainer):
    """The run's TensorBoard ``SummaryWriter``, or None without a TensorBoardLogger."""
    return next((lg.experiment for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)), None)


class TensorBoard(TensorBoardLogger):
    """Lightning's TensorBoard logger without its ``epoch`` chart, which would keep ``val/`` closed."""

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        super().log_metrics({k: v for k, v in metrics.items() if k != "epoch"}, step)


class LearningRate(Callback):
    """``train/lr``: the backbone's (top block's) learning rate (every group's: the diagnose preset)."""

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch,
                             batch_idx: int) -> None:
        groups = [g for opt in trainer.optimizers for g in opt.param_groups]
        backbone = [g["lr"] for g in groups if str(g.get("name", "")).startswith("backbone")]
        pl_module.log("train/lr", max(backbone or [g["lr"] for g in groups]), on_step=True, on_epoch=False)


class Dashboards(Callback):
    """The task's views after each validation epoch and at test (``Task.log_views``)."""

    def __init__(self, top_pairs: int = 5) -> None:
        require(top_pairs >= 0, "the Dashboards callback's top_pairs",
                "must be 0 or more (trainer.callbacks)", top_pairs)
        self.top_pairs = top_pairs

    def log_confusion(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        writer, result = tensorboard(trainer), pl_module.results.get(stage)
        if writer is None or result is None or trainer.sanity_checking:
            return
        pl_module.task.log_views(writer, result, stage, trainer.global_step, trainer.current_epoch,
                                 self.top_pairs)

    @rank_zero_only
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.log_confusion(trainer, pl_module, "val")

    @rank_zero_only
    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.log_confusion(trainer, pl_module, "test")
