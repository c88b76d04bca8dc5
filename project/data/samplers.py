"""One training sampler for one process or many: shuffled or class-balanced, seeded per epoch.

Every rank computes the same global draw from (seed, epoch) and takes every ``num_replicas``-th
element from its ``rank``: the shares are disjoint, their union is the whole draw, and the next
epoch draws anew. With ``weights`` the draw is with replacement in proportion to the weights,
like ``WeightedRandomSampler``; without, it is a permutation, like ``DistributedSampler``. Each
index comes with a per-sample seed for the Dataset's augmentation (see ``ImageDataset``).

It subclasses ``DistributedSampler`` so that Lightning keeps it as it is under DDP and calls
``set_epoch`` on it before each epoch.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import DistributedSampler

SEED_RANGE = 2**62


class EpochSampler(DistributedSampler):
    def __init__(
        self,
        num_items: int,
        weights: Sequence[float] | torch.Tensor | None = None,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
    ) -> None:
        # Not calling DistributedSampler.__init__: it needs a dataset and a process group.
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, {num_replicas})")
        self.num_items, self.shuffle, self.seed = num_items, shuffle, seed
        self.num_replicas, self.rank, self.epoch = num_replicas, rank, 0
        self.drop_last = False  # read by Lightning as on a DistributedSampler; never dropped here
        self.weights = None if weights is None else torch.as_tensor(weights, dtype=torch.double)
        if self.weights is not None and len(self.weights) != num_items:
            raise ValueError("one weight per item is needed")
        self.num_samples = math.ceil(num_items / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def global_draw(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(indices, seeds) of the whole epoch, identical on every rank."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        if self.weights is not None:
            indices = torch.multinomial(self.weights, self.total_size, True, generator=g)
        elif self.shuffle:
            indices = torch.randperm(self.num_items, generator=g)
        else:
            indices = torch.arange(self.num_items)
        if len(indices) < self.total_size:  # pad by repeating, as DistributedSampler does
            reps = math.ceil(self.total_size / len(indices))
            indices = indices.repeat(reps)
        indices = indices[: self.total_size]
        seeds = torch.randint(0, SEED_RANGE, (self.total_size,), generator=g)
        return indices, seeds

    def __iter__(self) -> Iterator[tuple[int, int]]:
        indices, seeds = self.global_draw()
        mine = slice(self.rank, self.total_size, self.num_replicas)
        return iter(zip(indices[mine].tolist(), seeds[mine].tolist(), strict=True))

    def __len__(self) -> int:
        return self.num_samples


def class_balanced_weights(targets: Sequence[int], num_classes: int) -> torch.Tensor:
    """Weight 1/count(class) per sample, so each class is drawn equally often on average."""
    labels = torch.as_tensor(targets)
    counts = torch.bincount(labels, minlength=num_classes).clamp(min=1)
    return (1.0 / counts.double())[labels]
