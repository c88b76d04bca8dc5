"""Deployment: verified ONNX, INT8, TorchScript and .pt2; predict; torch-free inference."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from project.checkpoints import load_model
from project.extras.analysis.calibration import write_temperature
from project.extras.deploy.infer import OnnxClassifier, classify
from project.extras.deploy.infer import main as infer_main
from tests.conftest import CLASSES, best_ckpt, cli, one_error, scratch


@pytest.fixture(scope="module")
def calibrated(trained_run, tmp_path_factory) -> Iterator[Path]:
    """The trained run's best checkpoint with a temperature of 2.5 (in model.ckpt.calibration.json)."""
    with scratch(tmp_path_factory, "calibrated") as folder:
        ckpt = folder / "model.ckpt"
        ckpt.write_bytes(best_ckpt(trained_run).read_bytes())
        write_temperature(ckpt, {"temperature": 2.5})
        yield ckpt


@pytest.fixture(scope="module")
def exported(calibrated, tiny_data) -> Path:
    out = calibrated.parent / "export"
    out.mkdir()  # an earlier export of another checkpoint, in a format not exported now: removed
    (out / "model.pt2").write_bytes(b"an earlier export's")
    (out / "export_report.json").write_text(json.dumps({"checkpoint": "another.ckpt"}))
    assert cli(["export", "--ckpt_path", str(calibrated), "--out", str(out), "--data_dir", str(tiny_data),
                "--formats", "onnx,int8", "--calibration_images", "16", "--int8_max_drop", "1.0",
                "--repeats", "2"], out.parent) == 0
    return out


def test_onnx_matches_pytorch_at_several_batch_sizes_and_carries_metadata(exported, calibrated):
    import onnx
    import onnxruntime as ort

    proto = onnx.load(str(exported / "model.onnx"))
    onnx.checker.check_model(proto)
    meta = {p.key: p.value for p in proto.metadata_props}
    assert json.loads(meta["class_names"]) == CLASSES and float(meta["temperature"]) == 2.5
    assert meta["image_size"] == "32" and json.loads(meta["mean"])[0] == pytest.approx(0.485)
    assert not list(exported.glob("*.data"))  # one self-contained file
    model = load_model(calibrated)
    session = ort.InferenceSession(str(exported / "model.onnx"), providers=["CPUExecutionProvider"])
    for batch in (1, 3, 8, 17):
        x = torch.randn(batch, 3, 32, 32)
        with torch.no_grad():
            expected = model(x).numpy()
        assert np.abs(session.run(None, {"input": x.numpy()})[0] - expected).max() <= 1e-4


def test_the_report_covers_every_format_and_int8_is_smaller(exported):
    report = json.loads((exported / "export_report.json").read_text())
    rows = report["formats"]
    assert set(rows) == {"pytorch", "onnx", "int8"} and rows["onnx"]["max_abs_diff"] <= 1e-4
    for name, row in rows.items():
        assert row["latency_ms_b1"] > 0 and 0 <= row["val_acc"] <= 1, name
        # by default only batch 1 is timed: a batch of 32 is seconds per run for a large model
        assert not [k for k in row if k.startswith("latency_ms_") and k != "latency_ms_b1"], name
    assert report["timing_batches"] == [1]
    assert report["checked_images"] == report["val_images"] == 20  # fewer than --check_images 256: all
    assert rows["int8"]["size_mb"] < 0.5 * rows["onnx"]["size_mb"]
    md = (exported / "export_report.md").read_text()
    assert "| int8 |" in md and "latency b1 (ms) |" in md and "b32" not in md
    assert not (exported / "model.pt2").exists()  # an earlier export's, which the report does not cover


