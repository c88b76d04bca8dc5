"""Labels from a table (data.labels) and multi-label training, end to end on tiny data."""

from __future__ import annotations

import csv
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from project.checkpoints import load_model, read_checkpoint
from project.data.folders import DataFolderError, Sample
from project.data.splits import multi_hot_split
from project.data.tables import discover_table
from project.extras.deploy.export import export_checkpoint
from project.extras.deploy.exporters import ExportError
from project.extras.deploy.infer import main as infer_main
from project.tasks.multilabel.metrics import fit_thresholds, scores
from tests.conftest import QUICK, best_ckpt, cli, fit_args, one_error, only_run, scalars, scratch

ML_ARGS = ("--model.input.crop_ratio=1.0",)  # 32-px mosaics at 32 px: predict and infer read the same pixels


def _rows(path: Path) -> list[dict]:
    return list(csv.DictReader(path.open()))


def test_a_labels_table_over_a_flat_folder_trains_like_class_folders(tiny_data, tmp_path):
    folders, flat = tmp_path / "folders", tmp_path / "flat"
    rows = []
    for image in sorted((tiny_data / "train").rglob("*.png")):
        cls = image.parent.name
        (folders / cls).mkdir(parents=True, exist_ok=True)
        shutil.copy(image, folders / cls / image.name)
        (flat / "images").mkdir(parents=True, exist_ok=True)
        shutil.copy(image, flat / "images" / image.name)
        rows.append(f"images/{image.name},{cls}")
    (flat / "labels.csv").write_text("image,label\n" + "\n".join(reversed(rows)) + "\n")
    from project.data.folders import discover

    by_folder, by_table = discover(folders), discover_table(flat / "labels.csv", flat)
    assert by_table.classes == by_folder.classes and by_table.task == "multiclass"
    for split in ("train", "val", "test"):  # the same seeded split, whatever the row order
        assert [(Path(s.path).name, s.label) for s in getattr(by_table, split)] == \
               [(Path(s.path).name, s.label) for s in getattr(by_folder, split)]
    results = {}
    for name, extra in (("folders", ()), ("flat", (f"--data.labels={flat / 'labels.csv'}",))):
        cwd = tmp_path / f"run-{name}"
        cwd.mkdir()
        data = folders if name == "folders" else flat
        assert cli(["fit", *fit_args(data, *QUICK, *extra, epochs=1)], cwd) == 0
        results[name] = scalars(only_run(cwd / "logs"))
    assert results["flat"]["val/acc"] == results["folders"]["val/acc"]
    assert results["flat"]["val/loss"] == results["folders"]["val/loss"]


@pytest.fixture(scope="module")
def multilabel_run(multilabel_data, tmp_path_factory) -> Iterator[Path]:
    with scratch(tmp_path_factory, "ml-run") as cwd:
        labels = f"--data.labels={multilabel_data / 'labels.csv'}"
        assert cli(["fit", *fit_args(multilabel_data, labels, *ML_ARGS, epochs=3)], cwd) == 0
        yield only_run(cwd / "logs")


def test_a_multilabel_table_trains_with_map_and_thresholds_in_the_checkpoint(multilabel_run, capsys):
    series = scalars(multilabel_run)
    for tag in ("val/map", "val/map_micro", "val/acc", "val/f1", "val/map_best", "val/per_class/ap/circle"):
        assert len(series[tag]) == 3, tag
    ckpt = best_ckpt(multilabel_run)
    assert "map" in ckpt.name  # the best checkpoint is chosen by val/map
    stored = read_checkpoint(ckpt)
    assert stored["hyper_parameters"]["task"] == "multilabel"
    thresholds = stored["task_state"]["thresholds"]
    assert len(thresholds) == 5 and all(0 < t < 1 for t in thresholds)
    model = load_model(ckpt)
    assert model.task.thresholds.tolist() == pytest.approx(stored["task_state"]["thresholds"])


