"""ImageClassifier: a pretrained torchvision backbone with a new head, trained by transfer.

Where to change things: the network in ``project/model/backbones.py``, the loss in
``loss``, the parameter groups in ``param_groups``, the optimiser in the config
(``model.optimizer``), the schedule in ``configure_optimizers``, what is logged in
``project/model/metrics.py``.
"""

from __future__ import annotations

import logging
import math
from typing import Literal

import lightning as L
import torch
from lightning.pytorch.cli import OptimizerCallable
from torch import nn
from torch.optim.lr_scheduler import LambdaLR
from torchmetrics.classification import MulticlassAccuracy

from project.data.transforms import Interpolation, Preprocessing
from project.errors import ConfigError, require
from project.model import backbones
from project.model.metrics import HP_METRICS, BestSoFar, PerSample, StageMetrics, loggable
from project.model.param_groups import make_param_groups
from project.model.recipe import (
    SharedCallable,
    batch_mixing,
    default_optimizer,
    set_backbone_frozen,
)
from project.model.schedule import LrScaling, global_batch_size, scaled_lr, step_schedule

log = logging.getLogger(__name__)
class ImageClassifier(L.LightningModule):
    """Transfer learning for image classification.

    Args:
        num_classes, class_names: linked from the data module by the CLI; saved in checkpoints.
        backbone: any torchvision classification model name (resnet18, efficientnet_b0, ...), or
            ``timm/<name>`` (timm/convnext_nano.in12k_ft_in1k; ``python -m project models PATTERN``).
        weights: ``DEFAULT`` (ImageNet), another torchvision weights name or timm weights tag, a
            .pth/.safetensors file or a checkpoint of this template, or null.
        image_size: linked from the data; kept so export and predict need no data.
        crop_ratio, interpolation, mean, std: evaluation preprocessing; null: that of the
            pretrained weights (``weights.transforms()``), else ImageNet's convention. The CLI
            passes the data module's values; stored in the checkpoint and the ONNX metadata.
        optimizer: a ``torch.optim`` class with its settings (``class_path``/``init_args`` in
            the config), called on the parameter groups made here; null: SGD, momentum 0.9,
            weight decay 1e-4. Its ``lr`` is ignored: ``lr`` below sets every group's LR.
        lr: learning rate of the backbone for ``base_batch_size`` images per step.
        head_lr_mult: the new head learns this many times faster than the pretrained body
            (1 when there are no pretrained weights: then every layer is new).
        layer_decay: timm-style layer-wise LR decay (e.g. 0.7): each backbone block learns this
            many times slower than the next one; null: one LR for the whole backbone.
        warmup_epochs, warmup_start_lr: linear warmup from ``warmup_start_lr``, then cosine.
        min_lr: the LR the cosine ends at.
        freeze_backbone_epochs: train the head only for this many epochs: the backbone gets no
            gradients and its norm layers stay in eval mode (their statistics do not move).
        label_smoothing: cross-entropy label smoothing.
        mixup_alpha, cutmix_alpha: MixUp / CutMix of training batches (Beta(alpha, alpha)
            mixing; 0: off; both set: one of the two per batch). Targets become soft.
        class_weights: per-class loss weights, ``balanced`` (inverse frequency) or null.
        lr_scaling, base_batch_size: adapt ``lr`` to the global batch (devices x nodes x accum).
        channels_last, compile: speed options (channels-last memory format, torch.compile).
        tta: test-time augmentation for ``test``/``evaluate``: ``hflip`` averages the
            probabilities of each image and its mirror image, logged as ``test_tta/...`` beside
            the plain ``test/...`` numbers.
    """

    def __init__(
        self,
        num_classes: int = 2,
        class_names: list[str] | None = None,
        backbone: str = "resnet18",
        weights: str | None = "DEFAULT",
        image_size: int = 224,
        crop_ratio: float | None = None,
        interpolation: Interpolation | None = None,
        mean: list[float] | None = None,
        std: list[float] | None = None,
        optimizer: OptimizerCallable | None = None,
        lr: float = 0.01,
        head_lr_mult: float = 10.0,
        layer_decay: float | None = None,
        warmup_epochs: float = 3.0,
        warmup_start_lr: float = 1e-4,
        min_lr: float = 0.0,
        freeze_backbone_epochs: int = 0,
        label_smoothing: float = 0.0,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        class_weights: list[float] | Literal["balanced"] | None = None,
        lr_scaling: LrScaling = "none",
        base_batch_size: int = 64,
        channels_last: bool = True,
        compile: bool = False,
        tta: Literal["none", "hflip"] = "none",
    ) -> None:
        super().__init__()
        for key, value in (("lr", lr), ("warmup_epochs", warmup_epochs), ("min_lr", min_lr),
                           ("warmup_start_lr", warmup_start_lr),
                           ("freeze_backbone_epochs", freeze_backbone_epochs)):
            require(value >= 0, f"model.{key}", "must be 0 or more", value)
        require(head_lr_mult > 0, "model.head_lr_mult", "must be above 0", head_lr_mult)
        require(base_batch_size >= 1, "model.base_batch_size", "must be 1 or more", base_batch_size)
        require(0 <= label_smoothing < 1, "model.label_smoothing", "must be in [0, 1)", label_smoothing)
        require(mixup_alpha >= 0 and cutmix_alpha >= 0, "model.mixup_alpha/cutmix_alpha",
                "must be 0 or more", (mixup_alpha, cutmix_alpha))
        require(layer_decay is None or 0 < layer_decay <= 1, "model.layer_decay", "must be in (0, 1]",
                layer_decay)
        if class_names is not None and len(class_names) != num_classes:
            raise ConfigError(f"{len(class_names)} class_names for num_classes={num_classes}")
        self.save_hyperparameters(logger=False)  # logged with the run summary instead
        given = {"crop_ratio": crop_ratio, "interpolation": interpolation, "mean": mean, "std": std}
        if None in given.values():  # the CLI passes all four, resolved once from the weights
            resolved = backbones.weights_preprocessing(backbone, weights)
            self.hparams.update({k: resolved[k] if v is None else v for k, v in given.items()})
        self.preprocessing = Preprocessing(image_size, self.hparams.crop_ratio,
                                           self.hparams.interpolation, tuple(self.hparams.mean),
                                           tuple(self.hparams.std))
        self.mixing = batch_mixing(num_classes, mixup_alpha, cutmix_alpha)
        if optimizer is not None and not isinstance(self.hparams.optimizer, dict):
            # built in Python rather than from a config: keep checkpoints free of code objects
            self.hparams.optimizer = {"class_path": getattr(optimizer, "__qualname__", str(optimizer))}
        # shared, not copied, by deep copies of the module (EMA's average): under DDP the config's
        # optimizer callable holds a lock that cannot be copied
        self.optimizer_factory = SharedCallable(optimizer or default_optimizer)
        self.class_names = list(class_names or [str(i) for i in range(num_classes)])
        built = backbones.build(backbone, weights, num_classes, image_size=image_size)
        self.net = built.net
        self.head_name = built.head_name
        self.pretrained = built.pretrained
        self.weights_note = built.weights_note
        self.lr = lr  # the LR finder reads and writes this attribute
        # Loss weights live in the checkpoint, so evaluate's test/loss uses the training loss.
        self.register_buffer("class_weight", torch.ones(num_classes))
        # Temperature scaling (project/model/calibration.py): probabilities = softmax(logits / T).
        # 1 until `calibrate` (or the TemperatureScaling callback) fits it on the validation set.
        self.register_buffer("temperature", torch.ones(()))
        self.train_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_metrics = StageMetrics("val", self.class_names)
        self.test_metrics = StageMetrics("test", self.class_names)
        self.test_tta_metrics = StageMetrics("test_tta", self.class_names)
        self.val_acc_best = BestSoFar()
        self.results: dict[str, dict[str, torch.Tensor]] = {}  # last computed, for callbacks
        # Each image's logits of the last val/test epoch (top losses, mistakes, curves)
        self.per_sample = {"val": PerSample(), "test": PerSample()}
        self.samples: dict[str, dict[str, torch.Tensor] | None] = {}
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

    def probabilities(self, x: torch.Tensor) -> torch.Tensor:
        """Calibrated class probabilities: ``softmax(logits / temperature)``."""
        return (self(x).float() / self.temperature).softmax(-1)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # checkpoints from before temperature scaling: T = 1, as they were used
        state_dict.setdefault(prefix + "temperature", torch.ones(()))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Cross-entropy with the class weights and label smoothing: for training and eval."""
        weight = self.class_weight if self.hparams.class_weights is not None else None
        return nn.functional.cross_entropy(logits, target, weight=weight,
                                           label_smoothing=self.hparams.label_smoothing)

    def setup(self, stage: str) -> None:
        weights = self.hparams.class_weights
        if stage == "fit" and weights is not None:
            if weights == "balanced":
                targets = torch.as_tensor(self.trainer.datamodule.train_set.targets)
                counts = torch.bincount(targets, minlength=self.hparams.num_classes).clamp(min=1)
                weights = (counts.sum() / (len(counts) * counts)).tolist()
            require(len(weights) == self.hparams.num_classes, "model.class_weights",
                    f"needs one weight per class ({self.hparams.num_classes})", weights)
            self.class_weight.copy_(torch.tensor(weights, dtype=torch.float32))

    # -- freezing ------------------------------------------------------------------------
    def backbone_frozen(self) -> bool:
        return self.current_epoch < self.hparams.freeze_backbone_epochs

    def apply_freeze(self) -> None:
        """While frozen: no backbone gradients, and backbone norm layers in eval mode."""
        set_backbone_frozen(self.net, self.head_name, self.backbone_frozen(), self.training)

    def on_train_epoch_start(self) -> None:
        self.apply_freeze()

    def on_validation_model_train(self) -> None:
        super().on_validation_model_train()  # back to train mode after validation...
        self.apply_freeze()  # ...but a frozen backbone's norm layers stay in eval mode

    # -- steps ---------------------------------------------------------------------------
    def training_step(self, batch, batch_idx: int) -> torch.Tensor | None:
        if batch is None:  # every image of this batch was undecodable and skipped
            return None
        x, y = batch
        target = y
        if self.mixing is not None:
            x, target = self.mixing(x, y)  # soft targets; accuracy still against the labels
        logits = self(x)
        loss = self.loss(logits, target)
        self.train_acc(logits, y)
        self.log("train/loss", loss, prog_bar=True, batch_size=len(y))
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True, prog_bar=True)
        return loss

    def _eval_step(self, batch, metrics: StageMetrics) -> None:
        if batch is None:
            return
        x, y = batch
        logits = self(x)
        metrics.update(logits, y, self.loss(logits, y))
        if metrics.stage in self.per_sample:
            self.per_sample[metrics.stage].update(logits, y)

    def validation_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, self.val_metrics)

    def test_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, self.test_metrics)
        if self.hparams.tta != "none" and batch is not None:
            x, y = batch
            log_probs = self.predict_tta(x).log()  # works as logits: softmax gives it back
            self.test_tta_metrics.update(log_probs, y, self.loss(log_probs, y))

    def predict_tta(self, x: torch.Tensor) -> torch.Tensor:
        """Mean (calibrated) probabilities of ``x`` and its horizontal mirror."""
        return (self.probabilities(x) + self.probabilities(x.flip(-1))) / 2

    def predict_step(self, batch, batch_idx: int) -> torch.Tensor:
        x = batch[0] if isinstance(batch, list | tuple) else batch
        return self.probabilities(x)

    def _eval_epoch_end(self, metrics: StageMetrics) -> None:
        values = metrics.compute()  # a collective under DDP: every rank computes
        samples = None
        if metrics.stage in self.per_sample:  # also a collective
            loaders = self.trainer.val_dataloaders if metrics.stage == "val" else \
                self.trainer.test_dataloaders
            samples = self.per_sample[metrics.stage].compute(loaders)
        if self.trainer.sanity_checking:
            return
        if metrics.stage in self.per_sample:
            self.samples[metrics.stage] = samples
        if metrics.stage == "val":
            self.val_acc_best(values["val/acc"])
            values["val/acc_best"] = self.val_acc_best.compute()
            values.update({hp: values[key] for hp, key in HP_METRICS.items()})
        self.results[metrics.stage] = {k: v.detach().cpu() for k, v in values.items()}
        self.log_dict(loggable(values), sync_dist=True)  # equal on every rank already

    def on_validation_epoch_end(self) -> None:
        self._eval_epoch_end(self.val_metrics)

    def on_test_epoch_end(self) -> None:
        self._eval_epoch_end(self.test_metrics)
        if self.hparams.tta != "none":
            self._eval_epoch_end(self.test_tta_metrics)

    # -- optimisation --------------------------------------------------------------------
    @property
    def head_lr_mult(self) -> float:
        """The head's LR multiplier: only a pretrained body needs protecting from a large LR;
        from random weights every layer is new and all learn at the same rate."""
        return self.hparams.head_lr_mult if self.pretrained else 1.0

    def param_groups(self) -> list[dict]:
        """Backbone and head, each split into decayed weights and undecayed norms/biases."""
        return make_param_groups(self.net, self.head_name, self.effective_lr, self.head_lr_mult,
                                 self.hparams.layer_decay)

    def configure_optimizers(self):
        hp = self.hparams
        t = self.trainer
        self.global_batch = global_batch_size(
            t.datamodule.batch_size, t.num_devices, t.num_nodes, t.accumulate_grad_batches
        )
        self.effective_lr = scaled_lr(self.lr, self.global_batch, hp.base_batch_size, hp.lr_scaling)
        groups = self.param_groups()
        opt = self.optimizer_factory(groups)
        if t.is_global_zero:
            log.info(
                "Global batch %d (%d per device x %d devices x %d nodes x %d accumulation); "
                "LR %.4g (model.lr %.4g, lr_scaling=%s, base_batch_size=%d); head x%g; %s",
                self.global_batch, t.datamodule.batch_size, t.num_devices, t.num_nodes,
                t.accumulate_grad_batches, self.effective_lr, self.lr, hp.lr_scaling,
                hp.base_batch_size, self.head_lr_mult, type(opt).__name__)
        if t.max_epochs in (None, -1) and t.max_steps == -1:
            raise ConfigError("the cosine schedule needs a length: set trainer.max_epochs or "
                              "trainer.max_steps")
        lr = self.effective_lr
        start = min(1.0, hp.warmup_start_lr / lr) if lr > 0 else 1.0
        end = hp.min_lr / lr if lr > 0 else 0.0
        factors = [
            step_schedule(self._schedule_lengths, hp.warmup_epochs, start, end,
                          frozen_epochs=0 if g["name"].startswith("head") else hp.freeze_backbone_epochs)
            for g in opt.param_groups
        ]
        scheduler = LambdaLR(opt, factors)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def _schedule_lengths(self) -> tuple[int, int]:
        """(optimizer steps per epoch, total optimizer steps), as Lightning estimates them."""
        t = self.trainer
        total = t.estimated_stepping_batches
        batches = t.num_training_batches  # unknown (inf) when only max_steps bounds the run
        per_epoch = math.ceil(batches / t.accumulate_grad_batches) if math.isfinite(batches) else total
        return int(per_epoch), max(1, int(total))
