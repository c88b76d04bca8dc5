"""The interface every task implements. ``ImageClassifier`` holds one and asks it for the loss,
the metrics and the monitored metric; the commands ask it for outputs, reports and views. A new
task is a subclass in a module of its own plus one line in ``project/tasks/__init__.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn
from torchmetrics import MaxMetric, Metric, MinMetric

from project.errors import ConfigError

Loss = Callable[..., torch.Tensor]  # (logits, target, weight=None) -> a scalar


class Task:
    """A task of ``num_outputs`` outputs named ``names`` (the classes, labels or values)."""

    name: ClassVar[str]
    monitor: ClassVar[str] = "val/acc"  # what the best checkpoint and a sweep follow
    mode: ClassVar[str] = "max"
    losses: ClassVar[dict[str, Callable[..., Loss]]] = {}  # model.loss -> factory(task, smoothing)
    default_loss: ClassVar[str]
    train_metric_name: ClassVar[str] = "train/acc"
    # one class per image: MixUp/CutMix, balanced sampling, suspects and a fitted temperature apply
    one_class_per_image: ClassVar[bool] = True

    def __init__(self, names: list[str], loss: str | None = None, label_smoothing: float = 0.0,
                 label_stats: dict | None = None) -> None:
        self.names, self.label_stats = list(names), dict(label_stats or {})
        self.loss_name = loss or self.default_loss
        if self.loss_name not in self.losses:
            raise ConfigError(f"model.loss '{self.loss_name}' is not a loss of the {self.name} task; "
                              f"choose from {', '.join(self.losses)} (or null: {self.default_loss})")
        self.criterion = self.losses[self.loss_name](self, label_smoothing)

    @classmethod
    def summarise_labels(cls, targets: list, num_outputs: int) -> dict:
        """What the model needs to know of the training split's labels (the data module computes
        it, the CLI links it into ``model.label_stats``): here, ``class_weights: balanced``."""
        from project.data.samplers import inverse_frequency

        return {"balanced_weights": inverse_frequency(targets, num_outputs).tolist()} if targets else {}

    def check(self, hparams: dict) -> None:
        """One-line errors for settings this task cannot honour."""
        if not self.one_class_per_image and (hparams.get("mixup_alpha") or hparams.get("cutmix_alpha")):
            raise ConfigError(f"model.mixup_alpha/cutmix_alpha must be 0 for a {self.name} task "
                              "(torchvision's MixUp and CutMix mix one class per image), got "
                              f"{(hparams.get('mixup_alpha'), hparams.get('cutmix_alpha'))}")

    # -- training ------------------------------------------------------------------------
    # whether data.unlabeled's objective (project/model/unlabeled.py) can train it; if so, the
    # two methods below turn a prediction into a pseudo-label and score a prediction against it
    learns_from_unlabeled: ClassVar[bool] = False

    def pseudo_labels(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(targets, confidence in [0, 1]) for unlabeled images from the network's outputs."""
        raise NotImplementedError

    def per_image_loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """One loss per image (unweighted, unsmoothed), against pseudo-labels."""
        raise NotImplementedError

    def loss(self, logits: torch.Tensor, target: torch.Tensor,
             weight: torch.Tensor | None = None) -> torch.Tensor:
        return self.criterion(logits, target, weight=weight)

    def train_metric(self) -> Metric:
        """Logged as ``train_metric_name`` each epoch."""
        raise NotImplementedError

    def stage_metrics(self, stage: str) -> nn.Module:
        """An ``nn.Module`` with ``update(logits, target, loss)`` and ``compute() -> {name: value}``
        (synced across ranks, then reset); its keys start with ``stage/``."""
        raise NotImplementedError

    def best_metric(self) -> Metric:
        return MaxMetric() if self.mode == "max" else MinMetric()

    @property
    def summary_metrics(self) -> list[str]:
        """What the run summary prints and TensorBoard's HPARAMS table compares across runs."""
        return [f"{self.monitor}_best", self.monitor, "val/loss"]

    def describe(self) -> str:
        """The one line a run starts with."""
        return f"Task: {self.name} ({len(self.names)} outputs), {self.loss_name} loss, best by {self.monitor}"

    # -- outputs ---------------------------------------------------------------------------
    def outputs(self, logits: torch.Tensor, temperature: torch.Tensor | float = 1.0) -> torch.Tensor:
        """What the network's raw outputs mean: probabilities, or values in the targets' units."""
        raise NotImplementedError

    def state(self) -> dict:
        """What the answers need besides names and temperature (thresholds, target scaling):
        JSON-able, kept in the checkpoint and the ONNX metadata."""
        return {}

    def load_state(self, state: dict) -> None:
        pass

    def export_score(self) -> tuple[str, Callable[[torch.Tensor, torch.Tensor], float]]:
        """(name, score(outputs of the network, targets)) that export compares formats by."""
        raise NotImplementedError

    # -- views and reports -------------------------------------------------------------------
    def log_views(self, writer, result: dict[str, torch.Tensor], stage: str, step: int, epoch: int,
                  top: int = 5) -> None:
        """Its TensorBoard pictures and tables after a validation or test epoch (``top``: rows of
        its worst-first tables)."""

    def write_report(self, model, result: dict[str, torch.Tensor], checkpoint: str, out_dir: Path,
                     samples: dict[str, torch.Tensor], dataset, top: int, target_acc: float) -> None:
        """evaluate's report.md/json and pictures for the test split."""
        raise NotImplementedError
