"""Multi-output classification, the fourth task: a table of two word columns (shape, colour)
trains one softmax per column, logs each column's accuracy and macro F1, resumes, evaluates,
predicts, exports and serves with one class per column."""

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
from tests.conftest import QUICK, best_ckpt, cli, fit_args, one_error, only_run, scalars, scratch

# 32 px at 32 px: predict and infer read the same pixels; from random weights, scratch's LR or more
# (at 0.01 three epochs leave colour at chance on one CPU thread, at 0.7 on two)
MO_ARGS = ("--model.input.crop_ratio=1.0", "--model.lr=0.1")
COLOURS = {"red": (1.0, 0.3, 0.3), "green": (0.3, 1.0, 0.3), "blue": (0.3, 0.3, 1.0)}


@pytest.fixture(scope="session")
def shape_colour_data(tiny_data, tmp_path_factory) -> Path:
    """tiny_data's 80 shapes, each tinted red, green or blue, in one flat folder with
    ``labels.csv`` (image, shape, colour): two word columns."""
    from PIL import Image

    out = tmp_path_factory.mktemp("shape-colour")
    (out / "img").mkdir()
    rng = np.random.default_rng(0)
    rows = ["image,shape,colour"]
    for k, path in enumerate(sorted(tiny_data.rglob("*.png"))):
        colour = list(COLOURS)[int(rng.integers(3))]
        pixels = np.asarray(Image.open(path).convert("RGB"), np.float32) * np.array(COLOURS[colour])
        Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(out / "img" / f"{k:03d}.png")
        rows.append(f"img/{k:03d}.png,{path.parent.name},{colour}")
    (out / "labels.csv").write_text("\n".join(rows) + "\n")
    return out


def mo_args(data: Path, *extra: str, epochs: int = 3, table: str = "labels.csv") -> list[str]:
    return fit_args(data, f"--data.labels={data / table}", *MO_ARGS, *extra, epochs=epochs)


@pytest.fixture(scope="module")
def multioutput_run(shape_colour_data, tmp_path_factory) -> Iterator[Path]:
    with scratch(tmp_path_factory, "mo-run") as cwd:
        assert cli(["fit", *mo_args(shape_colour_data)], cwd) == 0
        yield only_run(cwd / "logs")


def test_two_word_columns_are_a_multioutput_task_split_over_both(shape_colour_data):
    splits = discover_table(shape_colour_data / "labels.csv", shape_colour_data)
    assert splits.task == "multioutput"
    assert splits.classes == ["shape=checker", "shape=circle", "shape=cross", "shape=dots", "shape=square",
                              "colour=blue", "colour=green", "colour=red"]
    assert all(len(s.label) == 2 and all(isinstance(i, int) for i in s.label) for s in splits.train)
    for part in (splits.val, splits.test):  # every class of both columns in each split
        assert {s.label[0] for s in part} == set(range(5)) and {s.label[1] for s in part} == set(range(3))


def test_editing_rows_moves_no_other_image_between_splits(shape_colour_data, tmp_path):
    """The user trains, fixes a label from mistakes.csv and drops some rows, then evaluates: every
    image left must keep its side, or the test set would hold images the model trained on."""
    rows = (shape_colour_data / "labels.csv").read_text().splitlines()
    before = discover_table(shape_colour_data / "labels.csv", shape_colour_data)
    fixed = rows[5].rsplit(",", 1)[0] + ("," + ("red" if not rows[5].endswith(",red") else "blue"))
    table = tmp_path / "edited.csv"
    table.write_text("\n".join([rows[0], *rows[1:5], fixed, *rows[6:-12]]) + "\n")
    after = discover_table(table, shape_colour_data)

    def sides(found) -> dict[str, str]:
        return {s.path: split for split in ("train", "val", "test") for s in getattr(found, split)}

    old, new = sides(before), sides(after)
    assert len(new) == len(old) - 12
    assert {path: old[path] for path in new} == new


