"""The named extension points, each with the slip a user makes in it: a loss by name, an own
backbone, the answer policy that predict, infer.py and serve share, the task registry."""

from __future__ import annotations

import base64
import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from project import tasks
from project.errors import ConfigError
from project.model import ImageClassifier, backbones
from project.tasks import TASKS, answers, task_class
from tests.conftest import QUICK, best_ckpt, cli, fit_args, one_error, only_run, scalars


def test_every_task_has_answers_and_names_its_metric():
    for name in TASKS:
        cls = task_class(name)
        assert cls.name == name and cls.mode in ("max", "min") and cls.default_loss in cls.losses
        assert issubclass(tasks.load(cls.answers, "answers"), answers.Answers), name


def test_model_loss_picks_from_the_tasks_registry_and_a_misspelling_fails_in_one_line():
    logits, y = torch.randn(12, 5), torch.arange(12) % 5
    plain = ImageClassifier(num_classes=5, weights=None, input=32)
    focal = ImageClassifier(num_classes=5, weights=None, input=32, loss="focal")
    torch.testing.assert_close(plain.loss(logits, y), nn.functional.cross_entropy(logits, y))
    p = logits.softmax(-1)[torch.arange(12), y]
    torch.testing.assert_close(focal.loss(logits, y), (-(1 - p) ** 2 * p.log()).mean())
    with pytest.raises(ConfigError, match="model.loss 'focall' is not a loss of the multiclass task; "
                                          "choose from cross_entropy, focal"):
        ImageClassifier(num_classes=5, weights=None, input=32, loss="focall")


def test_an_own_loss_is_called_with_the_task_and_a_wrong_one_is_one_line():
    logits, y = torch.randn(6, 5), torch.tensor([0, 1, 2, 3, 4, 0])
    model = ImageClassifier(num_classes=5, weights=None, input=32, loss="tests.own_losses:smoothed")
    torch.testing.assert_close(model.loss(logits, y), nn.functional.cross_entropy(logits, y))
    for spec, message in (("plain_signature", r"takes \(logits, target\): a loss is fn\(task, logits"),
                          ("NOT_A_FUNCTION", "is a int, not a function")):
        with pytest.raises(ConfigError, match=f"model.loss 'tests.own_losses:{spec}' {message}"):
            ImageClassifier(num_classes=5, weights=None, input=32, loss=f"tests.own_losses:{spec}")
    model = ImageClassifier(num_classes=5, weights=None, input=32, loss="tests.own_losses:per_image")
    with pytest.raises(ConfigError, match=r"returned \(6,\), not one number: reduce it"):
        model.loss(logits, y)


def test_a_misspelt_loss_on_the_command_line_is_one_line_and_no_run(tiny_data, tmp_path, capsys):
    assert cli(["fit", *fit_args(tiny_data, *QUICK, "--model.loss=focall", epochs=1)], tmp_path) == 2
    assert "model.loss 'focall'" in one_error(capsys.readouterr().err)
    assert not (tmp_path / "logs").exists()


def test_an_own_backbone_trains_with_its_head_replaced(tiny_data, tmp_path):
    own = "tests.own_backbone:tiny_net"
    model = ImageClassifier(num_classes=5, backbone=own, weights=None, input=32)
    assert model.head_name == "5" and model.net[5].out_features == 5
    groups = model.param_groups()
    assert any(g["name"].startswith("head") for g in groups)
    assert cli(["fit", *fit_args(tiny_data, *QUICK, "--model.backbone=tests.own_backbone:tiny_net",
                                 epochs=1)], tmp_path) == 0
    assert "val/acc" in scalars(only_run(tmp_path / "logs"))