def test_multilabel_evaluate_predict_export_and_infer_agree(multilabel_run, multilabel_data, tmp_path):
    ckpt = best_ckpt(multilabel_run)
    assert cli(["evaluate", str(ckpt)], tmp_path) == 0
    report = json.loads((ckpt.parent / "report.json").read_text())
    assert report["task"] == "multilabel" and {r["label"] for r in report["labels"]} == {
        "checker", "circle", "cross", "dots", "square"}
    assert 0 <= report["map"] <= 1 and (ckpt.parent / "mistakes.csv").is_file()
    assert "Per label, worst first" in (ckpt.parent / "report.md").read_text()

    out = tmp_path / "export"  # the INT8 check compares mAP; no loss allowed, it refuses the INT8 file
    with pytest.raises(ExportError, match="INT8 val_map") as refused:
        export_checkpoint(ckpt, out, ["onnx", "int8"], repeats=1, int8_max_drop=-1.0)
    found = re.search(r"INT8 val_map (\S+) is .* FP32 \((\S+)\)", str(refused.value))
    int8_map, fp32_map = float(found[1]), float(found[2])
    assert 0 < int8_map <= 1 and 0 < fp32_map <= 1  # on 18 images; the benchmark checks 1 point
    assert (out / "model.onnx").is_file() and not (out / "model.int8.onnx").exists()
    meta = {p.key: p.value for p in onnx.load(out / "model.onnx").metadata_props}
    model = load_model(ckpt)
    assert meta["task"] == "multilabel"
    assert json.loads(meta["thresholds"]) == pytest.approx(model.task.thresholds.tolist())

    images = multilabel_data / "img"
    torch_csv, onnx_csv = tmp_path / "torch.csv", tmp_path / "onnx.csv"
    assert cli(["predict", "--ckpt_path", str(ckpt), "--input", str(images), "--output", str(torch_csv)],
               tmp_path) == 0
    assert infer_main([str(out / "model.onnx"), str(images), "--output", str(onnx_csv)]) == 0
    ours, theirs = _rows(onnx_csv), _rows(torch_csv)
    assert [r["path"] for r in ours] == [r["path"] for r in theirs] and len(ours) == 120
    for a, b in zip(ours, theirs, strict=True):
        assert float(a["top1_prob"]) == pytest.approx(float(b["top1_prob"]), abs=1e-5)
    # predicted: every label at or above its threshold (sigmoid, not softmax)
    logits = model(torch.stack([_pixels(model, theirs[0]["path"])]))[0]
    expected = [model.class_names[i] for i in torch.argsort(-logits).tolist()
                if logits.sigmoid()[i] >= model.task.thresholds[i]]
    assert theirs[0]["predicted"] == ";".join(expected)
    assert sum(1 for r in theirs if ";" in r["predicted"]) > 0  # several labels for some images


def _pixels(model, path: str) -> torch.Tensor:
    from project.data.images import decode, needed_side
    from project.data.transforms import eval_transforms

    with torch.no_grad():
        return eval_transforms(model.preprocessing)(decode(path, needed_side(model.preprocessing)))


def test_tools_that_do_not_apply_to_multilabel_say_so(multilabel_run, multilabel_data, tmp_path, capsys):
    assert cli(["calibrate", "--ckpt_path", str(best_ckpt(multilabel_run))], tmp_path) == 2
    assert "multilabel model, whose outputs have no temperature" in capsys.readouterr().err
    labels = multilabel_data / "labels.csv"
    assert cli(["fit", *fit_args(multilabel_data, f"--data.labels={labels}", "--model.mixup_alpha=0.2")],
               tmp_path) == 2
    assert "mixup_alpha" in capsys.readouterr().err