def test_check_images_and_timing_batches_bound_and_state_the_work(calibrated, tiny_data, tmp_path):
    out = tmp_path / "export"
    assert cli(["export", "--ckpt_path", str(calibrated), "--out", str(out), "--data_dir", str(tiny_data),
                "--formats", "onnx", "--check_images", "5", "--timing_batches", "4,1", "--repeats", "1"],
               tmp_path) == 0
    report = json.loads((out / "export_report.json").read_text())
    assert report["checked_images"] == 5 and report["val_images"] == 20
    assert report["timing_batches"] == [1, 4]
    for name, row in report["formats"].items():
        assert sorted(k for k in row if k.startswith("latency_ms_")) == ["latency_ms_b1", "latency_ms_b4"]
        assert row["val_acc"] * 5 == pytest.approx(round(row["val_acc"] * 5)), name  # k right of 5
    md = (out / "export_report.md").read_text()
    assert "on 5 of 20 validation images" in md and "| latency b1 (ms) | latency b4 (ms) |" in md


def test_the_export_checks_a_spread_of_the_validation_images_not_the_first_folders(monkeypatch):
    """--check_images below the validation split: every format's accuracy (and INT8's allowed drop)
    rests on a seeded choice across the classes, the same on every export."""
    from types import SimpleNamespace

    from project.data.folders import Sample
    from project.extras.deploy import export

    monkeypatch.setattr(export, "eval_dataset", lambda dm, samples: samples)
    val = [Sample(f"{c}/{i}.png", c) for c in range(5) for i in range(20)]  # class folders in order
    dm = SimpleNamespace(splits=SimpleNamespace(val=val))
    chosen = export.check_dataset(dm, 20)
    assert len(chosen) == 20 and {s.label for s in chosen} == set(range(5))
    assert export.check_dataset(dm, 20) == chosen and export.check_dataset(dm, 500) == dm.splits.val


@pytest.mark.parametrize(("option", "value"), [("--check_images", "0"), ("--check_images", "-3"),
                                               ("--timing_batches", "0"), ("--timing_batches", "1,x"),
                                               ("--timing_batches", "1,-32"), ("--repeats", "0")])
