"""``data.unlabeled``'s settings and how a batch carries them; the rest loads only when used."""

from __future__ import annotations

from dataclasses import dataclass


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
        """A one-line error naming the first setting out of range (the defaults hold)."""
        if self != Unlabeled():
            from project.model.unlabeled import check_settings

            check_settings(self)
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