@pytest.mark.parametrize(("spec", "message"), [
    ("tests.own_backbone:tiny_nett", "model.backbone 'tests.own_backbone:tiny_nett': cannot import it"),
    ("tests.own_backbon:tiny_net", "model.backbone 'tests.own_backbon:tiny_net': cannot import it"),
    ("tests.own_backbone:not_a_module", "returned a str, not a torch nn.Module"),
    ("tests.own_backbone:headless_net", "answers (1, 10) per image, not (1, 5)"),
    ("tests.own_backbone:needs_classes", "is called with no arguments, and needs_classes(num_classes: int)"),
])
def test_a_wrong_own_backbone_is_one_line(spec, message):
    with pytest.raises(backbones.WeightsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ImageClassifier(num_classes=5, backbone=spec, weights=None, input=32)


@pytest.mark.parametrize("weights", ["weights/small", "IMAGENET1K_V1"])
def test_an_own_backbones_weights_are_a_file_null_or_default(weights, caplog):
    """A mistyped path (no suffix, no file) or a torchvision weights name would train the factory's
    own initialisation under a setting that reads as weights: refused. DEFAULT keeps what the
    factory built and says, at the start, that it counts as random weights."""
    own = "tests.own_backbone:tiny_net"
    with pytest.raises(backbones.WeightsError, match=f"model.weights '{weights}': no such file"):
        ImageClassifier(num_classes=5, backbone=own, weights=weights, input=32)
    with caplog.at_level("INFO", logger="project"):
        model = ImageClassifier(num_classes=5, backbone=own, weights="DEFAULT", input=32)
    assert not model.pretrained and "counted as random weights" in caplog.text


def test_a_backbone_whose_head_was_not_replaced_fails_at_build_not_in_a_metric(monkeypatch):
    monkeypatch.setattr(backbones, "replace_head", lambda *args, **kwargs: None)  # the slip
    with pytest.raises(backbones.WeightsError, match=r"answers \(1, 1000\) per image, not \(1, 5\)"):
        ImageClassifier(num_classes=5, backbone="resnet18", weights=None, input=32)


def test_min_confidence_per_class_with_a_default():
    names = ["cat", "dog", "owl"]
    assert answers.min_confidence("0.8", names).tolist() == [0.8, 0.8, 0.8]
    assert answers.min_confidence("dog=0.9,0.5", names).tolist() == [0.5, 0.9, 0.5]
    assert answers.min_confidence("owl=0.7", names).tolist() == [0.0, 0.0, 0.7]
    for bad, says in (("cow=0.5", "'cow' is not a class"), ("1.5", "not a probability"),
                      ("x", "not a number")):
        with pytest.raises(ConfigError, match=says):
            answers.min_confidence(bad, names)


def test_predict_infer_and_serve_give_equal_rows_for_equal_options(trained_run, tiny_data, tmp_path):
    """One answer policy: the same image set and options, given on each command line, give the
    same rows from the checkpoint (predict), the exported file (infer.py) and the server, per-class
    minimum confidence included: an option one of them drops fails here."""
    from project.checkpoints import load_model
    from project.extras.deploy.export import export_checkpoint
    from project.extras.deploy.infer import main as infer_main
    from project.extras.deploy.predict import predict_files
    from project.extras.deploy.serve import make_api
    from project.extras.deploy.serve import parser as serve_parser

    ckpt = best_ckpt(trained_run)
    export_checkpoint(ckpt, tmp_path, ["onnx"], repeats=1)
    model = load_model(ckpt)
    side = model.preprocessing.resize_size  # both pipelines then only crop: the same pixels
    paths = []
    for f in sorted((tiny_data / "test").rglob("*.png"))[:8]:
        Image.open(f).convert("RGB").resize((side, side)).save(tmp_path / f.name)
        paths.append(str(tmp_path / f.name))
    cut = float(np.median([float(r["confidence"]) for r in predict_files(model, paths)]))  # half below
    policy = f"{model.class_names[0]}=0.0,{cut}"
    options = ["--top_k", "2", "--min_confidence", policy]
    folder = tmp_path / "images"
    folder.mkdir()
    for p in paths:
        Path(p).rename(folder / Path(p).name)
    paths = sorted(str(p) for p in folder.iterdir())
    assert cli(["predict", "--ckpt_path", str(ckpt), "--input", str(folder), "--output",
                str(tmp_path / "predict.csv"), *options], tmp_path) == 0
    assert infer_main([str(tmp_path / "model.onnx"), str(folder), "--output", str(tmp_path / "infer.csv"),
                       *options]) == 0
    by_predict, by_infer = (list(csv.DictReader((tmp_path / f"{name}.csv").open()))
                            for name in ("predict", "infer"))
    api = make_api(serve_parser().parse_args(["--ckpt_path", str(ckpt), *options]), ckpt, None)
    api.setup("cpu")
    served = []
    for path in paths:
        request = {"raw": base64.b64encode(Path(path).read_bytes()).decode()}
        row = api.encode_response(api.predict(api.decode_request(request)))["predictions"][0]
        served.append({**json.loads(json.dumps(row)), "path": path})  # as the server sends it: JSON
    unsure = [r["unsure"] == "True" for r in by_predict]
    assert any(unsure) and not all(unsure)
    assert [r["path"] for r in by_predict] == [r["path"] for r in by_infer] == paths
    for a, b, c in zip(by_predict, by_infer, served, strict=True):
        assert a["predicted"] == b["predicted"] == c["predicted"] and "top3" not in a and "top3" not in b
        assert a["unsure"] == b["unsure"] == str(c["unsure"])
        assert list(a) == list(b) and set(a) == set(c)
        # one batch of eight (predict, infer.py) against one image at a time (serve): the same
        # numbers up to the float rounding of another batch shape
        assert float(a["top1_prob"]) == pytest.approx(float(b["top1_prob"]), abs=1e-5)
        assert float(a["top1_prob"]) == pytest.approx(float(c["top1_prob"]), abs=1e-5)


def test_an_extra_validation_set_is_logged_apart_and_never_averaged_into_val(tiny_data, tmp_path, capsys):
    series = {}
    shifted = f'--data.extra_val={{"shifted": "{tiny_data / "test"}"}}'
    for name, extra in (("plain", ()), ("extra", (shifted,))):
        (tmp_path / name).mkdir()
        assert cli(["fit", *fit_args(tiny_data, "--trainer.limit_train_batches=2", *extra, epochs=2)],
                   tmp_path / name) == 0
        series[name] = scalars(only_run(tmp_path / name / "logs"))
    assert {"val_shifted/acc", "val_shifted/loss", "val_shifted/macro_f1"} <= set(series["extra"])
    assert "val_shifted/acc" not in series["plain"]
    for tag in ("val/acc", "val/loss", "val/acc_best"):  # val/ is the validation split's alone
        assert series["extra"][tag] == series["plain"][tag], tag
    missing = f'--data.extra_val={{"gone": "{tmp_path / "nowhere"}"}}'
    (tmp_path / "bad").mkdir()
    assert cli(["fit", *fit_args(tiny_data, *QUICK, missing, epochs=1)], tmp_path / "bad") == 2
    assert "data.extra_val.gone must be a folder" in one_error(capsys.readouterr().err)
    assert not (tmp_path / "bad" / "logs").exists()


def test_a_data_module_built_apart_with_other_preprocessing_stops_before_training(tiny_data):
    """In Python the data gets the model's preprocessing by hand; forgotten, the guards say so."""
    import lightning as L

    from project.callbacks.guards import Guards, TrainingHealthError
    from project.data import FolderDataModule

    model = ImageClassifier(num_classes=5, weights=None, input=32)
    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[Guards()])
    with pytest.raises(TrainingHealthError, match=r"prepares 224 px .* preprocessing=model.preprocessing"):
        trainer.fit(model, FolderDataModule(tiny_data, batch_size=8, num_workers=0))