BAD_TABLES = {
    "wrong columns": ("file,class\nimg/000.png,circle\n", "line 1: columns"),
    "missing file": ("image,label\nimg/000.png,circle\nimg/nope.png,dots\n",
                     "line 3: 'img/nope.png' not found"),
    "empty label": ("image,label\nimg/000.png,circle\nimg/001.png,\n", "line 3: empty label"),
    "duplicate row": ("image,label\nimg/000.png,circle\nimg/001.png,dots\nimg/000.png,dots\n",
                      "line 4: 'img/000.png' is listed again (first on line 2)"),
    "unknown label": ("image,label,split\nimg/000.png,circle,train\nimg/001.png,dots,train\n"
                      "img/002.png,cross,val\n", "line 4: label cross of 'img/002.png' is unknown"),
    "unknown split": ("image,label,split\nimg/000.png,circle,train\nimg/001.png,dots,holdout\n",
                      "line 3: split 'holdout'"),
    "unquoted comma": ("image,label\nimg/000.png,circle\nimg/001.png,big, dots\n",
                       "line 3: 3 fields for the 2 columns of line 1"),
    "decimal comma": ("image,value\nimg/000.png,1.5\nimg/001.png,2,5\n",
                      "line 3: 3 fields for the 2 columns of line 1"),
    "repeated column": ("image,label,label\nimg/000.png,circle,dots\n",
                        "line 1: column label appears more than once"),
    "trailing commas are blank fields": ("image,label,\nimg/000.png,circle,\nimg/000.png,dots,\n",
                                         "line 3: 'img/000.png' is listed again"),
    "one image spelt twice": ("image,label\nimg/000.png,circle\n./img/000.png,dots\n",
                              "line 3: './img/000.png' is listed again (first on line 2)"),
    "a label on every image": ("image,labels\nimg/000.png,photo;circle\nimg/001.png,dots;photo\n"
                               "img/002.png,photo\n", "labels.csv: label 'photo' is on every image"),
    "NaN label": ("image,label\nimg/000.png,circle\nimg/001.png,NaN\n",
                  "line 3: empty label for 'img/001.png' (a blank or NaN"),
    "semicolons": ("image;label\nimg/000.png;circle\n", "(one column: the table is semicolon-separated"),
    "tabs": ("image\tlabel\nimg/000.png\tcircle\n", "(one column: the table is tab-separated"),
}


@pytest.mark.parametrize("case", sorted(BAD_TABLES))
def test_a_bad_table_is_one_line_naming_the_line_and_writes_nothing(case, multilabel_data, tmp_path, capsys):
    text, expected = BAD_TABLES[case]
    table = tmp_path / "labels.csv"
    table.write_text(text)
    assert cli(["fit", *fit_args(multilabel_data, f"--data.labels={table}")], tmp_path) == 2
    assert expected in one_error(capsys.readouterr().err)
    assert not (tmp_path / "logs").exists()
    assert cli(["check-data", str(multilabel_data), "--labels", str(table)], tmp_path) == 1
    assert expected.split(": ", 1)[1][:20] in capsys.readouterr().out


def test_a_windows_path_in_a_table_is_named_with_the_fix(multilabel_data, tmp_path):
    from project.data.tables import read_table

    table = tmp_path / "labels.csv"
    table.write_text("image,label\nimg\\000.png,circle\nimg/001.png,dots\n")
    problems = read_table(table, multilabel_data).problems
    assert len(problems) == 1 and "line 2: 'img\\000.png' not found" in problems[0]
    assert "write paths with /" in problems[0]


def test_image_paths_relative_to_the_table_name_its_folder(multilabel_data, tmp_path):
    from project.data.tables import read_table

    table = multilabel_data / "labels.csv"  # its paths are relative to multilabel_data
    problems = read_table(table, tmp_path).problems  # data.data_dir left at another folder
    assert problems and problems[0].endswith(f"set data.data_dir={multilabel_data}")