def test_words_stay_words_and_numbers_beside_them_are_classes(shape_colour_data, tmp_path):
    rows = (shape_colour_data / "labels.csv").read_text().splitlines()
    table = tmp_path / "digits.csv"  # the colour as a number code: still a class, never a value
    codes = {"red": "1", "green": "2", "blue": "3"}
    table.write_text("image,shape,code\n" + "\n".join(
        f"{r.rsplit(',', 1)[0]},{codes[r.rsplit(',', 1)[1]]}" for r in rows[1:]) + "\n")
    splits = discover_table(table, shape_colour_data)
    assert splits.task == "multioutput" and "code=1" in splits.classes


@pytest.mark.parametrize(("edit", "says"), [
    (lambda r: r.replace(",red", ",blue").replace(",green", ",blue"),
     "column 'colour' holds one class ('blue')"),
    (lambda r: r if not r.startswith("img/000.png") else r + "\nimg/001.png,circle,",
     "has no class in column"),
    (lambda r: r if not r.startswith("img/000.png") else r.rsplit(",", 1)[0] + ",NaN",
     "has no class in column 'colour' (a blank or NaN cell)"),  # a data frame's missing value
])
def test_a_column_that_cannot_train_is_one_line_naming_it(shape_colour_data, tmp_path, capsys, edit, says):
    text = (shape_colour_data / "labels.csv").read_text()
    lines = text.splitlines()
    table = tmp_path / "bad.csv"
    table.write_text("\n".join([lines[0], *[edit(r) for r in lines[1:] if not r.startswith("img/001.png")]])
                     + "\n")
    assert cli(["fit", *mo_args(shape_colour_data, *QUICK, epochs=1, table=str(table))], tmp_path) == 2
    assert says in one_error(capsys.readouterr().err)
    assert not (tmp_path / "logs").exists()


def test_a_column_named_like_an_answer_field_answers_beside_it(shape_colour_data, tmp_path):
    """predict, infer.py and serve write each column's class under its name: a column 'path' or
    'confidence' (a regression's 'error') answers under '<column>_class' ('<column>_value'), so
    neither the image's path nor the column is lost, and a run trained on such a table still reads
    it. Two columns that would share a field ('shape' and 'shape_prob') are refused when read."""
    from project.data.tables import read_table
    from project.tasks.multioutput.answers import ClassPerColumn
    from project.tasks.regression.answers import Values

    names = ["confidence=high", "confidence=low", "path=left", "path=right"]
    row = ClassPerColumn(names, {}).rows_from_scores(["a.png"], [[0.9, 0.1, 0.2, 0.8]], 1, "0.5")[0]
    assert (row["path"], row["path_class"], row["confidence_class"]) == ("a.png", "right", "high")
    assert row["predicted"] == "high;right" and row["confidence"] == "0.800000" and not row["unsure"]
    row = Values(["error", "count"], {}).rows_from_scores(["b.png"], [[1.5, 2.0]])[0]
    assert (row["path"], row["error"], row["error_value"]) == ("b.png", "", "1.500000")
    table = tmp_path / "fields.csv"
    table.write_text("image,shape_prob,shape\n" + "".join(
        r + "\n" for r in (shape_colour_data / "labels.csv").read_text().splitlines()[1:]))
    problems = read_table(table, shape_colour_data).problems
    assert problems == [f"{table} line 1: column 'shape' would overwrite the field 'shape_prob' of another "
                        "column in predict's answers (each column answers in it and its <column>_prob); "
                        "rename the column (e.g. 'shape_class')"]