def test_bad_export_counts_fail_in_one_line_and_leave_nothing(option, value, calibrated, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli(["export", "--ckpt_path", str(calibrated), "--out", str(out), "--formats", "onnx",
                option, value], tmp_path) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {option} must be") and len(err.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("edit", ["grayscale", "no_crop"])
def test_an_evaluation_transform_that_infer_does_not_mirror_stops_the_export(edit, calibrated, tiny_data,
                                                                               tmp_path, capsys, monkeypatch):
    """A user's edit to the evaluation transforms (a grayscale step, another crop) that infer.py's
    torch-free copy lacks: the ONNX file would pass its parity check on torch's inputs and then
    answer infer.py and serve --onnx otherwise. The export stops, naming both places."""
    from torchvision.transforms import v2

    import project.data.datamodule as datamodule
    from project.data.transforms import eval_transforms

    def edited(pre):
        steps = list(eval_transforms(pre).transforms)
        if edit == "grayscale":
            steps.insert(2, v2.Grayscale(num_output_channels=3))
        else:
            steps[1] = v2.Resize((pre.image_size, pre.image_size), antialias=True)
        return v2.Compose(steps)

    monkeypatch.setattr(datamodule, "eval_transforms", edited)  # unedited: the `exported` fixture's export
    out = tmp_path / "out"
    assert cli(["export", "--ckpt_path", str(calibrated), "--out", str(out), "--data_dir", str(tiny_data),
                "--formats", "onnx", "--repeats", "1"], tmp_path) == 2
    err = one_error(capsys.readouterr().err)
    assert "infer.py prepares images otherwise" in err and "eval_transforms" in err
    assert not out.exists()


@pytest.mark.parametrize("interpolation", ["bicubic", "nearest", "bilinear"])
def test_the_preprocessing_check_passes_unedited_transforms_of_any_filter(interpolation, tiny_data):
    """Enlarging a small image, torch's and Pillow's bicubic round apart by 2 and their nearest
    pick other pixels: the check compares where neither resizes, so an unedited model exports."""
    from types import SimpleNamespace

    from project.common.preprocessing import Preprocessing
    from project.data.samples import Sample
    from project.extras.deploy.export import check_infer_preprocessing

    small = [Sample(str(p), 0) for p in sorted((tiny_data / "val").rglob("*.png"))[:4]]  # 32 px
    check_infer_preprocessing(Preprocessing(96, 0.9, interpolation), None, SimpleNamespace(samples=small))


@pytest.mark.parametrize("problem", ["missing", "corrupt", "not_a_checkpoint", "no_class_names"])
def test_bad_checkpoints_fail_in_one_line_and_leave_nothing(problem, trained_run, tmp_path, capsys):
    ckpt = tmp_path / "model.ckpt"
    if problem == "corrupt":
        ckpt.write_bytes(best_ckpt(trained_run).read_bytes()[:5000])
    elif problem == "not_a_checkpoint":
        torch.save({"weights": torch.zeros(3)}, ckpt)
    elif problem == "no_class_names":
        full = torch.load(best_ckpt(trained_run), weights_only=True)
        full["hyper_parameters"].pop("class_names")
        torch.save(full, ckpt)
    out = tmp_path / "out"
    assert cli(["export", "--ckpt_path", str(ckpt), "--out", str(out)], tmp_path) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and str(ckpt) in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_export_refuses_data_of_other_classes_in_one_line(calibrated, tiny_data, tmp_path, capsys):
    """Scored against other classes' labels every format reads 0 %, and the INT8 check passes."""
    other = tmp_path / "other"
    for split in ("train", "val"):
        for old, new in zip(CLASSES, ["apple", "pear", "plum"], strict=False):
            shutil.copytree(tiny_data / split / old, other / split / new)
    out = tmp_path / "out"
    assert cli(["export", "--ckpt_path", str(calibrated), "--out", str(out), "--data_dir", str(other),
                "--formats", "onnx"], tmp_path) == 2
    error = one_error(capsys.readouterr().err)
    assert "different classes" in error and "apple" in error
    assert not out.exists()


def test_other_classes_of_a_run_trained_from_a_table_name_the_table(trained_run, tmp_path):
    """A table that gained a class: the table changed (data.labels), not the data folder."""
    from project.checkpoints import check_checkpoint_classes
    from project.errors import CheckpointError

    full = torch.load(best_ckpt(trained_run), weights_only=True)
    full["datamodule_hyper_parameters"]["labels"] = str(tmp_path / "labels.csv")
    torch.save(full, tmp_path / "table.ckpt")
    with pytest.raises(CheckpointError) as err:
        check_checkpoint_classes(tmp_path / "table.ckpt", [*CLASSES, "star"])
    said = str(err.value)
    assert f"data.labels '{tmp_path / 'labels.csv'}'" in said and "only in the data: ['star']" in said
    assert "data.data_dir" not in said and "data folder" not in said and "\n" not in said


@pytest.mark.parametrize(("command", "option", "value", "says"), [
    ("predict", "--top_k", "0", "must be >= 1, got 0"),
    ("predict", "--batch_size", "0", "must be >= 1, got 0"),
    ("predict", "--device", "cuda:7", "GPU"),
    ("predict", "--device", "tpu", "is not a device"),
    ("calibrate", "--batch_size", "-1", "must be >= 1, got -1"),
    ("serve", "--top_k", "-2", "must be >= 1, got -2"),
    ("serve", "--workers", "0", "must be >= 1, got 0"),
    ("serve", "--accelerator", "cuda:7", "GPU"),
    ("infer.py", "--top_k", "0", "must be >= 1, got 0"),
])
def test_bad_answer_and_device_options_are_refused_naming_the_option(command, option, value, says,
                                                                      calibrated, tmp_path, capsys):
    """Before any model loads: not an IndexError per image, an HTTP 500, or a CUDA traceback."""
    if command == "infer.py":
        with pytest.raises(SystemExit) as exit_:
            infer_main([str(tmp_path / "model.onnx"), str(tmp_path), option, value])
        code = exit_.value.code
    else:
        extra = ["--input", str(tmp_path)] if command == "predict" else []
        code = cli([command, "--ckpt_path", str(calibrated), *extra, option, value], tmp_path)
    err = capsys.readouterr().err
    assert code == 2 and f"argument {option}: " in err and says in err and "Traceback" not in err


def test_infer_says_a_missing_model_does_not_exist(tmp_path, capsys):
    assert infer_main([str(tmp_path / "nope.onnx"), str(tmp_path)]) == 2
    assert "nope.onnx' does not exist" in one_error(capsys.readouterr().err)


def test_a_moved_data_folder_is_named_with_the_option_that_points_at_it(trained_run, tmp_path, capsys):
    full = torch.load(best_ckpt(trained_run), weights_only=True)
    full["datamodule_hyper_parameters"]["data_dir"] = str(tmp_path / "moved_away")
    (tmp_path / "checkpoints").mkdir()
    ckpt = tmp_path / "checkpoints" / "model.ckpt"
    torch.save(full, ckpt)
    for command, option in ((["evaluate", str(ckpt)], "--data.data_dir=NEW_FOLDER"),
                            (["calibrate", "--ckpt_path", str(ckpt)], "--data_dir NEW_FOLDER")):
        assert cli(command, tmp_path) == 2
        error = one_error(capsys.readouterr().err)
        assert "moved_away', which is not there now" in error and option in error
    # export works without the images, and says what it could not check and how to give them
    assert cli(["export", "--ckpt_path", str(ckpt), "--formats", "torchscript", "--out", str(tmp_path / "e"),
                "--repeats", "1"], tmp_path) == 0
    notice = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("Notice: no acc"))
    assert "moved_away', which is not there now" in notice and "--data_dir NEW_FOLDER" in notice


