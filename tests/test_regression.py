"""Regression, the third task behind the task seam: a table of numbers trains, resumes, evaluates,
predicts, exports and serves like the classifiers, in the targets' own units."""

from __future__ import annotations

import base64
import csv
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from project.checkpoints import load_model, read_checkpoint
from project.data.tables import discover_table
from tests.conftest import QUICK, REPO, best_ckpt, cli, fit_args, one_error, only_run, scalars, scratch
from tests.test_schedule import EVERY_EPOCH, straight_and_resumed

REG_ARGS = ("--model.input.crop_ratio=1.0",)  # 32 px at 32 px: predict and infer read the same pixels


@pytest.fixture(scope="session")
def count_data(tmp_path_factory) -> Path:
    """120 images of 32 px holding 1 to 6 bright squares on a dark noisy ground, in one flat
    folder with ``labels.csv`` (image, count): counting objects."""
    from PIL import Image

    out = tmp_path_factory.mktemp("counts")
    rng = np.random.default_rng(0)
    (out / "img").mkdir()
    rows = ["image,count"]
    for k in range(120):
        pixels = rng.integers(0, 60, (32, 32, 3), dtype=np.uint8)
        count = int(rng.integers(1, 7))
        for cell in rng.choice(16, size=count, replace=False):
            y, x = (cell // 4) * 8 + 1, (cell % 4) * 8 + 1
            pixels[y:y + 6, x:x + 6] = rng.integers(200, 256, 3)
        Image.fromarray(pixels).save(out / "img" / f"{k:03d}.png")
        rows.append(f"img/{k:03d}.png,{count}")
    (out / "labels.csv").write_text("\n".join(rows) + "\n")
    return out


def reg_args(data: Path, *extra: str, epochs: int = 3) -> list[str]:
    return fit_args(data, f"--data.labels={data / 'labels.csv'}", *REG_ARGS, *extra, epochs=epochs)


@pytest.fixture(scope="module")
def regression_run(count_data, tmp_path_factory) -> Iterator[Path]:
    with scratch(tmp_path_factory, "reg-run") as cwd:
        assert cli(["fit", *reg_args(count_data)], cwd) == 0
        yield only_run(cwd / "logs")


def test_a_table_of_numbers_is_a_regression_scaled_from_the_training_split(count_data):
    splits = discover_table(count_data / "labels.csv", count_data)
    assert splits.task == "regression" and splits.classes == ["count"]
    assert all(isinstance(s.label[0], float) for s in splits.train)
    counts = sorted(s.label[0] for s in splits.val)
    assert counts[0] <= 2 and counts[-1] >= 5  # stratified on the values: val covers their range
    from project.tasks import task_class

    stats = task_class("regression").summarise_labels([s.label for s in splits.train], 1)
    values = torch.tensor([s.label[0] for s in splits.train], dtype=torch.float64)
    assert stats["target_mean"] == pytest.approx([float(values.mean())])
    assert stats["target_std"] == pytest.approx([float(values.std(unbiased=False))])


def test_a_regression_run_logs_mae_and_keeps_the_lowest(regression_run, count_data, capsys):
    series = scalars(regression_run)
    for tag in ("val/mae", "val/rmse", "val/r2", "val/mae_best", "train/mae", "val/loss"):
        assert len(series[tag]) == 3, tag
    maes = [v for _, v in series["val/mae"]]
    assert series["val/mae_best"][-1][1] == pytest.approx(min(maes))
    assert "val/acc" not in series
    ckpt = best_ckpt(regression_run)
    assert f"mae{min(maes):.4f}" in ckpt.name  # the best checkpoint is the lowest val/mae
    stored = read_checkpoint(ckpt)
    hp = stored["hyper_parameters"]
    assert hp["task"] == "regression" and hp["class_names"] == ["count"]
    from project.tasks import task_class

    train = [s.label for s in discover_table(count_data / "labels.csv", count_data).train]
    expected = task_class("regression").summarise_labels(train, 1)  # the training split's, not val's
    for key in ("target_mean", "target_std"):
        assert hp["label_stats"][key] == pytest.approx(expected[key])
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(regression_run), size_guidance={"images": 0})
    acc.Reload()
    assert "val/predicted_vs_true" in acc.Tags()["images"]


@pytest.mark.slow
def test_a_regression_resumes_bit_exactly(count_data, tmp_path):
    common = ["--trainer.deterministic=true", "--trainer.limit_train_batches=3", *EVERY_EPOCH]
    a, b, run_a, run_b = straight_and_resumed(reg_args(count_data, *common, epochs=2), tmp_path)
    for key, tensor in a["state_dict"].items():
        assert torch.equal(tensor, b["state_dict"][key]), key
    assert scalars(run_a)["val/mae"][-1] == scalars(run_b)["val/mae"][-1]