def test_a_word_column_beside_label_is_a_notice_naming_the_fix(shape_colour_data, tmp_path, caplog):
    """image,label,colour trains single-label on label: colour is named, never dropped silently."""
    from project.data.tables import read_table

    table = tmp_path / "label.csv"
    table.write_text("image,label,colour\n" + "".join(
        r + "\n" for r in (shape_colour_data / "labels.csv").read_text().splitlines()[1:]))
    with caplog.at_level("INFO", logger="project"):
        read = read_table(table, shape_colour_data)
        read_table(table, shape_colour_data)  # said once
    assert read.problems == [] and read.task == "multiclass"
    notices = [r.getMessage() for r in caplog.records if "not trained on" in r.getMessage()]
    assert notices == [f"Notice: {table}: column colour not trained on (the multiclass run reads label); "
                       "rename 'label' (e.g. to class) to train on every word column (multi-output), or "
                       "drop them"]


def test_a_class_no_training_row_has_is_one_line(shape_colour_data, tmp_path, capsys):
    lines = (shape_colour_data / "labels.csv").read_text().splitlines()
    table = tmp_path / "split.csv"
    body = [f"{r},train" for r in lines[1:]] + ["img/000.png,circle,purple,val"]
    table.write_text("image,shape,colour,split\n" + "\n".join(body[1:]) + "\n")
    assert cli(["fit", *mo_args(shape_colour_data, *QUICK, epochs=1, table=str(table))], tmp_path) == 2
    assert "label colour=purple of 'img/000.png' is unknown" in one_error(capsys.readouterr().err)


def test_a_multioutput_run_logs_each_column_and_keeps_the_best_mean(multioutput_run):
    series = scalars(multioutput_run)
    for tag in ("val/acc", "val/macro_f1", "val/acc_best", "val/loss", "train/acc",
                "val/per_column/acc/shape", "val/per_column/acc/colour",
                "val/per_column/macro_f1/shape", "val/per_column/macro_f1/colour"):
        assert len(series[tag]) == 3, tag
    for (_, mean), (_, a), (_, b) in zip(series["val/acc"], series["val/per_column/acc/shape"],
                                         series["val/per_column/acc/colour"], strict=True):
        assert mean == pytest.approx((a + b) / 2, abs=1e-6)  # the monitored metric: the columns' mean
    hp = read_checkpoint(best_ckpt(multioutput_run))["hyper_parameters"]
    assert hp["task"] == "multioutput" and hp["num_classes"] == 8


def test_every_column_trains_its_own_slice_of_the_outputs():
    """The loss is the mean of each column's cross-entropy on its own slice, and every slice gets a
    gradient: a column the loss left out would stay at chance, which a 3-epoch run on 55 images
    cannot tell from noise."""
    from project.tasks.multioutput.task import MultiOutput

    task = MultiOutput(["shape=circle", "shape=cross", "colour=blue", "colour=green", "colour=red"])
    logits = torch.randn(6, 5, generator=torch.Generator().manual_seed(0)).requires_grad_()
    target = torch.tensor([[0, 2], [1, 0], [0, 1], [1, 2], [0, 0], [1, 1]])
    loss = task.loss(logits, target)
    ce = torch.nn.functional.cross_entropy
    each = ce(logits[:, :2], target[:, 0]), ce(logits[:, 2:], target[:, 1])
    assert float(loss) == pytest.approx(float(sum(each)) / 2)
    loss.backward()
    assert float(logits.grad[:, :2].abs().sum()) > 0 and float(logits.grad[:, 2:].abs().sum()) > 0


