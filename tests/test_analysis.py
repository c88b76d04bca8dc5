"""Beyond the curves: metrics by hand, evaluate's report, calibration, the analysis preset,
top losses and suspect labels on planted errors, TensorBoard in a real browser."""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import math
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from project.checkpoints import calibration_path, datamodule_for, load_model, read_checkpoint
from project.extras.analysis.calibration import (
    calibration_numbers,
    expected_calibration_error,
    fit_temperature,
    nll,
    write_temperature,
)
from project.tasks.single import metrics
from project.tasks.single.metrics import StageMetrics, summary_metrics
from project.tasks.single.report import per_class_table
from project.tasks.single.views import confused_pairs
from tests.conftest import (
    CLASSES,
    QUICK,
    REPO,
    best_ckpt,
    cli,
    fit_args,
    free_port,
    one_error,
    only_run,
    scalars,
    scratch,
)


def _values(logits: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    stage = StageMetrics("val", CLASSES)
    stage.update(logits[:5], target[:5], torch.tensor(0.0))  # two batches, as in an epoch
    stage.update(logits[5:], target[5:], torch.tensor(0.0))
    return stage.compute()


def test_metrics_equal_a_hand_computation_with_five_classes():
    # true:      0 0 0 0 1 1 1 2 2 2 3 3 4 4
    # predicted: 0 0 1 2 1 1 0 2 2 2 4 3 4 0
    target = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 4, 4])
    pred = torch.tensor([0, 0, 1, 2, 1, 1, 0, 2, 2, 2, 4, 3, 4, 0])
    values = _values(torch.nn.functional.one_hot(pred, 5).float(), target)
    assert values["val/confusion"][0].tolist() == [2, 1, 1, 0, 0]
    assert values["val/acc"] == pytest.approx(9 / 14)
    recall = [2 / 4, 2 / 3, 3 / 3, 1 / 2, 1 / 2]
    precision = [2 / 4, 2 / 3, 3 / 4, 1 / 1, 1 / 2]
    f1 = [2 * p * r / (p + r) for p, r in zip(precision, recall, strict=True)]
    assert [float(values[f"val/per_class/recall/{c}"]) for c in CLASSES] == pytest.approx(recall)
    assert [float(values[f"val/per_class/precision/{c}"]) for c in CLASSES] == pytest.approx(precision)
    assert [float(values[f"val/per_class/f1/{c}"]) for c in CLASSES] == pytest.approx(f1)
    assert values["val/macro_f1"] == pytest.approx(sum(f1) / 5)
    assert values["val/macro_acc"] == pytest.approx(sum(recall) / 5)
    table = per_class_table(values, "val", CLASSES)
    assert table["classes"]["checker"]["support"] == 4
    assert table["averages"]["weighted avg"]["recall"] == pytest.approx(9 / 14)
    pairs = confused_pairs(values["val/confusion"], CLASSES, top=2)
    assert [(p["true"], p["predicted"], p["count"]) for p in pairs] == [("checker", "circle", 1),
                                                                          ("checker", "cross", 1)]
    kept = target != 3
    absent = _values(torch.nn.functional.one_hot(pred[kept].clamp(max=2), 5).float(), target[kept])
    table = per_class_table(absent, "val", CLASSES)  # class 3 neither in the split nor predicted
    assert table["classes"][CLASSES[3]]["support"] == 0
    assert table["averages"]["macro avg"]["f1"] == pytest.approx(float(absent["val/macro_f1"]))
    assert table["averages"]["macro avg"]["recall"] == pytest.approx(float(absent["val/macro_acc"]))


def test_a_new_metric_is_one_line_and_the_summary_follows_it(monkeypatch):
    """Top-3 accuracy added to ``overview_metrics``: logged, and in the summary and HPARAMS."""
    from torchmetrics.classification import MulticlassAccuracy

    plain = metrics.overview_metrics
    monkeypatch.setattr(metrics, "overview_metrics",
                        lambda n: {**plain(n), "acc_top3": MulticlassAccuracy(n, top_k=3, average="micro")})
    # each row: the true class has the 1st, 2nd, 3rd, 4th, 3rd largest logit
    logits = torch.tensor([[5.0, 4, 3, 2, 1], [4, 5, 3, 2, 1], [4, 3, 5, 2, 1], [5, 4, 3, 1, 2],
                           [5, 4, 3, 2, 1]] * 2 + [[5.0, 4, 3, 2, 1]] * 4)
    target = torch.tensor([0, 0, 0, 4, 2] * 2 + [0] * 4)
    values = _values(logits, target)
    assert values["val/acc_top3"] == pytest.approx(12 / 14)  # all but the 4th largest, twice
    assert values["val/acc"] == pytest.approx(6 / 14)
    assert "val/acc_top3" in summary_metrics(5)


