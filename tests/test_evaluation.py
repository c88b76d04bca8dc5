"""Metrics beyond accuracy, TensorBoard dashboards, the test report and predictions."""

from __future__ import annotations

import csv
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from project.checkpoints import load_model
from project.data.images import decode
from project.data.transforms import eval_transforms
from project.model.metrics import StageMetrics, confused_pairs, per_class_table
from tests.conftest import run_cli, scalars

CLASSES = ["checker", "circle", "cross"]


def test_metrics_equal_a_hand_computation():
    # true:      0 0 0 0 1 1 1 2 2 2
    # predicted: 0 0 1 2 1 1 0 2 2 2
    target = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 2, 2])
    pred = torch.tensor([0, 0, 1, 2, 1, 1, 0, 2, 2, 2])
    metrics = StageMetrics("val", CLASSES)
    logits = torch.nn.functional.one_hot(pred, 3).float()
    metrics.update(logits, target, torch.nn.functional.cross_entropy(logits, target))
    values = metrics.compute()
    assert values["val/confusion"].tolist() == [[2, 1, 1], [1, 2, 0], [0, 0, 3]]
    assert values["val/acc"] == pytest.approx(7 / 10)

    def per_class(kind):
        return [float(values[f"val/{kind}/{c}"]) for c in CLASSES]

    assert per_class("recall") == pytest.approx([2 / 4, 2 / 3, 3 / 3])
    assert per_class("precision") == pytest.approx([2 / 3, 2 / 3, 3 / 4])
    f1 = [2 * p * r / (p + r) for p, r in ((2 / 3, 1 / 2), (2 / 3, 2 / 3), (3 / 4, 1.0))]
    assert per_class("f1") == pytest.approx(f1)
    assert values["val/f1_macro"] == pytest.approx(sum(f1) / 3)
    assert values["val/acc_macro"] == pytest.approx((1 / 2 + 2 / 3 + 1) / 3)
    assert int(metrics.confusion.confmat.sum()) == 0  # compute() restarted the counts

    table = per_class_table(values, "val", CLASSES)
    assert table["classes"]["checker"]["support"] == 4
    assert table["averages"]["weighted avg"]["recall"] == pytest.approx(0.7)
    pairs = confused_pairs(values["val/confusion"], CLASSES, top=5)
    assert [(p["true"], p["predicted"], p["count"]) for p in pairs] == [
        ("checker", "circle", 1), ("checker", "cross", 1), ("circle", "checker", 1)]


def test_tensorboard_holds_per_class_curves_confusion_matrix_and_samples(trained_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    series = scalars(trained_run)
    for c in CLASSES:
        for kind in ("recall", "precision", "f1"):
            assert len(series[f"val/{kind}/{c}"]) == 3
    for tag in ("val/acc_macro", "val/f1_macro", "val/acc_best", "hp/val_acc_best"):
        assert tag in series
    best = series["val/acc_best"]
    assert best[-1][1] == max(v for _, v in series["val/acc"])
    acc = EventAccumulator(str(trained_run), size_guidance={"images": 0, "tensors": 0})
    acc.Reload()
    images = acc.Tags()["images"]
    assert {"samples/train", "samples/val", "val/confusion_matrix"} <= set(images)
    assert len(acc.Images("val/confusion_matrix")) == 3
    png = acc.Images("samples/train")[0].encoded_image_string
    assert png.startswith(b"\x89PNG")
    assert "val/confused_pairs/text_summary" in acc.Tags()["tensors"]
    from tensorboard.plugins.hparams import plugin_data_pb2

    content = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    assert start.hparams["pretrained"].bool_value is False
    assert start.hparams["model/backbone"].string_value == "resnet18"
    experiment = plugin_data_pb2.HParamsPluginData.FromString(
        acc.PluginTagToContent("hparams")["_hparams_/experiment"]).experiment
    columns = {m.name.tag for m in experiment.metric_infos}
    assert {"hp/val_acc_best", "hp/val_f1_macro"} <= columns  # the HPARAMS table's metrics


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tensorboard_server_serves_the_scalars(trained_run):
    port = _free_port()
    exe = Path(sys.executable).with_name("tensorboard")
    server = subprocess.Popen([str(exe), "--logdir", str(trained_run.parent), "--host", "127.0.0.1",
                               "--port", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/data/plugin/scalars/tags"
        tags = None
        for _ in range(120):  # bounded wait for start-up
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    tags = json.load(response)
                if tags:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        assert tags, "TensorBoard did not answer"
        run_tags = tags[trained_run.name]
        assert {"val/acc", "train/loss", "val/recall/circle"} <= set(run_tags)
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_evaluate_writes_a_report_that_agrees_with_the_logged_metrics(trained_run):
    ckpt = next((trained_run / "checkpoints").glob("best-*.ckpt"))
    result = run_cli(["evaluate", str(ckpt), "--trainer.enable_progress_bar=false"],
                     cwd=trained_run.parents[2])
    assert result.returncode == 0, result.stderr[-3000:]
    for name in ("report.json", "report.md", "confusion_matrix.png"):
        assert (ckpt.parent / name).is_file(), name
    report = json.loads((ckpt.parent / "report.json").read_text())
    assert "precision" in result.stdout and "checker" in result.stdout  # the printed table
    logged = {tag: values[-1][1] for tag, values in scalars(trained_run).items()}
    assert report["accuracy"] == pytest.approx(logged["test/acc"], abs=1e-6)
    for c in CLASSES:
        assert report["classes"][c]["recall"] == pytest.approx(logged[f"test/recall/{c}"], abs=1e-6)
        assert report["classes"][c]["support"] == 4
    assert sum(map(sum, report["confusion_matrix"])) == 12


def test_predict_writes_csv_matching_the_model_and_lists_bad_files(trained_run, tiny_data, tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    for f in sorted((tiny_data / "test").rglob("*.png"))[::2]:
        (images / f.name).write_bytes(f.read_bytes())
    (images / "broken.png").write_bytes(b"not an image")
    ckpt = next((trained_run / "checkpoints").glob("best-*.ckpt"))
    out = tmp_path / "preds.csv"
    result = run_cli(["predict", "--ckpt_path", str(ckpt), "--input", str(images),
                      "--output", str(out)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {Path(r["path"]).name: r for r in csv.DictReader(out.open())}
    assert rows["broken.png"]["error"] and not rows["broken.png"]["predicted"]
    assert "broken.png" in result.stdout

    model = load_model(ckpt)
    transform = eval_transforms(model.preprocessing)
    good = sorted(p for p in images.iterdir() if p.name != "broken.png")
    with torch.no_grad():
        probs = model.probabilities(torch.stack([transform(decode(str(p))) for p in good]))
    for p, row_probs in zip(good, probs, strict=True):
        row = rows[p.name]
        assert row["predicted"] == CLASSES[int(row_probs.argmax())]
        assert float(row["confidence"]) == pytest.approx(float(row_probs.max()), abs=1e-4)
        assert row["top1"] == row["predicted"] and row["top3"]
