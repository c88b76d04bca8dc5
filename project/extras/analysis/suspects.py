"""Suspect labels: training images whose label the model, not having seen them, disagrees with.

    python -m project suspects [--ckpt_path CKPT|RUN | --config FILE] [--data_dir DIR] [--top 32]
    python -m project suspects --method refit [--config configs/train.yaml] [overrides] [--folds 3]

``--method embeddings`` (the default, seconds): a linear classifier on the cached embeddings
(``project/extras/embeddings/``) of the network (a checkpoint, or with ``--config`` the config's
pretrained backbone), fitted on K-1 stratified folds, predicts the held-out fold.
``--method refit`` (minutes to hours): the training images are split into K stratified folds;
for each fold a model is trained with the run's own recipe (the config, its presets and
``--key=value`` overrides) on the other K-1 folds and predicts the held-out fold.
Both give out-of-fold predictions (as cleanlab's ``find_label_issues`` expects them): every
image is judged by a model that never saw its label, and a memorised
wrong label cannot vouch for itself. Images are ranked by the probability that model gives to
their *given* label, lowest first (cleanlab's "self-confidence" score).

Writes ``suspects.csv`` (rank, path, given label, predicted class, p(given), p(predicted), fold,
every training image) and ``suspects.png`` (the ``--top`` most suspect images, titled given /
predicted / p(given)). Look at the top of the list, fix or remove wrong files, train again.

A checkpoint fine-tuned on these very labels has partly learnt the wrong ones into its features;
``--config`` (pretrained features) or refit avoid that. The refit folds are trained without the
config's callbacks (no checkpoints, logs, EMA, validation):
K short fits are the cost; ``--trainer.max_epochs=N`` makes them shorter.
"""

from __future__ import annotations

import argparse
import csv
import logging
import time
from pathlib import Path

import numpy as np
import torch

from project.common.files import atomic_path
from project.data.folders import FolderSplits, Sample
from project.data.splits import stratified_folds
from project.errors import ConfigError
from project.extras.analysis.plots import denormalise, grid_figure, save
from project.extras.analysis.predictions import predict_dataset

log = logging.getLogger("project")
FIELDS = ["rank", "path", "given", "predicted", "p_given", "p_predicted", "fold"]
# What each fold run leaves out: validation (the held-out fold is predicted once, at the end).
FOLD_ARGS = ["--trainer.limit_val_batches=0", "--trainer.num_sanity_val_steps=0"]


def rank_suspects(samples: list[Sample], probs: torch.Tensor, fold_of: list[int],
                  class_names: list[str]) -> list[dict]:
    """Rows sorted by p(given label), lowest first (ties: the more confident other class first)."""
    given = torch.tensor([s.label for s in samples])
    p_given = probs.gather(1, given[:, None])[:, 0]
    p_pred, pred = probs.max(1)
    order = sorted(range(len(samples)), key=lambda i: (float(p_given[i]), -float(p_pred[i])))
    return [{"rank": r + 1, "path": samples[i].path, "given": class_names[samples[i].label],
             "predicted": class_names[int(pred[i])], "p_given": float(p_given[i]),
             "p_predicted": float(p_pred[i]), "fold": fold_of[i]} for r, i in enumerate(order)]


def out_of_fold_probabilities(overrides: list[str], folds: int, seed: int = 0):
    """(training samples, class names, out-of-fold probabilities, fold of each sample, data
    module of the last fold): K fits with the config's recipe."""
    from project.extras.diagnose.tools import build

    probs = fold_of = samples = names = dm = seen = None
    for k in range(folds):
        cli = build(FOLD_ARGS, overrides)
        dm = cli.datamodule
        full = dm.splits
        if not cli.model.task.gives_probabilities:
            raise ConfigError(f"suspects ranks images by the probability of their one label; data.labels "
                              f"describes a {full.task} task, which gives none (evaluate's "
                              "mistakes.csv lists the test images it gets most wrong)")
        if samples is None:
            samples, names = list(full.train), full.classes
            counts = np.bincount([s.label for s in samples], minlength=len(names))
            if counts.min() < folds:
                raise ConfigError(f"--folds {folds}: class '{names[int(counts.argmin())]}' has "
                                  f"only {counts.min()} training images; use fewer folds")
            fold_of = stratified_folds(samples, folds, seed)
            probs = torch.zeros(len(samples), len(names))
            seen = torch.zeros(len(samples), dtype=torch.bool)
        held = [i for i, f in enumerate(fold_of) if f == k]
        # the same data module, its training split cut into "train on" and "predict"
        dm.splits = FolderSplits(full.classes, [s for s, f in zip(samples, fold_of, strict=True)
                                                if f != k], [samples[i] for i in held], [])
        start = time.perf_counter()
        cli.trainer.fit(cli.model, dm)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        out = predict_dataset(cli.model, dm.datasets["val"], dm.batch_size, device)
        predicted = torch.tensor(held)[out["index"]]
        probs[predicted] = cli.model.task.probabilities(out["logits"])
        seen[predicted] = True
        log.info("Fold %d/%d: trained on %d images, predicted %d held-out images (%.0f s)",
                 k + 1, folds, len(samples) - len(held), len(out["index"]),
                 time.perf_counter() - start)
    if not seen.all():  # undecodable: no prediction, so no place in the ranking
        log.info("Notice: %d training images could not be decoded and are not ranked "
                 "(python -m project check-data lists them)", int((~seen).sum()))
    keep = seen.nonzero().flatten().tolist()
    return ([samples[i] for i in keep], names, probs[seen], [fold_of[i] for i in keep], dm)