def test_a_tables_own_columns_and_split_names_read_in_any_case(multilabel_data, tmp_path):
    from project.data.tables import discover_table

    table = tmp_path / "labels.csv"
    splits = ["Train"] * 8 + ["Valid", "validation", "TEST", "testing"]
    table.write_text("image,label,Split\n" + "".join(
        f"img/{k:03d}.png,{('circle', 'dots')[k % 2]},{split}\n" for k, split in enumerate(splits)))
    found = discover_table(table, multilabel_data)
    assert (len(found.train), len(found.val), len(found.test)) == (8, 2, 2)
    assert found.classes == ["circle", "dots"]


def test_a_0_1_column_per_label_is_the_same_multilabel_table(multilabel_data, tmp_path):
    """image,checker,circle,... with 0 and 1 (a multi-hot export): labels, not numbers to regress."""
    rows = _rows(multilabel_data / "labels.csv")
    names = sorted({n for r in rows for n in r["labels"].split(";")})
    hot = tmp_path / "hot.csv"
    hot.write_text("image," + ",".join(names) + "\n" + "".join(
        r["image"] + "," + ",".join(str(int(n in r["labels"].split(";"))) for n in names) + "\n"
        for r in rows))
    by_cell, by_column = discover_table(multilabel_data / "labels.csv", multilabel_data), discover_table(
        hot, multilabel_data)
    assert by_column.task == by_cell.task == "multilabel" and by_column.classes == by_cell.classes
    for split in ("train", "val", "test"):
        assert getattr(by_column, split) == getattr(by_cell, split)
    zeros = tmp_path / "zeros.csv"  # a row of zeros shows none of them: no label is on every image
    zeros.write_text("image,scratch,dent\nimg/000.png,0,0\nimg/001.png,1,0\nimg/002.png,1,1\n")
    from project.data.tables import read_table

    assert read_table(zeros, multilabel_data).problems == []
    hot.write_text(hot.read_text().replace(",0\n", ",2\n", 1))
    with pytest.raises(DataFolderError, match=r"line \d+: '2' in label column '\w+' is not 0 or 1"):
        discover_table(hot, multilabel_data, task="multilabel")


def test_blank_split_cells_in_a_split_column_are_a_notice(multilabel_data, tmp_path, caplog):
    table = tmp_path / "labels.csv"
    splits = ["train"] * 6 + ["", ""] + ["val", "val", "test", "test"]
    table.write_text("image,label,split\n" + "".join(
        f"img/{k:03d}.png,{('circle', 'dots')[k % 2]},{split}\n" for k, split in enumerate(splits)))
    with caplog.at_level("WARNING"):
        found = discover_table(table, multilabel_data)
    assert len(found.train) == 8
    assert "2 rows of" in caplog.text and "have no split (the first on line 8)" in caplog.text


def test_a_columns_separator_is_decided_once_so_names_keep_their_spaces(multilabel_data, tmp_path, capsys,
                                                                         caplog):
    """A ';' anywhere in the column separates every cell by ';': 'light blue' alone is one label,
    and a notice names such cells (a table mixing 'cat dog' and 'cat;bird' meant two there)."""
    from project.data.tables import read_table

    caplog.set_level("INFO", logger="project")

    table = tmp_path / "labels.csv"
    cells = ["light blue;circle", "light blue", "dots", "circle;dots", "dark red", "light blue"]
    splits = ["train"] * 5 + ["val"]
    table.write_text("image,labels,split\n" + "".join(
        f"img/{k:03d}.png,{cell},{split}\n" for k, (cell, split) in enumerate(zip(cells, splits, strict=True))
    ))
    read = read_table(table, multilabel_data)
    assert read.problems == [] and read.task == "multilabel"
    assert [r.label for r in read.rows][1] == ["light blue"]
    assert "3 cells of column labels without ';' hold spaces (e.g. 'light blue'), each read as one label" \
        in caplog.text and "write 'light;blue' where they are several" in caplog.text
    assert discover_table(table, multilabel_data).classes == ["circle", "dark red", "dots", "light blue"]
    assert cli(["check-data", str(multilabel_data), "--labels", str(table)], tmp_path) == 0
    assert "light blue" not in capsys.readouterr().out  # no unknown or split label named


