"""Single images behind the numbers: per-image losses, mistakes.csv and the top-losses grid.

The probabilities are those ``predict`` gives (calibrated), and each image's loss is the plain
cross-entropy of its label under them, so the ranking is the one a user would find by hand.
"""

from __future__ import annotations

import csv
from pathlib import Path

import torch
from matplotlib.figure import Figure

from project.common.files import atomic_path
from project.extras.analysis.plots import denormalise, grid_figure
from project.extras.analysis.predictions import calibrated_probabilities

MISTAKE_FIELDS = ["path", "true", "predicted", "probability", "loss", "runner_up",
                  "runner_up_probability", "p_true"]


def sample_path(dataset: object, index: int) -> str:
    """The file of dataset item ``index`` (``#index`` when the dataset does not say)."""
    samples = getattr(dataset, "samples", None)
    if index >= 0 and samples is not None and index < len(samples):
        return str(getattr(samples[index], "path", samples[index]))
    return f"#{index}"


def sample_rows(samples: dict[str, torch.Tensor], class_names: list[str], temperature: float = 1.0,
                dataset: object = None) -> list[dict]:
    """One row per image: path, true and predicted class, p(predicted), loss, runner-up, p(true),
    highest loss first."""
    probs = calibrated_probabilities(samples["logits"].double(), temperature).double()
    target = samples["target"].long()
    top_p, top_i = probs.topk(min(2, probs.shape[1]), dim=-1)
    p_true = probs.gather(1, target[:, None])[:, 0]
    # from the logits: -log(p) of a saturated softmax would be clipped, and every such image tie
    loss = torch.nn.functional.cross_entropy(samples["logits"].double() / temperature, target,
                                             reduction="none")
    rows = []
    for k in range(len(target)):
        second = int(top_i[k, -1])
        rows.append({
            "index": int(samples["index"][k]),
            "path": sample_path(dataset, int(samples["index"][k])),
            "true": class_names[int(target[k])],
            "predicted": class_names[int(top_i[k, 0])],
            "probability": float(top_p[k, 0]),
            "loss": float(loss[k]),
            "runner_up": class_names[second],
            "runner_up_probability": float(top_p[k, -1]) if top_i.shape[1] > 1 else 0.0,
            "p_true": float(p_true[k]),
        })
    return sorted(rows, key=lambda r: -r["loss"])


def mistakes(rows: list[dict]) -> list[dict]:
    """The misclassified rows, highest loss first."""
    return [r for r in rows if r["true"] != r["predicted"]]


def write_mistakes_csv(rows: list[dict], path: Path) -> None:
    """Every misclassified image (highest loss first), atomically."""
    with atomic_path(path) as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=MISTAKE_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for r in mistakes(rows):
            writer.writerow({**r, **{k: f"{r[k]:.6f}" for k in
                                     ("probability", "loss", "runner_up_probability", "p_true")}})


def top_losses_figure(rows: list[dict], dataset: object, mean, std, title: str,
                      count: int = 24) -> Figure | None:
    """The ``count`` highest-loss images of ``rows`` (sorted), titled true / predicted /
    p(predicted) and loss; None when no image can be loaded."""
    images, titles, wrong = [], [], []
    for r in rows:
        if len(images) >= count:
            break
        item = dataset[r["index"]] if dataset is not None and r["index"] >= 0 else None
        if item is None:
            continue
        images.append(item[0])
        titles.append(f"{r['true']} / {r['predicted']} / {r['probability']:.2f}\n"
                      f"loss {r['loss']:.2f}  {Path(r['path']).name[:18]}")
        wrong.append(r["true"] != r["predicted"])
    if not images:
        return None
    return grid_figure(denormalise(torch.stack(images), mean, std), titles,
                       f"{title}: true / predicted / probability", wrong, cols=6)