def _resized_test_images(tiny_data: Path, folder: Path, side: int) -> Path:
    """The test images at the evaluation's resize side: both pipelines then only crop and
    normalise, so their pixels are identical (Pillow's and torchvision's resampling differ a little)."""
    folder.mkdir()
    for f in sorted((tiny_data / "test").rglob("*.png")):
        Image.open(f).convert("RGB").resize((side, side)).save(folder / f.name)
    (folder / "broken.png").write_bytes(b"not an image")
    return folder


def test_predict_and_infer_give_the_same_calibrated_probabilities(exported, calibrated, tiny_data, tmp_path,
                                                                  capsys):
    model = load_model(calibrated)
    images = _resized_test_images(tiny_data, tmp_path / "images", model.preprocessing.resize_size)
    torch_csv, onnx_csv = tmp_path / "torch.csv", tmp_path / "onnx.csv"
    assert cli(["predict", "--ckpt_path", str(calibrated), "--input", str(images),
                "--output", str(torch_csv)],
               tmp_path) == 0
    assert "could not read" in capsys.readouterr().out  # the broken file is listed, not fatal
    assert infer_main([str(exported / "model.onnx"), str(images), "--output", str(onnx_csv)]) == 0
    ours = {r["path"]: r for r in csv.DictReader(onnx_csv.open())}
    theirs = {r["path"]: r for r in csv.DictReader(torch_csv.open())}
    assert list(ours) == list(theirs) and len(ours) == 21  # 20 images and the broken one, in order
    assert ours[str(images / "broken.png")]["error"] and theirs[str(images / "broken.png")]["error"]
    for path, row in ours.items():
        for k in (1, 2, 3) if not row["error"] else ():
            assert row[f"top{k}"] == theirs[path][f"top{k}"]
            assert float(row[f"top{k}_prob"]) == pytest.approx(float(theirs[path][f"top{k}_prob"]), abs=1e-5)
    # ...and they are the calibrated ones: softmax(logits / 2.5), not the raw softmax
    clf = OnnxClassifier(exported / "model.onnx")
    first = sorted(p for p in ours if "broken" not in p)[0]
    logits = clf.logits([clf.read(first)])[0]
    expected = float(torch.tensor(logits / 2.5).softmax(-1).max())
    assert float(ours[first]["confidence"]) == pytest.approx(expected, abs=1e-5)
    assert classify(clf, [first])[0]["predicted"] == ours[first]["predicted"]