def test_the_answer_policy_travels_in_the_checkpoint_and_the_onnx_file(trained_run, tiny_data, tmp_path):
    """model.min_confidence is the model's own policy: predict, the exported file and infer.py
    answer with it unless the command line says otherwise; a class it does not know fails."""
    from project.checkpoints import load_model, read_checkpoint
    from project.extras.deploy.export import export_checkpoint
    from project.extras.deploy.infer import OnnxClassifier, classify
    from project.extras.deploy.predict import predict_files

    ckpt = read_checkpoint(best_ckpt(trained_run))
    ckpt["hyper_parameters"]["min_confidence"] = "0.999999"  # as --model.min_confidence stores it
    ckpt["hyper_parameters"]["input"]["interpolation"] = "bicubic"  # the resize travels with the model too
    torch.save(ckpt, tmp_path / "strict.ckpt")
    model = load_model(tmp_path / "strict.ckpt")
    paths = sorted(str(p) for p in (tiny_data / "test").rglob("*.png"))[:4]
    assert all(r["unsure"] for r in predict_files(model, paths))
    assert not any(r["unsure"] for r in predict_files(model, paths, min_confidence="0.0"))  # the option wins
    export_checkpoint(tmp_path / "strict.ckpt", tmp_path / "export", ["onnx"], repeats=1)
    onnx_model = OnnxClassifier(tmp_path / "export" / "model.onnx")
    assert all(r["unsure"] for r in classify(onnx_model, paths))
    assert onnx_model.preprocessing.interpolation == "bicubic"  # infer.py and serve --onnx resize as it
    _run_the_docs_onnx_example(tmp_path / "export" / "model.onnx", paths[0], onnx_model.class_names)
    with pytest.raises(ConfigError, match="model.min_confidence: .*'cow' is not a class"):
        ImageClassifier(num_classes=5, weights=None, input=32, min_confidence="cow=0.5")


