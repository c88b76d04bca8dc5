"""Accuracy per minute of training: the template's defaults vs a minimal plain-PyTorch loop.

    python -m benchmarks.accuracy [--epochs 3 10] [--seeds 0] [--size 64]   (make bench-accuracy)

Real data that no test uses and nothing downloads: scikit-learn's bundled handwritten digits
(1797 images of 10 classes, 8x8 grey levels, upscaled). Both sides train resnet18 from random
weights on the same files at equal epochs and batch size; the plain loop is the 40-line loop a
practitioner would write (SGD with momentum, per-epoch cosine, a random resized crop, fp32).
The template runs through its CLI with its defaults plus the documented presets for
characters (``configs/presets/characters.yaml``: no flips, crop scale 0.7-1, no jitter) and for
training from random weights (``configs/presets/scratch.yaml``: LR 0.05).
The rule of every comparison here: the plain loop takes the template's settings, read from the
same config files (:func:`template_settings`: LR, batch, momentum, weight decay, crop scale), so a
gap measures what the template adds, not a learning rate; the tables say so.
Tables: final val accuracy, wall time, time to a target accuracy; bf16 vs fp32; and transfer
(a template checkpoint trained on digits 0-4 as ``model.weights`` for a small set of digits 5-9,
20 training images per class) vs training from scratch.
"""

from __future__ import annotations

import argparse
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
from torch.utils.data import DataLoader
from torchvision import datasets, models
from torchvision.transforms import v2

REPO = Path(__file__).resolve().parents[1]


def write_digits(out: Path, size: int, classes: range = range(10), seed: int = 0,
                 train_per_class: int | None = None) -> Path:
    """The digits as PNG class folders, 80/20 stratified train/val split (seeded); with
    ``train_per_class`` only that many training images per class (a small new data set)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(seed)
    for c in classes:
        idx = rng.permutation(np.flatnonzero(digits.target == c))
        n_val = round(0.2 * len(idx))
        train = idx[n_val:] if train_per_class is None else idx[n_val:n_val + train_per_class]
        for split, part in (("val", idx[:n_val]), ("train", train)):
            folder = out / split / str(c)
            folder.mkdir(parents=True, exist_ok=True)
            for i in part:
                grey = (digits.images[i] * (255 / 16)).astype(np.uint8)
                Image.fromarray(grey).resize((size, size), Image.Resampling.BILINEAR).convert("RGB") \
                    .save(folder / f"{i:04d}.png")
    return out


PRESETS = ("characters", "scratch")  # the template's documented presets for these images


def template_settings(presets: tuple[str, ...] = PRESETS) -> dict:
    """What the plain loop takes from the template: ``configs/train.yaml`` with ``presets`` on
    top, as the CLI stacks them (LR, batch, SGD's momentum and weight decay, the crop scale)."""
    import yaml

    merged: dict = {}
    for path in [REPO / "configs/train.yaml", *(REPO / f"configs/presets/{p}.yaml" for p in presets)]:
        config = yaml.safe_load(path.read_text())
        for section in ("model", "data"):
            merge(merged.setdefault(section, {}), config.get(section) or {})
    model, data = merged["model"], merged["data"]
    sgd = model["optimizer"]["init_args"]
    return {"lr": model["lr"], "batch": data["batch_size"], "momentum": sgd["momentum"],
            "weight_decay": sgd["weight_decay"], "crop_scale": tuple(data["augmentation"]["crop_scale"])}


def merge(into: dict, new: dict) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = value


def rule(settings: dict) -> str:
    """The line every table of this folder starts with."""
    low, high = settings["crop_scale"]
    return (f"plain loop at the template's settings: SGD LR {settings['lr']} (momentum "
            f"{settings['momentum']}, weight decay {settings['weight_decay']}), batch {settings['batch']}, "
            f"random resized crop {low}-{high}, equal epochs and split")


def plain_transforms(size: int, crop_scale: tuple[float, float] | None = None
                     ) -> tuple[v2.Compose, v2.Compose]:
    """The plain loop's (train, evaluation) transforms: the template's random resized crop, ImageNet
    statistics."""
    norm = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
            v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])]
    scale = crop_scale or template_settings()["crop_scale"]
    return v2.Compose([v2.RandomResizedCrop(size, scale=scale), *norm]), v2.Compose(norm)


