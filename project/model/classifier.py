"""ImageClassifier: a pretrained torchvision backbone with a new head, trained by transfer.

Where to change things: the network in ``project/backbones.py``, the loss in ``__init__``,
the optimiser and schedule in ``configure_optimizers``, what is logged in the step methods.
"""

from __future__ import annotations

import logging
import math
from typing import Literal

import lightning as L
import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR
from torchmetrics import MaxMetric, MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from project.errors import ConfigError
from project.model import backbones
from project.model.metrics import flatten, stage_metrics
from project.model.schedule import LrScaling, global_batch_size, scaled_lr, step_schedule

log = logging.getLogger(__name__)


class ImageClassifier(L.LightningModule):
    """Transfer learning for image classification.

    Args:
        num_classes, class_names: linked from the data module by the CLI; saved in checkpoints.
        backbone: any torchvision classification model name (resnet18, efficientnet_b0, ...).
        weights: ``DEFAULT`` (ImageNet), another torchvision weights name, a .pth file, or null.
        image_size, crop_ratio: linked from the data; kept so export and predict need no data.
        optimizer: ``sgd`` (momentum, the CV default) or ``adamw``.
        lr: learning rate of the backbone for ``base_batch_size`` images per step.
        head_lr_mult: the new head learns this many times faster than the pretrained body
            (1 when there are no pretrained weights: then every layer is new).
        warmup_epochs, warmup_start_lr: linear warmup from ``warmup_start_lr``, then cosine.
        freeze_backbone_epochs: keep the backbone at LR 0 for this many epochs (head only).
        label_smoothing: cross-entropy label smoothing.
        class_weights: per-class loss weights, ``balanced`` (inverse frequency) or null.
        lr_scaling, base_batch_size: adapt ``lr`` to the global batch (devices x nodes x accum).
        channels_last, compile: speed options (channels-last memory format, torch.compile).
    """

    def __init__(
        self,
        num_classes: int = 2,
        class_names: list[str] | None = None,
        backbone: str = "resnet18",
        weights: str | None = "DEFAULT",
        image_size: int = 224,
        crop_ratio: float = 0.875,
        optimizer: Literal["sgd", "adamw"] = "sgd",
        lr: float = 0.01,
        head_lr_mult: float = 10.0,
        momentum: float = 0.9,
        weight_decay: float = 1e-4,
        warmup_epochs: float = 3.0,
        warmup_start_lr: float = 1e-4,
        min_lr: float = 0.0,
        freeze_backbone_epochs: int = 0,
        label_smoothing: float = 0.0,
        class_weights: list[float] | Literal["balanced"] | None = None,
        lr_scaling: LrScaling = "none",
        base_batch_size: int = 64,
        channels_last: bool = False,
        compile: bool = False,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(logger=False)  # logged with the run summary instead
        if class_names is not None and len(class_names) != num_classes:
            raise ConfigError(f"{len(class_names)} class_names for num_classes={num_classes}")
        self.class_names = list(class_names or [str(i) for i in range(num_classes)])
        built = backbones.build(backbone, weights, num_classes)
        self.net = built.net
        self.head_name = built.head_name
        self.pretrained = built.pretrained
        self.weights_note = built.weights_note
        self.lr = lr  # the LR finder reads and writes this attribute
        self.criterion = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
        self.train_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_metrics = stage_metrics(num_classes)
        self.test_metrics = stage_metrics(num_classes)
        self.val_loss, self.test_loss = MeanMetric(), MeanMetric()
        self.val_acc_best = MaxMetric()
        self.results: dict[str, dict[str, torch.Tensor]] = {}  # last computed, for callbacks
        self.effective_lr = lr
        self.global_batch = base_batch_size
        if channels_last:
            self.net = self.net.to(memory_format=torch.channels_last)
        if compile:
            self.net.compile()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.hparams.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.net(x)

    def setup(self, stage: str) -> None:
        weights = self.hparams.class_weights
        if stage == "fit" and weights is not None:
            if weights == "balanced":
                targets = torch.as_tensor(self.trainer.datamodule.train_set.targets)
                counts = torch.bincount(targets, minlength=self.hparams.num_classes).clamp(min=1)
                weights = (counts.sum() / (len(counts) * counts)).tolist()
            self.criterion = nn.CrossEntropyLoss(
                weight=torch.tensor(weights, dtype=torch.float32),
                label_smoothing=self.hparams.label_smoothing,
            )

    # -- steps ---------------------------------------------------------------------------
    def training_step(self, batch, batch_idx: int) -> torch.Tensor | None:
        if batch is None:  # every image of this batch was undecodable and skipped
            return None
        x, y = batch
        logits = self(x)
        loss = self.criterion(logits, y)
        self.train_acc(logits, y)
        self.log("train/loss", loss, prog_bar=True, batch_size=len(y))
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True, prog_bar=True)
        return loss

    def _eval_step(self, batch, stage: str) -> None:
        if batch is None:
            return
        x, y = batch
        logits = self(x)
        getattr(self, f"{stage}_loss").update(nn.functional.cross_entropy(logits, y), len(y))
        getattr(self, f"{stage}_metrics").update(logits, y)

    def validation_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def test_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def predict_step(self, batch, batch_idx: int) -> torch.Tensor:
        x = batch[0] if isinstance(batch, list | tuple) else batch
        return self(x).softmax(-1)

    def _eval_epoch_end(self, stage: str) -> None:
        collection = getattr(self, f"{stage}_metrics")
        values = collection.compute()  # synced across DDP ranks
        values["loss"] = getattr(self, f"{stage}_loss").compute()
        collection.reset()
        getattr(self, f"{stage}_loss").reset()
        if self.trainer.sanity_checking:
            return
        self.results[stage] = {k: v.detach().cpu() for k, v in values.items()}
        logged = flatten(values, stage, self.class_names)
        if stage == "val":
            self.val_acc_best(values["acc"])
            logged["val/acc_best"] = self.val_acc_best.compute()
            logged["hp/val_acc_best"] = logged["val/acc_best"]
            logged["hp/val_f1_macro"] = values["f1_macro"]
        self.log_dict(logged, sync_dist=True)  # equal on every rank already; this keeps them so

    def on_validation_epoch_end(self) -> None:
        self._eval_epoch_end("val")

    def on_test_epoch_end(self) -> None:
        self._eval_epoch_end("test")

    # -- optimisation --------------------------------------------------------------------
    def param_groups(self) -> list[dict]:
        """Two groups made once: pretrained body, and the new head at ``head_lr_mult`` x LR."""
        head_prefix = f"{self.head_name}."
        head, body = [], []
        for name, p in self.net.named_parameters():
            if p.requires_grad:
                (head if name.startswith(head_prefix) else body).append(p)
        return [
            {"params": body, "lr": self.effective_lr, "name": "backbone"},
            {"params": head, "lr": self.effective_lr * self.head_lr_mult, "name": "head"},
        ]

    @property
    def head_lr_mult(self) -> float:
        """The head's LR multiplier: only a pretrained body needs protecting from a large LR;
        from random weights every layer is new and all learn at the same rate."""
        return self.hparams.head_lr_mult if self.pretrained else 1.0

    def configure_optimizers(self):
        hp = self.hparams
        t = self.trainer
        self.global_batch = global_batch_size(
            t.datamodule.batch_size, t.num_devices, t.num_nodes, t.accumulate_grad_batches
        )
        self.effective_lr = scaled_lr(self.lr, self.global_batch, hp.base_batch_size, hp.lr_scaling)
        if t.is_global_zero:
            log.info(
                "Global batch %d (%d per device x %d devices x %d nodes x %d accumulation); "
                "LR %.4g (model.lr %.4g, lr_scaling=%s, base_batch_size=%d); head x%g",
                self.global_batch, t.datamodule.batch_size, t.num_devices, t.num_nodes,
                t.accumulate_grad_batches, self.effective_lr, self.lr, hp.lr_scaling,
                hp.base_batch_size, self.head_lr_mult)
        groups = self.param_groups()
        if hp.optimizer == "sgd":
            opt = torch.optim.SGD(groups, lr=self.effective_lr, momentum=hp.momentum,
                                  weight_decay=hp.weight_decay)
        else:
            opt = torch.optim.AdamW(groups, lr=self.effective_lr, weight_decay=hp.weight_decay)
        if t.max_epochs in (None, -1) and t.max_steps == -1:
            raise ConfigError("the cosine schedule needs a length: set trainer.max_epochs or "
                              "trainer.max_steps")
        lr = self.effective_lr
        start = min(1.0, hp.warmup_start_lr / lr) if lr > 0 else 1.0
        end = hp.min_lr / lr if lr > 0 else 0.0
        body = step_schedule(self._schedule_lengths, hp.warmup_epochs, start, end,
                             frozen_epochs=hp.freeze_backbone_epochs)
        head = step_schedule(self._schedule_lengths, hp.warmup_epochs, start, end)
        scheduler = LambdaLR(opt, [body, head])
        return {"optimizer": opt, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def _schedule_lengths(self) -> tuple[int, int]:
        """(optimizer steps per epoch, total optimizer steps), as Lightning estimates them."""
        t = self.trainer
        total = t.estimated_stepping_batches
        batches = t.num_training_batches  # unknown (inf) when only max_steps bounds the run
        per_epoch = math.ceil(batches / t.accumulate_grad_batches) if math.isfinite(batches) else total
        return int(per_epoch), max(1, int(total))
