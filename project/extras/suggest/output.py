"""What ``suggest`` writes: ``to_label.csv`` (a ``label`` column for the person to fill) and a
contact sheet of the same images, ``to_label.png``, both atomically."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import torch

from project.common.files import atomic_path
from project.data.datasets import ImageDataset
from project.data.folders import Sample
from project.data.images import needed_side
from project.data.transforms import eval_transforms

FIELDS = ["image", "label", "suggested", "score", "rank"]
SHEET_COLUMNS = 10


def write_csv(rows: list[dict], path: Path) -> None:
    """One row per image, best first, ``label`` empty: the person's to fill."""
    with atomic_path(path) as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        for r in rows:
            score = "" if not math.isfinite(r["score"]) else f"{r['score']:.6g}"
            writer.writerow({"image": r["image"], "label": "", "suggested": r["suggested"],
                             "score": score, "rank": r["rank"]})


def write_sheet(rows: list[dict], preprocessing, path: Path, strategy: str) -> int:
    """The images of ``rows`` as the model sees them, captioned ``#rank suggested`` and the file
    name; the number shown (0 writes nothing)."""
    from project.extras.analysis.plots import denormalise, grid_figure, save  # matplotlib: here only

    dataset = ImageDataset([Sample(r["image"], -1) for r in rows], eval_transforms(preprocessing),
                           short_side=needed_side(preprocessing))
    shown = [(item[0], r) for r, item in ((r, dataset[i]) for i, r in enumerate(rows)) if item is not None]
    if not shown:
        return 0
    images = denormalise(torch.stack([x for x, _ in shown]), preprocessing.mean, preprocessing.std)
    titles = [f"#{r['rank']} {r['suggested'] or '?'}\n{Path(r['image']).name[:18]}" for _, r in shown]
    save(grid_figure(images, titles, f"to label next ({strategy}): rank and the model's class",
                     cols=SHEET_COLUMNS), path)
    return len(shown)