def test_check_data_lists_images_that_no_row_names(multilabel_data, tmp_path, capsys):
    table = tmp_path / "labels.csv"
    cells = ("circle dots", "cross dots", "circle")  # no label on every image (that is an error)
    table.write_text("image,labels\n" + "".join(f"img/{k:03d}.png,{cells[k % 3]}\n" for k in range(100)))
    assert cli(["check-data", str(multilabel_data), "--labels", str(table)], tmp_path) == 0
    out = capsys.readouterr().out
    assert out.count("training leaves it out") == 20 and "img/119.png" in out


def test_the_multilabel_split_keeps_every_label_share_copies_together_and_is_stable():
    rng = np.random.default_rng(0)
    labels = (rng.random((400, 6)) < [0.5, 0.3, 0.2, 0.1, 0.05, 0.02]).astype(int)
    samples = [Sample(f"{i}.png", tuple(int(v) for v in row)) for i, row in enumerate(labels)]
    groups = [i - i % 2 if i < 40 else i for i in range(400)]  # the first 40 files in identical pairs
    keep, held = multi_hot_split(samples, 0.25, seed=0, groups=groups)
    assert len(keep) + len(held) == 400 and abs(len(held) - 100) <= 35  # 4 standard deviations
    held_counts, kept_counts = (np.array([s.label for s in side]).sum(0) for side in (held, keep))
    for label, total in enumerate(labels.sum(0)):
        assert abs(held_counts[label] - total / 4) <= 4 * (total * 3 / 16) ** 0.5 + 1, (label, total)
        assert held_counts[label] >= 1 and kept_counts[label] >= 1  # every label on both sides
    side = {s.path: 0 for s in keep} | {s.path: 1 for s in held}
    assert all(side[f"{i}.png"] == side[f"{i + 1}.png"] for i in range(0, 40, 2))
    fewer = [(s, g) for s, g in zip(samples, groups, strict=True) if int(s.path[:-4]) % 10 != 3]
    keep, held = multi_hot_split([s for s, _ in fewer], 0.25, seed=0, groups=[g for _, g in fewer])
    assert {s.path: 0 for s in keep} | {s.path: 1 for s in held} == {s.path: side[s.path] for s, _ in fewer}


def test_multilabel_scores_on_six_labels():
    targets = torch.tensor([[1, 0, 0, 1, 0, 0], [0, 1, 0, 0, 1, 0], [0, 0, 1, 0, 0, 1], [1, 1, 0, 0, 0, 0]])
    perfect = targets.float() * 0.8 + 0.1
    values = scores(perfect, targets, fit_thresholds(perfect, targets))
    assert float(values["map"]) == 1 and float(values["acc"]) == 1 and float(values["f1"]) == 1
    # one label missed in one image: exact match 3 of 4, that label's recall 1/2
    missed = perfect.clone()
    missed[3, 1] = 0.05
    values = scores(missed, targets, torch.full((6,), 0.5))
    assert float(values["acc"]) == 0.75
    assert float(values["recall"]) == pytest.approx((5 + 0.5) / 6)


def test_a_sweep_over_multilabel_data_optimises_val_map(multilabel_data):
    from jsonargparse import Namespace

    from project.extras.sweep.command import default_objective

    labels = str(multilabel_data / "labels.csv")
    config = Namespace({"data.labels": labels, "data.data_dir": str(multilabel_data)})
    assert default_objective(config) == ("val/map", "max")
    folders = Namespace({"data.labels": None, "data.data_dir": "data/demo"})
    assert default_objective(folders) == ("val/acc", "max")


