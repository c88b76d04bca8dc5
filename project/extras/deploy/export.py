"""Export a checkpoint for deployment and prove each file works before keeping it.

    python -m project export [--ckpt_path best|last|PATH] [--formats onnx,int8,torchscript,pt2]
                             [--out DIR] [--data_dir DIR] [--calibration_images 256]
                             [--check_images 256] [--timing_batches 1[,32]]

Writes model.onnx, model.int8.onnx, model.torchscript.pt, model.pt2 and export_report.{json,md}
(size, max |difference| to PyTorch, validation accuracy on at most --check_images images,
latency at each of --timing_batches: batch 1 unless asked).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from project.checkpoints import check_checkpoint_classes, check_data_dir, datamodule_for, load_model
from project.common.files import write_text
from project.data.datasets import ImageDataset, collate_skipping_bad
from project.errors import ProjectError, require
from project.extras.deploy import exporters
from project.runs import default_out_dir, resolve_checkpoint

FORMATS = ("onnx", "int8", "torchscript", "pt2")
FILES = {"onnx": "model.onnx", "int8": "model.int8.onnx", "torchscript": "model.torchscript.pt",
         "pt2": "model.pt2"}


def eval_dataset(dm, samples: list) -> ImageDataset:
    """``samples`` of the data module ``dm`` as evaluation sees them (no cache)."""
    return ImageDataset(samples, dm.transform("val"), on_bad_image=dm.hparams.on_bad_image,
                        short_side=dm.short_side("val"), target=dm.task_type.target)


def check_dataset(dm, n: int) -> ImageDataset:
    """At most ``n`` validation images, a seeded random choice (the same on every export, and
    spread over the classes, not the first folders), through the evaluation transforms:
    each format's accuracy is one pass over them, so a large validation set does not slow export."""
    samples = dm.splits.val
    if len(samples) > n:
        keep = np.sort(np.random.default_rng(0).permutation(len(samples))[:n])
        samples = [samples[i] for i in keep]
    return eval_dataset(dm, samples)


def parse_batches(text: str) -> tuple[int, ...]:
    """``--timing_batches 1,32`` as (1, 32); one line naming the option for anything else."""
    try:
        sizes = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        sizes = ()
    require(bool(sizes) and min(sizes) >= 1, "--timing_batches",
            "must be batch sizes >= 1, comma-separated, e.g. 1 or 1,32", text)
    return tuple(sorted(set(sizes)))


def check_counts(check_images: int, timing_batches: tuple[int, ...], repeats: int,
                 calibration_images: int) -> None:
    """The counts that a zero or negative value would turn into an empty loop and a traceback."""
    require(check_images >= 1, "--check_images", "must be >= 1 (validation images per format)",
            check_images)
    require(bool(timing_batches) and min(timing_batches) >= 1, "--timing_batches",
            "must be batch sizes >= 1, e.g. 1 or 1,32", ",".join(map(str, timing_batches)))
    require(repeats >= 1, "--repeats", "must be >= 1 (timed runs per latency figure)", repeats)
    require(calibration_images >= 1, "--calibration_images", "must be >= 1", calibration_images)


def batches(dataset, batch_size: int = 32) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(images, labels) through the evaluation transforms; undecodable files are left out and
    counted in the dataset's ``skipped_paths()``."""
    for batch in DataLoader(dataset, batch_size=batch_size, collate_fn=collate_skipping_bad):
        if batch is not None:
            yield batch


def task_score(run: Callable[[torch.Tensor], np.ndarray], batches, score) -> float | None:
    """The task's export score (``Task.export_score``) of a format's outputs on ``batches``."""
    parts = [(torch.from_numpy(np.asarray(run(x))).float(), y) for x, y in batches]
    if not parts:
        return None
    return score(torch.cat([p for p, _ in parts]), torch.cat([y for _, y in parts]))