def test_multioutput_evaluate_predict_export_infer_and_serve_agree(multioutput_run, shape_colour_data,
                                                                   tmp_path, capsys):
    from project.extras.deploy.export import export_checkpoint
    from project.extras.deploy.infer import main as infer_main
    from project.extras.deploy.predict import predict_files
    from project.extras.deploy.serve import ClassifierAPI

    ckpt = best_ckpt(multioutput_run)
    capsys.readouterr()
    assert cli(["evaluate", str(ckpt)], tmp_path) == 0
    said = capsys.readouterr().out  # where the report went, with every file beside it, as every task says
    assert f"Report: {ckpt.parent / 'report.md'} (and " in said and "confusion_colour.png" in said
    assert "mistakes.csv, report.json" in said
    report = json.loads((ckpt.parent / "report.json").read_text())
    assert report["task"] == "multioutput" and set(report["columns"]) == {"shape", "colour"}
    columns = report["columns"]
    assert report["acc"] == pytest.approx((columns["shape"]["acc"] + columns["colour"]["acc"]) / 2, abs=1e-5)
    assert (ckpt.parent / "confusion_colour.png").is_file() and "per_column" not in report["columns"]

    out = tmp_path / "export"
    result = export_checkpoint(ckpt, out, ["onnx"], repeats=1)
    assert result["metric"] == "val_acc" and result["formats"]["onnx"]["max_abs_diff"] <= 1e-4
    meta = {p.key: p.value for p in onnx.load(str(out / "model.onnx")).metadata_props}
    assert meta["task"] == "multioutput"

    model = load_model(ckpt)
    images = sorted((shape_colour_data / "img").glob("*.png"))[:6]
    rows = predict_files(model, [str(p) for p in images])
    assert list(rows[0])[:5] == ["path", "predicted", "confidence", "shape", "shape_prob"]
    assert all(r["predicted"] == f"{r['shape']};{r['colour']}" for r in rows)
    csv_out = tmp_path / "infer.csv"
    images_dir = str(shape_colour_data / "img")
    assert infer_main([str(out / "model.onnx"), images_dir, "--output", str(csv_out)]) == 0
    by_path = {r["path"]: r for r in csv.DictReader(csv_out.open())}
    for row in rows:  # ONNX Runtime and PyTorch: the same class per column, the same probabilities
        other = by_path[row["path"]]
        assert (other["shape"], other["colour"]) == (row["shape"], row["colour"])
        assert float(other["colour_prob"]) == pytest.approx(float(row["colour_prob"]), abs=1e-5)
    api = ClassifierAPI(ckpt, None)
    api.setup("cpu")
    request = {"raw": base64.b64encode(images[0].read_bytes()).decode()}
    served = api.encode_response(api.predict(api.decode_request(request)))["predictions"][0]
    assert (served["shape"], served["colour"]) == (rows[0]["shape"], rows[0]["colour"])
    with torch.no_grad():  # one class per column: each column's own softmax
        probs = model.task.outputs(model(torch.zeros(1, 3, 32, 32)))
    assert probs[0, :5].sum() == pytest.approx(1.0) and probs[0, 5:].sum() == pytest.approx(1.0)


def test_a_multioutput_sweep_maximises_the_mean_accuracy(shape_colour_data):
    from jsonargparse import Namespace

    from project.extras.sweep.command import default_objective

    config = Namespace({"data.labels": str(shape_colour_data / "labels.csv"),
                        "data.data_dir": str(shape_colour_data)})
    assert default_objective(config) == ("val/acc", "max")


@pytest.mark.slow
def test_a_multioutput_run_resumes_bit_exactly(shape_colour_data, tmp_path):
    from tests.test_schedule import EVERY_EPOCH, straight_and_resumed

    common = ["--trainer.deterministic=true", "--trainer.limit_train_batches=3", *EVERY_EPOCH]
    a, b, run_a, run_b = straight_and_resumed(mo_args(shape_colour_data, *common, epochs=2), tmp_path)
    for key, tensor in a["state_dict"].items():
        assert torch.equal(tensor, b["state_dict"][key]), key
    assert scalars(run_a)["val/acc"][-1] == scalars(run_b)["val/acc"][-1]


def test_the_analysis_preset_skips_what_a_multioutput_task_has_not(shape_colour_data, tmp_path, capsys):
    """Temperature and the per-class views are for one class per image; another task's run with
    the analysis preset trains and says so, not a traceback from inside a view."""
    from tests.conftest import REPO

    preset = f"--config={REPO / 'configs/presets/analysis.yaml'}"
    assert cli(["fit", *mo_args(shape_colour_data, preset, *QUICK, epochs=1)], tmp_path) == 0
    assert "no temperature fitted: a multioutput task's outputs have none" in capsys.readouterr().err


