"""The focal loss, loaded only when ``model.loss: focal`` chooses it."""

from __future__ import annotations

import torch
from torch import nn

from project.tasks.base import Task


def focal(task: Task, logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None,
          gamma: float = 2.0) -> torch.Tensor:
    """Lin et al. (2017): ``-(1 - p)^gamma log p`` of the true class, so that images classified well
    weigh little; soft targets (MixUp, smoothing) weigh each class's term."""
    log_p = logits.float().log_softmax(-1)
    n, smoothing = logits.shape[-1], task.setting("label_smoothing", 0.0)
    soft = nn.functional.one_hot(target, n).float() if target.dim() == 1 else target.float()
    if smoothing:
        soft = soft * (1 - smoothing) + smoothing / n
    terms = -soft * (1 - log_p.exp()) ** gamma * log_p
    if weight is not None:
        terms = terms * weight
    return terms.sum(-1).mean()