def test_a_confidently_wrong_image_has_its_whole_loss():
    from project.extras.analysis.rows import sample_rows

    samples = {"logits": torch.tensor([[0.0, 1000.0], [0.0, 800.0]]), "target": torch.tensor([0, 0]),
               "index": torch.tensor([0, 1])}
    rows = sample_rows(samples, ["cat", "dog"])
    assert [r["loss"] for r in rows] == pytest.approx([1000.0, 800.0])  # not both clipped at 690.8


def test_ece_equals_a_hand_computation():
    probs = torch.tensor([[0.90, 0.05, 0.05], [0.90, 0.05, 0.05], [0.62, 0.28, 0.10], [0.20, 0.52, 0.28]])
    target = torch.tensor([0, 1, 0, 2])
    # 15 equal bins: {0.90, 0.90} share one (accuracy 1/2), 0.62 and 0.52 have their own
    by_hand = 2 / 4 * abs(0.90 - 0.5) + 1 / 4 * abs(0.62 - 1) + 1 / 4 * abs(0.52 - 0)
    assert expected_calibration_error(probs.log(), target) == pytest.approx(by_hand, abs=1e-6)


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
    assert numbers["nll_after"] < numbers["nll_before"] - 0.5 and numbers["ece_after"] < 0.05
    assert numbers["ece_after"] < numbers["ece_before"] / 3
    assert nll(logits, target, t) <= min(nll(logits, target, t * f) for f in (0.9, 1.1))
    every_image_right = torch.eye(3).repeat(4, 1) * 10  # T -> 0: the validation set cannot tell
    assert fit_temperature(every_image_right, torch.arange(3).repeat(4)) == 1.0


def test_a_checkpoint_without_temperature_loads_as_uncalibrated(trained_run, tmp_path):
    ckpt = read_checkpoint(best_ckpt(trained_run))
    ckpt["state_dict"].pop("temperature")
    torch.save(ckpt, tmp_path / "old.ckpt")
    assert float(load_model(tmp_path / "old.ckpt").temperature) == 1.0


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_temperature_file_beside_a_checkpoint_wins_unless_the_checkpoint_was_rewritten(
        trained_run, tmp_path, caplog):
    """Older checkpoints kept T in their weights: still read. A side file written for other
    bytes (a resumed run rewrote last.ckpt) is ignored, with a notice."""
    ckpt = read_checkpoint(best_ckpt(trained_run))
    ckpt["state_dict"]["temperature"] = torch.tensor(1.7)  # as versions before the side file wrote it
    ckpt["calibration"] = {"temperature": 1.7}
    old = tmp_path / "old.ckpt"
    torch.save(ckpt, old)
    assert float(load_model(old).temperature) == pytest.approx(1.7)
    write_temperature(old, {"temperature": 2.5})
    assert float(load_model(old).temperature) == pytest.approx(2.5)
    assert json.loads(calibration_path(old).read_text())["checkpoint_sha256"] == sha256(old)
    ckpt["epoch"] += 1  # training went on and wrote the file again
    torch.save(ckpt, old)
    assert float(load_model(old).temperature) == pytest.approx(1.7)
    assert "was fitted for other weights" in caplog.text


@pytest.mark.parametrize("content", ["{not json", '{"temperature": 0}', '{"temperature": -2.0}',
                                     '{"temperature": "hot"}', '{"nll_after": 1.0}'])
def test_a_broken_temperature_file_is_one_error_that_names_it(content, trained_run, tiny_data, tmp_path,
                                                              capsys):
    ckpt = tmp_path / "model.ckpt"
    ckpt.write_bytes(best_ckpt(trained_run).read_bytes())
    calibration_path(ckpt).write_text(content)
    assert cli(["predict", "--ckpt_path", str(ckpt), "--input", str(tiny_data / "test" / "circle"),
                "--output", str(tmp_path / "p.csv")], tmp_path) == 2
    assert not (tmp_path / "p.csv").exists()
    assert "model.ckpt.calibration.json" in one_error(capsys.readouterr().err)


