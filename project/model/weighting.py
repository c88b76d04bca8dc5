"""``model.class_weights`` as the loss takes them, loaded by a run that sets them."""

import torch

from project.errors import require


def class_weights(weights: list[float] | str, label_stats: dict, num_classes: int) -> torch.Tensor:
    """The configured weights; ``balanced``: from the training split's counts, which the data linked in."""
    if weights == "balanced":
        weights = label_stats.get("balanced_weights")
        require(weights is not None, "model.class_weights", "balanced needs the training "
                "split's counts (model.label_stats, which the CLI links from the data)", "balanced")
    require(len(weights) == num_classes, "model.class_weights",
            f"needs one weight per class ({num_classes})", weights)
    return torch.tensor(weights, dtype=torch.float32)
