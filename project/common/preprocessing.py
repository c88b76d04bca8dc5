"""What a model expects of its input, one record for training, checkpoints, exports and infer.py."""

import math
from dataclasses import asdict, dataclass
from typing import Literal

from project.errors import ConfigError, require, require_all

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
INTERPOLATIONS = ("bilinear", "bicubic", "nearest")


@dataclass(frozen=True)
class Input:
    """The input settings (``model.input``); null: the weights' own, else ImageNet's."""

    size: int | None = None
    crop_ratio: float | None = None
    interpolation: Literal["bilinear", "bicubic", "nearest"] | None = None
    mean: list[float] | None = None
    std: list[float] | None = None

    @classmethod
    def of(cls, value: "Input | dict | int") -> "Input":
        """From the config (a group), a checkpoint (a dict) or Python (``input=32``: the size)."""
        return cls(value) if isinstance(value, int) else from_plain(cls, value, "model.input")


@dataclass(frozen=True)
class Preprocessing:
    """Evaluation resizes to ``resize_size`` and center-crops ``image_size``, then normalises."""

    image_size: int = 224
    crop_ratio: float = 0.875
    interpolation: str = "bilinear"
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD

    def __post_init__(self) -> None:
        require(isinstance(self.image_size, int) and self.image_size >= 1, "model.input.size",
                "must be an integer >= 1", self.image_size)  # before the rows compare it
        require_all(
            (self.image_size <= 16384, "model.input.size", "must be at most 16384 pixels", self.image_size),
            (0 < self.crop_ratio <= 1, "model.input.crop_ratio", "must be in (0, 1]", self.crop_ratio),
            (self.interpolation in INTERPOLATIONS, "model.input.interpolation",
             f"must be one of {', '.join(INTERPOLATIONS)}", self.interpolation))
        require(len(self.mean) == 3 and len(self.std) == 3 and min(self.std) > 0
                and all(math.isfinite(v) for v in (*self.mean, *self.std)), "model.input.mean/std",
                "need three finite values each, std above 0", (self.mean, self.std))

    @property
    def resize_size(self) -> int:
        return round(self.image_size / self.crop_ratio)


def plain(record) -> dict:
    """A settings dataclass as a config or checkpoint holds it: plain values, tuples as lists."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(record).items()}


def from_plain(cls, value, key: str):
    """``value`` as the dataclass ``cls`` when it is a config group's or checkpoint's dict (lists as
    tuples); else as it is. A key ``cls`` lacks is one line naming ``key`` and the keys it has."""
    if not isinstance(value, dict):
        return value
    unknown = set(value) - set(cls.__dataclass_fields__)
    if unknown:
        raise ConfigError(f"{key} has no {', '.join(sorted(unknown))}: its keys are "
                          f"{', '.join(cls.__dataclass_fields__)}")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in value.items()})
