"""Speed of the template, measured side by side in one run and printed as Markdown tables.

    python -m benchmarks.bench [--quick] [--data DIR] [--ckpt CKPT]     (make bench)

1. Training overhead: images/s of the template's fit (the callbacks of configs/train.yaml but
   checkpoints, with EMA and without it) vs a minimal plain-PyTorch loop (same model, data,
   transforms, batch, precision, workers and steps), start-up excluded; the EMA's own cost.
2. Data pipeline: decoded + augmented images/s by num_workers, with and without the cache,
   and streamed from LitData shards (``optimize-data``) at two chunk sizes, next to the
   model's training-step rate: which side is the bottleneck.
3. Precision: the model step in float32 and under bf16 autocast on this CPU (what the CLI's
   ``16-mixed`` rule chooses between).
4. Start-up: seconds from the command to the first training step.
5. Inference: PyTorch eager vs ONNX Runtime FP32 vs INT8, from the export report.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
from torch.optim.swa_utils import AveragedModel

from project.callbacks import default_callbacks
from project.callbacks.dashboards import Dashboards, LearningRate, TensorBoard
from project.callbacks.ema import EMA, ema_update
from project.cli import cpu_has_bfloat16
from project.common.preprocessing import Preprocessing
from project.data import FolderDataModule
from project.data.demo import make_demo
from project.extras.streaming.optimize import run as optimize
from project.model import ImageClassifier

# what the CLI runs on this CPU: bf16 autocast where the CPU has bfloat16, else float32
BF16 = cpu_has_bfloat16()

REPO = Path(__file__).resolve().parents[1]


def table(headers: list[str], rows: list[list]) -> str:
    def fmt(v) -> str:
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def datamodule(data: Path, size: int, batch: int, workers: int, cache: str) -> FolderDataModule:
    dm = FolderDataModule(str(data), batch_size=batch, num_workers=workers, cache=cache)
    dm.preprocessing = Preprocessing(size)
    dm.setup("fit")
    return dm


class _StepTimer(L.Callback):
    """The end time of every training step."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.ends.append(time.perf_counter())


def median_rate(ends: list[float], warmup: int, batch: int) -> float:
    """Images/s from the median step time after ``warmup`` steps: the median, not the total, so
    that a burst of another process on a shared machine does not decide a comparison."""
    return batch / statistics.median(b - a for a, b in zip(ends[warmup:-1], ends[warmup + 1:], strict=True))


def template_rate(data: Path, size: int, batch: int, workers: int, steps: int, warmup: int,
                  ema: bool = False) -> float:
    """Images/s of the template's training path: the callbacks of configs/train.yaml (but the
    checkpoints), its logger, schedule and guards; with ``ema``, the ema preset's callback too."""
    torch.manual_seed(0)
    dm = FolderDataModule(data, batch_size=batch, num_workers=workers)
    model = ImageClassifier(weights=None, num_classes=dm.num_classes, class_names=dm.class_names,
                            input=size)
    dm.preprocessing = model.preprocessing
    timer = _StepTimer()  # last: the EMA update of a step is inside its time
    callbacks = [*([EMA()] if ema else []), *default_callbacks(), LearningRate(), Dashboards(), timer]
    with tempfile.TemporaryDirectory() as logs:
        trainer = L.Trainer(max_steps=warmup + steps + 1, max_epochs=-1,
                            precision="bf16-mixed" if BF16 else "32-true", accelerator="cpu",
                            devices=1, limit_val_batches=0,
                            enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, callbacks=callbacks,
                            logger=TensorBoard(logs), log_every_n_steps=10)
        trainer.fit(model, dm)
    return median_rate(timer.ends, warmup, batch)


def plain_rate(data: Path, size: int, batch: int, workers: int, steps: int, warmup: int) -> float:
    """The physical limit of the same work: a bare PyTorch loop over the same loader."""
    torch.manual_seed(0)
    dm = datamodule(data, size, batch, workers, "auto")
    model = ImageClassifier(weights=None, num_classes=dm.num_classes, input=size).net
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9, weight_decay=1e-4)
    model.train()
    ends, epoch = [], 0
    while len(ends) < warmup + steps + 1:
        loader = dm.train_dataloader()
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=BF16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            ends.append(time.perf_counter())
            if len(ends) == warmup + steps + 1:
                break
        epoch += 1
    return median_rate(ends, warmup, batch)


def loader_rate(dm: FolderDataModule, batches: int) -> float:
    """Decoded + augmented images/s of the training loader alone (first batch excluded)."""
    it = iter(dm.train_dataloader())
    next(it)
    start, n = time.perf_counter(), 0
    for _ in range(batches):
        x, _ = next(it)
        n += len(x)
    return n / (time.perf_counter() - start)


CHUNK_BYTES = ("1MB", "64MB")  # many small chunks vs LitData's default size (one chunk here)


