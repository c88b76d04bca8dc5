"""Temperature scaling: one scalar T, fitted on the validation set, so confidences mean what they say.

    python -m project calibrate [--ckpt_path best|last|PATH] [--data_dir DIR]

A network trained with cross-entropy is usually over-confident: among images predicted with
probability 0.95, fewer than 95 % are right. Dividing the logits by T > 1 before the softmax
fixes most of that (Guo et al., "On Calibration of Modern Neural Networks", 2017) without
changing any prediction: the argmax of ``logits / T`` is the argmax of ``logits``.

T minimises the negative log-likelihood of the validation images (LBFGS on log T, so T stays
positive). It is stored beside the checkpoint, in ``<ckpt>.calibration.json`` with the numbers
and the checkpoint's SHA-256 (written atomically; the checkpoint itself is never rewritten);
``load_model`` sets it on the model's ``temperature`` buffer, so ``predict``, ``evaluate``,
``serve`` and the ONNX export (metadata ``temperature``, used by ``infer.py``) apply it. The
network's output, and every exported file's output, stay the raw logits.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset
from torchmetrics.functional.classification import multiclass_calibration_error

from project.checkpoints import (
    calibration_path,
    check_data_dir,
    checkpoint_task,
    file_sha256,
    read_calibration,
    read_checkpoint,
)
from project.common.files import write_text
from project.common.options import device, positive_int
from project.errors import ProjectError
from project.extras.analysis.predictions import calibrated_probabilities, predict_dataset
from project.runs import default_out_dir

log = logging.getLogger("project")
# A fitted T outside this range means the validation set cannot tell: every image right with a
# margin drives T towards 0, a model no better than chance drives it up without end. Then T
# stays 1 (no scaling), and the run says so.
TEMPERATURE_RANGE = (0.05, 50.0)
FEW_IMAGES = 100
ECE_BINS = 15  # equal-width confidence bins (Guo et al. 2017 use 15)


def expected_calibration_error(logits: torch.Tensor, target: torch.Tensor, temperature: float = 1.0,
                               n_bins: int = ECE_BINS) -> float:
    """ECE of ``softmax(logits / T)``: the confidence-weighted gap between confidence and accuracy
    over equal-width bins of the top-1 probability."""
    probs = calibrated_probabilities(logits.detach(), temperature)
    return float(multiclass_calibration_error(probs, target, probs.shape[-1], n_bins=n_bins, norm="l1"))


def nll(logits: torch.Tensor, target: torch.Tensor, temperature: float = 1.0) -> float:
    return float(nn.functional.cross_entropy(logits.double() / temperature, target))


def fit_temperature(logits: torch.Tensor, target: torch.Tensor, max_iter: int = 100) -> float:
    """The T > 0 that minimises the NLL of ``softmax(logits / T)`` for ``target``."""
    if len(target) == 0:
        raise ProjectError("temperature scaling needs validation images; the set is empty")
    if bool((logits.argmax(-1) == target.to(logits.device)).all()):
        log.warning("Notice: every validation image is classified correctly, so the NLL falls "
                    "without end as the temperature goes to 0: the temperature stays 1")
        return 1.0
    with torch.inference_mode(False), torch.enable_grad():  # callers may be in inference mode
        logits = logits.detach().cpu().double().clone()  # clone: a normal tensor, autograd-safe
        target = target.detach().cpu().clone()
        log_t = torch.zeros((), dtype=torch.float64, requires_grad=True)
        opt = torch.optim.LBFGS([log_t], lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe")

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(logits / log_t.exp(), target)
            loss.backward()
            return loss

        opt.step(closure)
    t = float(log_t.detach().exp())
    low, high = TEMPERATURE_RANGE
    if not math.isfinite(t) or not low <= t <= high:
        log.warning("Notice: the fitted temperature %.4g is outside [%g, %g]: the validation set "
                    "cannot pin it down (too few images, or all of them right with a margin), so "
                    "the temperature stays 1", t, low, high)
        return 1.0
    return t


def calibration_numbers(logits: torch.Tensor, target: torch.Tensor, temperature: float) -> dict:
    """NLL and ECE of the raw softmax (before) and of ``softmax(logits / T)`` (after)."""
    return {
        "temperature": temperature,
        "images": len(target),
        "nll_before": nll(logits, target),
        "nll_after": nll(logits, target, temperature),
        "ece_before": expected_calibration_error(logits, target),
        "ece_after": expected_calibration_error(logits, target, temperature),
    }


def calibrate_checkpoint(ckpt_path: str | Path, data_dir: str | None = None,
                         dataset: Dataset | None = None, batch_size: int = 64,
                         device: str | torch.device | None = None) -> dict:
    """Fit T on the validation images of ``ckpt_path``'s run (or ``dataset``) and store it beside
    the checkpoint; returns the numbers before and after."""
    from project.checkpoints import check_checkpoint_classes, datamodule_for, load_model

    ckpt_path = Path(ckpt_path)
    model = load_model(ckpt_path)
    if dataset is None:
        dm = datamodule_for(ckpt_path, model, data_dir)
        check_checkpoint_classes(ckpt_path, dm.class_names)
        dm.setup("validate")
        dataset = dm.datasets["val"]
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    out = predict_dataset(model, dataset, batch_size, device)
    if len(out["target"]) < FEW_IMAGES:
        log.warning("Notice: the temperature is fitted on only %d validation images; expect it "
                    "to move with more data", len(out["target"]))
    numbers = calibration_numbers(out["logits"], out["target"],
                                  fit_temperature(out["logits"], out["target"]))
    write_temperature(ckpt_path, numbers)
    return numbers


def ensure_temperature(ckpt_path: Path, data_dir: str | None = None, batch_size: int = 64) -> None:
    """Fit the temperature once, when the checkpoint has none (no valid side file, and not one
    that older versions wrote into the checkpoint): evaluate reports calibrated confidences, and
    predict and export use them from then on. Without the run's validation images it stays 1,
    with a notice."""
    if read_calibration(ckpt_path) is not None or "calibration" in read_checkpoint(ckpt_path, mmap=True):
        return
    try:
        numbers = calibrate_checkpoint(ckpt_path, data_dir, batch_size=batch_size)
    except ProjectError as err:
        log.info("Notice: no temperature fitted (%s); probabilities stay uncalibrated", err)
        return
    log.info("%s; stored in %s", format_numbers(numbers), calibration_path(ckpt_path))


def write_temperature(ckpt_path: Path, numbers: dict) -> None:
    """Store T and its numbers in ``<ckpt>.calibration.json`` beside the checkpoint, atomically,
    with the checkpoint's SHA-256: a checkpoint rewritten later (a resumed ``last.ckpt``) is not
    given a temperature fitted for other weights. The checkpoint's bytes are left alone."""
    record = {k: v if type(v) is int else float(v) for k, v in numbers.items()}  # images stays a count
    record.update(checkpoint=Path(ckpt_path).name, checkpoint_sha256=file_sha256(ckpt_path))
    write_text(calibration_path(ckpt_path), json.dumps(record, indent=2) + "\n")
    notice_stale_exports(Path(ckpt_path), record["temperature"])


