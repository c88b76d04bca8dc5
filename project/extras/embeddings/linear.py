"""A linear layer on frozen embeddings, fitted full-batch with L-BFGS on standardised features
under L2: with the task's loss (softmax cross-entropy for one class per image, BCE for several
labels, ...). A few lines of torch instead of a scikit-learn dependency; probe fits one, suspects
fits one per fold for out-of-fold probabilities."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from project.errors import ProjectError


@dataclass
class LinearProbe:
    """A fitted linear layer with the standardisation of the features it was fitted on."""

    mean: torch.Tensor
    scale: torch.Tensor
    layer: nn.Linear

    @torch.no_grad()
    def logits(self, features: np.ndarray) -> torch.Tensor:
        return self.layer((torch.as_tensor(features, dtype=torch.float32) - self.mean) / self.scale)

    def probabilities(self, features: np.ndarray) -> np.ndarray:
        return self.logits(features).softmax(-1).numpy()


def single_labels(samples, what: str) -> np.ndarray:
    """The class index of each sample; a table of another task (several labels, numbers) is refused."""
    if not all(isinstance(s.label, int | np.integer) for s in samples):
        raise ProjectError(f"{what}: a linear classifier on embeddings is made for one class per image; "
                           "these labels are of another task (several labels or numbers per image)")
    return np.array([int(s.label) for s in samples], dtype=np.int64)


def fit_linear(features: np.ndarray, labels: np.ndarray | torch.Tensor, num_classes: int, l2: float = 1e-2,
               steps: int = 200, loss: Callable = nn.functional.cross_entropy) -> LinearProbe:
    """A linear layer minimising ``loss(logits, labels)`` plus ``l2`` weight decay (of the mean
    loss): softmax regression by default; deterministic, seconds on CPU."""
    x = torch.as_tensor(features, dtype=torch.float32)
    y = torch.as_tensor(labels)
    mean, scale = x.mean(0), x.std(0, unbiased=False).clamp_min(1e-6)
    x = (x - mean) / scale
    layer = nn.Linear(x.shape[1], num_classes)
    nn.init.zeros_(layer.weight)
    nn.init.zeros_(layer.bias)
    opt = torch.optim.LBFGS(layer.parameters(), lr=1, max_iter=steps, history_size=20,
                            line_search_fn="strong_wolfe", tolerance_grad=1e-6, tolerance_change=1e-9)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        value = loss(layer(x), y) + 0.5 * l2 * layer.weight.pow(2).sum()
        value.backward()
        return value

    with torch.enable_grad():
        opt.step(closure)
    return LinearProbe(mean, scale, layer)


def out_of_fold(features: np.ndarray, samples, num_classes: int, folds: int = 5,
                seed: int = 0) -> tuple[np.ndarray, list[int]]:
    """(N, C) probabilities of each image from a linear model fitted on the other folds (stratified),
    and each image's fold: no image's label vouches for itself."""
    from project.data.splits import stratified_folds

    labels = single_labels(samples, "suspects --method embeddings")
    counts = np.bincount(labels, minlength=num_classes)
    if counts[counts > 0].min() < folds:
        raise ProjectError(f"--folds {folds}: a class has only {counts[counts > 0].min()} training "
                           "images; use fewer folds")
    fold_of = stratified_folds(list(samples), folds, seed)
    fold = np.array(fold_of)
    probs = np.zeros((len(samples), num_classes), dtype=np.float32)
    for k in range(folds):
        held = fold == k
        model = fit_linear(features[~held], labels[~held], num_classes)
        probs[held] = model.probabilities(features[held])
    return probs, fold_of
