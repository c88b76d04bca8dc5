"""MixUp and CutMix of training batches (``model.mixup_alpha``/``cutmix_alpha``), loaded when set."""

from torchvision.transforms import v2


def batch_mixing(num_classes: int, mixup_alpha: float, cutmix_alpha: float) -> v2.Transform | None:
    """torchvision's MixUp and/or CutMix on a whole batch (one of the two per batch if both)."""
    mixes = [m(alpha=a, num_classes=num_classes)
             for m, a in ((v2.MixUp, mixup_alpha), (v2.CutMix, cutmix_alpha)) if a > 0]
    if not mixes:
        return None
    return mixes[0] if len(mixes) == 1 else v2.RandomChoice(mixes)