def test_balanced_class_weights_weigh_each_column_s_classes(shape_colour_data):
    from project.model import ImageClassifier
    from project.tasks.multioutput.task import MultiOutput

    stats = MultiOutput.summarise_labels([(0, 0), (0, 1), (1, 1), (0, 1)], 3)
    assert stats["balanced_weights"] == pytest.approx([4 / 6, 4 / 2, 4 / 2, 4 / 6])
    names = ["shape=a", "shape=b", "colour=x", "colour=y"]
    model = ImageClassifier(num_classes=4, class_names=names, task="multioutput", weights=None, input=32,
                            label_stats=stats, class_weights="balanced")
    model.setup("fit")
    logits, target = torch.randn(4, 4), torch.tensor([[0, 0], [0, 1], [1, 1], [0, 1]])
    weighted = model.loss(logits, target)
    model.hparams.class_weights = None  # read when the loss is computed
    assert float(weighted) != pytest.approx(float(model.loss(logits, target)))


def test_each_column_answers_from_its_own_softmax_and_is_unsure_when_any_column_is():
    """predict, infer.py and serve share this answerer, so their parity cannot see a slip in it."""
    from project.tasks.answers import answers

    names = ["shape=a", "shape=b", "colour=x", "colour=y"]
    answer = answers(names, {"answers": "project.tasks.multioutput.answers:ClassPerColumn"})
    logits = np.array([[0.0, 0.1, 5.0, 0.0], [3.0, 0.0, 0.0, 3.0]])
    scores = answer.scores(logits)
    for part in (slice(0, 2), slice(2, 4)):  # each column's probabilities: its own softmax
        expected = np.exp(logits[:, part]) / np.exp(logits[:, part]).sum(1, keepdims=True)
        assert np.allclose(scores[:, part], expected)
    first, second = answer.rows_from_scores(["p", "q"], scores, min_confidence="0.9")
    assert first["unsure"] is True and first["predicted"] == "unsure"  # shape unsure, colour sure
    assert second["unsure"] is False and second["predicted"] == "a;y"
    per_class = answer.rows_from_scores(["p"], scores[:1], min_confidence="shape=b=0.9,0")[0]
    assert per_class["unsure"] is True  # shape=b answered at 0.52, below its own 0.9


def test_a_column_s_accuracy_counts_images_not_classes():
    """val/per_column/acc (and the monitored mean): plain accuracy, as single-label's val/acc."""
    from project.tasks.multioutput.task import ColumnMetrics, MultiOutput

    task = MultiOutput(["s=a", "s=b", "c=x", "c=y"])
    metrics = ColumnMetrics("val", task)
    target = torch.tensor([[0, 0], [0, 1], [0, 0], [1, 1]])  # s: three of a right, the b wrong
    logits = torch.tensor([[5.0, 0, 5, 0], [5, 0, 0, 5], [5, 0, 5, 0], [5, 0, 0, 5]])
    metrics.update(logits, target, torch.tensor(0.0))
    values = metrics.compute()
    assert float(values["val/per_column/acc/s"]) == pytest.approx(0.75)  # balanced: 0.5
    assert float(values["val/acc"]) == pytest.approx((0.75 + 1.0) / 2)


def test_a_one_class_column_is_judged_on_the_training_rows(shape_colour_data, tmp_path):
    rows = (shape_colour_data / "labels.csv").read_text().splitlines()
    table = tmp_path / "split.csv"  # val's colour is red in every row; training's varies: fine
    body = [f"{r},train" for r in rows[1:61]] + [f"{r.rsplit(',', 1)[0]},red,val" for r in rows[61:]]
    table.write_text("image,shape,colour,split\n" + "\n".join(body) + "\n")
    assert discover_table(table, shape_colour_data).task == "multioutput"
