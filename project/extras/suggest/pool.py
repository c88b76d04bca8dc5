"""The unlabeled pool as the ranking sees it: each decodable image's class probabilities and
embedding, from one forward pass; the labeled images' embeddings only when a strategy asks.

The embedding is the input of the network's head (``model.head_name``), caught by a forward
hook during the pass that gives the logits: one pass, and the same features the head decides on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from project.data.datasets import ImageDataset
from project.data.folders import Sample
from project.data.images import needed_side
from project.data.transforms import eval_transforms
from project.errors import ProjectError
from project.extras.analysis.predictions import predict_dataset


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


def forward_pass(model, paths: list[str], batch_size: int = 64, device: str = "cpu",
                 num_workers: int = 0) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """(indices of the decodable ``paths``, their logits, their embeddings) from one pass of
    ``predict_dataset`` with a hook on the head's input."""
    head: nn.Module = model.net.get_submodule(model.head_name)
    caught: list[torch.Tensor] = []
    hook = head.register_forward_hook(lambda _m, inputs, _out: caught.append(
        inputs[0].detach().flatten(1).float().cpu()))
    pre = model.preprocessing
    dataset = ImageDataset([Sample(p, -1) for p in paths], eval_transforms(pre), short_side=needed_side(pre))
    try:
        out = predict_dataset(model, dataset, batch_size, device, num_workers)
    except ProjectError as err:  # not one decodable image
        raise ProjectError(f"none of the {len(paths)} files could be decoded as an image "
                           "(python -m project check-data DIR says why)") from err
    finally:
        hook.remove()
    embeddings = torch.cat(caught)
    if len(embeddings) != len(out["index"]):
        raise ProjectError(f"the head '{model.head_name}' ran {len(embeddings)} times for "
                           f"{len(out['index'])} images: its input is not one embedding per image")
    return out["index"].tolist(), out["logits"], embeddings


def embed_pool(model, paths: list[str], batch_size: int = 64, device: str = "cpu", num_workers: int = 0,
               labeled_paths: list[str] | Callable[[], list[str] | None] | None = None) -> Pool:
    """The pool of ``paths`` (undecodable files left out and listed in ``skipped``).
    ``labeled_paths``: the labeled images, or a function that finds them (called only when a
    strategy asks for their embeddings)."""
    index, logits, embeddings = forward_pass(model, paths, batch_size, device, num_workers)
    probs = model.task.probabilities(logits, model.temperature.cpu())  # None: no class distribution
    kept = set(index)

    def load_labeled() -> torch.Tensor | None:
        found = labeled_paths() if callable(labeled_paths) else labeled_paths
        if not found:
            return None
        try:
            return forward_pass(model, found, batch_size, device, num_workers)[2]
        except ProjectError:  # not one of them decodable: k-center measures from the chosen only
            return None

    return Pool([paths[i] for i in index], embeddings, probs, list(model.class_names),
                [p for i, p in enumerate(paths) if i not in kept], model.task.name, load_labeled)