def optimized_copies(data: Path, tmp: Path, chunk_sizes: tuple[str, ...]) -> tuple[dict[str, Path], str]:
    """``optimize-data`` copies of ``data``, one per chunk size, and a note of their cost."""
    shards, notes = {}, []
    for chunk in chunk_sizes:
        out = tmp / f"optimized-{chunk}"
        settings = {"max_side": None, "chunk_bytes": chunk, "val_fraction": 0.15, "test_fraction": 0.15,
                    "split_seed": 0}
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            optimize(data, out, settings, workers=min(2, os.cpu_count() or 1))
        chunks = len(list((out / "train").glob("*.bin")))
        notes.append(f"chunk_bytes={chunk}: {chunks} train chunks, made in "
                     f"{time.perf_counter() - start:.1f} s")
        shards[chunk] = out
    return shards, "; ".join(notes)


def model_step_rate(num_classes: int, size: int, batch: int, steps: int) -> float:
    """Images/s of the template's network on random tensors: no data loading at all."""
    torch.manual_seed(0)
    net = ImageClassifier(weights=None, num_classes=num_classes, input=size).net
    return step_rate(net, num_classes, size, batch, steps, BF16)


def step_rate(net: torch.nn.Module, num_classes: int, size: int, batch: int, steps: int, bf16: bool) -> float:
    """Images/s of forward + backward + SGD step on one random batch, after two warm-up steps."""
    opt = torch.optim.SGD(net.train().parameters(), lr=1e-4, momentum=0.9)
    x, y = torch.randn(batch, 3, size, size), torch.randint(0, num_classes, (batch,))
    for i in range(steps + 2):
        if i == 2:
            start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = torch.nn.functional.cross_entropy(net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return steps * batch / (time.perf_counter() - start)


def ema_update_ms(num_classes: int, size: int, updates: int) -> float:
    """Milliseconds of one EMA update as the EMA callback runs it: Lightning's WeightAveraging
    calls ``AveragedModel.update_parameters`` with the template's multi-tensor EMA."""
    net = ImageClassifier(weights=None, num_classes=num_classes, input=size)
    averaged = AveragedModel(net, multi_avg_fn=ema_update(0.999, warmup=True), use_buffers=True)
    averaged.update_parameters(net)  # the first update copies
    start = time.perf_counter()
    for _ in range(updates):
        averaged.update_parameters(net)
    return 1000 * (time.perf_counter() - start) / updates


def startup_seconds(data: Path, size: int) -> float:
    """From launching ``python -m project fit`` to the first training step."""
    with tempfile.TemporaryDirectory() as cwd:
        start = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "project", "fit", "--config", str(REPO / "configs/train.yaml"),
             f"--data.data_dir={data}", f"--model.input.size={size}", "--model.weights=null",
             "--trainer.max_steps=1", "--trainer.enable_progress_bar=false"],
            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        seconds = float("nan")
        for line in proc.stdout:
            if "First training batch" in line and seconds != seconds:
                seconds = time.perf_counter() - start
        proc.wait()
    return seconds


def pipeline_table(data: Path, tmp: Path, size: int, batch: int, steps: int, loader_batches: int,
                   worker_counts: tuple[int, ...]) -> str:
    """Loader images/s: files without and with the cache, and LitData shards, by num_workers."""
    shards, notes = optimized_copies(data, tmp, CHUNK_BYTES)
    model_rate = model_step_rate(FolderDataModule(data).num_classes, size, batch, steps)
    sources = [(f"loader, cache={cache}", data, cache) for cache in ("none", "memory")]
    sources += [(f"loader, streaming chunk_bytes={chunk}", shards[chunk], "none") for chunk in CHUNK_BYTES]
    rates = {}
    for n in worker_counts:  # interleaved: the machine's drift hits each source alike
        for name, source, cache in sources:
            rates[name, n] = loader_rate(datamodule(source, size, batch, n, cache), loader_batches)
    rows = [["model training step (no data)", "-", model_rate, 1.0]]
    rows += [[name, n, rates[name, n], rates[name, n] / model_rate] for name, _, _ in sources
             for n in worker_counts]
    return (f"Streaming reads an optimized copy of the same data ({notes}).\n\n"
            + table(["pipeline", "num_workers", "images/s", "ratio to model step"], rows))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes: checks the script runs")
    p.add_argument("--data", help="data folder (default: data/demo, or a small one with --quick)")
    p.add_argument("--ckpt", help="checkpoint for the inference table (default: newest run's best)")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        return run(a, Path(tmp))