def write_suspects(rows: list[dict], out: Path, pre, top: int, how: str = "out of fold") -> None:
    """suspects.csv (every row) and suspects.png (the ``top`` rows' images, with ``pre``: the
    network's preprocessing)."""
    with atomic_path(out / "suspects.csv") as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows({**r, "p_given": f"{r['p_given']:.6f}",
                          "p_predicted": f"{r['p_predicted']:.6f}"} for r in rows)
    from project.data.datasets import ImageDataset
    from project.data.images import needed_side
    from project.data.transforms import eval_transforms

    shown = rows[:top]
    dataset = ImageDataset([Sample(r["path"], 0) for r in shown], eval_transforms(pre),
                           short_side=needed_side(pre))
    items = [(dataset[i], r) for i, r in enumerate(shown)]
    items = [(item[0], r) for item, r in items if item is not None]
    if items:
        titles = [f"{r['given']} / {r['predicted']} / {r['p_given']:.2f}\n"
                  f"#{r['rank']} {Path(r['path']).name[:18]}" for _, r in items]
        images = denormalise(torch.stack([x for x, _ in items]), pre.mean, pre.std)
        save(grid_figure(images, titles, f"suspect labels: given / predicted / p(given), {how}",
                         [r["given"] != r["predicted"] for _, r in items], cols=6), out / "suspects.png")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m project suspects",
                                description="Rank training images by how strongly out-of-fold "
                                            "models disagree with their label",
                                epilog="embeddings: the network is --ckpt_path CKPT|RUN|best|last "
                                       "(default: the newest run's best) or --config FILE (its pretrained "
                                       "backbone), the data --data_dir DIR; refit: --config FILE and "
                                       "--key=value, as for fit")
    p.add_argument("--method", choices=("embeddings", "refit"), default="embeddings",
                   help="embeddings: a linear model on the cached embeddings, per fold (seconds); "
                        "refit: K fine-tunes with the config's recipe (the costly, stronger check)")
    p.add_argument("--folds", type=int, default=None, help="K (default: 5 for embeddings, 3 for refit)")
    p.add_argument("--top", type=int, default=32, help="images in suspects.png")
    p.add_argument("--out", default="logs/suspects", help="folder for suspects.csv and .png")
    p.add_argument("--seed", type=int, default=0, help="seed of the fold split")
    a, overrides = p.parse_known_args(argv)
    folds = a.folds or (5 if a.method == "embeddings" else 3)
    if folds < 2:
        raise ConfigError(f"--folds must be 2 or more, got {folds}")
    out = Path(a.out)
    if a.method == "embeddings":
        from project.extras.embeddings.suspects import embedding_suspects

        samples, names, probs, fold_of, pre, how = embedding_suspects(overrides, folds, a.seed)
    else:
        if any(o.split("=", 1)[0] == "--ckpt_path" for o in overrides):
            raise ConfigError("--method refit trains its own models with a config's recipe (--config FILE); "
                              "--ckpt_path is for --method embeddings")
        samples, names, probs, fold_of, dm = out_of_fold_probabilities(overrides, folds, a.seed)
        pre, how = dm.preprocessing, f"{folds} folds"
    rows = rank_suspects(samples, probs, fold_of, names)
    write_suspects(rows, out, pre, a.top, f"out of fold ({how})")
    disagree = sum(r["given"] != r["predicted"] for r in rows)
    print(f"{disagree} of {len(rows)} training images are predicted as another class than their "
          f"folder by a model that did not train on them ({how}).")
    print(f"Ranked list: {out / 'suspects.csv'}; the {min(a.top, len(rows))} most suspect: "
          f"{out / 'suspects.png'}")
    for r in rows[:10]:
        print(f"  {r['rank']:3d}. {r['path']}: given {r['given']}, predicted {r['predicted']} "
              f"(p(given) {r['p_given']:.3f})")
    return 0
