"""Beyond the confusion matrix: top losses, mistakes.csv, suspect labels, calibration, PR curves."""

from __future__ import annotations

import csv
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from project.checkpoints import load_model, read_checkpoint
from project.model.calibration import calibration_numbers, fit_temperature, nll, write_temperature
from project.model.metrics import PerSample, StageMetrics, expected_calibration_error, loader_order
from tests.conftest import best_ckpt, fit_args, only_run, run_cli

CLASSES = ["checker", "circle", "cross"]


def test_ece_equals_a_hand_computation():
    probs = torch.tensor([[0.90, 0.05, 0.05],   # confidence 0.90, right
                          [0.90, 0.05, 0.05],   # confidence 0.90, wrong
                          [0.62, 0.28, 0.10],   # confidence 0.62, right
                          [0.20, 0.52, 0.28]])  # confidence 0.52, wrong
    target = torch.tensor([0, 1, 0, 2])
    logits = probs.log()
    # 15 equal bins: {0.90, 0.90} share one (accuracy 1/2), 0.62 and 0.52 have their own
    by_hand = 2 / 4 * abs(0.90 - 0.5) + 1 / 4 * abs(0.62 - 1) + 1 / 4 * abs(0.52 - 0)
    assert by_hand == pytest.approx(0.425)
    assert expected_calibration_error(logits, target) == pytest.approx(by_hand, abs=1e-6)
    metrics = StageMetrics("val", CLASSES)
    metrics.update(logits[:2], target[:2], torch.tensor(0.0))  # two batches, as in an epoch
    metrics.update(logits[2:], target[2:], torch.tensor(0.0))
    values = metrics.compute()
    assert float(values["val/ece"]) == pytest.approx(by_hand, abs=1e-6)
    assert {f"val/ap/{c}" for c in CLASSES} <= set(values) and "val/ap_macro" in values


def _over_confident(n: int = 2000, scale: float = 4.0, seed: int = 0):
    """Logits of a calibrated model (labels drawn from its own softmax), multiplied by ``scale``."""
    g = torch.Generator().manual_seed(seed)
    calibrated = 1.5 * torch.randn(n, 5, generator=g)
    target = torch.multinomial(calibrated.softmax(-1), 1, generator=g)[:, 0]
    return scale * calibrated, target


def test_temperature_scaling_lowers_nll_and_ece_and_keeps_the_argmax():
    logits, target = _over_confident(scale=4.0)
    t = fit_temperature(logits, target)
    assert t == pytest.approx(4.0, rel=0.15)  # it undoes the scale that made it over-confident
    numbers = calibration_numbers(logits, target, t)
    assert numbers["nll_after"] < numbers["nll_before"] - 0.5
    assert numbers["ece_after"] < numbers["ece_before"] / 3
    assert numbers["ece_after"] < 0.05  # what is left is the sampling noise of 2000 images
    assert torch.equal((logits / t).argmax(-1), logits.argmax(-1))
    assert nll(logits, target, t) <= min(nll(logits, target, t * f) for f in (0.9, 1.1))


def test_temperature_stays_1_when_validation_cannot_tell():
    logits = torch.eye(3).repeat(4, 1) * 10  # every image right with a wide margin: T -> 0
    assert fit_temperature(logits, torch.arange(3).repeat(4)) == 1.0


def test_per_sample_indices_follow_the_loader_without_skipped_images():
    class Loader:
        sampler = [0, 1, 2, 3, 4, 5]
        dataset = type("D", (), {"bad_flags": torch.tensor([0, 0, 1, 0, 0, 0])})()

    assert loader_order(Loader(), 4).tolist() == [0, 1, 3, 4]  # 2 was skipped
    assert loader_order(object(), 2) is None
    kept = PerSample()
    kept.update(torch.randn(3, 3), torch.tensor([0, 1, 2]))
    kept.update(torch.randn(2, 3), torch.tensor([0, 1]))
    out = kept.compute(Loader())
    assert out["index"].tolist() == [0, 1, 3, 4, 5] and len(out["logits"]) == 5
    assert kept.compute(Loader()) is None  # restarted


def test_checkpoint_without_temperature_loads_as_uncalibrated(trained_run, tmp_path):
    ckpt = read_checkpoint(best_ckpt(trained_run))
    ckpt["state_dict"].pop("temperature")
    old = tmp_path / "old.ckpt"
    torch.save(ckpt, old)
    assert float(load_model(old).temperature) == 1.0