def run(a: argparse.Namespace, tmp: Path) -> int:
    if a.quick:
        data = Path(a.data) if a.data else make_demo(tmp / "data", 24, 4, 2, image_size=32,
                                                     num_classes=3)
        size, batch, steps, warmup, loader_batches, repeats = 32, 16, 6, 2, 3, 1
    else:
        data = Path(a.data or REPO / "data" / "demo")
        size, batch, steps, warmup, loader_batches, repeats = 48, 64, 60, 5, 30, 5
    threads = torch.get_num_threads()
    print(f"# Benchmarks\n\nMachine: {platform.machine()} {platform.processor() or ''}, "
          f"{os.cpu_count()} CPUs, torch {torch.__version__} with {threads} threads; "
          f"data {data}, {size} px, batch {batch}, {'bf16 autocast' if BF16 else 'float32'}.\n")

    workers = FolderDataModule(data).workers()  # the automatic choice on this (CPU) machine
    rates: dict[str, list[float]] = {"plain": [], "template": [], "ema": []}
    for _ in range(repeats):  # interleaved: a shared 2-core machine drifts by +-10 %
        with contextlib.redirect_stdout(io.StringIO()):
            rates["template"].append(template_rate(data, size, batch, workers, steps, warmup))
            rates["ema"].append(template_rate(data, size, batch, workers, steps, warmup, ema=True))
        rates["plain"].append(plain_rate(data, size, batch, workers, steps, warmup))

    def ratio(name: str) -> float:
        return statistics.median(t / p for t, p in zip(rates[name], rates["plain"], strict=True))

    ema_ms = ema_update_ms(FolderDataModule(data).num_classes, size, 5 if a.quick else 50)
    step_ms = 1000 * batch / statistics.median(rates["template"])
    print(f"## Training overhead ({steps} steps after {warmup} warm-up, num_workers={workers}, "
          f"median step time; median of {repeats} interleaved runs)\n")
    print(table(["loop", "images/s", "ratio to plain", "ms a step"],
                [["plain PyTorch", statistics.median(rates["plain"]), 1.0, "-"],
                 ["template fit (as train.yaml)", statistics.median(rates["template"]),
                  ratio("template"), step_ms],
                 ["template fit, EMA on (ema preset)", statistics.median(rates["ema"]), ratio("ema"), "-"],
                 ["the EMA update alone (foreach)", "-", "-", ema_ms]]))
    every = EMA().every_n_steps
    print(f"\nThe EMA update is {100 * ema_ms / every / step_ms:.1f} % of a template step ({ema_ms:.2f} ms "
          f"every {every} steps, timed on its own).")

    print("\n## Data pipeline vs model\n")
    print(pipeline_table(data, tmp, size, batch, steps, loader_batches, (0,) if a.quick else (0, 1, 2)))

    print("\n## Precision on this CPU (model step alone, 5 steps each)\n")
    precision = {bf16: step_rate(ImageClassifier(weights=None, num_classes=10, input=size).net, 10,
                                 size, batch, 2 if a.quick else 5, bf16) for bf16 in (False, True)}
    print(table(["precision", "images/s", "ratio to float32"],
                [["float32", precision[False], 1.0], ["bf16 autocast", precision[True],
                                                      precision[True] / precision[False]]]))
    print(f"\n`16-mixed` runs as {'bf16 autocast' if BF16 else 'float32'} here (cpu_has_bfloat16).")

    print("\n## Start-up\n")
    print(table(["command", "seconds to first training step"],
                [["python -m project fit", startup_seconds(data, size)]]))

    print("\n## Inference\n")
    print(inference_table(a.ckpt, data, tmp, a.quick))
    return 0


def inference_table(ckpt: str | None, data: Path, tmp: Path, quick: bool) -> str:
    from project.extras.deploy.export import export_checkpoint
    from project.runs import RunNotFoundError, resolve_checkpoint

    if quick and not ckpt:  # hermetic: never pick up a real run's checkpoint
        path = _quick_checkpoint(data, tmp)
    else:
        try:
            path = resolve_checkpoint(ckpt)
        except RunNotFoundError:
            return "No checkpoint: train first (make train), or pass --ckpt."
    with contextlib.redirect_stdout(io.StringIO()):  # export prints its own table
        report = export_checkpoint(path, tmp / "export", ["onnx", "int8"], str(data),
                                   calibration_images=16 if quick else 256, int8_max_drop=1.0,
                                   repeats=3 if quick else 20)
    rows = report["formats"]
    base = rows["pytorch"]
    out = [[name, r["size_mb"] or "-", r["val_acc"], r["latency_ms_b1"], r["latency_ms_b32"],
            base["latency_ms_b32"] / r["latency_ms_b32"]] for name, r in rows.items()]
    return (f"{report['latency']}; checkpoint {path}\n\n" + table(
        ["engine", "size MB", "val acc", "ms batch 1", "ms batch 32", "speed-up b32 vs eager"], out))


def _quick_checkpoint(data: Path, tmp: Path) -> Path:
    dm = FolderDataModule(data, batch_size=8, num_workers=0)
    model = ImageClassifier(weights=None, num_classes=dm.num_classes, class_names=dm.class_names,
                            input=32)
    dm.preprocessing = model.preprocessing
    trainer = L.Trainer(max_epochs=1, default_root_dir=tmp, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=default_callbacks())
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.fit(model, dm)
    path = tmp / "quick.ckpt"
    trainer.save_checkpoint(path)
    return path


if __name__ == "__main__":
    sys.exit(main())