def median_ms(run: Callable[[torch.Tensor], object], x: torch.Tensor, repeats: int) -> float:
    for _ in range(3):  # warm-up: allocations, kernel selection, caches
        run(x)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run(x)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def export_checkpoint(ckpt_path: Path, out: Path, formats: list[str], data_dir: str | None = None,
                      calibration_images: int = 256, calibration_method: str = "minmax",
                      tolerance: float = 1e-4, int8_max_drop: float = 0.05,
                      repeats: int = 20, check_images: int = 256,
                      timing_batches: tuple[int, ...] = (1, 32)) -> dict:
    """Export ``formats`` and the report. The command times batch 1 only unless asked; this
    function keeps batch 32 too by default, for the callers whose tables show it."""
    check_counts(check_images, timing_batches, repeats, calibration_images)
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        raise ProjectError(f"--formats: unknown {unknown}; choose from {', '.join(FORMATS)}")
    model = load_model(ckpt_path)  # fails with one line before anything is written
    net = model.net.float().eval()
    try:
        dm = datamodule_for(ckpt_path, model, data_dir)
        splits = dm.splits
    except ProjectError as err:  # the run's data is not here: exports work, without accuracies
        if "int8" in formats:
            raise ProjectError(f"INT8 calibration needs the training images ({err}): pass "
                               "--data_dir DIR") from err
        print(f"Notice: no accuracies, and infer.py's image preparation is not checked on real images: {err}")
        dm = splits = None
    if dm is not None:  # accuracies against other classes' labels would read as a broken export
        check_checkpoint_classes(ckpt_path, dm.class_names)
    if "int8" in formats and "onnx" not in formats:
        formats = ["onnx", *formats]
    size = model.preprocessing.image_size
    # what the formats are compared on: the task's (accuracy, a multi-label model's mAP, ...)
    metric, task_fn = model.task.export_score()
    val = check_dataset(dm, check_images) if splits is not None and splits.val else None
    if "onnx" in formats:
        check_infer_preprocessing(model.preprocessing, dm, val)

    def val_batches():
        return batches(val) if val is not None else []

    threads = torch.get_num_threads()
    inputs = {b: torch.randn(b, 3, size, size) for b in timing_batches}
    rows: dict[str, dict] = {}

    def measure(name: str, run, file: Path | None, diff: float | None) -> None:
        rows[name] = {
            "file": file.name if file else None,
            "size_mb": round(file.stat().st_size / 2**20, 3) if file else None,
            "max_abs_diff": diff,
            metric: task_score(run, val_batches(), task_fn),
            **{f"latency_ms_b{b}": round(median_ms(run, x, repeats), 3) for b, x in inputs.items()},
        }

    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        with torch.inference_mode():
            measure("pytorch", lambda x: net(x).numpy(), None, 0.0)
            for name in [f for f in FORMATS if f in formats]:
                path = out / FILES[name]
                if name == "onnx":
                    diff = exporters.export_onnx(model, net, path, tolerance)
                    measure(name, exporters.ort_runner(exporters.ort_session(path, threads)), path, diff)
                elif name == "int8":
                    _export_int8(out, dm, calibration_images, calibration_method)
                    run = exporters.ort_runner(exporters.ort_session(path, threads))
                    diff = float(max(np.abs(run(x) - net(x).numpy()).max()
                                     for x in exporters.parity_inputs(size)))
                    measure(name, run, path, diff)
                    _check_int8_accuracy(rows, int8_max_drop, path, metric, model.task.mode)
                elif name == "torchscript":
                    diff = exporters.export_torchscript(net, path, size, tolerance)
                    loaded = torch.jit.load(str(path))
                    measure(name, lambda x, m=loaded: m(x).numpy(), path, diff)
                else:
                    diff = exporters.export_pt2(net, path, size, tolerance)
                    loaded = torch.export.load(str(path)).module()
                    measure(name, lambda x, m=loaded: m(x).numpy(), path, diff)
    finally:  # a failed export leaves no empty folder behind
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()
    earlier = out / "export_report.json"  # read before this export's report replaces it
    try:
        before = json.loads(earlier.read_text()).get("checkpoint") if earlier.is_file() else None
    except (ValueError, OSError, AttributeError):
        before = None
    stale = [out / FILES[f] for f in FORMATS if f not in formats and (out / FILES[f]).is_file()]
    if stale and before is not None and before != str(ckpt_path):  # another model's, beside this one's
        for path in stale:
            path.unlink()
        print(f"Notice: removed {', '.join(p.name for p in stale)} in {out}: exported from {before}, "
              "not from this checkpoint")
    skipped = len(val.skipped_paths()) if val is not None else 0
    if skipped:
        print(f"Notice: {skipped} validation images could not be decoded and are not in "
              "the accuracies (python -m project check-data lists them)")
    report = {"checkpoint": str(ckpt_path), "threads": threads, "image_size": size,
              "class_names": model.class_names, "formats": rows, "metric": metric,
              # every format outputs raw logits; project/tasks/answers.py makes the answers
              "answers": model.answer_state(),
              # how much each figure rests on: images scored per format, batch sizes timed
              "checked_images": len(val) - skipped if val is not None else 0,
              "val_images": len(splits.val) if splits is not None else 0,
              "timing_batches": list(inputs),
              "latency": f"median of {repeats} runs after 3 warm-up runs, {threads} threads"}
    _write_report(out, report)
    return report