def test_event_files_hold_top_losses_reliability_pr_curves_and_ece(trained_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(trained_run), size_guidance={"images": 0, "tensors": 0, "scalars": 0})
    acc.Reload()
    assert {"val/top_losses", "val/reliability"} <= set(acc.Tags()["images"])
    assert acc.Images("val/top_losses")[0].encoded_image_string.startswith(b"\x89PNG")
    curves = acc.PluginTagToContent("pr_curves")
    assert {f"val/pr_curve/{c}" for c in CLASSES} <= set(curves)
    assert len(acc.Tensors("val/pr_curve/circle")) == 3  # one per validation epoch
    scalars = set(acc.Tags()["scalars"])
    assert {"val/ece", "val/ap_macro", "val/ap/cross", "calibration/temperature",
            "calibration/ece_after"} <= scalars
    assert len(acc.Scalars("val/ece")) == 3


def test_fit_stores_the_temperature_calibrate_refits_it_and_predict_uses_it(trained_run, tmp_path):
    stored = read_checkpoint(best_ckpt(trained_run))
    assert "calibration" in stored  # the TemperatureScaling callback of configs/train.yaml
    fitted = float(stored["state_dict"]["temperature"])
    assert fitted == pytest.approx(stored["calibration"]["temperature"], rel=1e-6)
    copy = tmp_path / "copy.ckpt"
    shutil.copy(best_ckpt(trained_run), copy)
    write_temperature(copy, {"temperature": 1.0})
    result = run_cli(["calibrate", "--ckpt_path", str(copy)], cwd=trained_run.parents[2])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Temperature" in result.stdout and "ECE" in result.stdout
    assert float(load_model(copy).temperature) == pytest.approx(fitted, rel=1e-4)


