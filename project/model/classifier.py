"""ImageClassifier: a backbone with a new head, trained as its task (``project/tasks/``) says."""

import functools
import logging
import math
from dataclasses import asdict
from typing import Literal

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn

from project import tasks
from project.common.preprocessing import Input
from project.data.unlabeled import split_batch
from project.errors import ConfigError, require_all
from project.model import backbones, schedule
from project.model.param_groups import make_param_groups

log = logging.getLogger("project")
EVAL_PREFIXES = {"validation": "val", "test": "test"}  # a metric's first part names its data
# when model.optimizer is not set (its lr is replaced by the parameter groups')
DEFAULT_OPTIMIZER = functools.partial(torch.optim.SGD, lr=0.01, momentum=0.9, weight_decay=1e-4)


class ImageClassifier(L.LightningModule):
    """Transfer learning (configs/train.yaml explains each setting); the CLI links in the data's
    classes. ``lr`` is the backbone's for ``base_batch_size`` images; the head's x ``head_lr_mult``."""

    def __init__(
        self,
        num_classes: int = 2,
        class_names: list[str] | None = None,
        task: str | None = None,
        label_stats: dict | None = None,
        loss: str | None = None,
        backbone: str = "resnet18",
        weights: str | None = "DEFAULT",
        head: backbones.Head = backbones.Head(),
        input: Input | int = Input(),  # an int: the size (model.input: 224)
        optimizer: OptimizerCallable | None = None,
        scheduler: LRSchedulerCallable | None = schedule.WarmupCosine,
        lr: float = 0.01,
        head_lr_mult: float = 10.0,
        layer_decay: float | None = None,
        lr_scaling: schedule.LrScaling = "none",
        base_batch_size: int = 64,
        label_smoothing: float = 0.0,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        class_weights: list[float] | Literal["balanced"] | None = None,
        channels_last: bool = True,
        compile: bool = False,
        extra_val: list[str] | None = None,
        loader_batch_size: int | None = None,
        min_confidence: str | float | None = None,
        unlabeled: dict | None = None,
    ) -> None:
        super().__init__()
        weights_ok = len(class_weights) == num_classes and any(class_weights) and all(
            0 <= w < math.inf for w in class_weights) if isinstance(class_weights, list) else True
        require_all(
            (0 <= lr < math.inf and 0 < head_lr_mult < math.inf, "model.lr/head_lr_mult",
             "must be >= 0 and > 0 (finite)", (lr, head_lr_mult)),
            (base_batch_size >= 1, "model.base_batch_size", "must be 1 or more", base_batch_size),
            (0 <= label_smoothing < 1, "model.label_smoothing", "must be in [0, 1)", label_smoothing),
            (0 <= min(mixup_alpha, cutmix_alpha) <= max(mixup_alpha, cutmix_alpha) < math.inf,
             "model.mixup_alpha/cutmix_alpha", "must be 0 or more (finite)", (mixup_alpha, cutmix_alpha)),
            (layer_decay is None or 0 < layer_decay <= 1, "model.layer_decay", "must be in (0, 1]",
             layer_decay),
            (weights_ok, "model.class_weights",
             f"needs one weight per class ({num_classes}), each finite and >= 0, not all 0", class_weights))
        head = backbones.Head.of(head)
        if class_names is not None and len(class_names) != num_classes:
            raise ConfigError(f"{len(class_names)} class_names for num_classes={num_classes}")
        self.save_hyperparameters(logger=False)  # the run summary logs them, with the data's
        pre = self.preprocessing = backbones.resolve_preprocessing(backbone, weights, input)
        self.hparams.update(head=asdict(head), input={  # resolved: a checkpoint rebuilds without the weights
            "size": pre.image_size, "crop_ratio": pre.crop_ratio, "interpolation": pre.interpolation,
            "mean": list(pre.mean), "std": list(pre.std)})
        for key, value in (("optimizer", optimizer), ("scheduler", scheduler)):
            if value is not None and not isinstance(self.hparams[key], dict):  # built in Python:
                self.hparams[key] = {"class_path": getattr(value, "__qualname__", str(value))}  # no code
        # kept by reference when EMA deep-copies the module (the config's callables hold a lock)
        self.optimizer_factory = _Shared(optimizer or DEFAULT_OPTIMIZER)
        self.scheduler_factory = _Shared(scheduler) if scheduler is not None else None
        schedule.check_factories(self.optimizer_factory.fn, scheduler)  # torch's refusals: one line now
        self.class_names = list(class_names or [str(i) for i in range(num_classes)])
        built = backbones.build(backbone, weights, num_classes, head, pre.image_size)
        self.net, self.head_name = built.net, built.head_name
        self.pretrained, self.weights_note = built.pretrained, built.weights_note
        self.lr = lr  # the LR finder reads and writes this attribute
        self._mixing: tuple = ((0.0, 0.0), None)  # (alphas, MixUp/CutMix): see batch_mixing
        self.register_buffer("class_weight", torch.ones(num_classes))  # in the checkpoint, for evaluate
        self.register_buffer("temperature", torch.ones(()))  # fitted by `python -m project calibrate`
        # the data chose the task; it reads hparams when used, as a callback may change them
        self.task = tasks.task_class(task)(self.class_names, loss, self.hparams, label_stats)
        self.task.check(dict(self.hparams))
        if min_confidence is not None:  # the answer policy stored with the model, checked now
            from project.tasks.answers import check_min_confidence

            check_min_confidence(self.class_names, self.answer_state())
        self.unlabeled_objective = None  # data.unlabeled's (FixMatch), linked in by the CLI
        if unlabeled:
            from project.model.unlabeled import make_objective

            self.unlabeled_objective = make_objective(unlabeled, self.task)
        self.train_acc = self.task.train_metric()
        self.val_metrics = self.task.stage_metrics("val")
        self.test_metrics = self.task.stage_metrics("test")
        # data.extra_val's sets, linked in by the CLI: each its own val_<name>/... metrics
        self.extra_val_metrics = nn.ModuleDict({name: self.task.stage_metrics(f"val_{name}")
                                                for name in extra_val or []})
        self.val_acc_best = self.task.best_metric()  # of the monitored metric (val/acc by default)
        self.val_acc_best.persistent(True)  # in checkpoints: a resumed run keeps its best so far
        self.results: dict[str, dict[str, torch.Tensor]] = {}  # last computed, for callbacks
        if channels_last:
            self.net = self.net.to(memory_format=torch.channels_last)
        if compile:
            self.net.compile()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.hparams.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.net(x)

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The task's ``model.loss`` (cross-entropy by default) with the class weights."""
        weight = self.class_weight if self.hparams.class_weights is not None else None
        return self.task.loss(logits, target, weight)

    def setup(self, stage: str) -> None:
        if stage == "fit" and self.hparams.class_weights is not None:
            from project.model.weighting import class_weights

            self.class_weight.copy_(class_weights(self.hparams.class_weights, self.task.label_stats,
                                                  self.hparams.num_classes))

    def answer_state(self) -> dict:
        """What answers need beside the class names; kept in checkpoints and ONNX metadata."""
        return {"task": self.task.name, "answers": self.task.answers, "temperature": float(self.temperature),
                **self.task.state(), "min_confidence": self.hparams.min_confidence}

    # -- steps ---------------------------------------------------------------------------
    def training_step(self, batch, batch_idx: int) -> torch.Tensor | None:
        batch, unlabeled = split_batch(batch)  # the second: with data.unlabeled only
        if batch is None:  # every image of this batch was undecodable and skipped
            return None
        x, y = batch
        target = y
        mixing = self.batch_mixing()
        if mixing is not None:
            x, target = mixing(x, y)  # soft targets; the training metric still against the labels
        if unlabeled is None or self.unlabeled_objective is None:
            logits, extra = self(x), None
        else:  # one forward over the labeled images and both views of the unlabeled ones
            logits, extra = self.unlabeled_objective.step(self, x, unlabeled[0])
        loss = self.loss(logits, target)
        if extra is not None:
            self.log("train/unlabeled_loss", extra, batch_size=len(unlabeled[0][0]))
            loss = loss + extra
        self.train_acc(logits, y)
        self.log("train/loss", loss, prog_bar=True, batch_size=len(y))
        self.log(self.task.train_metric_name, self.train_acc, on_step=False, on_epoch=True, prog_bar=True)
        return loss

    def batch_mixing(self):
        """MixUp/CutMix as ``mixup_alpha``/``cutmix_alpha`` say now: a callback may schedule them."""
        alphas = (self.hparams.mixup_alpha, self.hparams.cutmix_alpha)
        if self._mixing[0] != alphas:
            from project.model.mixing import batch_mixing

            self._mixing = (alphas, batch_mixing(self.hparams.num_classes, *alphas))
        return self._mixing[1]

    def on_train_epoch_end(self) -> None:
        if self.unlabeled_objective is not None:
            self.unlabeled_objective.log_epoch(self)

    def _eval_step(self, batch, metrics: nn.Module) -> None:
        if batch is not None:
            x, y = batch
            logits = self(x)
            metrics.update(logits, y, self.loss(logits, y))

    def validation_step(self, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        extra = list(self.extra_val_metrics.values())  # data.extra_val's loaders follow val's
        self._eval_step(batch, extra[dataloader_idx - 1] if dataloader_idx else self.val_metrics)

    def test_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, self.test_metrics)

    def _eval_epoch_end(self, metrics: nn.Module) -> None:
        values = metrics.compute()  # a collective under DDP: every rank computes
        if self.trainer.sanity_checking:
            return
        if metrics.stage == "val":
            self.val_acc_best(values[self.task.monitor])
            values[f"{self.task.monitor}_best"] = self.val_acc_best.compute()
        self.results[metrics.stage] = {k: v.detach().cpu() for k, v in values.items()}
        self.log_dict({k: v for k, v in values.items() if v.dim() == 0}, sync_dist=True)

    def on_validation_epoch_end(self) -> None:
        self._logging_from = ("validation", "on_validation_epoch_end")
        for metrics in (self.val_metrics, *self.extra_val_metrics.values()):
            self._eval_epoch_end(metrics)

    def on_test_epoch_end(self) -> None:
        self._logging_from = ("test", "on_test_epoch_end")
        self._eval_epoch_end(self.test_metrics)

    # -- one value per metric name in an evaluation epoch: Lightning would silently average or
    # replace a name logged twice (an extra set under val/ would blend into val/acc) -----------
    def on_validation_epoch_start(self) -> None:
        self._logged: dict[str, str] = {}  # name -> where it was logged this epoch
        self._logging_from: tuple[str, str] | None = ("validation", "a validation hook")

    def on_test_epoch_start(self) -> None:
        self._logged, self._logging_from = {}, ("test", "a test hook")

    def on_validation_batch_start(self, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        t = self.trainer
        loaders = len(t.num_sanity_val_batches if t.sanity_checking else t.num_val_batches)
        suffix = f"/dataloader_idx_{dataloader_idx}" if loaders > 1 else ""
        self._logging_from = ("validation", "validation_step", suffix)

    def on_test_batch_start(self, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        suffix = f"/dataloader_idx_{dataloader_idx}" if len(self.trainer.num_test_batches) > 1 else ""
        self._logging_from = ("test", "test_step", suffix)

    def on_validation_end(self) -> None:
        self._logging_from = None

    on_test_end = on_validation_end

    def log(self, name: str, value, *args, **kwargs) -> None:
        where = self.__dict__.get("_logging_from")
        head = name.split("/", 1)[0]
        owner = next((s for s, p in EVAL_PREFIXES.items() if head == p or head.startswith(f"{p}_")), None)
        if owner is not None and (where is None or where[0] != owner):  # val/ holds validation's alone
            when = f"in a {where[0]} epoch" if where else "in training"
            raise ConfigError(f"metric '{name}' is logged {when}: {head}/ names hold what {owner} data "
                              "measures; log it under another prefix (train/ for training batches)")
        if where is not None:  # inside an evaluation epoch
            stage, origin, *suffix = where
            key = name + (suffix[0] if suffix and kwargs.get("add_dataloader_idx", True) else "")
            seen = self._logged.get(key)
            if seen is not None and (seen != origin or not suffix):  # a step's repeats are one series
                by = f"{origin}, twice" if seen == origin else f"{seen} and {origin}"
                raise ConfigError(f"metric '{name}' is logged twice in one {stage} epoch (by {by}); log an "
                                  f"extra set under its own prefix, e.g. {name.split('/')[0]}_<name>/...")
            self._logged[key] = origin
        super().log(name, value, *args, **kwargs)

    # -- optimisation --------------------------------------------------------------------
    @property
    def head_lr_mult(self) -> float:  # from random weights every layer is new: one LR for all
        return self.hparams.head_lr_mult if self.pretrained else 1.0

    @property
    def per_device_batch(self) -> int:
        """data.batch_size, which the CLI links in (a model built alone: model.base_batch_size)."""
        return self.hparams.loader_batch_size or self.hparams.base_batch_size

    def run_lr(self) -> tuple[float, int]:
        """(the backbone's LR for this run's global batch, the global batch)."""
        t, hp = self.trainer, self.hparams
        batch = schedule.global_batch_size(self.per_device_batch, t.num_devices, t.num_nodes,
                                           t.accumulate_grad_batches)
        return schedule.scaled_lr(self.lr, batch, hp.base_batch_size, hp.lr_scaling), batch

    def param_groups(self, lr: float | None = None) -> list[dict]:
        """Backbone and head, each split into decayed weights and undecayed norms/biases."""
        return make_param_groups(self.net, self.head_name, self.lr if lr is None else lr,
                                 self.head_lr_mult, self.hparams.layer_decay)

    def configure_optimizers(self):
        lr, batch = self.run_lr()
        opt = self.optimizer_factory(self.param_groups(lr))
        if self.trainer.is_global_zero:
            t = self.trainer
            log.info("Global batch %d (%d per device x %d devices x %d nodes x %d accumulation); LR %.4g "
                     "(model.lr %.4g, lr_scaling=%s); head x%g; %s", batch, self.per_device_batch,
                     t.num_devices, t.num_nodes, t.accumulate_grad_batches, lr, self.lr,
                     self.hparams.lr_scaling, self.head_lr_mult, type(opt).__name__)
        if self.scheduler_factory is None:
            return opt
        scheduler = schedule.DeferredScheduler(opt, self.scheduler_factory.fn)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict) -> None:  # beside the weights: EMA swaps those
        checkpoint["task_state"] = self.task.state()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        state = checkpoint.get("task_state")
        if state is None and "thresholds" in checkpoint:  # written before the task seam
            state = {"thresholds": checkpoint["thresholds"]}
        self.task.load_state(state or {})

    def on_train_start(self) -> None:
        for config in self.trainer.lr_scheduler_configs:  # the run's lengths are known now
            if isinstance(config.scheduler, schedule.DeferredScheduler):
                config.scheduler.build(schedule.run_lengths(self.trainer))


class _Shared:
    """A callable kept by reference when its owner is deep-copied."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __deepcopy__(self, memo: dict) -> "_Shared":
        return self
