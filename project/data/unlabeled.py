"""``data.unlabeled``'s settings and how a batch carries them; the rest loads only when used."""

from __future__ import annotations

import math
from dataclasses import dataclass

from project.errors import require_all


@dataclass(frozen=True)
class Unlabeled:
    """Semi-supervised training: ``images`` a folder of images (any layout), or the labels table
    (``data.labels``) whose rows with an empty label are the unlabeled images; null: off."""

    images: str | None = None
    method: str = "fixmatch"  # model/unlabeled.py's OBJECTIVES
    ratio: int = 7  # unlabeled images per labeled one in each step
    threshold: float = 0.95  # a weak view's confidence needed to become a pseudo-label
    weight: float = 1.0  # of the unlabeled loss beside the labeled one

    def check(self) -> Unlabeled:
        require_all(
            (self.images is None or bool(str(self.images).strip()), "data.unlabeled.images",
             "must be a folder of images or the labels table (null: none)", self.images),
            (isinstance(self.ratio, int) and self.ratio >= 1, "data.unlabeled.ratio",
             "must be an integer >= 1", self.ratio),
            (0 < self.threshold <= 1, "data.unlabeled.threshold", "must be in (0, 1]", self.threshold),
            (0 <= self.weight < math.inf, "data.unlabeled.weight", "must be >= 0 (finite)", self.weight))
        if self.method != Unlabeled.method:  # the default needs no look-up; another must be known
            from project.model.unlabeled import check_method

            check_method(self.method)
        return self

    def objective(self) -> dict | None:
        """What the model needs (linked into ``model.unlabeled``); None when off."""
        if self.images is None:
            return None
        return {"method": self.method, "threshold": self.threshold, "weight": self.weight}


def split_batch(batch) -> tuple:
    """(labeled (x, y) or None, unlabeled ((weak, strong), _) or None) of a training batch."""
    if isinstance(batch, dict):
        return batch.get("labeled"), batch.get("unlabeled")
    return batch, None