def test_predict_and_torch_free_inference_give_the_same_calibrated_probabilities(
        trained_run, tiny_data, tmp_path):
    ckpt = tmp_path / "calibrated.ckpt"
    shutil.copy(best_ckpt(trained_run), ckpt)
    write_temperature(ckpt, {"temperature": 2.5})
    out = tmp_path / "export"
    result = run_cli(["export", "--ckpt_path", str(ckpt), "--out", str(out), "--formats", "onnx",
                      "--data_dir", str(tiny_data), "--repeats", "1"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    import onnx

    meta = {p.key: p.value for p in onnx.load(str(out / "model.onnx")).metadata_props}
    assert float(meta["temperature"]) == 2.5
    # images already at the evaluation's resize side: both pipelines then only crop and
    # normalise, so the pixels are identical and only the model and the temperature can differ
    # (resampling in Pillow and torchvision differs by a little: test_export allows 0.02 there)
    model = load_model(ckpt)
    side = round(model.hparams.image_size / model.hparams.crop_ratio)
    images = tmp_path / "images"
    images.mkdir()
    for f in sorted((tiny_data / "test").rglob("*.png")):
        Image.open(f).convert("RGB").resize((side, side)).save(images / f.name)
    torch_csv, onnx_csv = tmp_path / "torch.csv", tmp_path / "onnx.csv"
    result = run_cli(["predict", "--ckpt_path", str(ckpt), "--input", str(images),
                      "--output", str(torch_csv)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    blocker = tmp_path / "no_torch"
    (blocker / "torch").mkdir(parents=True)
    (blocker / "torch" / "__init__.py").write_text("raise ImportError('torch is blocked')\n")
    infer = subprocess.run(
        [sys.executable, "-m", "project.deploy.infer", str(out / "model.onnx"), str(images),
         "--output", str(onnx_csv)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": str(blocker), "PATH": "/usr/bin:/bin"})
    assert infer.returncode == 0, infer.stderr[-3000:]
    ours = {r["path"]: r for r in csv.DictReader(onnx_csv.open())}
    theirs = {r["path"]: r for r in csv.DictReader(torch_csv.open())}
    assert ours.keys() == theirs.keys() and len(ours) == 12
    for path, row in ours.items():
        for k in (1, 2, 3):
            assert row[f"top{k}"] == theirs[path][f"top{k}"]
            assert float(row[f"top{k}_prob"]) == pytest.approx(float(theirs[path][f"top{k}_prob"]),
                                                               abs=1e-5)
    # ...and they are the calibrated ones: softmax(logits / 2.5), not the raw softmax
    from project.data.images import decode, decode_side
    from project.data.transforms import eval_transforms

    first = sorted(ours)[0]
    x = eval_transforms(model.preprocessing)(decode(first, decode_side(model.preprocessing)))
    with torch.no_grad():
        logits = model(x[None])[0]
    assert float(theirs[first]["confidence"]) == pytest.approx(
        float((logits / 2.5).softmax(-1).max()), abs=1e-5)
    assert abs(float((logits / 2.5).softmax(-1).max()) - float(logits.softmax(-1).max())) > 1e-3


# -- a data set with planted errors ----------------------------------------------------------
COLOURS = {"blue": (40, 60, 200), "green": (40, 180, 60), "red": (210, 40, 40)}


def _colour_images(folder: Path, colour: str, count: int, seed: list[int], prefix: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(count):
        base = np.array(COLOURS[colour], float) + rng.normal(0, 20, 3)
        pixels = np.clip(base + rng.normal(0, 25, (32, 32, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"{prefix}_{colour}_{i:03d}.png")


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    """Colour classes a small network learns in a few epochs; two red images planted in
    train/green and two in test/green: wrong labels the model should disagree with."""
    root = tmp_path_factory.mktemp("planted") / "colours"
    for s, (split, count) in enumerate({"train": 12, "val": 4, "test": 4}.items()):
        for c, colour in enumerate(COLOURS):
            _colour_images(root / split / colour, colour, count, [s, c], "img")
    _colour_images(root / "train" / "green", "red", 2, [9, 1], "planted")
    _colour_images(root / "test" / "green", "red", 2, [9, 2], "planted")
    return root


PLANTED_RECIPE = ["--model.backbone=timm/test_resnet", "--data.color_jitter=0",
                  "--model.warmup_epochs=0"]


@pytest.mark.slow
def test_planted_labels_top_mistakes_csv_and_the_report_reads_in_order(planted, tmp_path):
    result = run_cli(["fit", *fit_args(planted, *PLANTED_RECIPE, epochs=6)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = only_run(tmp_path / "logs")
    result = run_cli(["evaluate", str(run), "--trainer.enable_progress_bar=false"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    folder = best_ckpt(run).parent
    rows = list(csv.DictReader((folder / "mistakes.csv").open()))
    assert {Path(r["path"]).name for r in rows[:2]} == {"planted_red_000.png", "planted_red_001.png"}, \
        (rows, result.stdout[-2000:])
    assert all(r["true"] == "green" and r["predicted"] == "red" for r in rows[:2])
    losses = [float(r["loss"]) for r in rows]
    assert losses == sorted(losses, reverse=True)
    assert float(rows[0]["loss"]) == pytest.approx(-math.log(float(rows[0]["p_true"])), abs=1e-4)
    report = json.loads((folder / "report.json").read_text())
    assert report["mistakes"] == len(rows)
    assert report["ece"] == pytest.approx(report["calibration"]["ece_before"], abs=1e-5)
    for name in ("top_losses.png", "pr_curves.png", "reliability.png", "confusion_matrix.png"):
        assert (folder / name).read_bytes().startswith(b"\x89PNG"), name
    markdown = (folder / "report.md").read_text()
    sections = ["## Summary", "## Per-class results", "## Confusion matrix",
                "## Most confused pairs", "## Top losses", "## Calibration"]
    positions = [markdown.index(s) for s in sections]
    assert positions == sorted(positions)
    for picture in ("(pr_curves.png)", "(confusion_matrix.png)", "(top_losses.png)",
                    "(reliability.png)"):
        assert picture in markdown
    assert "planted_red_00" in markdown.split("## Top losses")[1]


@pytest.mark.slow
def test_suspects_puts_the_planted_training_labels_first(planted, tmp_path):
    out = tmp_path / "suspects"
    args = fit_args(planted, *PLANTED_RECIPE, epochs=6)
    result = run_cli(["suspects", "--folds", "2", "--top", "8", "--out", str(out), *args],
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = list(csv.DictReader((out / "suspects.csv").open()))
    assert len(rows) == 3 * 12 + 2  # every training image, ranked
    assert {Path(r["path"]).name for r in rows[:2]} == {"planted_red_000.png", "planted_red_001.png"}, \
        rows[:5]
    assert all(r["given"] == "green" and r["predicted"] == "red" for r in rows[:2])
    assert {r["fold"] for r in rows} == {"0", "1"}
    assert (out / "suspects.png").read_bytes().startswith(b"\x89PNG")
    assert not (tmp_path / "logs").exists()  # the fold fits leave no runs behind
