"""Guards that stop a broken run early, naming the layer, step or statistic and the fix."""

import logging
import math

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn

from project.callbacks.dashboards import tensorboard
from project.data.unlabeled import split_batch
from project.errors import ProjectError, require

log = logging.getLogger("project")
DARK = 32  # of 255: a first batch with no brighter pixel is all but black


class TrainingHealthError(ProjectError, RuntimeError):
    """A run stopped by a guard; the message holds the diagnosis and the fixes."""


class Guards(Callback):
    """The model's own preprocessing in the data; every trainable parameter in an optimiser; the
    first batch's statistics, warning of un-normalised or NaN inputs; a non-finite gradient stops the
    run before the weights change (with fp16 loss scaling: ``patience_with_scaler`` in a row)."""

    def __init__(self, max_abs_input: float = 10.0, patience_with_scaler: int = 10, top: int = 5) -> None:
        require(max_abs_input > 0 and min(patience_with_scaler, top) >= 0, "the Guards callback's "
                "max_abs_input/patience_with_scaler/top", "must be > 0, >= 0, >= 0 (trainer.callbacks)",
                (max_abs_input, patience_with_scaler, top))
        self.max_abs_input, self.patience, self.top = max_abs_input, patience_with_scaler, top
        self.overflows = 0
        self.batch: torch.Tensor | None = None
        self.previous: tuple[torch.Tensor, list[str]] | None = None
        self.first_batch_seen = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        data = getattr(trainer.datamodule, "preprocessing", None)
        model = getattr(pl_module, "preprocessing", None)
        if data is not None and model is not None and data != model:  # built apart in Python
            raise TrainingHealthError(
                f"the data module prepares {data.image_size} px images normalised with mean {data.mean}, "
                f"but the model takes {model}: build it with "
                "FolderDataModule(..., preprocessing=model.preprocessing) (the CLI links it)")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        hidden = plain_container_modules(pl_module)
        missing = params_missing_from_optimizers(pl_module, trainer.optimizers)
        if hidden or missing:
            from project.callbacks.diagnosis import untrained_parameters  # the failure's report

            raise TrainingHealthError(untrained_parameters(hidden, missing))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        labeled = split_batch(batch)[0]
        self.batch = labeled[0] if labeled is not None else None
        if self.first_batch_seen or self.batch is None:
            return
        self.first_batch_seen = True
        if not trainer.is_global_zero:  # rank 0's batch speaks for the run: one line, not one per rank
            return
        stats = batch_stats(self.batch)
        text = f"First training batch {tuple(self.batch.shape)}, per channel: {format_stats(stats)}"
        log.info(text)
        writer = tensorboard(trainer)
        if writer is not None:
            writer.add_text("input/first_batch", text, trainer.global_step)
        if sum(stats["nonfinite"]) > 0:
            log.warning("WARNING: the training inputs contain %d NaN/Inf values: check the data "
                        "(python -m project check-data) and the transforms", sum(stats["nonfinite"]))
        finite_max = max((abs(v) for v in stats["min"] + stats["max"] if abs(v) != float("inf")), default=0.0)
        if finite_max > self.max_abs_input:
            log.warning("WARNING: training inputs look un-normalised (values up to %.1f; expected "
                        "roughly -3..3): is the 0..255 -> 0..1 scaling or Normalize missing?", finite_max)
        pre = getattr(pl_module, "preprocessing", None)  # the brightest pixel, back in 0..255
        top = [255 * (v * s + m) for v, m, s in zip(stats["max"], pre.mean, pre.std, strict=False)
               ] if pre is not None else []
        if top and -math.inf < max(top) < DARK:  # all non-finite: warned above
            log.warning("WARNING: the first training batch is nearly black (no pixel above %.0f of 255): "
                        "likely 12-bit images saved as 16-bit files, which decode this dark; rescale them to "
                        "the full range (python -m project check-data names the high-bit ones)", max(top))

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        named = [(n, p.grad) for n, p in pl_module.named_parameters() if p.grad is not None]
        if not named:
            return
        norms = gradient_norms([g.detach() for _, g in named])
        if bool(torch.isfinite(norms).all()):
            self.overflows = 0
            self.previous = (norms, [n for n, _ in named])  # read only for a diagnosis
            return
        self.overflows += 1
        if getattr(trainer.precision_plugin, "scaler", None) is not None and self.overflows < self.patience:
            return
        bad = [named[i][0] for i in (~torch.isfinite(norms)).nonzero().flatten().tolist()]
        from project.callbacks.diagnosis import nonfinite_gradients  # the failure's report

        batch = None if self.batch is None else format_stats(batch_stats(self.batch))
        raise TrainingHealthError(nonfinite_gradients(trainer, bad, len(named), self.previous, batch,
                                                      self.top))


def plain_container_modules(model: nn.Module) -> list[str]:
    """Modules or parameters in plain list/tuple/dict attributes, which never train."""
    found = []
    for prefix, module in model.named_modules():
        for attr, value in vars(module).items():
            if attr.startswith("_") or not isinstance(value, list | tuple | dict):
                continue
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(item, nn.Parameter) or (
                        isinstance(item, nn.Module) and next(item.parameters(), None) is not None):
                    where = f"{prefix}.{attr}" if prefix else attr
                    found.append(f"{where}[{key!r}] ({type(item).__name__})")
    return found


def params_missing_from_optimizers(model: nn.Module, optimizers) -> list[str]:
    in_groups = {id(p) for opt in optimizers for g in opt.param_groups for p in g["params"]}
    return [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in in_groups]


def batch_stats(x: torch.Tensor) -> dict[str, list[float]]:
    """Per channel (NCHW): mean, std, min, max of the finite values, and the non-finite count."""
    x = x.detach().float().transpose(0, 1).flatten(1)
    finite = torch.isfinite(x)
    values = torch.where(finite, x, torch.nan)
    mean = values.nanmean(1)
    std = (values - mean[:, None]).pow(2).nanmean(1).sqrt()
    low, high = torch.where(finite, x, torch.inf).amin(1), torch.where(finite, x, -torch.inf).amax(1)
    return {k: v.tolist() for k, v in dict(mean=mean, std=std, min=low, max=high,
                                          nonfinite=(~finite).sum(1)).items()}


def format_stats(stats: dict[str, list[float]]) -> str:
    """One list per statistic, a value per channel."""
    return "; ".join(f"{k} [{', '.join(f'{v:.3g}' for v in values)}]" for k, values in stats.items())


def gradient_norms(grads: list[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of each tensor as one vector: one multi-tensor kernel call, one host sync."""
    return torch.stack(torch._foreach_norm(grads)).float()
