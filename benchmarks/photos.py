"""Camera photos (12 MP): decode time and training-loader speed, full-size vs reduced decode.

    python -m benchmarks.photos [--count 48] [--workers 0 1 2] [--batches 4] [--steps 3] [--quick]

Builds its own 12-MP JPEGs from a real photo (scikit-learn's bundled ``china.jpg``, upscaled to
4032x3024 with Gaussian noise, quality 92, two class folders) and prints Markdown tables:

1. Decode: ms per image (median over the files) at full size and reduced to the training and
   evaluation short sides (``needed_side``), and the bytes each takes in ``data.cache``.
2. Loader: images/s of the training loader (the real train transforms at 224 px, batch 16) by
   ``num_workers``, full vs reduced decode, with ``cache=none`` and ``cache=memory``.
3. Model: resnet18 training-step images/s at 224 px, batch 16, on the same machine (no data):
   the rate the loader has to keep up with.
4. Short fit: ``python -m project fit`` with ``configs/train.yaml`` on the photo folder (224 px,
   batch 16, random init, otherwise the defaults, plus the DataWaitMonitor),
   ``perf/data_wait_frac`` of its last epoch with ``data.cache`` auto (the default) and none.

About 3-5 minutes on 2 CPU cores with the defaults.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from benchmarks.bench import step_rate, table
from project.common.pixels import read_rgb
from project.common.preprocessing import Preprocessing
from project.data import FolderDataModule
from project.data.datasets import ImageDataset
from project.data.images import ImageCache, decoded_bytes, needed_side

PHOTO_SIZE = (4032, 3024)  # a 12-MP phone camera
NOISE_SIGMA = 4.0
IMAGE_SIZE, BATCH = 224, 16


def _noise(seed: int, size: tuple[int, int]) -> np.ndarray:
    """Gaussian noise a little larger than a photo; each photo takes another window of it."""
    w, h = size
    rng = np.random.default_rng(seed)
    return rng.normal(0, NOISE_SIGMA, (h + 64, w + 64, 3)).astype(np.float32)


def _make_photos(paths: list[Path], seed: int, size: tuple[int, int]) -> None:
    from sklearn.datasets import load_sample_image  # the dev extra: scikit-learn

    rng = np.random.default_rng(seed)
    china = Image.fromarray(load_sample_image("china.jpg"))  # 640x427, a real photo
    base = np.asarray(china.resize(size, Image.Resampling.BICUBIC), np.float32)
    noise, (w, h) = _noise(seed, size), size
    for path in paths:
        dy, dx = rng.integers(0, 64, 2)
        img = base[:, ::-1] if rng.random() < 0.5 else base
        arr = (img * rng.uniform(0.85, 1.15) + noise[dy:dy + h, dx:dx + w]).clip(0, 255).astype(np.uint8)
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(arr).save(path, quality=92)


def make_photos(folder: Path, count: int, size: tuple[int, int] = PHOTO_SIZE) -> list[Path]:
    """``count`` JPEGs of ``size`` in ``folder/{a,b}/`` (written in parallel, a process per CPU)."""
    paths = [folder / "ab"[i % 2] / f"photo_{i:03d}.jpg" for i in range(count)]
    procs = max(1, min(os.cpu_count() or 1, count))
    with ProcessPoolExecutor(procs) as pool:
        list(pool.map(_make_photos, [paths[i::procs] for i in range(procs)], range(procs),
                      [size] * procs))
    return paths


def decode_table(paths: list[Path], sides: dict[str, int | None]) -> str:
    rows = []
    full_ms = None
    for name, side in sides.items():
        times = []
        for path in paths:
            start = time.perf_counter()
            img = read_rgb(str(path), side)
            times.append((time.perf_counter() - start) * 1000)
        ms = statistics.median(times)
        full_ms = full_ms or ms
        h, w = img.shape[:2]
        mb = statistics.median(decoded_bytes(str(p), side) for p in paths) / 2**20
        rows.append([name, f"{w}x{h}", ms, 1000 / ms, full_ms / ms, mb])
    return table(["decode", "size", "ms per image", "images/s (1 core)", "speed-up", "cache MB per image"],
                 rows)


def train_loader(data: Path, workers: int, side: int | None, cache: ImageCache | None):
    """The FolderDataModule training loader with its real train transforms, every image decoded
    at ``side`` (None: full size, the behaviour before), from ``cache`` when there is one."""
    dm = FolderDataModule(data, batch_size=BATCH, num_workers=workers, cache="none", val_fraction=0,
                          test_fraction=0)
    dm.preprocessing = Preprocessing(IMAGE_SIZE)
    # What datamodule.make_dataset does once it passes the side down (see the report).
    dm.datasets["train"] = ImageDataset(dm.splits.train, dm.transform("train"), cache, short_side=side)
    return dm.train_dataloader()


def loader_rate(loader, batches: int) -> float:
    """Images/s over ``batches`` batches after the first (worker start-up excluded), across
    epochs when the data set is shorter."""
    seen, start, n, epoch = 0, 0.0, 0, 0
    while seen <= batches:
        loader.sampler.set_epoch(epoch)
        for x, _ in loader:
            if seen == 0:
                start = time.perf_counter()
            else:
                n += len(x)
            seen += 1
            if seen > batches:
                break
        epoch += 1
    return n / (time.perf_counter() - start)


def model_step_rate(steps: int, bf16: bool, size: int = IMAGE_SIZE, batch: int = BATCH) -> float:
    """resnet18 forward + backward + SGD step on random batches: no data loading."""
    from torchvision.models import resnet18

    torch.manual_seed(0)
    return step_rate(resnet18(num_classes=2), 2, size, batch, steps, bf16)


REPO = Path(__file__).resolve().parents[1]


def fit_wait(data: Path, workdir: Path, cache: str, epochs: int, batch: int = BATCH) -> tuple[float, float]:
    """(perf/data_wait_frac of the last epoch, wall s) of a short fit through the CLI."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    workdir.mkdir(parents=True)
    args = [sys.executable, "-m", "project", "fit", "--config", str(REPO / "configs/train.yaml"),
            f"--data.data_dir={data}", f"--model.input.size={IMAGE_SIZE}", f"--data.batch_size={batch}",
            f"--data.cache={cache}", "--model.weights=null", f"--trainer.max_epochs={epochs}",
            "--trainer.enable_progress_bar=false", "--trainer.log_every_n_steps=1",
            "--trainer.callbacks+=project.extras.diagnose.monitors.DataWaitMonitor"]
    start = time.perf_counter()
    result = subprocess.run(args, cwd=workdir, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"the fit failed:\n{result.stderr[-3000:]}")
    events = EventAccumulator(str(next(workdir.glob("logs/*/version_*"))), size_guidance={"scalars": 0})
    events.Reload()
    return events.Scalars("perf/data_wait_frac")[-1].value, wall


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.photos", description=__doc__.split("\n")[0])
    p.add_argument("--count", type=int, default=48, help="12-MP photos to make")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2], help="num_workers to measure")
    p.add_argument("--batches", type=int, default=4, help="batches timed per loader row")
    p.add_argument("--steps", type=int, default=3, help="model training steps timed")
    p.add_argument("--fit-epochs", type=int, default=2, help="epochs of the short fit (0: skip it)")
    p.add_argument("--quick", action="store_true", help="12 small photos, one of each measurement: "
                   "checks the script runs (the numbers mean nothing)")
    a = p.parse_args(argv)
    size = PHOTO_SIZE
    if a.quick:
        size, a.count, a.workers, a.batches, a.steps = (800, 600), 12, [0], 1, 1
        a.fit_epochs = min(a.fit_epochs, 1)
    dm = FolderDataModule()
    dm.preprocessing = Preprocessing(IMAGE_SIZE)
    train_side = needed_side(dm.preprocessing, dm.augmentation.crop_scale)
    eval_side = needed_side(dm.preprocessing)
    print(f"# Camera photos\n\nMachine: {platform.machine()} {platform.processor() or ''}, "
          f"{os.cpu_count()} CPUs, torch {torch.__version__} with {torch.get_num_threads()} threads; "
          f"{a.count} JPEGs {size[0]}x{size[1]} (quality 92); {IMAGE_SIZE} px, batch {BATCH}; "
          f"decode sides: training {train_side} (crop_scale min {dm.augmentation.crop_scale[0]}), "
          f"evaluation {eval_side}.\n")
    with tempfile.TemporaryDirectory(prefix="photos-") as tmp:
        start = time.perf_counter()
        paths = make_photos(Path(tmp) / "data", a.count, size)
        mb = statistics.median(p.stat().st_size for p in paths) / 2**20
        print(f"Made {a.count} photos ({mb:.1f} MB each) in {time.perf_counter() - start:.0f} s.\n")

        print("## Decode (`read_rgb`, median over the files)\n")
        print(decode_table(paths, {"full size": None, f"reduced to {train_side} (training)": train_side,
                                   f"reduced to {eval_side} (evaluation)": eval_side}))

        # quick: 64 px, batch 4 (bf16 is emulated, ~10x slower, on a CPU without it)
        step_size = (64, 4) if a.quick else (IMAGE_SIZE, BATCH)
        rates = {bf16: model_step_rate(a.steps, bf16, *step_size) for bf16 in (False, True)}
        model = rates[True]  # the template trains with bf16 autocast on the CPU
        rows = [["resnet18 training step, fp32 (no data)", "-", "-", rates[False], rates[False] / model],
                ["resnet18 training step, bf16 autocast (no data)", "-", "-", model, 1.0]]
        files = [s.path for s in FolderDataModule(Path(tmp) / "data", val_fraction=0,
                                                  test_fraction=0).splits.train]
        for side, name in ((None, "full size"), (train_side, f"reduced to {train_side}")):
            for use_cache in (False, True):
                cache, cached = None, "none"
                if use_cache:
                    start = time.perf_counter()
                    cache = ImageCache.decode(files, short_side=side)
                    cached = (f"memory ({cache.buffer.numel() / 2**30:.2f} GiB, built in "
                              f"{time.perf_counter() - start:.1f} s)")
                for workers in a.workers:
                    rate = loader_rate(train_loader(Path(tmp) / "data", workers, side, cache), a.batches)
                    rows.append([f"loader, decode {name}", cached, workers, rate, rate / model])
                del cache
        print("\n## Training loader vs model step (images/s)\n")
        print(table(["pipeline", "cache", "num_workers", "images/s", "ratio to bf16 model step"], rows))

        if a.fit_epochs:
            fit_rows = []
            for cache in ("auto", "none"):
                frac, wall = fit_wait(Path(tmp) / "data", Path(tmp) / f"fit-{cache}", cache, a.fit_epochs,
                                     4 if a.quick else BATCH)
                fit_rows.append([f"data.cache={cache}" + (" (default)" if cache == "auto" else ""),
                                 a.fit_epochs, f"{100 * frac:.1f} %", f"{wall:.0f} s"])
            print(f"\n## Short fit (python -m project fit, configs/train.yaml, {IMAGE_SIZE} px, "
                  f"batch {BATCH}, num_workers default)\n")
            print(table(["run", "epochs", "perf/data_wait_frac (last epoch)", "wall"], fit_rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
