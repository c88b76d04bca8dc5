"""The unlabeled pool as the ranking sees it: each decodable image's class probabilities and
embedding, from one forward pass; the labeled images' embeddings only when a strategy asks.

The embedding is the input of the network's head (``model.head_name``), caught by a forward
hook during the pass that gives the logits: one pass, and the same features the head decides on.
With a ``Network`` (the command's checkpoint), both come from the embedding cache
(``project/extras/embeddings/cache.py``): an image ranked before is not computed again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from project.errors import ProjectError
from project.extras.embeddings.cache import CACHE_ROOT, Network, embed, forward_pass  # noqa: F401


@dataclass
class Pool:
    """The decodable images (``paths``) with their embeddings (N, D); ``probs`` (N, C) only for a
    one-class-per-image model (None otherwise); ``skipped``: the files that could not be decoded."""

    paths: list[str]
    embeddings: torch.Tensor
    probs: torch.Tensor | None = None
    class_names: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    task: str = ""
    load_labeled: Callable[[], torch.Tensor | None] = lambda: None
    _labeled: tuple[torch.Tensor | None] | None = field(default=None, repr=False)  # computed once

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def labeled(self) -> torch.Tensor | None:
        """The labeled images' embeddings (M, D), computed on first use (k-center needs them,
        margin and entropy never pay for them); None when there are none."""
        if self._labeled is None:
            self._labeled = (self.load_labeled(),)
        return self._labeled[0]

    def suggested(self, i: int) -> str:
        """The model's top class for image ``i`` ("" for a model without one class per image)."""
        return self.class_names[int(self.probs[i].argmax())] if self.probs is not None else ""


def embed_pool(model, paths: list[str], batch_size: int = 64, device: str = "cpu", num_workers: int = 0,
               labeled_paths: list[str] | Callable[[], list[str] | None] | None = None,
               network: Network | None = None, cache: str | Path = CACHE_ROOT) -> Pool:
    """The pool of ``paths`` (undecodable files left out and listed in ``skipped``).
    ``labeled_paths``: the labeled images, or a function that finds them (called only when a
    strategy asks for their embeddings). ``network``: ``model`` with its cache key; its embeddings
    and logits are read from and added to the cache under ``cache``."""
    def features(found: list[str]) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        if network is None:
            return forward_pass(model, found, batch_size, device, num_workers)
        done = embed(found, network, cache, batch_size, device, num_workers)
        if not done.paths:
            raise ProjectError(f"none of the {len(found)} files could be decoded as an image "
                               "(python -m project check-data DIR says why)")
        at = {p: i for i, p in enumerate(found)}
        return ([at[p] for p in done.paths], torch.from_numpy(done.logits),
                torch.from_numpy(done.features))

    index, logits, embeddings = features(paths)
    probs = model.task.probabilities(logits, model.temperature.cpu())  # None: no class distribution
    kept = set(index)

    def load_labeled() -> torch.Tensor | None:
        found = labeled_paths() if callable(labeled_paths) else labeled_paths
        if not found:
            return None
        try:
            return features(found)[2]
        except ProjectError:  # not one of them decodable: k-center measures from the chosen only
            return None

    return Pool([paths[i] for i in index], embeddings, probs, list(model.class_names),
                [p for i, p in enumerate(paths) if i not in kept], model.task.name, load_labeled)
