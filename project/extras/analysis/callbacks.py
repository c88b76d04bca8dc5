"""The analysis preset's callbacks (``configs/presets/analysis.yaml``): temperature scaling
after fit; sample grids, and the validation set's top losses, reliability diagram and PR curves
in TensorBoard."""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_only

from project.callbacks.dashboards import tensorboard
from project.callbacks.summary import monitored_checkpoint
from project.extras.analysis.calibration import calibrate_checkpoint, format_numbers
from project.extras.analysis.plots import denormalise, grid_figure, reliability_figure
from project.extras.analysis.predictions import calibrated_probabilities, predict_dataset
from project.extras.analysis.rows import sample_rows, top_losses_figure

log = logging.getLogger("project")


class TemperatureScaling(Callback):
    """After fit, fit the temperature of the best checkpoint on the validation set and store it
    there (``python -m project calibrate`` does the same for any checkpoint); the numbers go to
    the log and TensorBoard's Text tab (``calibration``)."""

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero or trainer.interrupted:
            return
        if not pl_module.task.temperature_scaling:
            log.info("Notice: no temperature fitted: a %s task's outputs have none", pl_module.task.name)
            return
        callback = monitored_checkpoint(trainer)
        best = callback.best_model_path if callback is not None else ""
        dataset = getattr(trainer.datamodule, "datasets", {}).get("val")
        if not best or not Path(best).is_file() or dataset is None:
            # e.g. a run resumed in another folder: the restored best path is the old run's
            log.info("Notice: no temperature fitted (needs the best checkpoint%s and a validation set); "
                     "run `python -m project calibrate --ckpt_path PATH` later",
                     f", {best} is not there" if best else "")
            return
        numbers = calibrate_checkpoint(best, dataset=dataset, batch_size=trainer.datamodule.batch_size,
                                       device=pl_module.device)
        log.info("%s; stored in %s", format_numbers(numbers), best)
        writer = tensorboard(trainer)
        if writer is not None:
            writer.add_text("calibration", format_numbers(numbers), trainer.global_step)


class AnalysisDashboards(Callback):
    """At the start of fit, grids of ``num_samples`` augmented training images (what the model
    really sees) and validation images (``views/``). At the end, from one pass over the
    validation set with the final weights: the ``top_losses`` highest-loss images, the
    reliability diagram and a PR curve per class."""

    def __init__(self, top_losses: int = 24, num_samples: int = 32) -> None:
        self.top_losses, self.num_samples = top_losses, num_samples
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
                labels = [pl_module.class_names[y] if isinstance(y, int) else "" for _, y in items]
                writer.add_figure(f"views/{split}_samples", grid_figure(images, labels, title), 0)


    @rank_zero_only
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        writer = tensorboard(trainer)
        dataset = getattr(trainer.datamodule, "datasets", {}).get("val")
        if writer is None or dataset is None or not hasattr(dataset, "samples") or \
                not pl_module.task.gives_probabilities:  # these views rank one class per image
            return
        samples = predict_dataset(pl_module, dataset, trainer.datamodule.batch_size, pl_module.device)
        pl_module.train()  # predict_dataset leaves it in eval mode; Lightning expects train here
        t, step, pre = float(pl_module.temperature), trainer.global_step, pl_module.preprocessing
        rows = sample_rows(samples, pl_module.class_names, t, dataset)
        fig = top_losses_figure(rows, dataset, pre.mean, pre.std, "val top losses", self.top_losses)
        if fig is not None:
            writer.add_figure("val/top_losses", fig, step)
        writer.add_figure("val/reliability", reliability_figure(
            samples["logits"], samples["target"], t, title="val reliability diagram"), step)
        probs = calibrated_probabilities(samples["logits"], t)
        for c, name in enumerate(pl_module.class_names):
            writer.add_pr_curve(f"val/pr_curve/{name}", samples["target"] == c, probs[:, c], step)
