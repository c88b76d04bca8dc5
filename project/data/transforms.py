"""Train and eval pipelines (torchvision.transforms.v2) on uint8 CHW tensors.

Both start from the decoded uint8 image (from disk or from the in-memory cache), so the two
sources give identical outputs. Evaluation is deterministic: resize the short side, center crop,
normalise, with the size ratio, interpolation, mean and std of the pretrained weights
(:class:`Preprocessing`). Training draws fresh random variants every epoch from the named
settings of :class:`Augmentation`, in the spirit of torchvision's reference presets and timm's
flags.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import torch
from torchvision.transforms import InterpolationMode, v2

from project.errors import require

log = logging.getLogger(__name__)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
AutoAugment = Literal["none", "randaugment", "trivialaugment", "augmix"]
Interpolation = Literal["bilinear", "bicubic", "nearest"]


@dataclass(frozen=True)
class Preprocessing:
    """What the pretrained weights expect: the same numbers for training, evaluation, the
    checkpoint, the ONNX metadata, ``predict`` and ``infer.py``."""

    image_size: int = 224
    crop_ratio: float = 0.875  # eval: resize the short side to image_size / crop_ratio
    interpolation: Interpolation = "bilinear"
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD

    def __post_init__(self) -> None:
        require(self.image_size >= 1, "data.image_size", "must be 1 or more", self.image_size)
        require(0 < self.crop_ratio <= 1, "data.crop_ratio", "must be in (0, 1]", self.crop_ratio)
        require(self.interpolation in ("bilinear", "bicubic", "nearest"), "data.interpolation",
                "must be bilinear, bicubic or nearest", self.interpolation)
        require(len(self.mean) == 3 and len(self.std) == 3 and min(self.std) > 0, "data.mean/std",
                "need three values each, std above 0", (self.mean, self.std))

    @property
    def resize_size(self) -> int:
        return round(self.image_size / self.crop_ratio)

    @property
    def mode(self) -> InterpolationMode:
        return InterpolationMode(self.interpolation)


@dataclass(frozen=True)
class Augmentation:
    """Random training augmentation; every field is a ``data.*`` setting.

    Defaults suit photos. Characters, digits and documents want ``hflip: 0`` (a mirrored 3 is
    not a 3); aerial, satellite and microscopy images can take ``vflip: 0.5`` too.
    """

    hflip: float = 0.5  # probability of a horizontal flip
    vflip: float = 0.0  # probability of a vertical flip
    crop_scale: tuple[float, float] = (0.6, 1.0)  # area share kept by the random resized crop
    color_jitter: float = 0.2  # brightness, contrast and saturation jitter (0: off)
    auto_augment: AutoAugment = "none"
    random_erasing: float = 0.0  # probability of erasing a random rectangle

    def __post_init__(self) -> None:
        for key in ("hflip", "vflip", "random_erasing"):
            value = getattr(self, key)
            require(0 <= value <= 1, f"data.{key}", "must be a probability in [0, 1]", value)
        low, high = self.crop_scale
        require(0 < low <= high <= 1, "data.crop_scale", "must be [min, max] with 0 < min <= max <= 1",
                list(self.crop_scale))
        require(0 <= self.color_jitter <= 1, "data.color_jitter", "must be in [0, 1]",
                self.color_jitter)
        require(self.auto_augment in AutoAugment.__args__, "data.auto_augment",
                f"must be one of {', '.join(AutoAugment.__args__)}", self.auto_augment)


def _normalise(pre: Preprocessing) -> list[v2.Transform]:
    return [v2.ToDtype(torch.float32, scale=True), v2.Normalize(pre.mean, pre.std)]


def _auto_augment(policy: AutoAugment, mode: InterpolationMode) -> list[v2.Transform]:
    if policy == "randaugment":
        return [v2.RandAugment(interpolation=mode)]
    if policy == "trivialaugment":
        return [v2.TrivialAugmentWide(interpolation=mode)]
    if policy == "augmix":
        return [v2.AugMix(interpolation=mode)]
    return []


def train_transforms(pre: Preprocessing, aug: Augmentation | None = Augmentation()) -> v2.Compose:
    """Random resized crop, flips, auto-augment, colour jitter, random erasing; or, with
    ``aug=None``, the plain evaluation pipeline (for checks that need no randomness).

    The crop and the policies run on uint8 (torchvision's fast path), the jitter on floats
    (no uint8 round trips); no hue jitter, as in timm's default.
    """
    if aug is None:
        return eval_transforms(pre)
    steps: list[v2.Transform] = [
        v2.RandomResizedCrop(pre.image_size, scale=aug.crop_scale, interpolation=pre.mode,
                             antialias=True)]
    if aug.hflip:
        steps.append(v2.RandomHorizontalFlip(aug.hflip))
    if aug.vflip:
        steps.append(v2.RandomVerticalFlip(aug.vflip))
    steps += _auto_augment(aug.auto_augment, pre.mode)
    steps.append(v2.ToDtype(torch.float32, scale=True))
    if aug.color_jitter:
        j = aug.color_jitter
        steps.append(v2.ColorJitter(brightness=j, contrast=j, saturation=j))
    steps.append(v2.Normalize(pre.mean, pre.std))
    if aug.random_erasing:
        steps.append(v2.RandomErasing(aug.random_erasing, value=0))
    return v2.Compose(steps)


def eval_transforms(pre: Preprocessing) -> v2.Compose:
    """Resize the short side to ``image_size / crop_ratio``, then center-crop ``image_size``."""
    return v2.Compose([
        v2.Resize(pre.resize_size, interpolation=pre.mode, antialias=True),
        v2.CenterCrop(pre.image_size),
        *_normalise(pre),
    ])


def check_scale_agreement(pre: Preprocessing, aug: Augmentation) -> None:
    """Say so when objects will look bigger or smaller in training than in evaluation.

    Evaluation keeps a ``crop_ratio**2`` share of the (square) image; a training crop keeps an
    area share drawn uniformly from ``crop_scale``. When ``crop_ratio**2`` is outside that range
    the model never trains at the scale it is evaluated at.
    """
    share = pre.crop_ratio ** 2
    low, high = aug.crop_scale
    if not low <= share <= high:
        log.warning("Notice: evaluation keeps %.0f%% of each image (crop_ratio %.3f) but training "
                    "crops keep %.0f-%.0f%% (data.crop_scale): objects will have another apparent "
                    "size in evaluation. Widen data.crop_scale to include %.2f.",
                    100 * share, pre.crop_ratio, 100 * low, 100 * high, share)


def denormalise(batch: torch.Tensor, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> torch.Tensor:
    """Undo the normalisation for display: float images in 0..1."""
    m = torch.tensor(mean, device=batch.device).view(-1, 1, 1)
    s = torch.tensor(std, device=batch.device).view(-1, 1, 1)
    return (batch.float() * s + m).clamp(0, 1)
