"""Regression accuracy: the template (a labels table of numbers, ``image,value,split``) vs a plain
PyTorch loop with the Huber loss, at the same learning rate, batch, augmentation and epochs.

    python -m benchmarks.regression [--epochs 3 10] [--seeds 0 1] [--size 32] [--quick]
    (make bench-regression)

Real images that ship in an installable package: scikit-learn's handwritten digits, split and
upscaled as ``benchmarks/accuracy.py`` does (80/20 per digit, seeded), written as one flat
folder of PNGs and a ``labels.csv``; the number to learn is the digit's value, 0 to 9. Both
sides train resnet18 from random weights on targets standardised with the training split's
mean and standard deviation, with SGD (momentum 0.9, weight decay 1e-4) at ``scratch.yaml``'s
LR and ``characters.yaml``'s crop scale (no flips, no colour jitter), batch 64. The plain loop
steps a cosine per epoch in float32 and evaluates the whole image; the template runs through its
CLI with its defaults plus those two presets. The scores are the last epoch's validation MAE
and RMSE in digit units.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision import models
from torchvision.transforms import v2

from benchmarks import accuracy

REPO = Path(__file__).resolve().parents[1]
PLAIN, TEMPLATE = "plain loop (Huber, fp32)", "template + characters + scratch"
BAR = 0.05  # the template's MAE may be at most 5 % above the plain loop's


def presets() -> dict:
    """The recipe both sides share, read from the configs the template run stacks."""

    def read(name: str) -> dict:
        return yaml.safe_load((REPO / "configs" / f"{name}.yaml").read_text())

    aug, model = read("presets/characters")["data"]["augmentation"], read("presets/scratch")["model"]
    assert not aug["hflip"] and not aug["color_jitter"], "the plain loop has neither flips nor jitter"
    return {"lr": float(model["lr"]), "crop_scale": tuple(aug["crop_scale"]),
            "batch": int(read("train")["data"]["batch_size"])}


def write_values(out: Path, size: int, seed: int = 0, train_per_class: int | None = None) -> Path:
    """``out/images/*.png`` and ``out/labels.csv`` (image, value, split): the digits of
    ``accuracy.write_digits`` (same split, same upscaling), each valued as its digit."""
    folders = accuracy.write_digits(out / "by_digit", size, seed=seed, train_per_class=train_per_class)
    (out / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    for png in sorted(folders.glob("*/*/*.png")):  # by_digit/<split>/<digit>/<index>.png
        png.rename(out / "images" / png.name)
        rows.append({"image": f"images/{png.name}", "value": png.parent.name,
                     "split": png.parent.parent.name})
    shutil.rmtree(folders)
    with open(out / "labels.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["image", "value", "split"])
        writer.writeheader()
        writer.writerows(rows)
    return out


class Values(Dataset):
    """One split of ``labels.csv``: (image, value)."""

    def __init__(self, root: Path, split: str, transform) -> None:
        with open(root / "labels.csv", newline="") as f:
            self.items = [(root / r["image"], float(r["value"])) for r in csv.DictReader(f)
                          if r["split"] == split]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        path, value = self.items[i]
        return self.transform(Image.open(path).convert("RGB")), torch.tensor(value)


def plain_loop(data: Path, size: int, epochs: int, seed: int) -> list[dict]:
    """The loop a practitioner writes: resnet18 with one output, Huber on standardised targets,
    SGD with momentum, cosine per epoch, float32. (elapsed, MAE, RMSE in digit units) per epoch."""
    recipe = presets()
    norm = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
            v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])]
    train_tf = v2.Compose([v2.RandomResizedCrop(size, scale=recipe["crop_scale"], antialias=True), *norm])
    train, val = Values(data, "train", train_tf), Values(data, "val", v2.Compose(norm))
    values = torch.tensor([v for _, v in train.items])
    mean, std = values.mean(), values.std(unbiased=False)  # the template's label_stats

    torch.manual_seed(seed)
    train_dl = DataLoader(train, recipe["batch"], shuffle=True, generator=torch.Generator().manual_seed(seed))
    val_dl = DataLoader(val, 256)
    net = models.resnet18(num_classes=1)
    opt = torch.optim.SGD(net.parameters(), lr=recipe["lr"], momentum=0.9, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs)
    history, start = [], time.perf_counter()
    for _ in range(epochs):
        net.train()
        for x, y in train_dl:
            opt.zero_grad()
            nn.functional.huber_loss(net(x).squeeze(1), (y - mean) / std).backward()
            opt.step()
        sched.step()
        net.eval()
        with torch.no_grad():
            err = torch.cat([net(x).squeeze(1) * std + mean - y for x, y in val_dl])
        history.append({"elapsed": time.perf_counter() - start, "mae": float(err.abs().mean()),
                        "rmse": float(err.pow(2).mean().sqrt())})
    return history


def plain_run(data: Path, size: int, epochs: int, seed: int) -> dict:
    """The plain loop in its own process, its wall time from the process start, as the template's."""
    start = time.time()
    result = subprocess.run([sys.executable, "-m", "benchmarks.regression", "--plain", str(data),
                             str(size), str(epochs), str(seed)], cwd=REPO, capture_output=True,
                            text=True, check=True)
    return {**json.loads(result.stdout.splitlines()[-1])[-1], "elapsed": time.time() - start}


def template_run(data: Path, size: int, epochs: int, seed: int, workdir: Path, *extra: str) -> dict:
    """``accuracy.template_run`` with the labels table: the last epoch's val/mae and val/rmse,
    and the wall time to them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    labels = f"--data.labels={data / 'labels.csv'}"
    mae, run = accuracy.template_run(data, size, epochs, seed, workdir, labels, *extra, metric="val/mae")
    events = EventAccumulator(str(run), size_guidance={"scalars": 0})
    events.Reload()
    if len(mae) != epochs:
        raise RuntimeError(f"{run}: val/mae logged for {len(mae)} epochs, expected {epochs}")
    rmse = events.Scalars("val/rmse")[-1].value
    return {"elapsed": mae[-1][0], "mae": mae[-1][1], "rmse": rmse, "run": run}


def rows_of(name: str, epochs: int, seeds: list[int], results: list[dict]) -> list[str]:
    """A row per seed and one of their mean."""
    rows = [f"| {name} | {epochs} | {s} | {r['mae']:.3f} | {r['rmse']:.3f} | {r['elapsed']:.0f} |"
            for s, r in zip(seeds, results, strict=True)]
    mean = {k: statistics.mean(r[k] for r in results) for k in ("mae", "rmse", "elapsed")}
    return rows + [f"| {name} | {epochs} | mean | **{mean['mae']:.3f}** | {mean['rmse']:.3f} | "
                   f"{mean['elapsed']:.0f} |"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--plain":  # the child process of plain_run
        data, size, epochs, seed = Path(argv[1]), *map(int, argv[2:5])
        print(json.dumps(plain_loop(data, size, epochs, seed)))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, nargs="+", default=[3, 10])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--quick", action="store_true",
                   help="1 epoch on 10 training images per digit: that it runs")
    a = p.parse_args(argv)
    per_class = None
    if a.quick:
        a.epochs, a.seeds, a.size, per_class = [1], [0], 32, 10
    torch.set_num_threads(os.cpu_count() or 1)
    recipe = presets()
    with tempfile.TemporaryDirectory() as tmp:
        data = write_values(Path(tmp) / "values", a.size, train_per_class=per_class)
        with open(data / "labels.csv", newline="") as f:
            splits = [r["split"] for r in csv.DictReader(f)]
        counts = {s: splits.count(s) for s in ("train", "val")}
        print(f"digit values: {counts['train']} training and {counts['val']} validation images, "
              f"{a.size} px, resnet18 from scratch, {os.cpu_count()} CPU threads\n"
              f"Rule: both sides get the same LR {recipe['lr']} (scratch.yaml), batch {recipe['batch']}, "
              f"augmentation (characters.yaml: crop scale {list(recipe['crop_scale'])}, no flips, no "
              f"jitter) and epochs; Huber loss on standardised targets; seeds {a.seeds}, "
              f"{len(a.seeds)} run(s) per side and epoch count\n", flush=True)
        lines = ["| run | epochs | seed | val MAE | val RMSE | wall (s) |", "|---|---|---|---|---|---|"]
        verdicts = []
        for epochs in a.epochs:
            means = {}
            for name in (PLAIN, TEMPLATE):
                results = [plain_run(data, a.size, epochs, s) if name == PLAIN else
                           template_run(data, a.size, epochs, s, Path(tmp) / f"t{epochs}-{s}")
                           for s in a.seeds]
                lines += rows_of(name, epochs, a.seeds, results)
                print("\n".join(lines[-len(results) - 1:]), flush=True)
                means[name] = statistics.mean(r["mae"] for r in results)
            ratio = means[TEMPLATE] / means[PLAIN] if means[PLAIN] > 0 else math.inf
            verdicts.append(f"{epochs} epochs: template MAE {means[TEMPLATE]:.3f} vs plain "
                            f"{means[PLAIN]:.3f} ({100 * (ratio - 1):+.1f} %): "
                            f"{'meets' if ratio <= 1 + BAR else 'misses'} the bar "
                            f"(within {BAR:.0%} or better)")
        print("\n" + "\n".join(lines) + "\n\n" + "\n".join(verdicts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
