"""How well does ``python -m project suspects`` find wrong labels? Plant some and count.

    python -m benchmarks.planted_labels [--per-class 100] [--share 0.05] [--folds 3] [--epochs 5]
                                        [any fit option, e.g. --config configs/presets/scratch.yaml]

Makes a copy of the demo data set (``--per-class`` training images per class), moves ``--share``
of the training images into another class's folder (a wrong label, chosen at random), runs the
suspects command on it with the default recipe for ``--epochs`` epochs, and prints the recall of
the planted images among the top k of ``suspects.csv`` for k = planted, 2 x planted, 4 x planted.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from project.cli import main as cli_main
from project.data.demo import make_demo


def plant(root: Path, share: float, seed: int = 0) -> set[str]:
    """Move ``share`` of the training images to a random other class folder; their new paths."""
    rng = np.random.default_rng(seed)
    classes = sorted(p.name for p in (root / "train").iterdir())
    files = sorted((root / "train").rglob("*.png"))
    moved = set()
    for i in rng.choice(len(files), round(share * len(files)), replace=False):
        src = files[i]
        wrong = rng.choice([c for c in classes if c != src.parent.name])
        dst = root / "train" / wrong / f"planted_{src.name}"
        shutil.move(src, dst)
        moved.add(str(dst))
    return moved


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--per-class", type=int, default=100)
    p.add_argument("--share", type=float, default=0.05)
    p.add_argument("--folds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=5)
    a, extra = p.parse_known_args()  # the rest goes to the suspects command (fit options)
    with tempfile.TemporaryDirectory() as tmp:
        root = make_demo(Path(tmp) / "demo", train_per_class=a.per_class, val_per_class=20,
                         test_per_class=20)
        planted = plant(root, a.share)
        out = Path(tmp) / "suspects"
        start = time.perf_counter()
        cli_main(["suspects", "--method", "refit", "--folds", str(a.folds), "--out", str(out), "--config",
                  "configs/train.yaml", "--config", "configs/demo.yaml",  # the demo's own 48 px
                  f"--data.data_dir={root}", "--model.weights=null",
                  f"--trainer.max_epochs={a.epochs}", "--trainer.enable_progress_bar=false", *extra])
        minutes = (time.perf_counter() - start) / 60
        ranked = [r["path"] for r in csv.DictReader((out / "suspects.csv").open())]
    n = len(planted)
    print(f"\n{n} planted wrong labels among {len(ranked)} training images; {a.folds} folds x "
          f"{a.epochs} epochs, {minutes:.1f} min")
    print("| top k | planted found | recall |\n|---|---|---|")
    for k in (n, 2 * n, 4 * n):
        found = len(planted & set(ranked[:k]))
        print(f"| {k} | {found} | {found / n:.2f} |")


if __name__ == "__main__":
    main()
