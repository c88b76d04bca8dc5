"""Classify images with an exported model.onnx: NumPy, Pillow and ONNX Runtime only, no torch.

    python -m project.deploy.infer exports/demo/version_0/model.onnx DIR_OR_FILE --output preds.csv

For deployment, copy this file, ``project/common/`` and the .onnx file; the preprocessing
(input size, crop ratio, mean and std), the class names and the temperature are read from the
model's metadata. Probabilities are ``softmax(logits / temperature)``, as ``predict`` gives them.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
from PIL import Image

from project.common.files import atomic_path, list_images
from project.common.pixels import read_rgb


class OnnxClassifier:
    def __init__(self, model_path: str | Path, threads: int | None = None) -> None:
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(model_path), options,
                                            providers=["CPUExecutionProvider"])
        meta = self.session.get_modelmeta().custom_metadata_map
        missing = {"class_names", "image_size", "crop_ratio", "mean", "std"} - set(meta)
        if missing:
            raise ValueError(f"{model_path} lacks metadata {sorted(missing)}: export it with "
                             "`python -m project export`")
        self.class_names: list[str] = json.loads(meta["class_names"])
        self.image_size = int(meta["image_size"])
        self.crop_ratio = float(meta["crop_ratio"])
        self.mean = np.asarray(json.loads(meta["mean"]), np.float32).reshape(3, 1, 1)
        self.std = np.asarray(json.loads(meta["std"]), np.float32).reshape(3, 1, 1)
        resampling = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC,
                      "nearest": Image.Resampling.NEAREST}
        self.resampling = resampling[meta.get("interpolation", "bilinear")]
        # temperature scaling; files exported before it existed are uncalibrated (1)
        self.temperature = float(meta.get("temperature", 1.0))
        if not self.temperature > 0:
            raise ValueError(f"{model_path}: metadata temperature must be above 0, got "
                             f"{meta['temperature']!r}")
        self.input_name = self.session.get_inputs()[0].name

    def preprocess(self, rgb: np.ndarray) -> np.ndarray:
        """Resize the short side, center crop, normalise: the training's evaluation transform."""
        return preprocess(rgb, self.image_size, self.crop_ratio, self.mean, self.std, self.resampling)

    def read(self, path: str) -> np.ndarray:
        """The image at ``path``, decoded as training's evaluation decodes it (same pixels)."""
        return read_rgb(path, resize_side(self.image_size, self.crop_ratio))

    def probabilities(self, images: list[np.ndarray]) -> np.ndarray:
        batch = np.stack([self.preprocess(im) for im in images]).astype(np.float32)
        logits = self.session.run(None, {self.input_name: batch})[0].astype(np.float64)
        logits = logits / self.temperature
        e = np.exp(logits - logits.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)


def resize_side(image_size: int, crop_ratio: float) -> int:
    """The short side before the center crop: ``Preprocessing.resize_size`` of training."""
    return round(image_size / crop_ratio)


def preprocess(rgb: np.ndarray, image_size: int, crop_ratio: float, mean: np.ndarray, std: np.ndarray,
               resampling: Image.Resampling = Image.Resampling.BILINEAR) -> np.ndarray:
    """Resize the short side, center crop, normalise: the training's evaluation transform.

    ``rgb`` comes from ``read_rgb(path, resize_side(...))``, already reduced to the resize side
    by the reader training uses, so the resize here is a no-op (Pillow returns a copy), except
    for an image smaller than that side, which is enlarged here as torchvision does there.
    """
    h, w = rgb.shape[:2]
    short = resize_side(image_size, crop_ratio)
    # the short side becomes ``short``; the long side is truncated, as torchvision does
    size = (short, int(short * h / w)) if w <= h else (int(short * w / h), short)
    img = Image.fromarray(rgb).resize(size, resampling)
    top = int(round((img.height - image_size) / 2.0))
    left = int(round((img.width - image_size) / 2.0))
    img = img.crop((left, top, left + image_size, top + image_size))
    x = np.asarray(img, np.float32).transpose(2, 0, 1) / 255.0
    return (x - np.reshape(mean, (3, 1, 1))) / np.reshape(std, (3, 1, 1))


def image_paths(spec: str | Path) -> list[str]:
    """A file, or the images below a folder, listed exactly as training lists them."""
    if not Path(spec).exists():
        raise FileNotFoundError(f"'{spec}' does not exist")
    return list_images(spec)


def classify(model: OnnxClassifier, paths: list[str], top_k: int = 3,
             batch_size: int = 32) -> list[dict]:
    k = min(top_k, len(model.class_names))
    rows: list[dict] = []
    for start in range(0, len(paths), batch_size):
        good, images = [], []
        for path in paths[start:start + batch_size]:
            try:
                images.append(model.read(path))
                good.append(path)
            except Exception as err:
                rows.append({"path": path, "error": f"{type(err).__name__}: {err}"})
        if not images:
            continue
        for path, p in zip(good, model.probabilities(images), strict=True):
            order = np.argsort(-p)[:k]
            row = {"path": path, "predicted": model.class_names[order[0]],
                   "confidence": f"{p[order[0]]:.6f}", "error": ""}
            for rank, c in enumerate(order, 1):
                row[f"top{rank}"] = model.class_names[c]
                row[f"top{rank}_prob"] = f"{p[c]:.6f}"
            rows.append(row)
    order_of = {p: i for i, p in enumerate(paths)}
    return sorted(rows, key=lambda r: order_of[r["path"]])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m project.deploy.infer", description=__doc__.split("\n")[0])
    p.add_argument("model", help="an exported .onnx file")
    p.add_argument("input", help="an image file or a folder of images")
    p.add_argument("--output", default="preds.csv")
    p.add_argument("--top_k", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    a = p.parse_args(argv)
    try:
        model = OnnxClassifier(a.model, a.threads)
        paths = image_paths(a.input)
    except (ValueError, FileNotFoundError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    rows = classify(model, paths, a.top_k)
    k = min(a.top_k, len(model.class_names))
    fields = ["path", "predicted", "confidence"]
    fields += [f"top{r}{s}" for r in range(1, k + 1) for s in ("", "_prob")] + ["error"]
    with atomic_path(a.output) as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields, restval="")
        writer.writeheader()
        writer.writerows(rows)
    failed = sum(1 for r in rows if r["error"])
    print(f"{len(rows) - failed} images classified with {a.model} -> {a.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