def plain_train(train, val, num_outputs: int, epochs: int, seed: int, loss_fn, score,
                settings: dict | None = None, net: nn.Module | None = None,
                head: nn.Module | None = None, head_lr_mult: float = 1.0) -> list[tuple[float, object]]:
    """The loop a practitioner writes: resnet18 (or ``net``), SGD with momentum, per-epoch cosine,
    fp32, at the template's settings (``head``'s parameters at ``head_lr_mult`` x the LR, for
    fine-tuning). ``score(net, val_loader)`` after each epoch; (elapsed seconds, score) each."""
    s = settings or template_settings()
    torch.manual_seed(seed)
    train_dl = DataLoader(train, s["batch"], shuffle=True, generator=torch.Generator().manual_seed(seed))
    val_dl = DataLoader(val, 256)
    net = net if net is not None else models.resnet18(num_classes=num_outputs)
    in_head = {id(p) for p in head.parameters()} if head is not None else set()
    groups = [{"params": [p for p in net.parameters() if id(p) not in in_head]}]
    if head is not None:
        groups.append({"params": list(head.parameters()), "lr": head_lr_mult * s["lr"]})
    opt = torch.optim.SGD(groups, lr=s["lr"], momentum=s["momentum"], weight_decay=s["weight_decay"])
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs)
    history, start = [], time.perf_counter()
    for _ in range(epochs):
        net.train()
        for x, y in train_dl:
            opt.zero_grad()
            loss_fn(net(x), y).backward()
            opt.step()
        sched.step()
        net.eval()
        with torch.no_grad():
            history.append((time.perf_counter() - start, score(net, val_dl)))
    return history


def plain_loop(data: Path, size: int, epochs: int, seed: int, lr: float | None = None
               ) -> list[tuple[float, float]]:
    """The minimal loop (at ``lr``, else the template's). Returns (elapsed seconds, val accuracy)
    after each epoch."""
    train_tf, eval_tf = plain_transforms(size)
    train = datasets.ImageFolder(data / "train", train_tf)
    val = datasets.ImageFolder(data / "val", eval_tf)

    def accuracy(net: nn.Module, loader: DataLoader) -> float:
        return sum(int((net(x).argmax(1) == y).sum()) for x, y in loader) / len(val)

    return plain_train(train, val, len(train.classes), epochs, seed, nn.functional.cross_entropy, accuracy,
                       settings=at_lr(lr))


def at_lr(lr: float | None) -> dict:
    """The template's settings, with another LR for an LR grid (``--lrs``)."""
    return {**template_settings(), **({"lr": lr} if lr is not None else {})}


def lr_from_argv(text: str) -> float | None:
    """The LR a plain loop's child process gets (``str(lr)`` of ``at_lr``'s argument)."""
    return None if text == "None" else float(text)


def lr_args(lr: float | None) -> list[str]:
    """The template's command-line override for the same LR."""
    return [] if lr is None else [f"--model.lr={lr}"]


def plain_run(data: Path, size: int, epochs: int, seed: int, lr: float | None = None
              ) -> list[tuple[float, float]]:
    """The plain loop in its own process, timed from the process start like the template."""
    start = time.time()
    result = subprocess.run([sys.executable, "-m", "benchmarks.accuracy", "--plain", str(data),
                             str(size), str(epochs), str(seed), str(lr)], cwd=REPO, capture_output=True,
                            text=True, check=True)
    offset = time.time() - start - json.loads(result.stdout.splitlines()[-1])["elapsed"]
    return [(t + offset, acc) for t, acc in json.loads(result.stdout.splitlines()[-1])["history"]]