@pytest.fixture(scope="module")
def evaluated(trained_run, tmp_path_factory) -> Iterator[Path]:
    """evaluate --tta hflip on a copy of the trained run: its checkpoint folder."""
    with scratch(tmp_path_factory, "evaluated") as folder:
        copy = folder / "run"
        shutil.copytree(trained_run, copy)
        assert not calibration_path(best_ckpt(copy)).exists()
        console = io.StringIO()
        with contextlib.redirect_stdout(console):
            assert cli(["evaluate", str(copy), "--tta", "hflip", "--target_acc", "0.1",
                        "--trainer.enable_progress_bar=false"], copy) == 0
        (folder / "console.txt").write_text(console.getvalue())  # beside the run, not in it
        yield best_ckpt(copy).parent


def test_evaluate_writes_a_report_that_agrees_with_the_logged_metrics(evaluated):
    report = json.loads((evaluated / "report.json").read_text())
    logged = {tag: values[-1][1] for tag, values in scalars(evaluated.parent).items()}
    assert report["accuracy"] == pytest.approx(logged["test/acc"], abs=1e-6)
    for c in CLASSES:
        assert report["classes"][c]["recall"] == pytest.approx(logged[f"test/per_class/recall/{c}"], abs=1e-6)
        assert report["classes"][c]["support"] == 4
    assert sum(map(sum, report["confusion_matrix"])) == 20
    assert report["tta"]["policy"] == "hflip" and 0 <= report["tta"]["accuracy"] <= 1
    for name in ("report.md", "mistakes.csv", "top_losses.png", "pr_curves.png", "reliability.png",
                 "confusion_matrix.png", "risk_coverage.png"):
        assert (evaluated / name).is_file(), name
    curve = report["abstain"]["curve"]
    assert curve[0]["coverage"] == 1.0 and curve[0]["accuracy"] == pytest.approx(report["accuracy"], abs=1e-6)
    best = report["abstain"]["at_target"]  # the console says the accuracy reached (as report.md), not 0.1
    console = (evaluated.parent.parent / "console.txt").read_text()
    assert best is not None and report["abstain"]["target_acc"] == 0.1
    assert (f"Abstaining: accuracy {best['accuracy']:.4f} (target 0.1) on {best['coverage']:.1%} of the test "
            f"images with --min_confidence {best['min_confidence']:.4f}") in console
    markdown = (evaluated / "report.md").read_text()
    sections = ["## Summary", "## Per-class results", "## Confusion matrix", "## Most confused pairs",
                "## Top losses", "## Calibration", "## Abstaining when unsure"]
    assert [markdown.index(s) for s in sections] == sorted(markdown.index(s) for s in sections)


def test_evaluate_fits_the_temperature_once_and_predict_uses_it(evaluated, tiny_data, tmp_path):
    ckpt = next(evaluated.glob("best-*.ckpt"))
    fitted = json.loads(calibration_path(ckpt).read_text())["temperature"]  # beside, not inside
    stored = read_checkpoint(ckpt)
    assert "calibration" not in stored and float(stored["state_dict"]["temperature"]) == 1
    report = json.loads((evaluated / "report.json").read_text())
    assert report["calibration"]["temperature"] == pytest.approx(fitted)
    assert cli(["predict", "--ckpt_path", str(evaluated.parent),
                "--input", str(tiny_data / "test" / "circle"),
                "--output", str(tmp_path / "p.csv")], tmp_path) == 0
    model = load_model(ckpt)
    assert float(model.temperature) == pytest.approx(fitted)