@pytest.mark.slow
def test_infer_runs_where_torch_is_missing(exported, tiny_data, tmp_path):
    blocker = tmp_path / "no_torch"
    (blocker / "torch").mkdir(parents=True)
    (blocker / "torch" / "__init__.py").write_text("raise ImportError('torch is blocked')\n")
    result = subprocess.run(
        [sys.executable, "-m", "project.extras.deploy.infer", str(exported / "model.onnx"),
         str(tiny_data / "test"),
         "--output", str(tmp_path / "preds.csv")], cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": f"{blocker}:{Path(__file__).resolve().parents[1]}", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(list(csv.DictReader((tmp_path / "preds.csv").open()))) == 20


@pytest.mark.slow
def test_torchscript_and_pt2_reload_without_the_project(calibrated, tmp_path):
    from project.extras.deploy.export import export_checkpoint

    exported = tmp_path / "export"
    rows = export_checkpoint(calibrated, exported, ["torchscript", "pt2"], repeats=1)["formats"]
    assert rows["torchscript"]["max_abs_diff"] <= 1e-4 and rows["pt2"]["max_abs_diff"] <= 1e-4
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        expected = load_model(calibrated)(x)
    torch.save({"x": x, "expected": expected}, tmp_path / "io.pt")
    script = textwrap.dedent(f"""
        import sys, torch
        io = torch.load({str(tmp_path / 'io.pt')!r})
        ts = torch.jit.load({str(exported / 'model.torchscript.pt')!r})
        pt2 = torch.export.load({str(exported / 'model.pt2')!r}).module()
        for out in (ts(io["x"]), pt2(io["x"])):
            assert (out - io["expected"]).abs().max() <= 1e-4
        assert not any(m == "project" or m.startswith("project.") for m in sys.modules)
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]


def test_predict_and_infer_answer_unsure_below_min_confidence(exported, calibrated, tiny_data, tmp_path):
    torch_csv, onnx_csv = tmp_path / "torch.csv", tmp_path / "onnx.csv"
    images = str(tiny_data / "test" / "circle")
    assert cli(["predict", "--ckpt_path", str(calibrated), "--input", images, "--output", str(torch_csv),
                "--min_confidence", "0.999999"], tmp_path) == 0
    assert infer_main([str(exported / "model.onnx"), images, "--output", str(onnx_csv),
                       "--min_confidence", "0.999999"]) == 0
    for table in (torch_csv, onnx_csv):
        rows = list(csv.DictReader(table.open()))
        assert rows and all(r["predicted"] == "unsure" and r["unsure"] == "True" for r in rows)
        assert all(r["top1"] for r in rows)  # the top classes are still there


def test_predict_and_infer_count_the_files_they_leave_out(exported, calibrated, tiny_data, tmp_path, capsys):
    import shutil

    images = shutil.copytree(tiny_data / "test" / "circle", tmp_path / "photos")
    (images / "IMG_0001.HEIC").write_bytes(b"a phone's photo")
    said = "left out: 1 other file (.heic 1), not images by their extension"
    assert cli(["predict", "--ckpt_path", str(calibrated), "--input", str(images), "--output",
                str(tmp_path / "torch.csv")], tmp_path) == 0
    assert said in capsys.readouterr().out
    onnx_csv = str(tmp_path / "onnx.csv")
    assert infer_main([str(exported / "model.onnx"), str(images), "--output", onnx_csv]) == 0
    assert said in capsys.readouterr().out
    for f in images.glob("*.png"):
        f.unlink()
    assert infer_main([str(exported / "model.onnx"), str(images), "--output", str(tmp_path / "x.csv")]) == 2
    assert said in one_error(capsys.readouterr().err)


def test_infer_refuses_a_text_file_and_an_empty_folder_in_one_line(exported, tmp_path, capsys):
    """As predict does: exit 2, one error line, no CSV of error rows."""
    (tmp_path / "notes.txt").write_text("not an image\n")
    (tmp_path / "empty").mkdir()
    for bad, said in ((tmp_path / "notes.txt", "no file could be read as an image"),
                      (tmp_path / "empty", "no image files in")):
        out = tmp_path / "preds.csv"
        assert infer_main([str(exported / "model.onnx"), str(bad), "--output", str(out)]) == 2
        assert said in one_error(capsys.readouterr().err)
        assert not (tmp_path / "preds.csv").exists()


def test_the_export_checks_keep_their_limits(monkeypatch):
    """Parity past its tolerance, an INT8 file worse by more than its allowed share (a lower-is-
    better metric too), infer.py's pixels a few values off evaluation's: each stops the export."""
    from project.common.preprocessing import Preprocessing
    from project.errors import ProjectError
    from project.extras.deploy import infer
    from project.extras.deploy.export import _check_int8_accuracy, check_infer_preprocessing
    from project.extras.deploy.exporters import ExportError, check_parity

    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 2)).eval()
    assert check_parity("same", net, lambda x: net(x).numpy() + 5e-5, 8, 1e-4) <= 1e-4
    with pytest.raises(ExportError, match="max |difference|"):
        check_parity("off", net, lambda x: net(x).numpy() + 5e-4, 8, 1e-4)
    for int8, refused in ((1.5, True), (1.04, False), (0.9, False)):  # val_mae, FP32's 1.0, 5 % allowed
        rows = {"onnx": {"val_mae": 1.0}, "int8": {"val_mae": int8}}
        if refused:
            with pytest.raises(ExportError, match="INT8 val_mae"):
                _check_int8_accuracy(rows, 0.05, Path("never-written"), "val_mae", "min")
        else:
            _check_int8_accuracy(rows, 0.05, Path("never-written"), "val_mae", "min")
    pre = Preprocessing(32)
    check_infer_preprocessing(pre, None, None)
    original = infer.preprocess  # three pixel values brighter: a resize or filter slightly off
    monkeypatch.setattr(infer, "preprocess",
                        lambda rgb, p: original(rgb, p) + (3 / 255) / np.reshape(p.std, (3, 1, 1)))
    with pytest.raises(ProjectError, match="infer.py prepares images otherwise"):
        check_infer_preprocessing(pre, None, None)


def test_serve_answers_a_calibrated_model_as_predict_does_and_tta_uses_the_mirror(calibrated, tiny_data):
    """At T=2.5 a temperature applied twice, or not at all, changes every probability; ``--tta
    hflip`` averages each image with its mirror, not with itself."""
    import base64

    from project.data.datasets import ImageDataset
    from project.data.samples import Sample
    from project.data.transforms import eval_transforms
    from project.extras.analysis.predictions import predict_dataset
    from project.extras.deploy.predict import predict_files
    from project.extras.deploy.serve import ClassifierAPI

    model = load_model(calibrated)
    paths = sorted(str(p) for p in (tiny_data / "test").rglob("*.png"))[:3]
    rows = predict_files(model, paths)
    api = ClassifierAPI(calibrated, None)
    api.setup("cpu")
    for path, row in zip(paths, rows, strict=True):
        request = {"raw": base64.b64encode(Path(path).read_bytes()).decode()}
        served = api.encode_response(api.predict(api.decode_request(request)))["predictions"][0]
        assert float(served["confidence"]) == pytest.approx(float(row["confidence"]), abs=1e-5)
    dataset = ImageDataset([Sample(p, 0) for p in paths], eval_transforms(model.preprocessing))
    out = predict_dataset(model, dataset, 3, "cpu", mirrored=True)
    both = (out["logits"].double() / 2.5).softmax(-1) + (out["mirrored"].double() / 2.5).softmax(-1)
    mirrored = [float(r["confidence"]) for r in predict_files(model, paths, tta=True)]
    assert mirrored == pytest.approx((both / 2).max(-1).values.tolist(), abs=1e-5)