def template_run(data: Path, size: int, epochs: int, seed: int, workdir: Path, *extra: str,
                 presets: tuple[str, ...] = PRESETS,
                 launcher: tuple[str, ...] = ("-m", "project"), metric: str = "val/acc",
                 ) -> tuple[list[tuple[float, float]], Path]:
    """The template through its CLI (``python -m project fit``, or ``python *launcher fit``).
    Returns (elapsed, ``metric``) per epoch and the run folder."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    stack = [arg for name in presets for arg in ("--config", str(REPO / f"configs/presets/{name}.yaml"))]
    args = [sys.executable, *launcher, "fit", "--config", str(REPO / "configs/train.yaml"), *stack,
            f"--data.data_dir={data}", f"--model.input.size={size}", "--model.weights=null",
            f"--trainer.max_epochs={epochs}", f"--seed_everything={seed}",
            "--trainer.enable_progress_bar=false", *extra]
    workdir.mkdir(parents=True, exist_ok=True)
    start = time.time()
    # the repository on the path: a launcher may be a benchmarks/ module
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    result = subprocess.run(args, cwd=workdir, capture_output=True, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path})
    if result.returncode != 0:
        raise RuntimeError(f"template run failed:\n{result.stderr[-3000:]}")
    run = max(workdir.glob("logs/*/version_*"), key=lambda p: p.stat().st_mtime)
    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
    acc.Reload()
    events = acc.Scalars(metric)
    return [(e.wall_time - start, e.value) for e in events], run


def time_to(history: list[tuple[float, float]], target: float) -> str:
    hit = next((t for t, a in history if a >= target), None)
    return "not reached" if hit is None else f"{hit:.0f} s"


def table(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(str(v) for v in r) + " |" for r in rows])


def mean_sd(values: list[float]) -> str:
    if len(values) == 1:
        return f"{100 * values[0]:.1f} %"
    return f"{100 * statistics.mean(values):.1f} ± {100 * statistics.stdev(values):.1f} %"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--plain":  # the child process of plain_run
        data, size, epochs, seed = Path(argv[1]), *map(int, argv[2:5])
        history = plain_loop(data, size, epochs, seed, lr_from_argv(argv[5]))
        print(json.dumps({"history": history, "elapsed": history[-1][0]}))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, nargs="+", default=[3, 10])
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--target", type=float, default=0.97)
    p.add_argument("--skip", nargs="*", default=[], choices=["precision", "transfer"])
    p.add_argument("--lrs", type=float, nargs="*", default=[None],
                   help="an LR grid: both sides at each (default: the template's LR)")
    p.add_argument("--variants", nargs="*", default=[], metavar="ARGS",
                   help="extra template rows, each with these settings (without the leading --), "
                        "e.g. 'model.scheduler.init_args.warmup_epochs=0 trainer.precision=32-true'")
    p.add_argument("--variants-only", action="store_true", help="only the --variants rows")
    a = p.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = write_digits(tmp / "digits", a.size)
        print(f"digits: {sum(1 for _ in data.rglob('*.png'))} images, {a.size} px, resnet18 from "
              f"scratch, seeds {a.seeds}, {os.cpu_count()} CPU threads; {rule(template_settings())}\n")
        rows, raw = [], {}
        headers = ["run", "epochs", "LR", "val acc", "wall", f"time to {a.target:.0%}"]
        base = [] if a.variants_only else [("plain loop (fp32)", []), ("template defaults", [])]
        runs = [*base, *((f"template, {v}", [f"--{arg}" for arg in v.split()]) for v in a.variants)]
        for epochs, lr in itertools.product(a.epochs, a.lrs):
            for i, (name, extra) in enumerate(runs):
                finals, walls, histories = [], [], []
                for seed in a.seeds:
                    if name.startswith("plain"):
                        h = plain_run(data, a.size, epochs, seed, lr)
                    else:
                        h, _ = template_run(data, a.size, epochs, seed, tmp / f"t{epochs}-{lr}-{i}-{seed}",
                                            *lr_args(lr), *extra)
                    finals.append(h[-1][1])
                    walls.append(h[-1][0])
                    histories.append(h)
                raw[f"{name} {epochs} {lr}"] = histories
                rows.append([name, epochs, at_lr(lr)["lr"], mean_sd(finals),
                             f"{statistics.mean(walls):.0f} s", time_to(histories[0], a.target)])
                print(table(headers, rows[-1:]).splitlines()[-1], flush=True)
        print(table(headers, rows))

        if "precision" not in a.skip:
            epochs = max(a.epochs)
            prec_rows = []
            for precision in ("bf16-mixed", "32-true"):
                finals, walls = [], []
                for seed in a.seeds:
                    h, _ = template_run(data, a.size, epochs, seed, tmp / f"p{precision}-{seed}",
                                        f"--trainer.precision={precision}")
                    finals.append(h[-1][1])
                    walls.append(h[-1][0])
                prec_rows.append([precision, epochs, mean_sd(finals), f"{statistics.mean(walls):.0f} s"])
            print("\n" + table(["template precision", "epochs", "val acc", "wall"], prec_rows))

        if "transfer" not in a.skip:
            source = write_digits(tmp / "digits04", a.size, range(0, 5))
            target = write_digits(tmp / "digits59", a.size, range(5, 10), train_per_class=20)
            _, run = template_run(source, a.size, 5, 0, tmp / "source")
            ckpt = next((run / "checkpoints").glob("best-*.ckpt"))
            epochs = min(a.epochs)
            transfer_rows = []
            for label, extra in (("from scratch", []), ("from the digits 0-4 checkpoint",
                                                        [f"--model.weights={ckpt}"])):
                finals = []
                for seed in a.seeds:
                    # fine-tuning a checkpoint keeps the default LR; from scratch takes scratch.yaml's
                    h, _ = template_run(target, a.size, epochs, seed, tmp / f"x{len(extra)}-{seed}",
                                        *extra, presets=("characters",) if extra else
                                        ("characters", "scratch"))
                    finals.append(h[-1][1])
                transfer_rows.append([label, epochs, mean_sd(finals)])
            print("\nTransfer to a small new set: digits 5-9 with 20 training images per class "
                  "(source: 5 epochs on all of digits 0-4, the template's best checkpoint)\n"
                  + table(["start", "epochs", "val acc"], transfer_rows))
        print("\nraw histories (elapsed s, val acc):", json.dumps(
            {k: [[(round(t, 1), round(v, 4)) for t, v in h] for h in hs] for k, hs in raw.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
