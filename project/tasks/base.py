"""The interface every task implements: the model, the data module and the commands ask it,
never the task's name (a new task: docs/your-own-task.md)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn
from torchmetrics import MaxMetric, Metric, MinMetric

from project.errors import ConfigError
from project.tasks import load

Loss = Callable[..., torch.Tensor]  # (task, logits, target, weight=None) -> a scalar


class Task:
    """A task of outputs named ``names``; ``settings`` (the model's hyperparameters) are read when
    used, so a callback that changes one mid-run is followed."""

    name: ClassVar[str]
    # package.module:Class of its torch-free parts, loaded when used: Labels (tables), Answers
    labels: ClassVar[str] = ""
    answers: ClassVar[str]
    monitor: ClassVar[str] = "val/acc"  # what the best checkpoint and a sweep follow
    mode: ClassVar[str] = "max"
    # model.loss -> loss(task, logits, target, weight), or its package.module:function (loaded when chosen)
    losses: ClassVar[dict[str, Loss | str]] = {}
    default_loss: ClassVar[str]
    train_metric_name: ClassVar[str] = "train/acc"
    temperature_scaling: ClassVar[bool] = False  # calibrate fits a temperature of its outputs
    reads_class_folders: ClassVar[bool] = False  # folders of class subfolders hold its labels
    learns_from_unlabeled: ClassVar[bool] = False  # data.unlabeled trains it (pseudo_labels, per_image_loss)
    # init's LR: x scratch.yaml's from random weights, x train.yaml's from pretrained ones
    lr_scale: ClassVar[float] = 1.0

    def __init__(self, names: list[str], loss: str | None = None, settings: Mapping | None = None,
                 label_stats: dict | None = None) -> None:
        self.names, self.label_stats = list(names), dict(label_stats or {})
        self.settings = settings if settings is not None else {}
        self.loss_name = loss or self.default_loss
        criterion = self.losses.get(self.loss_name, self.loss_name)  # an own loss: package.module:function
        if isinstance(criterion, str) and ":" not in criterion:
            raise ConfigError(f"model.loss '{self.loss_name}' is not a loss of the {self.name} task; "
                              f"choose from {', '.join(self.losses)} (or null: {self.default_loss}), or "
                              "package.module:function for your own")
        if self.loss_name not in self.losses:
            from project.tasks.own_loss import own_loss

            criterion = own_loss(self.loss_name)
        self.criterion = load(criterion, "model.loss") if isinstance(criterion, str) else criterion

    def setting(self, key: str, default=None):
        """A model setting as it is now, not when the task was made."""
        value = self.settings.get(key, default)
        return default if value is None else value

    # -- data ----------------------------------------------------------------------------
    @classmethod
    def summarise_labels(cls, targets: list, num_outputs: int) -> dict:
        """What the model needs of the training labels (linked into ``model.label_stats``)."""
        return {}

    @staticmethod
    def target(label: object) -> object:
        """A sample's label as the loss takes it."""
        return label

    @classmethod
    def sample_weights(cls, targets: list, num_outputs: int) -> torch.Tensor:
        """Each training image's weight in a balanced draw (``data.balanced_sampling``)."""
        raise ConfigError(f"data.balanced_sampling is for classes drawn evenly; a {cls.name} task has no "
                          "one class per image to balance (set it to false)")

    def check(self, hparams: dict) -> None:
        """One-line errors for settings this task cannot honour."""
        if hparams.get("mixup_alpha") or hparams.get("cutmix_alpha"):
            raise ConfigError(f"model.mixup_alpha/cutmix_alpha must be 0 for a {self.name} task "
                              "(torchvision's MixUp and CutMix mix one class per image), got "
                              f"{(hparams.get('mixup_alpha'), hparams.get('cutmix_alpha'))}")

    # -- training ------------------------------------------------------------------------
    def pseudo_labels(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(targets, confidence in [0, 1]) for unlabeled images from the network's outputs."""
        raise NotImplementedError

    def per_image_loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """One loss per image (unweighted, unsmoothed), against pseudo-labels."""
        raise NotImplementedError

    def loss(self, logits: torch.Tensor, target: torch.Tensor,
             weight: torch.Tensor | None = None) -> torch.Tensor:
        return self.criterion(self, logits, target, weight)

    def train_metric(self) -> Metric:
        """Logged as ``train_metric_name`` each epoch."""
        raise NotImplementedError

    def stage_metrics(self, stage: str) -> nn.Module:
        """A module with ``stage``, ``update(logits, target, loss)`` and ``compute()`` (synced, reset)."""
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
        """The raw outputs as probabilities, or values in the targets' units."""
        raise NotImplementedError

    def probabilities(self, logits: torch.Tensor,
                      temperature: torch.Tensor | float = 1.0) -> torch.Tensor | None:
        """One distribution over the classes per image (suspects, suggest), or None."""
        return None

    @property
    def gives_probabilities(self) -> bool:
        """Whether :meth:`probabilities` gives a distribution (suspects, suggest's margin need one)."""
        return self.probabilities(torch.zeros(1, len(self.names))) is not None

    def state(self) -> dict:
        """What answers need beside names and temperature: JSON-able, kept with the model."""
        return {}

    def load_state(self, state: dict) -> None:
        pass

    def export_score(self) -> tuple[str, Callable[[torch.Tensor, torch.Tensor], float]]:
        """(name, score(outputs of the network, targets)) that export compares formats by."""
        raise NotImplementedError

    # -- views and reports -------------------------------------------------------------------
    def log_views(self, writer, result: dict[str, torch.Tensor], stage: str, step: int, epoch: int,
                  top: int = 5) -> None:
        """Its TensorBoard pictures and tables after an evaluation epoch."""

    def write_report(self, model, result: dict[str, torch.Tensor], checkpoint: str, out_dir: Path,
                     samples: dict[str, torch.Tensor], dataset, top: int, target_acc: float) -> None:
        """evaluate's report.md/json and pictures for the test split."""
        raise NotImplementedError
