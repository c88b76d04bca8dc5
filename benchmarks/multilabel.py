"""Multi-label accuracy: the template (``data.labels`` table, ``model.task: multilabel``) vs a
plain PyTorch loop with BCE, same backbone, epochs and batch size.

    python -m benchmarks.multilabel [--epochs 3 10] [--seeds 0] [--size 64]   (make bench-multilabel)

Real images that ship in an installable package: scikit-learn's handwritten digits, tiled 2x2
into mosaics; an image's labels are the digits it shows (one to four cells filled, one to
three distinct digits). The digits of the validation mosaics are never seen in training ones.
Both sides train resnet18 from random weights; the template with its defaults plus the
characters and scratch presets (as ``benchmarks/accuracy.py``) and the tiles preset. mAP is the macro average
precision over the labels (threshold-free, the same torchmetrics function for both); exact
match is at 0.5 for the plain loop and at the template's thresholds (fitted on that same
validation set, so a little optimistic).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset

from benchmarks import accuracy
from benchmarks.accuracy import (
    at_lr,
    lr_args,
    mean_sd,
    plain_train,
    plain_transforms,
    rule,
    template_settings,
)

REPO = Path(__file__).resolve().parents[1]
DIGITS = [str(d) for d in range(10)]
PRESETS = (*accuracy.PRESETS, "tiles")  # mosaics: evaluation sees the whole image


def write_mosaics(out: Path, size: int, n_train: int = 1500, n_val: int = 400, seed: int = 0) -> Path:
    """``out/images/*.png`` and ``out/labels.csv`` (image, labels, split): 2x2 mosaics of digits."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(digits.target))
    pools = {"val": order[: len(order) // 5], "train": order[len(order) // 5:]}
    cell = size // 2
    (out / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    for split, count in (("train", n_train), ("val", n_val)):
        for k in range(count):
            canvas = np.zeros((size, size), np.uint8)
            filled = rng.choice(4, size=rng.integers(1, 5), replace=False)
            labels = set()
            for c in filled:
                i = rng.choice(pools[split])
                grey = Image.fromarray((digits.images[i] * (255 / 16)).astype(np.uint8))
                r, q = divmod(int(c), 2)
                canvas[r * cell:(r + 1) * cell, q * cell:(q + 1) * cell] = np.asarray(
                    grey.resize((cell, cell), Image.Resampling.BILINEAR))
                labels.add(str(digits.target[i]))
            name = f"images/{split}{k:05d}.png"
            Image.fromarray(canvas).convert("RGB").save(out / name)
            rows.append({"image": name, "labels": " ".join(sorted(labels)), "split": split})
    with open(out / "labels.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["image", "labels", "split"])
        writer.writeheader()
        writer.writerows(rows)
    return out


class Mosaics(Dataset):
    def __init__(self, root: Path, split: str, transform) -> None:
        with open(root / "labels.csv", newline="") as f:
            rows = [r for r in csv.DictReader(f) if r["split"] == split]
        self.items = [(root / r["image"], torch.tensor([float(d in r["labels"].split()) for d in DIGITS]))
                      for r in rows]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        path, target = self.items[i]
        return self.transform(Image.open(path).convert("RGB")), target


def mean_ap(probs: torch.Tensor, targets: torch.Tensor) -> float:
    from torchmetrics.functional.classification import multilabel_average_precision

    return float(multilabel_average_precision(probs, targets.int(), len(DIGITS), average="macro"))


def plain_loop(data: Path, size: int, epochs: int, seed: int, lr: float | None = None) -> list[dict]:
    """The plain loop of ``benchmarks/accuracy.py`` with BCE: (elapsed, mAP, exact match) per epoch."""
    train_tf, eval_tf = plain_transforms(size)
    train, val = Mosaics(data, "train", train_tf), Mosaics(data, "val", eval_tf)

    def score(net: nn.Module, loader: DataLoader) -> dict:
        p, t = (torch.cat(part) for part in zip(*((net(x).sigmoid(), y) for x, y in loader), strict=True))
        return {"map": mean_ap(p, t), "exact": float(((p >= 0.5).float() == t).all(1).float().mean())}

    history = plain_train(train, val, len(DIGITS), epochs, seed,
                          nn.functional.binary_cross_entropy_with_logits, score, settings=at_lr(lr))
    return [{"elapsed": t, **scores} for t, scores in history]


def plain_run(data: Path, size: int, epochs: int, seed: int, lr: float | None = None) -> dict:
    """The plain loop in its own process, its wall time from the process start, as the template's."""
    start = time.time()
    result = subprocess.run([sys.executable, "-m", "benchmarks.multilabel", "--plain", str(data),
                             str(size), str(epochs), str(seed), str(lr)], cwd=REPO, capture_output=True,
                            text=True, check=True)
    return {**json.loads(result.stdout.splitlines()[-1])[-1], "elapsed": time.time() - start}


def template_run(data: Path, size: int, epochs: int, seed: int, workdir: Path, *extra: str) -> dict:
    """``benchmarks/accuracy.py``'s template run with the labels table: its last val/map."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    labels = f"--data.labels={data / 'labels.csv'}"
    history, run = accuracy.template_run(data, size, epochs, seed, workdir, labels, *extra, presets=PRESETS)
    events = EventAccumulator(str(run), size_guidance={"scalars": 0})
    events.Reload()
    return {"elapsed": history[-1][0], "map": events.Scalars("val/map")[-1].value, "exact": history[-1][1],
            "run": run}


# One change at a time against the template's defaults (``--variants``), to find what a gap costs.
EMA_PRESET = str(REPO / "configs/presets/ema.yaml")
VARIANTS = {
    "fp32": ["--trainer.precision=32-true"],
    "EMA on": [f"--config={EMA_PRESET}"],
    "warmup 1 epoch": ["--model.scheduler.init_args.warmup_epochs=1"],
    "cosine per step": ["--model.scheduler.init_args.cosine_interval=step"],
    # train.yaml's schedule for fine-tuning, which the scratch preset replaces
    "fine-tuning schedule": ["--model.scheduler.init_args.cosine_interval=step",
                             "--model.scheduler.init_args.warmup_epochs=3"],
}


def int8_map(run: Path, workdir: Path) -> dict:
    """FP32 and INT8 ONNX validation mAP of a run's best checkpoint (``python -m project export``)."""
    ckpt = next((run / "checkpoints").glob("best-*.ckpt"))
    out = workdir / "export"
    workdir.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "project", "export", "--ckpt_path", str(ckpt), "--formats",
                    "onnx,int8", "--out", str(out), "--repeats", "2"], cwd=workdir, check=True,
                   capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    formats = json.loads((out / "export_report.json").read_text())["formats"]
    return {name: formats[name]["val_map"] for name in ("onnx", "int8")}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--plain":  # the child process of plain_run
        data, size, epochs, seed = Path(argv[1]), *map(int, argv[2:5])
        print(json.dumps(plain_loop(data, size, epochs, seed, accuracy.lr_from_argv(argv[5]))))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, nargs="+", default=[3, 10])
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--train", type=int, default=1500, help="training mosaics")
    p.add_argument("--quick", action="store_true", help="1 epoch on 64 mosaics: that it runs")
    p.add_argument("--variants", nargs="*", default=[], choices=list(VARIANTS),
                   help="template rows with one change each (at the fewest epochs)")
    p.add_argument("--no-int8", action="store_true", help="skip the INT8 export check")
    p.add_argument("--variants-only", action="store_true", help="only the --variants rows")
    p.add_argument("--lrs", type=float, nargs="*", default=[None],
                   help="an LR grid: both sides at each (default: the template's LR)")
    a = p.parse_args(argv)
    if a.quick:
        a.epochs, a.seeds, a.size, a.train = [1], [0], 32, 64
    torch.set_num_threads(os.cpu_count() or 1)
    with tempfile.TemporaryDirectory() as tmp:
        data = write_mosaics(Path(tmp) / "mosaics", a.size, a.train, max(32, a.train * 4 // 15))
        print(f"digit mosaics: {a.train} training images, {a.size} px, 10 labels, resnet18 from "
              f"scratch, seeds {a.seeds}, {os.cpu_count()} CPU threads; {rule(template_settings())}\n")
        lines = ["| run | epochs | LR | val mAP | exact match | wall (s) |", "|---|---|---|---|---|---|"]
        for epochs, lr in itertools.product([] if a.variants_only else a.epochs, a.lrs):
            for name in ("plain loop (BCE, fp32)", "template defaults"):
                results = [plain_run(data, a.size, epochs, s, lr) if name.startswith("plain")
                           else template_run(data, a.size, epochs, s, Path(tmp) / f"t{epochs}-{lr}-{s}",
                                             *lr_args(lr))
                           for s in a.seeds]
                if "run" in results[0]:
                    longest = results[0]["run"]  # the template's run of the most epochs, first seed
                lines.append(f"| {name} | {epochs} | {at_lr(lr)['lr']} | "
                             f"{mean_sd([r['map'] for r in results])} | "
                             f"{mean_sd([r['exact'] for r in results])} | "
                             f"{statistics.mean(r['elapsed'] for r in results):.0f} |")
                print(lines[-1], flush=True)
        for variant in a.variants:
            extra = VARIANTS[variant]
            epochs = min(a.epochs)
            results = [template_run(data, a.size, epochs, s, Path(tmp) / f"v{variant}-{s}".replace(" ", "_"),
                                    *extra) for s in a.seeds]
            lines.append(f"| template, {variant} | {epochs} | | {mean_sd([r['map'] for r in results])} | "
                         f"{mean_sd([r['exact'] for r in results])} | "
                         f"{statistics.mean(r['elapsed'] for r in results):.0f} |")
            print(lines[-1], flush=True)
        print("\n" + "\n".join(lines))
        if a.no_int8 or a.variants_only:
            return 0
        maps = int8_map(longest, Path(tmp) / "int8")
        print(f"\nExported ({max(a.epochs)} epochs, seed {a.seeds[0]}): validation mAP "
              f"ONNX FP32 {100 * maps['onnx']:.2f}, INT8 {100 * maps['int8']:.2f} "
              f"(difference {100 * (maps['onnx'] - maps['int8']):.2f} points)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