def test_evaluate_and_calibrate_leave_the_checkpoint_s_bytes_alone(evaluated, trained_run, tiny_data,
                                                                     tmp_path):
    """The checkpoint evaluate read (a byte copy of the trained run's) is unchanged after evaluate
    and after calibrate; predict's confidences are softmax(logits / T) with the side file's T."""
    evaluated_ckpt, trained = next(evaluated.glob("best-*.ckpt")), sha256(best_ckpt(trained_run))
    assert sha256(evaluated_ckpt) == trained
    fitted = json.loads(calibration_path(evaluated_ckpt).read_text())
    assert fitted["checkpoint_sha256"] == trained
    ckpt = tmp_path / "model.ckpt"  # calibrate a copy: the module's evaluated run stays as evaluate left it
    ckpt.write_bytes(evaluated_ckpt.read_bytes())
    assert cli(["calibrate", "--ckpt_path", str(ckpt), "--data_dir", str(tiny_data)], tmp_path) == 0
    assert sha256(ckpt) == trained
    t = json.loads(calibration_path(ckpt).read_text())["temperature"]
    assert t == pytest.approx(fitted["temperature"], rel=1e-4)  # the same images, the same fit
    model = load_model(ckpt)
    dm = datamodule_for(ckpt, model, str(tiny_data))
    dm.setup("test")
    test = dm.datasets["test"]
    with torch.no_grad():
        logits = model(torch.stack([test[i][0] for i in range(len(test))]))  # raw: T is not in them
    # the shared run learns little, so its fitted T may well be 1: 2.5 as well, from the same writer
    for temperature in (t, None):
        if temperature is None:
            temperature = 2.5
            write_temperature(ckpt, {"temperature": temperature})
            assert sha256(ckpt) == trained
        out = tmp_path / f"preds-{temperature}.csv"
        assert cli(["predict", "--ckpt_path", str(ckpt), "--input", str(tiny_data / "test"),
                    "--output", str(out)], tmp_path) == 0
        rows = {str(Path(r["path"]).resolve()): float(r["confidence"]) for r in csv.DictReader(out.open())}
        expected = (logits / temperature).softmax(-1).amax(-1).tolist()
        assert len(rows) == len(test) == 20
        for sample, p in zip(test.samples, expected, strict=True):
            assert rows[str(Path(sample.path).resolve())] == pytest.approx(p, abs=1e-5)


def test_evaluate_scores_the_whole_test_split_of_a_debug_run(tiny_data, tmp_path, capsys):
    """configs/presets/debug.yaml limits the test loop to 2 batches (16 of the 20 test images at
    batch size 8): evaluate scores all of them, in the precision it names."""
    debug = REPO / "configs" / "presets" / "debug.yaml"
    assert cli(["fit", *fit_args(tiny_data, "--config", str(debug), *QUICK, "--trainer.max_epochs=1")],
               tmp_path) == 0
    run = only_run(tmp_path / "logs")
    assert "limit_test_batches: 2" in (run / "config.yaml").read_text()  # what evaluate reads
    images = len(list((tiny_data / "test").rglob("*.png")))
    capsys.readouterr()
    assert cli(["evaluate", str(run), "--trainer.enable_progress_bar=false"], tmp_path) == 0
    assert f"on {images} test images in 32-true" in capsys.readouterr().out
    report = json.loads((best_ckpt(run).parent / "report.json").read_text())
    assert sum(c["support"] for c in report["classes"].values()) == images == 20
    assert sum(map(sum, report["confusion_matrix"])) == images
    # overrides on evaluate's command line win over evaluate's own settings and the run's: the
    # data in another place, with a test file that does not decode (named, not scored)
    moved = tmp_path / "moved"
    shutil.copytree(tiny_data, moved)
    (moved / "test" / "circle" / "broken.png").write_bytes(b"not an image")
    assert cli(["evaluate", str(run), "--trainer.enable_progress_bar=false",
                "--trainer.precision=bf16-mixed", f"--data.data_dir={moved}"], tmp_path) == 0
    out = capsys.readouterr().out
    assert f"on {images + 1} test images in bf16-mixed" in out
    assert "Notice: 1 test images could not be decoded" in out and "broken.png" in out


def test_evaluate_refuses_a_checkpoint_outside_its_run_folder(trained_run, tmp_path, capsys):
    """Its settings are the run folder's config.yaml: a copy elsewhere (here beside another
    config.yaml two levels up) is refused before anything is written."""
    (tmp_path / "copied").mkdir()
    shutil.copy(best_ckpt(trained_run), tmp_path / "copied" / "model.ckpt")
    shutil.copy(trained_run / "config.yaml", tmp_path / "config.yaml")
    assert cli(["evaluate", str(tmp_path / "copied" / "model.ckpt")], tmp_path) == 2
    assert "is not where training wrote it" in one_error(capsys.readouterr().err)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["config.yaml", "copied", "model.ckpt"]


def test_mirror_tta_is_refused_for_a_model_trained_without_flips(trained_run, tmp_path, capsys):
    ckpt = read_checkpoint(best_ckpt(trained_run))
    ckpt["datamodule_hyper_parameters"]["augmentation"]["hflip"] = 0.0
    torch.save(ckpt, tmp_path / "digits.ckpt")
    assert cli(["predict", "--ckpt_path", str(tmp_path / "digits.ckpt"), "--input", str(tmp_path),
                "--tta", "hflip"], tmp_path) == 2
    assert "trained without horizontal flips" in capsys.readouterr().err


