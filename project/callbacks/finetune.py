"""Staged fine-tuning: the new head alone first, then the whole network (configs/presets/finetune.yaml).

Freezing lives here and only here, as in Lightning's fine-tuning example: while frozen, the
backbone's parameters get no gradients (so no update, weight decay or optimiser state) and its
norm layers stay in eval mode (their running statistics do not move). The parameter groups and
the schedule do not change: every group exists from the start, so a resume restores them as
they were.
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import Callback
from torch import nn

NORM_LAYERS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm, nn.GroupNorm, nn.LayerNorm)


class FreezeBackbone(Callback):
    """Train the head alone for ``epochs`` epochs. Under DDP the frozen parameters get no
    gradients: use ``trainer.strategy: ddp_find_unused_parameters_true``."""

    def __init__(self, epochs: int = 2) -> None:
        if epochs < 0:
            raise ValueError(f"FreezeBackbone epochs must be 0 or more, got {epochs}")
        self.epochs = epochs
        self.trainable: set[int] = set()

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # what the network leaves trainable before any freezing here: layers it froze for good
        # (a factory's frozen stem) stay frozen when the backbone thaws; a second fit of the same
        # network (a notebook's, after one that ended frozen) keeps what the first one found
        params = {id(p): p.requires_grad for p in pl_module.net.parameters()}
        if not self.trainable & params.keys():
            self.trainable = {i for i, trainable in params.items() if trainable}

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # every epoch: Lightning restores each module's mode after validation, and a resumed
        # run starts at its own epoch
        set_backbone_frozen(pl_module.net, pl_module.head_name, trainer.current_epoch < self.epochs,
                            self.trainable)


def set_backbone_frozen(net: nn.Module, head_name: str, frozen: bool, trainable: set[int]) -> None:
    """Freeze or thaw the backbone's parameters among ``trainable`` (ids); the rest keep their state."""
    head_params = {id(p) for p in net.get_submodule(head_name).parameters()}
    for p in net.parameters():
        if id(p) not in head_params and id(p) in trainable:
            p.requires_grad_(not frozen)
    for module in net.modules():  # called in training mode: unfrozen norms train again
        params = [id(p) for p in module.parameters()]
        if (isinstance(module, NORM_LAYERS) and not set(params) & head_params
                and (not params or set(params) & trainable)):
            module.train(not frozen)
