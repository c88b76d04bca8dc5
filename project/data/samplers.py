"""Samplers for one process or many: each epoch's draw and each image's augmentation seed depend
on (seed, epoch, position) alone, not on workers, ranks or an interruption."""

import math
from collections.abc import Iterator

import torch
from torch.utils.data import DistributedSampler

SEED_RANGE = 2**62


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of one epoch's random draws: fixed by the run's seed and the epoch alone."""
    return seed * 1_000_003 + epoch


class EpochSampler(DistributedSampler):
    """Every rank's share of one seeded draw: ``draws`` per rank (None: the items once), cycled."""

    def __init__(self, num_items: int, weights: torch.Tensor | None = None, shuffle: bool = True,
                 seed: int = 0, num_replicas: int = 1, rank: int = 0, draws: int | None = None) -> None:
        # no DistributedSampler.__init__: it needs a dataset and a process group (its set_epoch is kept)
        self.num_items, self.shuffle, self.seed = num_items, shuffle, seed
        self.num_replicas, self.rank, self.epoch = num_replicas, rank, 0
        self.drop_last = False  # read by Lightning as on a DistributedSampler; never dropped here
        self.weights = None if weights is None else torch.as_tensor(weights, dtype=torch.double)
        self.num_samples = draws or math.ceil(num_items / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def global_draw(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(indices, seeds) of the whole epoch, identical on every rank."""
        g = torch.Generator().manual_seed(epoch_seed(self.seed, self.epoch))
        if self.weights is not None:
            indices = torch.multinomial(self.weights, self.total_size, True, generator=g)
        elif self.shuffle:
            indices = torch.randperm(self.num_items, generator=g)
        else:
            indices = torch.arange(self.num_items)
        if len(indices) < self.total_size:  # pad by repeating, as DistributedSampler does
            indices = indices.repeat(math.ceil(self.total_size / len(indices)))
        indices = indices[: self.total_size]
        return indices, torch.randint(0, SEED_RANGE, (self.total_size,), generator=g)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        indices, seeds = self.global_draw()
        mine = slice(self.rank, self.total_size, self.num_replicas)
        return iter(zip(indices[mine].tolist(), seeds[mine].tolist(), strict=True))

    def __len__(self) -> int:
        return self.num_samples


class ShardSampler(DistributedSampler):
    """Evaluation: rank r takes every R-th item, unpadded, so each image counts once, of one fixed
    shuffle: a ``limit_val_batches`` below the whole split scores images of every class, not the
    first class folders."""

    def __init__(self, num_items: int, num_replicas: int = 1, rank: int = 0) -> None:
        self.num_items, self.num_replicas, self.rank = num_items, num_replicas, rank
        self.epoch, self.drop_last, self.shuffle = 0, False, False

    def __iter__(self) -> Iterator[int]:
        order = torch.randperm(self.num_items, generator=torch.Generator().manual_seed(0))
        return iter(order[self.rank::self.num_replicas].tolist())

    def __len__(self) -> int:
        return len(range(self.rank, self.num_items, self.num_replicas))