def test_the_analysis_preset_calibrates_and_draws_the_sample_and_validation_views(tiny_data, tmp_path):
    preset = str(Path(__file__).resolve().parents[1] / "configs" / "presets" / "analysis.yaml")
    assert cli(["fit", *fit_args(tiny_data, "--config", preset, *QUICK, epochs=1)], tmp_path) == 0
    run = only_run(tmp_path / "logs")
    assert calibration_path(best_ckpt(run)).is_file() and "calibration" not in read_checkpoint(best_ckpt(run))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run), size_guidance={"images": 0, "tensors": 0})
    acc.Reload()
    assert {"val/top_losses", "val/reliability", "views/train_samples", "views/val_samples"} <= set(
        acc.Tags()["images"])
    assert acc.Images("views/train_samples")[0].encoded_image_string.startswith(b"\x89PNG")
    assert {f"val/pr_curve/{c}" for c in CLASSES} <= set(acc.PluginTagToContent("pr_curves"))
    assert "calibration/text_summary" in acc.Tags()["tensors"]


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


PLANTED_RECIPE = ["--model.backbone=timm/test_resnet", "--data.augmentation.color_jitter=0",
                  "--model.scheduler.init_args.warmup_epochs=0"]


@pytest.mark.slow
def test_planted_labels_come_first_in_mistakes_csv(planted, tmp_path):
    assert cli(["fit", *fit_args(planted, *PLANTED_RECIPE, epochs=6)], tmp_path) == 0
    run = only_run(tmp_path / "logs")
    # the last checkpoint: the best by val/acc is the first epoch to reach 1.0, barely trained
    assert cli(["evaluate", str(run / "checkpoints" / "last.ckpt"), "--trainer.enable_progress_bar=false"],
               tmp_path) == 0
    folder = run / "checkpoints"
    rows = list(csv.DictReader((folder / "mistakes.csv").open()))
    assert {Path(r["path"]).name for r in rows[:2]} == {"planted_red_000.png", "planted_red_001.png"}, rows
    assert all(r["true"] == "green" and r["predicted"] == "red" for r in rows[:2])
    losses = [float(r["loss"]) for r in rows]
    assert losses == sorted(losses, reverse=True)
    assert float(rows[0]["loss"]) == pytest.approx(-math.log(float(rows[0]["p_true"])), abs=1e-4)
    assert json.loads((folder / "report.json").read_text())["mistakes"] == len(rows)
    assert "planted_red_00" in (folder / "report.md").read_text().split("## Top losses")[1]


@pytest.mark.slow
def test_suspects_puts_the_planted_training_labels_first(planted, tmp_path):
    out = tmp_path / "suspects"
    args = fit_args(planted, *PLANTED_RECIPE, epochs=6)
    refit = ["suspects", "--method", "refit", "--folds", "2", "--top", "8", "--out", str(out)]
    assert cli([*refit, *args], tmp_path) == 0
    rows = list(csv.DictReader((out / "suspects.csv").open()))
    assert len(rows) == 3 * 12 + 2  # every training image, ranked
    planted_files = {"planted_red_000.png", "planted_red_001.png"}
    assert {Path(r["path"]).name for r in rows[:2]} == planted_files, rows[:5]
    assert all(r["given"] == "green" and r["predicted"] == "red" for r in rows[:2])
    assert {r["fold"] for r in rows} == {"0", "1"}
    assert (out / "suspects.png").read_bytes().startswith(b"\x89PNG")
    assert not (tmp_path / "logs").exists()  # the fold fits leave no runs behind