REMOVAL_SCRIPT = """
import sys
from project.cli import main
data, out = sys.argv[1], sys.argv[2]
fit = ["fit", "--config", "configs/train.yaml", "--config", "configs/presets/debug.yaml",
       f"--data.data_dir={data}", "--model.input.size=32", "--model.weights=null", "--data.batch_size=8",
       "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
for args in (fit, ["evaluate"], ["predict", "--input", f"{data}/test", "--output", f"{out}/preds.csv"],
             ["export", "--formats", "onnx", "--out", f"{out}/export"]):
    code = main(args)
    if code:
        sys.exit(f"{args[0]} exited {code}")
"""


def test_deleting_every_task_folder_but_the_default_leaves_the_default_path_working(tiny_data, tmp_path):
    """A task is one folder: with the others' folders and registry lines gone, a default run fits,
    evaluates, predicts and exports (nothing outside the folders needed them)."""
    import shutil
    import subprocess
    import sys

    from tests.conftest import REPO

    copy = tmp_path / "copy"
    for part in ("project", "configs"):
        shutil.copytree(REPO / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    registry = copy / "project/tasks/__init__.py"
    lines = registry.read_text().splitlines(keepends=True)
    kept = [line for line in lines if not any(f'"{name}":' in line for name in list(TASKS)[1:])]
    assert len(lines) - len(kept) == len(TASKS) - 1  # one registry line each
    registry.write_text("".join(kept))
    for name in list(TASKS)[1:]:
        folder = copy / Path(TASKS[name].split(":")[0].replace(".", "/")).parent
        assert folder.parent.name == "tasks" and folder.is_dir(), folder
        shutil.rmtree(folder)
    (tmp_path / "out").mkdir()
    done = subprocess.run([sys.executable, "-c", REMOVAL_SCRIPT, str(tiny_data), str(tmp_path / "out")],
                          cwd=copy, capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "PYTHONPATH": str(copy)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "out/export/model.onnx").is_file() and (tmp_path / "out/preds.csv").is_file()
    left = sorted(p.name for p in (copy / "project/tasks").iterdir() if p.is_dir() and p.name[0] != "_")
    assert left == [Path(TASKS[next(iter(TASKS))].split(":")[0].replace(".", "/")).parent.name]


def _run_the_docs_onnx_example(onnx_file: Path, image: str, class_names: list[str]) -> None:
    """docs/deployment.md's Python example of OnnxClassifier, as written, on a real export."""
    import contextlib
    import io
    import re

    from tests.conftest import REPO

    text = (REPO / "docs" / "deployment.md").read_text()
    example = r"```python\n(from project.extras.deploy.infer import OnnxClassifier\n.*?)```"
    code = re.search(example, text, re.S)[1]
    code = code.replace('"model.onnx"', repr(str(onnx_file))).replace('"photo.jpg"', repr(image))
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        exec(code, {})
    assert printed.getvalue().strip() in class_names
