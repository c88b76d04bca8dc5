"""Training throughput on one NVIDIA GPU for each precision / speed option (run by gpu_check.sh).

    python -m benchmarks.gpu_throughput [--data data/demo] [--image-size 224] [--steps 60]
"""

from __future__ import annotations

import argparse
import sys
import time

import lightning as L
import torch

from benchmarks.bench import _StepTimer, table
from project.callbacks import default_callbacks
from project.data import FolderDataModule
from project.model import ImageClassifier

MODES = {  # name: (precision, channels_last, compile, strategy)
    "32-true": ("32-true", False, False, "auto"),
    "16-mixed": ("16-mixed", False, False, "auto"),
    "16-mixed + channels_last": ("16-mixed", True, False, "auto"),
    "16-mixed + channels_last + torch.compile": ("16-mixed", True, True, "auto"),
    "16-mixed, DDP on 1 GPU": ("16-mixed", False, False, "ddp"),
}


def rate(data: str, size: int, batch: int, steps: int, warmup: int, mode: tuple) -> float:
    precision, channels_last, compile_, strategy = mode
    torch.manual_seed(0)
    dm = FolderDataModule(data, batch_size=batch, num_workers=8)
    model = ImageClassifier(weights=None, num_classes=dm.num_classes, class_names=dm.class_names,
                            input=size, channels_last=channels_last, compile=compile_)
    dm.preprocessing = model.preprocessing
    timer = _StepTimer(warmup)
    trainer = L.Trainer(accelerator="gpu", devices=1, strategy=strategy, precision=precision,
                        max_steps=warmup + steps, max_epochs=-1, limit_val_batches=0,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[*default_callbacks(), timer])
    trainer.fit(model, dm)
    return steps * batch / (timer.end - timer.start)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="data/demo")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=15)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("No CUDA GPU visible: this check needs an NVIDIA GPU.", file=sys.stderr)
        return 2
    print(f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}; resnet18 at "
          f"{a.image_size} px, batch {a.batch_size}, {a.steps} timed steps after {a.warmup}.\n")
    rows, base = [], None
    for name, mode in MODES.items():
        start = time.perf_counter()
        images_per_s = rate(a.data, a.image_size, a.batch_size, a.steps, a.warmup, mode)
        base = base or images_per_s
        rows.append([name, images_per_s, images_per_s / base, time.perf_counter() - start])
    print(table(["mode", "images/s", "vs 32-true", "wall s (incl. start-up)"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