# -- TensorBoard, as a user opens it ---------------------------------------------------------
@pytest.fixture(scope="module")
def tensorboard_url(trained_run):
    port = free_port()
    exe = Path(sys.executable).with_name("tensorboard")
    server = subprocess.Popen([str(exe), "--logdir", str(trained_run.parent), "--host", "127.0.0.1",
                               "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(120):  # bounded wait for start-up
            try:
                with urllib.request.urlopen(f"{url}/data/plugin/scalars/tags", timeout=5) as response:
                    if json.load(response):
                        break
            except OSError:
                time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.slow
def test_tensorboard_serves_the_scalars(tensorboard_url, trained_run):
    with urllib.request.urlopen(f"{tensorboard_url}/data/plugin/scalars/tags", timeout=30) as response:
        tags = json.load(response)[trained_run.name]
    assert {"val/acc", "train/loss", "val/per_class/recall/circle"} <= set(tags)


@pytest.mark.slow
def test_tensorboard_s_first_screen_shows_the_overview(tensorboard_url, chromium, tmp_path):
    """Time Series in headless chromium at 1920 x 1080: the first cards are the curves a user
    looks at first, not one-dot charts."""
    from selenium.webdriver.common.by import By

    driver = chromium
    driver.get(f"{tensorboard_url}/#timeseries")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(driver.find_elements(By.CSS_SELECTOR, "card-view")) < 6:
        time.sleep(0.5)
    visible = [c for c in driver.find_elements(By.CSS_SELECTOR, "card-view")
               if 0 <= c.rect["y"] < driver.execute_script("return window.innerHeight")]
    titles = [c.find_element(By.CSS_SELECTOR, ".title, tb-truncated-path").text.replace("\n", "")
              for c in visible]
    driver.save_screenshot(str(tmp_path / "first_screen.png"))
    print("first screen:", titles)
    assert {"train/loss", "val/loss", "val/acc"} <= set(titles), titles


def test_the_abstain_threshold_reaches_the_target_on_the_answered_images():
    from project.extras.analysis.abstain import abstain_numbers

    # 10 images, surest first: right, right, right, wrong, right, wrong, ...
    confidence = torch.linspace(0.99, 0.50, 10)
    probs = torch.stack([confidence, 1 - confidence], 1)
    target = torch.tensor([0, 0, 0, 1, 0, 1, 0, 1, 1, 1])
    numbers = abstain_numbers(probs, target, target_acc=0.8)
    best = numbers["at_target"]  # the 5 surest: 4 of 5 right; 6 would be 4 of 6
    assert best["coverage"] == pytest.approx(0.5) and best["accuracy"] == pytest.approx(0.8)
    assert best["min_confidence"] == pytest.approx(float(confidence[4]))
    assert numbers["curve"][0] == {"coverage": 1.0, "accuracy": pytest.approx(0.5),
                                   "min_confidence": pytest.approx(0.5)}
    assert abstain_numbers(probs, 1 - target, target_acc=0.99)["at_target"] is None
    tied = abstain_numbers(torch.tensor([[1.0, 0.0]] * 6), torch.tensor([0, 0, 0, 0, 1, 1]), 0.99)
    assert tied["curve"][-1] == {"coverage": 1.0, "accuracy": pytest.approx(4 / 6), "min_confidence": 1.0}
    assert tied["at_target"] is None  # a threshold of 1.0 answers all six, not the first three



def test_a_new_temperature_names_the_export_that_still_carries_the_old_one(tmp_path, monkeypatch, caplog):
    """fit, export, then evaluate (which fits a temperature): the ONNX file's confidences are the
    old ones until it is exported again, and the temperature's writer says so."""
    monkeypatch.chdir(tmp_path)
    ckpt = tmp_path / "logs/run/version_0/checkpoints/best.ckpt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"weights")
    report = tmp_path / "exports/run/version_0/export_report.json"
    report.parent.mkdir(parents=True)
    report.write_text(json.dumps({"checkpoint": str(ckpt), "answers": {"temperature": 1.0}}))
    write_temperature(ckpt, {"temperature": 1.0})
    assert "exported with temperature" not in caplog.text  # the export's own: nothing to say
    write_temperature(ckpt, {"temperature": 1.7})
    assert f"{Path('exports/run/version_0')} was exported with temperature 1.0000, not 1.7000" in caplog.text
    assert f"export --ckpt_path {ckpt}` again" in caplog.text


@pytest.mark.parametrize("given", [["--trainer.accelerator", "cpu"], ["--config", "mine.yaml"]])
def test_evaluate_takes_a_setting_s_value_after_a_space_as_the_setting_s(given, tmp_path, capsys):
    """``evaluate --config mine.yaml``: the value is the setting's, not the checkpoint to evaluate
    (here no run exists, and that is what the one line says)."""
    assert cli(["evaluate", *given], tmp_path) == 2
    error = one_error(capsys.readouterr().err)
    assert "no run with checkpoints under 'logs/'" in error and given[1] not in error