def test_the_asymmetric_loss_drops_easy_negatives_and_balanced_weights_are_negatives_per_positive():
    from project.tasks.multilabel.metrics import asymmetric_loss, multilabel_loss
    from project.tasks.multilabel.task import MultiLabel

    target = torch.tensor([[1.0, 0.0, 0.0, 0.0, 0.0]])
    easy = torch.tensor([[4.0, -6.0, -6.0, -6.0, -6.0]])  # every negative below the 0.05 margin
    bce = multilabel_loss(easy, target)
    positive_only = nn_bce(easy[:, :1], target[:, :1]) / 5  # the mean over 5 labels of the one positive
    assert float(asymmetric_loss(easy, target)) == pytest.approx(float(positive_only), rel=1e-5)
    assert float(asymmetric_loss(easy, target)) < float(bce)
    stats = MultiLabel.summarise_labels([(1, 0), (0, 0), (1, 1), (0, 0)], 2)  # model.class_weights: balanced
    assert stats["balanced_weights"] == [1.0, 3.0]
    smoothed = multilabel_loss(easy, target, label_smoothing=0.2)  # targets 0.9 and 0.1
    soft = torch.nn.functional.binary_cross_entropy_with_logits(easy, target * 0.8 + 0.1)
    assert float(smoothed) == pytest.approx(float(soft)) and float(smoothed) > float(bce)


def nn_bce(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.binary_cross_entropy_with_logits(logits, target, reduction="sum")


def test_the_server_answers_a_multilabel_model_with_the_labels_above_their_thresholds(multilabel_run,
                                                                                      multilabel_data):
    import base64

    from project.extras.deploy.predict import predict_files
    from project.extras.deploy.serve import ClassifierAPI

    ckpt = best_ckpt(multilabel_run)
    api = ClassifierAPI(ckpt, None)
    api.setup("cpu")  # what a LitServe worker runs, in this process
    path = multilabel_data / "img" / "007.png"
    request = {"raw": base64.b64encode(path.read_bytes()).decode()}
    row = api.encode_response(api.predict(api.decode_request(request)))["predictions"][0]
    expected = predict_files(load_model(ckpt), [str(path)])[0]
    assert row["predicted"] == expected["predicted"] and row["top1_prob"] == expected["top1_prob"]


def test_a_label_at_its_threshold_is_answered_and_scored_alike():
    """Answers (predict, infer.py, serve) and metrics (evaluate) cut at 'at or above' both."""
    from project.common.predictions import top_k_row
    from project.tasks.multilabel.metrics import decisions

    assert top_k_row("p", np.array([0.5, 0.2]), ["a", "b"], 2, np.array([0.5, 0.5]))["predicted"] == "a"
    assert decisions(torch.tensor([[0.5, 0.49]]), torch.tensor([0.5, 0.5])).tolist() == [[1, 0]]


def test_thresholds_loaded_from_a_checkpoint_reach_the_metrics_that_use_them():
    from project.tasks.multilabel.task import MultiLabel

    task = MultiLabel(["a", "b", "c"])
    metrics = task.stage_metrics("test")
    task.load_state({"thresholds": [0.3, 0.4, 0.6]})
    assert metrics.thresholds.tolist() == pytest.approx([0.3, 0.4, 0.6])


def test_the_per_label_rows_and_the_macro_f1_are_what_they_are_named():
    from project.tasks.multilabel.report import label_rows

    probs = torch.tensor([[0.9, 0.1], [0.8, 0.9], [0.1, 0.8]])  # label a: tp 1, fp 1; b: tp 1, fn 1
    targets = torch.tensor([[1, 1], [0, 1], [0, 0]])
    rows = {r["label"]: r for r in label_rows(probs, targets, torch.tensor([0.5, 0.5]), ["a", "b"])}
    assert (rows["a"]["precision"], rows["a"]["recall"]) == (0.5, 1.0)
    assert (rows["b"]["precision"], rows["b"]["recall"]) == (0.5, 0.5)
    values = scores(probs, targets, torch.tensor([0.5, 0.5]))
    assert float(values["f1"]) == pytest.approx((2 / 3 + 0.5) / 2)  # macro: each label's F1, averaged
