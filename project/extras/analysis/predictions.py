"""The one per-image prediction pass: each decodable image's logits with its dataset index.

Calibration, suspect labels, the evaluation report, the analysis dashboards and ``predict`` all
call :func:`predict_dataset`, so an image is predicted the same way everywhere: float32, no
autocast, eval mode, undecodable files left out (their indices are missing from ``index``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from project.data.datasets import collate_skipping_bad
from project.errors import ProjectError


def calibrated_probabilities(logits: torch.Tensor, temperature: torch.Tensor | float = 1.0) -> torch.Tensor:
    """``softmax(logits / T)`` of a one-class-per-image model, for the analyses (the answers of
    every task: ``project/tasks/answers.py``)."""
    return (logits.float() / temperature).softmax(-1)


class Indexed(Dataset):
    """``dataset[i]`` as ``(i, item)``: the index travels with the image through the loader."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, i: int):
        item = self.dataset[i]
        return None if item is None else (i, *item)


@torch.inference_mode()
def predict_dataset(model: nn.Module, dataset: Dataset, batch_size: int = 64,
                    device: str | torch.device = "cpu", num_workers: int = 0,
                    mirrored: bool = False) -> dict[str, torch.Tensor]:
    """``{"index", "logits", "target"}`` of every decodable image of ``dataset`` (items are
    ``(image, label)``), and ``"mirrored"``: the logits of the horizontally flipped images
    (test-time augmentation), when asked."""
    model = model.to(device).eval()
    parts: dict[str, list[torch.Tensor]] = {"index": [], "logits": [], "target": []}
    if mirrored:
        parts["mirrored"] = []
    loader = DataLoader(Indexed(dataset), batch_size=batch_size, num_workers=num_workers,
                        collate_fn=collate_skipping_bad)
    for batch in loader:
        if batch is None:
            continue
        index, x, y = batch
        x = x.to(device)
        parts["index"].append(index)
        parts["logits"].append(model(x).float().cpu())
        parts["target"].append(torch.as_tensor(y))
        if mirrored:
            parts["mirrored"].append(model(x.flip(-1)).float().cpu())
    if not parts["index"]:
        raise ProjectError("no decodable images to predict (run `python -m project check-data`)")
    return {k: torch.cat(v) for k, v in parts.items()}


def check_mirror_tta(data_hparams: dict) -> None:
    """Mirror-image test-time augmentation only for a model trained with flips: with
    ``hflip: 0`` (digits, text) a mirrored image is not of the same class."""
    augmentation = data_hparams.get("augmentation") or {}
    if augmentation.get("hflip", 0.5) == 0 or data_hparams.get("hflip") == 0:
        raise ProjectError("--tta hflip: this model was trained without horizontal flips "
                           "(data.augmentation.hflip: 0), so mirrored images are not of its classes; "
                           "leave --tta off")
