"""Classify images with a checkpoint: one CSV row per image, unreadable files listed, not fatal.

    python -m project predict --ckpt_path PATH --input DIR_OR_FILE --output preds.csv

Uses the evaluation transforms, class names and temperature stored in the checkpoint, so it
needs neither the training data nor a config file; ``confidence`` is the calibrated probability
``softmax(logits / temperature)`` (temperature 1 until ``python -m project calibrate``).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from project.checkpoints import load_model, read_checkpoint
from project.common.files import atomic_path, list_images
from project.data.images import decode, decode_side
from project.data.transforms import eval_transforms
from project.errors import ProjectError
from project.model.recipe import check_tta
from project.runs import resolve_checkpoint


def input_files(spec: str | Path) -> list[str]:
    """A single file, or every image file below a folder (sorted), as training lists them."""
    if not Path(spec).exists():
        raise ProjectError(f"--input '{spec}' does not exist")
    return list_images(spec)


class _Files(Dataset):
    def __init__(self, paths: list[str], transform, short_side: int | None = None) -> None:
        self.paths, self.transform, self.short_side = paths, transform, short_side

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        try:
            return i, self.transform(decode(self.paths[i], self.short_side)), ""
        except Exception as err:  # listed in the CSV with the reason
            return i, None, f"{type(err).__name__}: {err}".replace("\n", " ")


def _collate(items):
    good = [(i, x) for i, x, _ in items if x is not None]
    bad = [(i, e) for i, x, e in items if x is None]
    images = torch.stack([x for _, x in good]) if good else None
    return [i for i, _ in good], images, bad


@torch.inference_mode()
def predict_files(model, paths: list[str], top_k: int = 3, batch_size: int = 64,
                  num_workers: int = 0, device: str = "cpu") -> list[dict]:
    """Rows of {path, predicted, confidence, top-k, error}, in the order of ``paths``."""
    transform = eval_transforms(model.preprocessing)
    side = decode_side(model.preprocessing)  # the evaluation's side: the same pixels as in training
    loader = DataLoader(_Files(paths, transform, side), batch_size=batch_size, num_workers=num_workers,
                        collate_fn=_collate)
    model = model.to(device).eval()
    names = model.class_names
    k = min(top_k, len(names))
    rows: list[dict] = [{} for _ in paths]
    for indices, images, bad in loader:
        for i, error in bad:
            rows[i] = {"path": paths[i], "predicted": "", "confidence": "", "error": error}
        if images is None:
            continue
        x = images.to(device)
        # calibrated: softmax(logits / temperature), the temperature stored by `calibrate`
        probs = model.predict_tta(x) if model.hparams.tta == "hflip" else model.probabilities(x)
        probs = probs.float().cpu()
        top_p, top_i = probs.topk(k, dim=-1)
        for i, p, c in zip(indices, top_p.tolist(), top_i.tolist(), strict=True):
            row = {"path": paths[i], "predicted": names[c[0]], "confidence": f"{p[0]:.6f}"}
            for rank in range(k):
                row[f"top{rank + 1}"] = names[c[rank]]
                row[f"top{rank + 1}_prob"] = f"{p[rank]:.6f}"
            rows[i] = {**row, "error": ""}
    return rows


def write_csv(rows: list[dict], output: Path, top_k: int) -> None:
    fields = ["path", "predicted", "confidence"]
    fields += [f"top{r}{s}" for r in range(1, top_k + 1) for s in ("", "_prob")]
    fields.append("error")
    with atomic_path(output) as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields, restval="")
        writer.writeheader()
        writer.writerows(rows)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m project predict", description=__doc__.split("\n")[0])
    p.add_argument("--ckpt_path", default="best", help="a .ckpt, a run folder, best or last")
    p.add_argument("--input", required=True, help="an image file or a folder of images")
    p.add_argument("--output", default="preds.csv", help="CSV file to write")
    p.add_argument("--top_k", type=int, default=3)
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--num_workers", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tta", default="none", choices=["none", "hflip"],
                   help="hflip: average each image's probabilities with its mirror image's")
    a = p.parse_args(argv)
    ckpt = resolve_checkpoint(a.ckpt_path)
    data_hparams = read_checkpoint(ckpt, mmap=True).get("datamodule_hyper_parameters", {})
    check_tta(a.tta, data_hparams.get("hflip"))
    model = load_model(ckpt)
    model.hparams.tta = a.tta
    paths = input_files(a.input)
    if not paths:
        raise ProjectError(f"no image files in '{a.input}'")
    rows = predict_files(model, paths, a.top_k, a.batch_size, a.num_workers, a.device)
    k = min(a.top_k, len(model.class_names))
    write_csv(rows, Path(a.output), k)
    failed = [r for r in rows if r["error"]]
    print(f"{len(rows) - len(failed)} images classified with {ckpt} -> {a.output}")
    for r in failed:
        print(f"  could not read {r['path']}: {r['error']}")
    return 0

