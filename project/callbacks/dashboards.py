"""TensorBoard views beyond scalars: sample grids, confusion matrices, most confused pairs,
precision-recall curves, top losses and reliability diagrams."""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only

from project.callbacks.mistakes import sample_rows, top_losses_figure
from project.callbacks.plots import confusion_figure, image_grid_figure, reliability_figure
from project.model.metrics import confused_pairs


def confused_pairs_markdown(confusion: torch.Tensor, class_names: list[str], top: int = 5) -> str:
    pairs = confused_pairs(confusion, class_names, top)
    if not pairs:
        return "No confusions: every image was classified correctly."
    lines = ["| true | predicted as | count | share of true |", "|---|---|---|---|"]
    lines += [f"| {p['true']} | {p['predicted']} | {p['count']} | {p['share_of_true']:.1%} |"
              for p in pairs]
    return "\n".join(lines)


class Dashboards(Callback):
    """Adds images and text to the TensorBoard run.

    At the start of fit: a grid of augmented training images (what the model really sees,
    de-normalised) and one of validation images. After each validation epoch and at test: the
    confusion matrix, the most confused class pairs and a precision-recall curve per class
    (PR curves tab, ``<stage>/pr_curve/<class>``). At the end of fit and of test: the
    ``top_losses`` highest-loss images (``<stage>/top_losses``) and the reliability diagram
    (``<stage>/reliability``) of the last epoch's model.
    """

    def __init__(self, num_samples: int = 32, top_pairs: int = 5, top_losses: int = 24) -> None:
        self.num_samples = num_samples
        self.top_pairs = top_pairs
        self.top_losses = top_losses

    @staticmethod
    def _writer(trainer: L.Trainer):
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                return logger.experiment
        return None

    @rank_zero_only
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        writer = self._writer(trainer)
        dm = trainer.datamodule
        if writer is None or dm is None or trainer.global_step > 0:
            return
        names = pl_module.class_names
        for split, title in (("train", "training images, augmented"), ("val", "validation images")):
            dataset = dm.datasets.get(split)
            if dataset is None:
                continue
            items = []
            for i in range(min(self.num_samples, len(dataset))):
                index = (i * len(dataset)) // self.num_samples  # spread over the classes
                item = dataset[(index, i)] if split == "train" else dataset[index]
                if item is not None:
                    items.append(item)
            if items:
                images = torch.stack([x for x, _ in items])
                labels = [names[y] for _, y in items]
                writer.add_figure(f"samples/{split}", image_grid_figure(images, labels, title), 0)

    def _log_confusion(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        writer = self._writer(trainer)
        result = getattr(pl_module, "results", {}).get(stage)
        if writer is None or result is None or trainer.sanity_checking:
            return
        cm, names, step = result[f"{stage}/confusion"], pl_module.class_names, trainer.global_step
        title = f"{stage} confusion matrix (epoch {trainer.current_epoch})"
        writer.add_figure(f"{stage}/confusion_matrix", confusion_figure(cm, names, title), step)
        writer.add_text(f"{stage}/confused_pairs",
                        confused_pairs_markdown(cm, names, self.top_pairs), step)
        samples = getattr(pl_module, "samples", {}).get(stage)
        if samples is not None and len(samples["target"]):
            probs = (samples["logits"] / float(pl_module.temperature)).softmax(-1)
            for c, name in enumerate(names):
                writer.add_pr_curve(f"{stage}/pr_curve/{name}", samples["target"] == c,
                                    probs[:, c], step)

    def _log_images(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """The highest-loss images and the reliability diagram of the last ``stage`` epoch."""
        writer = self._writer(trainer)
        samples = getattr(pl_module, "samples", {}).get(stage)
        if writer is None or samples is None or not len(samples["target"]):
            return
        loader = trainer.val_dataloaders if stage == "val" else trainer.test_dataloaders
        dataset = getattr(loader, "dataset", None)
        t, hp, step = float(pl_module.temperature), pl_module.hparams, trainer.global_step
        rows = sample_rows(samples, pl_module.class_names, t, dataset)
        fig = top_losses_figure(rows, dataset, hp.mean, hp.std, f"{stage} top losses",
                                self.top_losses)
        if fig is not None:
            writer.add_figure(f"{stage}/top_losses", fig, step)
        writer.add_figure(f"{stage}/reliability", reliability_figure(
            samples["logits"], samples["target"], t, title=f"{stage} reliability diagram"), step)

    @rank_zero_only
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log_confusion(trainer, pl_module, "val")

    @rank_zero_only
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log_images(trainer, pl_module, "val")

    @rank_zero_only
    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log_confusion(trainer, pl_module, "test")
        self._log_images(trainer, pl_module, "test")