def notice_stale_exports(ckpt_path: Path, temperature: float) -> None:
    """An export of this checkpoint made before this temperature carries the old one in its ONNX
    metadata: infer.py and serve --onnx would answer other confidences than predict from now on."""
    report = default_out_dir(ckpt_path) / "export_report.json"
    try:
        made = json.loads(report.read_text(encoding="utf-8"))
        source, exported = Path(made["checkpoint"]), float(made["answers"].get("temperature", 1.0))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # none, or not the project's
        return
    if source.resolve() == ckpt_path.resolve() and abs(exported - temperature) > 1e-6:
        log.warning("Notice: %s was exported with temperature %.4f, not %.4f: its confidences (infer.py, "
                    "serve --onnx, --min_confidence) differ from predict's until you run `python -m project "
                    "export --ckpt_path %s` again", report.parent, exported, temperature, ckpt_path)


def format_numbers(numbers: dict) -> str:
    return (f"Temperature {numbers['temperature']:.4f} (fitted on {numbers['images']} validation "
            f"images): NLL {numbers['nll_before']:.4f} -> {numbers['nll_after']:.4f}, "
            f"ECE {numbers['ece_before']:.4f} -> {numbers['ece_after']:.4f}")


def main(argv: list[str]) -> int:
    from project.runs import resolve_checkpoint

    p = argparse.ArgumentParser(prog="python -m project calibrate",
                                description="Fit a temperature on the validation set and store "
                                            "it beside the checkpoint (<ckpt>.calibration.json)")
    p.add_argument("--ckpt_path", default="best", help="a .ckpt, a run folder, best or last")
    p.add_argument("--data_dir", help="the data folder (default: the run's)")
    p.add_argument("--batch_size", type=positive_int, default=64)
    p.add_argument("--device", type=device, default=None, help="default: cuda when available, else cpu")
    a = p.parse_args(argv)
    check_data_dir(a.data_dir)  # before the model loads
    ckpt = resolve_checkpoint(a.ckpt_path)
    task = checkpoint_task(ckpt)
    if not task.temperature_scaling:
        raise ProjectError(f"calibrate: '{ckpt}' is a {task.name} model, whose outputs have no "
                           "temperature to fit (its answers use what training stored in the checkpoint)")
    numbers = calibrate_checkpoint(ckpt, a.data_dir, batch_size=a.batch_size, device=a.device)
    print(format_numbers(numbers))
    print(f"Stored in {calibration_path(ckpt)} (the checkpoint is unchanged): predict, evaluate and "
          "export now use it.")
    return 0