def test_regression_evaluate_predict_export_infer_and_serve_agree(regression_run, count_data, tmp_path,
                                                                  capsys):
    from project.extras.deploy.export import export_checkpoint
    from project.extras.deploy.infer import main as infer_main
    from project.extras.deploy.predict import predict_files
    from project.extras.deploy.serve import ClassifierAPI

    ckpt = best_ckpt(regression_run)
    before = ckpt.read_bytes()
    capsys.readouterr()
    assert cli(["evaluate", str(ckpt)], tmp_path) == 0
    console = capsys.readouterr().out
    assert "| output | MAE | RMSE | R² |\n|---|" in console  # the header above its rows
    assert f"Report: {ckpt.parent / 'report.md'}" in console
    report = json.loads((ckpt.parent / "report.json").read_text())
    assert report["task"] == "regression" and report["outputs"]["count"]["mae"] == pytest.approx(
        report["mae"], abs=1e-4)
    assert report["images"] == len(discover_table(count_data / "labels.csv", count_data).test)
    assert (ckpt.parent / "residuals.png").is_file() and (ckpt.parent / "mistakes.csv").is_file()
    assert ckpt.read_bytes() == before  # no temperature written for numbers

    out = tmp_path / "export"
    result = export_checkpoint(ckpt, out, ["onnx"])
    assert result["metric"] == "val_mae" and result["formats"]["onnx"]["val_mae"] == pytest.approx(
        result["formats"]["pytorch"]["val_mae"], abs=1e-4)
    meta = {p.key: p.value for p in onnx.load(str(out / "model.onnx")).metadata_props}
    model = load_model(ckpt)
    assert meta["task"] == "regression"
    assert json.loads(meta["target_mean"]) == pytest.approx(model.task.mean.tolist())
    assert json.loads(meta["target_std"]) == pytest.approx(model.task.std.tolist())

    images = sorted((count_data / "img").glob("*.png"))[:6]
    rows = predict_files(model, [str(p) for p in images])
    assert list(rows[0]) == ["path", "predicted", "count", "error"]
    csv_out = tmp_path / "infer.csv"
    assert infer_main([str(out / "model.onnx"), str(count_data / "img"), "--output", str(csv_out)]) == 0
    by_path = {r["path"]: r for r in csv.DictReader(csv_out.open())}
    for row in rows:  # ONNX Runtime and PyTorch, the same values in the targets' units
        assert float(by_path[row["path"]]["count"]) == pytest.approx(float(row["count"]), rel=1e-5, abs=1e-4)
    api = ClassifierAPI(ckpt, None)
    api.setup("cpu")  # what a LitServe worker runs, in this process
    request = {"raw": base64.b64encode(images[0].read_bytes()).decode()}
    served = api.encode_response(api.predict(api.decode_request(request)))["predictions"][0]
    assert float(served["count"]) == pytest.approx(float(rows[0]["count"]), rel=1e-5, abs=1e-5)  # batch of 1


@pytest.mark.parametrize(("cell", "expected"), [
    ("three", "line 4: 'three' in column 'count' is not a number"),
    ("nan", "line 4: 'nan' in column 'count' is not a finite")])
def test_a_number_that_is_not_one_is_one_line_naming_the_line(count_data, tmp_path, capsys, cell, expected):
    lines = (count_data / "labels.csv").read_text().splitlines()
    lines[3] = lines[3].rsplit(",", 1)[0] + f",{cell}"
    table = tmp_path / "bad.csv"
    table.write_text("\n".join(lines) + "\n")
    args = fit_args(count_data, f"--data.labels={table}", *QUICK, epochs=1)
    assert cli(["fit", *args], tmp_path) == 2
    assert expected in one_error(capsys.readouterr().err)
    assert not (tmp_path / "logs").exists()


def test_settings_for_classes_are_refused_for_numbers_in_one_line(count_data, tmp_path, capsys):
    for extra, key in (("--model.loss=focal", "model.loss"),
                       ("--model.label_smoothing=0.1", "model.label_smoothing"),
                       ("--model.mixup_alpha=0.2", "model.mixup_alpha"),
                       ("--data.balanced_sampling=true", "data.balanced_sampling")):
        assert cli(["fit", *reg_args(count_data, *QUICK, extra, epochs=1)], tmp_path) == 2, extra
        assert key in one_error(capsys.readouterr().err), extra
    assert cli(["calibrate", "--ckpt_path", str(tmp_path / "none.ckpt")], tmp_path) == 2
    for task, says in (("regresion", "data.task 'regresion' is unknown; choose from auto, multiclass"),
                       ("multiclass", "data.task=multiclass, but")):
        capsys.readouterr()
        assert cli(["fit", *reg_args(count_data, *QUICK, f"--data.task={task}", epochs=1)], tmp_path) == 2
        assert says in one_error(capsys.readouterr().err), task
    assert not (tmp_path / "logs").exists()


