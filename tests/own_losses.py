"""Own losses for the loss seam's tests (``model.loss=tests.own_losses:smoothed``), with the
slips a user makes in one."""

from torch.nn import functional as F


def smoothed(task, logits, target, weight=None):
    """Cross-entropy that reads the label smoothing when called, as the docs' example does."""
    smoothing = task.setting("label_smoothing", 0.0)
    return F.cross_entropy(logits, target, weight=weight, label_smoothing=smoothing)


def plain_signature(logits, target):
    """torch's own shape of a loss: the seam calls it with the task first."""
    return F.cross_entropy(logits, target)


def per_image(task, logits, target, weight=None):
    """Left unreduced: one value per image."""
    return F.cross_entropy(logits, target, reduction="none")


NOT_A_FUNCTION = 3
