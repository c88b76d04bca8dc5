"""Learning from unlabeled images (``data.unlabeled``): an objective adds a loss on a batch of
them to the labeled one. A new method is a class with this ``step`` plus one line in
``OBJECTIVES``; the task says whether it can learn so (``Task.learns_from_unlabeled``) and how
a prediction becomes a pseudo-label (``Task.pseudo_labels``). ``log_epoch`` logs what the
method wants to show once an epoch."""

from __future__ import annotations

import math

import torch
from torch import nn
from torchmetrics import Metric

from project.errors import ConfigError, require_all


class PseudoLabelStats(Metric):
    """Per epoch: the share of unlabeled images whose pseudo-label passed the threshold, and
    the classes those pseudo-labels fell in (summed over ranks)."""

    full_state_update = False

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.add_state("counts", torch.zeros(num_classes, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("seen", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")

    def update(self, target: torch.Tensor, accepted: torch.Tensor) -> None:
        self.counts += torch.bincount(target[accepted], minlength=self.num_classes)
        self.seen += accepted.numel()

    def compute(self) -> dict[str, torch.Tensor]:
        accepted = self.counts.sum()
        return {"above_threshold": accepted / self.seen.clamp(min=1),
                "shares": self.counts / accepted.clamp(min=1)}


class FixMatch(nn.Module):
    """Sohn et al. (2020): the prediction on a weakly augmented view becomes the target of the
    strongly augmented view when its confidence reaches ``threshold``. The labeled images and
    both views go through the network in one batch, so batch norm sees them together."""

    def __init__(self, task, threshold: float = 0.95, weight: float = 1.0) -> None:
        super().__init__()
        self.task, self.threshold, self.weight = task, threshold, weight
        self.stats = PseudoLabelStats(len(task.names))

    def step(self, model: nn.Module, x: torch.Tensor,
             views: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(the labeled images' logits, the weighted unlabeled loss)."""
        weak, strong = views
        logits = model(torch.cat([x, weak, strong]))
        labeled, on_weak, on_strong = logits.split([len(x), len(weak), len(strong)])
        with torch.no_grad():
            target, confidence = self.task.pseudo_labels(on_weak.detach())
            accepted = confidence >= self.threshold
        self.stats.update(target, accepted)
        loss = (self.task.per_image_loss(on_strong, target) * accepted).mean()
        return labeled, self.weight * loss

    def log_epoch(self, module) -> None:
        """The epoch's pseudo-label statistics, summed over ranks (every rank calls it)."""
        if not self.stats.update_count:
            return
        values = self.stats.compute()
        self.stats.reset()
        module.log("train/unlabeled_above_threshold", values["above_threshold"])
        module.log_dict({f"train/pseudo_labels/{name}": share
                         for name, share in zip(module.class_names, values["shares"], strict=True)})


OBJECTIVES: dict[str, type[nn.Module]] = {"fixmatch": FixMatch}


def check_settings(unlabeled) -> None:
    """``data.unlabeled``'s settings (:class:`~project.data.unlabeled.Unlabeled`), each in its range."""
    u = unlabeled
    require_all(
        (u.images is None or bool(str(u.images).strip()), "data.unlabeled.images",
         "must be a folder of images or the labels table (null: none)", u.images),
        (isinstance(u.ratio, int) and u.ratio >= 1, "data.unlabeled.ratio", "must be an integer >= 1",
         u.ratio),
        (0 < u.threshold <= 1, "data.unlabeled.threshold", "must be in (0, 1]", u.threshold),
        (0 <= u.weight < math.inf, "data.unlabeled.weight", "must be >= 0 (finite)", u.weight))
    check_method(u.method)


def check_method(method: str) -> None:
    if method not in OBJECTIVES:
        raise ConfigError(f"data.unlabeled.method '{method}' is not known; choose from "
                          f"{', '.join(OBJECTIVES)}")


def make_objective(settings: dict | None, task) -> nn.Module | None:
    """The objective ``data.unlabeled`` asks for (linked in as ``model.unlabeled``), or None."""
    if not settings:
        return None
    settings = dict(settings)
    method = settings.pop("method", "fixmatch")
    check_method(method)
    if not task.learns_from_unlabeled:
        raise ConfigError(f"data.unlabeled: a {task.name} task does not learn from unlabeled images (pseudo-"
                          "labels need one class per image); remove data.unlabeled.images")
    return OBJECTIVES[method](task, **settings)