def test_a_sweep_over_numbers_minimises_val_mae(count_data):
    from jsonargparse import Namespace

    from project.extras.sweep.command import default_objective

    config = Namespace({"data.labels": str(count_data / "labels.csv"), "data.data_dir": str(count_data)})
    assert default_objective(config) == ("val/mae", "min")


def test_a_sweep_of_settings_a_regression_refuses_stops_before_any_trial(count_data, tmp_path, capsys):
    """The shipped search space tries label smoothing, which a regression refuses: one line
    naming the space file and the key, before any trial or study."""
    assert cli(["sweep", "--sweep", str(REPO / "configs/sweep.yaml"), "--n_trials", "2",
                *reg_args(count_data, epochs=1)], tmp_path) == 2
    error = one_error(capsys.readouterr().err)
    assert "configs/sweep.yaml: 'model.label_smoothing': 0.2 is not for this data" in error
    assert "a regression learns numbers" in error and not (tmp_path / "logs").exists()


@pytest.mark.slow
def test_two_numeric_columns_are_two_outputs(count_data, tmp_path):
    rows = (count_data / "labels.csv").read_text().splitlines()
    table = tmp_path / "two.csv"
    table.write_text("image,count,double\n" + "\n".join(f"{r},{2 * float(r.rsplit(',', 1)[1])}"
                                                        for r in rows[1:]) + "\n")
    assert cli(["fit", *fit_args(count_data, f"--data.labels={table}", *QUICK, epochs=1)], tmp_path) == 0
    series = scalars(only_run(tmp_path / "logs"))
    assert {"val/per_output/mae/count", "val/per_output/mae/double", "val/mae"} <= set(series)
    model = load_model(best_ckpt(only_run(tmp_path / "logs")))
    assert model.class_names == ["count", "double"]
    assert model.task.mean[1] == pytest.approx(2 * model.task.mean[0])
    # the monitored mean is in each output's standard deviations, not in a sum of unlike units
    last = {k: series[k][-1][1] for k in ("val/mae", "val/per_output/mae/count", "val/per_output/mae/double")}
    scaled = [last[f"val/per_output/mae/{name}"] / float(model.task.std[j])
              for j, name in enumerate(["count", "double"])]
    assert last["val/mae"] == pytest.approx(sum(scaled) / 2, rel=1e-4)


@pytest.mark.slow
def test_a_sweep_over_numbers_keeps_the_trial_with_the_lowest_val_mae(count_data, tmp_path):
    import optuna

    (tmp_path / "space.yaml").write_text("model.lr: {log_uniform: [0.003, 0.03]}\n")
    assert cli(["sweep", "--sweep", str(tmp_path / "space.yaml"), "--n_trials", "2", "--pruner", "none",
                "--study", "counts", *reg_args(count_data, *QUICK, epochs=1)], tmp_path) == 0
    study = optuna.load_study(study_name="counts", storage=f"sqlite:///{tmp_path}/logs/sweeps/counts.db")
    assert study.direction == optuna.study.StudyDirection.MINIMIZE
    values = [t.value for t in study.get_trials()]
    assert len(values) == 2 and study.best_value == min(values)
    for trial in study.get_trials():  # each trial's value is its run's lowest val/mae
        run = tmp_path / "logs/sweeps/counts" / f"trial_{trial.number:03d}"
        assert trial.value == pytest.approx(min(v for _, v in scalars(run)["val/mae"]), rel=1e-5)


def test_serve_draws_no_heat_map_for_numbers(regression_run, count_data):
    """The heat map explains a class; a regression answers values: /info says so and the page's
    request (cam=1) gets its row without one, not the argmax of the values."""
    from project.extras.deploy.serve import ClassifierAPI, model_info

    ckpt = best_ckpt(regression_run)
    assert model_info(ckpt, None)["cam"] is False
    api = ClassifierAPI(ckpt, None)
    api.setup("cpu")

    class Form:  # what the page posts: multipart fields file and cam
        def __init__(self, **fields) -> None:
            self.fields = fields

        def get(self, key: str, default=None):
            return self.fields.get(key, default)

        def getlist(self, key: str) -> list:
            return self.fields.get(key, [])

    class Upload:
        filename = "image.png"

        def __init__(self, path: Path) -> None:
            self.file = path.open("rb")

    image = sorted((count_data / "img").glob("*.png"))[0]
    row = api.encode_response(api.predict(api.decode_request(Form(file=[Upload(image)], cam="1"))))
    assert "cam" not in row["predictions"][0] and "count" in row["predictions"][0]


def test_the_answers_undo_the_training_scale():
    """predict, infer.py and serve share this answerer: their parity cannot see it scaled wrong."""
    from project.tasks.answers import answers

    answer = answers(["v"], {"answers": "project.tasks.regression.answers:Values", "target_mean": [10.0],
                             "target_std": [2.0]})
    assert answer.scores(np.array([[1.0], [-0.5]]))[:, 0].tolist() == [12.0, 9.0]
