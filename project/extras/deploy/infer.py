"""Classify images with an exported model.onnx: NumPy, Pillow and ONNX Runtime only, no torch.

    python -m project.extras.deploy.infer exports/demo/version_0/model.onnx DIR_OR_FILE --output preds.csv

For deployment, copy this file, ``project/common/``, ``project/errors.py``, the import-free
``__init__.py`` files of ``project/``, ``project/extras/`` and ``project/extras/deploy/``, and the
.onnx file;
the preprocessing (input size, crop ratio, interpolation, mean and std), the class names and the
answer state (the task, temperature, thresholds, target scaling) are read from the model's
metadata, and ``project/tasks/answers.py`` (with the import-free ``project/tasks/__init__.py``)
makes ``predict``'s rows from them: the same numbers and columns.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnxruntime as ort
from PIL import Image

from project.common.files import left_out_text, list_images
from project.common.pixels import DECODE_ERRORS, read_rgb
from project.common.predictions import error_row, write_csv
from project.common.preprocessing import Preprocessing
from project.tasks import answers

RESAMPLING = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC,
              "nearest": Image.Resampling.NEAREST}


def to_metadata(pre: Preprocessing) -> dict[str, str]:
    """The preprocessing as strings, for an ONNX file's metadata (:func:`from_metadata` reads it)."""
    return {"image_size": str(pre.image_size), "crop_ratio": repr(pre.crop_ratio),
            "interpolation": pre.interpolation, "mean": json.dumps(list(pre.mean)),
            "std": json.dumps(list(pre.std))}


def from_metadata(meta: dict[str, str]) -> Preprocessing:
    return Preprocessing(int(meta["image_size"]), float(meta["crop_ratio"]),
                         meta.get("interpolation", "bilinear"), tuple(json.loads(meta["mean"])),
                         tuple(json.loads(meta["std"])))


def ort_session(path: str | Path, threads: int | None = None) -> ort.InferenceSession:
    """An ONNX Runtime session on the CPU (``threads``: intra-op threads, None: its default)."""
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as err:  # ONNX Runtime's own types (InvalidProtobuf, NoSuchFile, Fail)
        raise ValueError(f"'{path}' is not an ONNX model ONNX Runtime can load ({type(err).__name__}); "
                         "export one with `python -m project export`") from None


class OnnxClassifier:
    def __init__(self, model_path: str | Path, threads: int | None = None) -> None:
        self.session = ort_session(model_path, threads)
        meta = self.session.get_modelmeta().custom_metadata_map
        missing = {"class_names", "image_size", "crop_ratio", "mean", "std"} - set(meta)
        if missing:
            raise ValueError(f"{model_path} lacks metadata {sorted(missing)}: export it with "
                             "`python -m project export`")
        self.class_names: list[str] = json.loads(meta["class_names"])
        self.preprocessing = from_metadata(meta)
        try:
            self.answers = answers.answers(self.class_names, answers.from_metadata(meta))
        except ValueError as err:
            raise ValueError(f"{model_path}: metadata {err}") from None
        self.input_name = self.session.get_inputs()[0].name

    def read(self, path: str) -> np.ndarray:
        """The image at ``path``, decoded as training's evaluation decodes it (same pixels)."""
        return read_rgb(path, self.preprocessing.resize_size)

    def logits(self, images: list[np.ndarray]) -> np.ndarray:
        batch = np.stack([preprocess(im, self.preprocessing) for im in images]).astype(np.float32)
        return self.session.run(None, {self.input_name: batch})[0]



def preprocess(rgb: np.ndarray, pre: Preprocessing) -> np.ndarray:
    """Resize the short side, center crop, normalise: the training's evaluation transform.

    ``rgb`` comes from ``read_rgb(path, pre.resize_size)``, already reduced to the resize side
    by the reader training uses, so the resize here is a no-op (Pillow returns a copy), except
    for an image smaller than that side, which is enlarged here as torchvision does there.
    """
    h, w = rgb.shape[:2]
    short, size = pre.resize_size, pre.image_size
    # the short side becomes ``short``; the long side is truncated, as torchvision does
    new = (short, int(short * h / w)) if w <= h else (int(short * w / h), short)
    img = Image.fromarray(rgb).resize(new, RESAMPLING[pre.interpolation])
    top, left = int(round((img.height - size) / 2.0)), int(round((img.width - size) / 2.0))
    x = np.asarray(img.crop((left, top, left + size, top + size)), np.float32).transpose(2, 0, 1) / 255.0
    return (x - np.reshape(pre.mean, (3, 1, 1))) / np.reshape(pre.std, (3, 1, 1))


def classify(model: OnnxClassifier, paths: list[str], top_k: int = 3, batch_size: int = 32,
             min_confidence: str | None = None) -> list[dict]:
    """``predict``'s rows for ``paths``, in their order; unreadable files get an error row."""
    rows: dict[str, dict] = {}
    for start in range(0, len(paths), batch_size):
        good, images = [], []
        for path in paths[start:start + batch_size]:
            try:
                images.append(model.read(path))
                good.append(path)
            except DECODE_ERRORS as err:
                rows[path] = error_row(path, f"{type(err).__name__}: {err}")
        if images:
            rows.update(zip(good, model.answers.rows(good, model.logits(images), top_k, min_confidence),
                            strict=True))
    return [rows[p] for p in paths]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m project.extras.deploy.infer",
                                description=__doc__.split("\n")[0])
    p.add_argument("model", help="an exported .onnx file")
    p.add_argument("input", help="an image file or a folder of images")
    p.add_argument("--output", default="preds.csv")
    p.add_argument("--threads", type=int, default=None)
    answers.add_arguments(p)
    a = p.parse_args(argv)
    try:
        if not Path(a.model).is_file():
            raise FileNotFoundError(f"'{a.model}' does not exist: pass the model.onnx that export wrote")
        model = OnnxClassifier(a.model, a.threads)
        if not Path(a.input).exists():
            raise FileNotFoundError(f"'{a.input}' does not exist")
        left_out: Counter = Counter()
        paths = list_images(a.input, left_out)
        note = f"; left out: {left_out_text(left_out)}" if left_out else ""
        if not paths:
            raise FileNotFoundError(f"no image files in '{a.input}'{note}")
        model.answers.policy(a.min_confidence)  # a bad policy fails before any image is read
        rows = classify(model, paths, a.top_k, min_confidence=a.min_confidence)
    except (ValueError, OSError) as err:  # a missing or foreign model file, a missing input, a bad option
        print(f"error: {err}", file=sys.stderr)
        return 2
    failed = sum(1 for r in rows if r["error"])
    if failed == len(rows):  # a text file, or a folder of broken files: nothing to write (as predict)
        first = rows[0]
        print(f"error: '{a.input}': no file could be read as an image ({first['path']}: {first['error']})",
              file=sys.stderr)
        return 2
    write_csv(rows, a.output)
    print(f"{len(rows) - failed} images classified with {a.model} -> {a.output}{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