def check_infer_preprocessing(pre, dm, val: ImageDataset | None) -> None:
    """``infer.py`` and ``serve --onnx`` prepare images without torch (``infer.preprocess``): an
    edit to the evaluation transforms that it does not mirror would feed the ONNX file other inputs
    than those its accuracy is measured on here. Compared on a made-up image and a few validation
    images read at the resize side, where neither resizes (torch's and Pillow's resizers round
    differently when they enlarge), in steps of one pixel value."""
    from project.common.pixels import DECODE_ERRORS, read_rgb
    from project.data.transforms import eval_transforms
    from project.extras.deploy.infer import preprocess

    transform = dm.transform("val") if dm is not None else eval_transforms(pre)
    y, x = np.mgrid[0:1:pre.resize_size * 1j, 0:1:pre.resize_size * 4 // 3 * 1j]  # landscape, colours
    made = (np.stack([x, y, 1 - (x + y) / 2], -1) * 255).astype(np.uint8)
    images = {"a made-up gradient": made}
    for sample in (val.samples[:4] if val is not None else []):
        try:
            rgb = read_rgb(sample.path, pre.resize_size)
        except DECODE_ERRORS:
            continue  # undecodable: left out of the accuracies too
        if min(rgb.shape[:2]) == pre.resize_size:  # a smaller image is enlarged: not compared
            images[sample.path] = rgb
    std = np.reshape(pre.std, (3, 1, 1))
    for name, rgb in images.items():
        want = transform(torch.from_numpy(rgb).permute(2, 0, 1).contiguous()).numpy()
        got = preprocess(rgb, pre)
        diff = float(np.abs((want - got) * std).max() * 255) if want.shape == got.shape else float("inf")
        if diff > 1.01:
            raise ProjectError(
                f"infer.py prepares images otherwise than evaluation does ({name}: shapes "
                f"{tuple(want.shape)} and {tuple(got.shape)}, up to {diff:.1f} pixel values apart): "
                "infer.py and serve --onnx would feed the ONNX file other inputs than those scored "
                "here. Make preprocess in project/extras/deploy/infer.py and the evaluation "
                "transforms (project/data/transforms.py eval_transforms) do the same")


def _export_int8(out: Path, dm, n: int, method: str) -> None:
    """Calibrate on ``n`` training images (seeded choice) through the evaluation transforms: the
    input distribution the quantized model will see in use."""
    from project.extras.deploy.quantize import quantize_int8

    rng = np.random.default_rng(0)
    chosen = [dm.splits.train[i] for i in rng.permutation(len(dm.splits.train))[:n]]
    images = (x.numpy() for x, _ in batches(eval_dataset(dm, chosen)))
    quantize_int8(out / FILES["onnx"], out / FILES["int8"], images, method)


def _check_int8_accuracy(rows: dict, max_drop: float, path: Path, metric: str = "val_acc",
                         mode: str = "max") -> None:
    """INT8 may lose at most ``max_drop`` of the metric (of a lower-is-better one: that share of it)."""
    fp32, int8 = rows["onnx"][metric], rows["int8"][metric]
    if fp32 is None or int8 is None:
        return
    drop = fp32 - int8 if mode == "max" else (int8 - fp32) / max(abs(fp32), 1e-12)
    if drop > max_drop:
        path.unlink(missing_ok=True)
        raise exporters.ExportError(
            f"INT8 {metric} {int8:.4f} is {'a share ' if mode == 'min' else ''}{drop:.4f} worse than FP32 "
            f"({fp32:.4f}), more than --int8_max_drop={max_drop}; try --calibration_method percentile "
            "or more --calibration_images (the INT8 file was removed)"
        )


def _write_report(out: Path, report: dict) -> None:
    sizes = report["timing_batches"]
    checked = (f"{report['checked_images']} of {report['val_images']} validation images (seeded "
               "choice; --check_images)" if report["val_images"] else "no validation images here")
    lines = [f"# Export report\n\nCheckpoint: `{report['checkpoint']}`  \n"
             f"Latency: {report['latency']}, at batch {', '.join(map(str, sizes))} (--timing_batches).  \n"
             f"{report['metric'].replace('_', ' ').capitalize()}: on {checked}.  \n"
             f"Outputs are the network's raw outputs; the answers ({report['answers']['task']}) are made "
             "from them with the state in model.onnx's metadata (project/tasks/answers.py).\n",
             f"| format | file | size (MB) | max abs diff vs PyTorch | {report['metric'].replace('_', ' ')} "
             + "".join(f"| latency b{b} (ms) " for b in sizes) + "|",
             "|---|---|---|---|---|" + "---|" * len(sizes)]

    def cell(v, fmt):
        return "-" if v is None else format(v, fmt)

    for name, r in report["formats"].items():
        lines.append(f"| {name} | {r['file'] or '-'} | {cell(r['size_mb'], '.2f')} | "
                     f"{cell(r['max_abs_diff'], '.2e')} | {cell(r[report['metric']], '.4f')} | "
                     + " | ".join(f"{r[f'latency_ms_b{b}']:.2f}" for b in sizes) + " |")
    for name, text in (("export_report.json", json.dumps(report, indent=2)),
                       ("export_report.md", "\n".join(lines) + "\n")):
        write_text(out / name, text)
    print("\n".join(lines[2:]))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m project export", description=__doc__.split("\n")[0])
    p.add_argument("--ckpt_path", default="best", help="a .ckpt, a run folder, best or last")
    p.add_argument("--formats", default=",".join(FORMATS), help="comma-separated: " + ",".join(FORMATS))
    p.add_argument("--out", help="output folder (default exports/<run>)")
    p.add_argument("--data_dir", help="images for INT8 calibration and accuracy (default: the run's)")
    p.add_argument("--calibration_images", type=int, default=256)
    p.add_argument("--calibration_method", default="minmax", choices=("minmax", "entropy", "percentile"))
    p.add_argument("--tolerance", type=float, default=1e-4, help="max |logit difference| allowed")
    p.add_argument("--int8_max_drop", type=float, default=0.05, help="largest INT8 accuracy loss")
    p.add_argument("--repeats", type=int, default=20, help="timed runs per latency figure")
    p.add_argument("--check_images", type=int, default=256,
                   help="validation images each format's accuracy is measured on (a seeded choice)")
    p.add_argument("--timing_batches", default="1",
                   help="batch sizes to time, comma-separated, e.g. 1,32 (default: 1)")
    a = p.parse_args(argv)
    check_data_dir(a.data_dir)  # before the model loads
    timing_batches = parse_batches(a.timing_batches)
    check_counts(a.check_images, timing_batches, a.repeats, a.calibration_images)  # before any run is read
    ckpt = resolve_checkpoint(a.ckpt_path)
    out = Path(a.out) if a.out else default_out_dir(ckpt)
    if out.exists() and not out.is_dir():
        raise ProjectError(f"--out '{out}' is a file: pass a folder to write the exports to")
    formats = [f.strip() for f in a.formats.split(",") if f.strip()]
    export_checkpoint(ckpt, out, formats, a.data_dir, a.calibration_images, a.calibration_method,
                      a.tolerance, a.int8_max_drop, a.repeats, a.check_images, timing_batches)
    print(f"\nExported {', '.join(formats)} from {ckpt} to {out}/ (report: export_report.md)")
    return 0
