"""Classify images with a checkpoint: one CSV row per image, unreadable files listed, not fatal.

    python -m project predict --ckpt_path PATH --input DIR_OR_FILE --output preds.csv

Uses the preprocessing, class names and answer state stored in the checkpoint, so it needs
neither the training data nor a config; the rows come from the task's answers
(``project/tasks/answers.py``): ``confidence`` is the calibrated probability
``softmax(logits / temperature)`` (temperature 1 until ``evaluate`` or ``calibrate`` fits it), a
multi-label model lists the labels at or above their thresholds, a regression model its values.
The CSV is the one ``infer.py`` writes from an exported ONNX file.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import torch

from project.checkpoints import load_model, read_checkpoint
from project.common.files import left_out_text, list_images
from project.common.options import device, positive_int
from project.common.pixels import DECODE_ERRORS, read_rgb
from project.common.predictions import error_row, write_csv
from project.data.datasets import ImageDataset
from project.data.folders import Sample
from project.data.images import needed_side
from project.data.transforms import eval_transforms
from project.errors import ProjectError
from project.extras.analysis.predictions import check_mirror_tta, predict_dataset
from project.runs import resolve_checkpoint
from project.tasks import answers


def input_files(spec: str | Path, left_out: Counter | None = None) -> list[str]:
    """A single file, or every image file below a folder (sorted), as training lists them."""
    if not Path(spec).exists():
        raise ProjectError(f"--input '{spec}' does not exist")
    return list_images(spec, left_out)


def predict_files(model, paths: list[str], top_k: int = 3, batch_size: int = 64,
                  num_workers: int = 0, device: str = "cpu", tta: bool = False,
                  min_confidence: str | None = None) -> list[dict]:
    """The task's rows ({path, predicted, confidence, top-k, error} for a classifier), in the
    order of ``paths``."""
    answer = answers.answers(model.class_names, model.answer_state())
    answer.policy(min_confidence)  # a bad policy fails before any image is read
    pre = model.preprocessing
    dataset = ImageDataset([Sample(p, -1) for p in paths], eval_transforms(pre),
                           short_side=needed_side(pre))
    try:
        out = predict_dataset(model, dataset, batch_size, device, num_workers, mirrored=tta)
    except ProjectError:  # not one decodable image: every row says why
        return [error_row(p, decode_error(p)) for p in paths]
    scores = answer.scores(out["logits"].double().numpy())
    if tta:  # the mean of each image's and its mirror image's probabilities (or values)
        scores = (scores + answer.scores(out["mirrored"].double().numpy())) / 2
    index = out["index"].tolist()
    rows = dict(zip(index, answer.rows_from_scores([paths[i] for i in index], scores, top_k, min_confidence),
                    strict=True))
    return [rows.get(i) or error_row(paths[i], decode_error(paths[i])) for i in range(len(paths))]


def decode_error(path: str) -> str:
    """Why ``path`` could not be read (asked again only for the files that failed)."""
    try:
        read_rgb(path)
    except DECODE_ERRORS as err:
        return f"{type(err).__name__}: {err}"
    return "could not be decoded"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m project predict", description=__doc__.split("\n")[0])
    p.add_argument("--ckpt_path", default="best", help="a .ckpt, a run folder, best or last")
    p.add_argument("--input", required=True, help="an image file or a folder of images")
    p.add_argument("--output", default="preds.csv", help="CSV file to write")
    p.add_argument("--batch_size", type=positive_int, default=64)
    p.add_argument("--num_workers", type=int, default=0)
    p.add_argument("--device", type=device, default="cuda" if torch.cuda.is_available() else "cpu")
    answers.add_arguments(p)
    p.add_argument("--tta", default="none", choices=["none", "hflip"],
                   help="hflip: average each image's probabilities with its mirror image's")
    a = p.parse_args(argv)
    if Path(a.output).is_dir():
        raise ProjectError(f"--output '{a.output}' is a folder: pass the CSV file to write, e.g. preds.csv")
    ckpt = resolve_checkpoint(a.ckpt_path)
    if a.tta == "hflip":
        check_mirror_tta(read_checkpoint(ckpt, mmap=True).get("datamodule_hyper_parameters") or {})
    left_out: Counter = Counter()
    paths = input_files(a.input, left_out)
    note = f"; left out: {left_out_text(left_out)}" if left_out else ""
    if not paths:
        raise ProjectError(f"no image files in '{a.input}'{note}")
    model = load_model(ckpt)
    rows = predict_files(model, paths, a.top_k, a.batch_size, a.num_workers, a.device, a.tta == "hflip",
                         a.min_confidence)
    failed = [r for r in rows if r["error"]]
    if len(failed) == len(rows):  # a text file, or a folder of broken files: nothing to write
        raise ProjectError(f"--input '{a.input}': no file could be read as an image ({failed[0]['path']}: "
                           f"{failed[0]['error']})")
    write_csv(rows, Path(a.output))
    print(f"{len(rows) - len(failed)} images classified with {ckpt} -> {a.output}{note}")
    for r in failed:
        print(f"  could not read {r['path']}: {r['error']}")
    return 0
