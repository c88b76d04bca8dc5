"""FSDP set up for this project, so a YAML preset can select it with plain values."""

from __future__ import annotations

import functools

from lightning.pytorch.strategies import FSDPStrategy
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy


class ShardedStrategy(FSDPStrategy):
    """Fully sharded data parallel: parameters, gradients and optimiser state split across GPUs.

    For backbones too big for one card (vit_h_14, regnet_y_128gf...). Submodules with at least
    ``min_params`` parameters become their own shard unit. ``use_orig_params`` keeps the
    parameters addressable, which the two LR groups (backbone and head) need. Checkpoints are
    gathered into one full file (``state_dict_type="full"``), loadable without FSDP.
    """

    def __init__(self, min_params: int = 1_000_000, sharding_strategy: str = "FULL_SHARD",
                 cpu_offload: bool = False, **kwargs) -> None:
        policy = functools.partial(size_based_auto_wrap_policy, min_num_params=min_params)
        super().__init__(auto_wrap_policy=policy, sharding_strategy=sharding_strategy,
                         cpu_offload=cpu_offload, use_orig_params=True, state_dict_type="full",
                         **kwargs)
