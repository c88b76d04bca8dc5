"""Pieces of the fine-tuning recipe the LightningModule calls: the default optimiser, a real
backbone freeze, MixUp/CutMix of batches, and the test-time augmentation check."""

from __future__ import annotations

import torch
from torch import nn
from torchvision.transforms import v2

from project.errors import ConfigError, require

# Layers whose statistics or affine parameters a frozen backbone keeps as they are.
NORM_LAYERS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm, nn.GroupNorm,
               nn.LayerNorm)


def default_optimizer(params) -> torch.optim.Optimizer:
    """SGD with momentum 0.9 and weight decay 1e-4 (the transfer-learning default); used when
    ``model.optimizer`` is not set. Any ``torch.optim`` class can replace it from the config."""
    return torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=1e-4)


class SharedCallable:
    """A callable kept by reference when its owner is deep-copied."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __deepcopy__(self, memo: dict) -> SharedCallable:
        return self


def check_tta(policy: str, train_hflip: float | None) -> None:
    """Mirror-image TTA only for a model trained with flips: with ``data.hflip: 0`` (digits,
    text) a mirrored image is not of the same class."""
    require(policy in ("none", "hflip"), "--tta", "must be none or hflip", policy)
    if policy == "hflip" and train_hflip == 0:
        raise ConfigError("--tta hflip: this model was trained without horizontal flips "
                          "(data.hflip: 0), so mirrored images are not of its classes; leave "
                          "--tta off")


def batch_mixing(num_classes: int, mixup_alpha: float, cutmix_alpha: float) -> v2.Transform | None:
    """torchvision's MixUp and/or CutMix on a whole batch (one of the two per batch if both)."""
    mixes = []
    if mixup_alpha > 0:
        mixes.append(v2.MixUp(alpha=mixup_alpha, num_classes=num_classes))
    if cutmix_alpha > 0:
        mixes.append(v2.CutMix(alpha=cutmix_alpha, num_classes=num_classes))
    if not mixes:
        return None
    return mixes[0] if len(mixes) == 1 else v2.RandomChoice(mixes)



def set_backbone_frozen(net: nn.Module, head_name: str, frozen: bool, training: bool) -> None:
    """Frozen: backbone parameters get no gradients and its norm layers stay in eval mode (their
    statistics do not move). Called at every epoch start and after every validation, because
    Lightning restores the modules' train/eval modes after validation."""
    head_params = {id(p) for p in net.get_submodule(head_name).parameters()}
    for p in net.parameters():
        if id(p) not in head_params:
            p.requires_grad_(not frozen)
    for module in net.modules():
        if isinstance(module, NORM_LAYERS) and not any(id(p) in head_params for p in module.parameters()):
            module.train(training and not frozen)
