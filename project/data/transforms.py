"""Train and eval pipelines on decoded uint8 images; a new augmentation is a field of
:class:`Augmentation` and a line in :func:`train_transforms`."""

import logging
from dataclasses import dataclass
from typing import Literal

import torch
from torchvision.transforms import InterpolationMode, v2

from project.common.preprocessing import Preprocessing
from project.errors import require_all

log = logging.getLogger(__name__)
AutoAugment = Literal["none", "randaugment", "trivialaugment", "augmix"]


@dataclass(frozen=True)
class Augmentation:
    """Random training augmentation. Defaults suit photos; characters, digits and documents want
    ``hflip: 0`` (a mirrored 3 is not a 3); aerial and microscopy images take ``vflip`` too."""

    hflip: float = 0.5  # probability of a horizontal flip
    vflip: float = 0.0  # probability of a vertical flip
    crop_scale: tuple[float, float] = (0.6, 1.0)  # area share kept by the random resized crop
    color_jitter: float = 0.2  # brightness, contrast and saturation jitter (0: off)
    auto_augment: AutoAugment = "none"  # a learned policy on top
    random_erasing: float = 0.0  # probability of erasing a random rectangle

    def __post_init__(self) -> None:  # a checkpoint stores the crop scale as a list
        object.__setattr__(self, "crop_scale", tuple(self.crop_scale))

    def check(self) -> "Augmentation":
        """A one-line error naming the first setting out of range (not in ``__post_init__``, where
        the config parser would wrap it)."""
        low, high = self.crop_scale
        require_all(
            *((0 <= getattr(self, k) <= 1, f"data.augmentation.{k}", "must be in [0, 1]", getattr(self, k))
              for k in ("hflip", "vflip", "random_erasing", "color_jitter")),
            (0 < low <= high <= 1, "data.augmentation.crop_scale",
             "must be [min, max] with 0 < min <= max <= 1", list(self.crop_scale)),
            (self.auto_augment in AutoAugment.__args__, "data.augmentation.auto_augment",
             f"must be one of {', '.join(AutoAugment.__args__)}", self.auto_augment))
        return self


def train_transforms(pre: Preprocessing, aug: Augmentation | None) -> v2.Compose:
    """Random resized crop, flips, auto-augment (on uint8: faster), colour jitter, random erasing."""
    if aug is None:
        return eval_transforms(pre)
    mode = InterpolationMode(pre.interpolation)
    policies = {"randaugment": v2.RandAugment, "trivialaugment": v2.TrivialAugmentWide,
                "augmix": v2.AugMix}
    steps: list[v2.Transform] = [
        v2.RandomResizedCrop(pre.image_size, scale=aug.crop_scale, interpolation=mode, antialias=True)]
    if aug.hflip:
        steps.append(v2.RandomHorizontalFlip(aug.hflip))
    if aug.vflip:
        steps.append(v2.RandomVerticalFlip(aug.vflip))
    if aug.auto_augment in policies:  # their affine ops take nearest or bilinear on tensors
        policy_mode = mode if mode == InterpolationMode.NEAREST else InterpolationMode.BILINEAR
        steps.append(policies[aug.auto_augment](interpolation=policy_mode))
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
        v2.Resize(pre.resize_size, interpolation=InterpolationMode(pre.interpolation), antialias=True),
        v2.CenterCrop(pre.image_size),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(pre.mean, pre.std),
    ])


def check_scale_agreement(pre: Preprocessing, aug: Augmentation) -> None:
    """A notice when evaluation's share of an image is outside training's ``crop_scale``."""
    share = pre.crop_ratio ** 2
    low, high = aug.crop_scale
    if not low <= share <= high:
        log.warning("Notice: evaluation keeps %.0f%% of each image (crop_ratio %.3f) but training "
                    "crops keep %.0f-%.0f%% (data.augmentation.crop_scale): objects will have "
                    "another apparent size in evaluation. Widen crop_scale to include %.2f.",
                    100 * share, pre.crop_ratio, 100 * low, 100 * high, share)
