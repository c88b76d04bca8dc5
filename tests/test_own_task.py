"""docs/your-own-task.md's worked example, taken out of the page into a package outside
``project/``, through every command: fit, evaluate, predict, export, infer.py and serve."""

from __future__ import annotations

import base64
import csv
import json
import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import QUICK, REPO, best_ckpt, cli, fit_args, only_run, scalars

PAGE = REPO / "docs" / "your-own-task.md"
TASK = "grading.task:Ordinal"


def example_files(page: Path) -> dict[str, str]:
    """The page's Python blocks whose first line names their file (``# grading/task.py``)."""
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    return {m.group(1): block for block in blocks if (m := re.match(r"# (\S+\.py)", block))}


def test_the_docs_commands_read_images_the_example_s_layout_has():
    """A labels table split by the template has no test/ folder: predict and infer.py read data.data_dir."""
    commands = re.search(r"```bash\n(.*?)```", PAGE.read_text(), re.S).group(1)
    data_dir = re.search(r"--data\.data_dir=(\S+)", commands).group(1)
    inputs = re.findall(r"--input (\S+)", commands) + re.findall(r"infer \S+\.onnx (\S+)", commands)
    assert len(inputs) == 2 and set(inputs) == {data_dir}, inputs


@pytest.fixture(scope="module")
def own_task(tiny_data, tmp_path_factory):
    """The example package on sys.path, a ``rating`` table over tiny_data, and one trained run."""
    root = tmp_path_factory.mktemp("own-task")
    files = example_files(PAGE)
    assert sorted(files) == ["grading/answers.py", "grading/task.py"], sorted(files)
    (root / "grading").mkdir()
    (root / "grading/__init__.py").write_text("")
    for name, text in files.items():
        (root / name).write_text(text)
    rows = ["image,rating,split"]
    for k, cls in enumerate(sorted(p.name for p in (tiny_data / "train").iterdir())):
        for split in ("train", "val", "test"):
            rows += [f"{p.relative_to(tiny_data).as_posix()},{k + 1},{split}"
                     for p in sorted((tiny_data / split / cls).glob("*.png"))]
    table = root / "ratings.csv"
    table.write_text("\n".join(rows) + "\n")
    import sys

    sys.path.insert(0, str(root))
    cwd = root / "work"
    cwd.mkdir()
    args = fit_args(tiny_data, f"--data.labels={table}", f"--data.task={TASK}",
                    "--model.input.crop_ratio=1.0", *QUICK, epochs=2)
    try:
        assert cli(["fit", *args], cwd) == 0
        yield cwd, only_run(cwd / "logs")
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m == "grading" or m.startswith("grading.")]:
            del sys.modules[name]
        shutil.rmtree(root, ignore_errors=True)  # the run's checkpoints, not kept to the session's end


def test_the_docs_own_task_trains_with_its_own_loss_and_labels(own_task):
    from project.checkpoints import load_model, read_checkpoint

    cwd, run = own_task
    assert "val/acc" in scalars(run)
    ckpt = best_ckpt(run)
    assert read_checkpoint(ckpt)["hyper_parameters"]["task"] == TASK
    model = load_model(ckpt)
    assert model.task.name == "ordinal" and model.task.loss_name == "ordinal"
    assert model.task.describe().startswith("Task: ordinal (5 classes")  # the run's first line
    assert model.class_names == ["1", "2", "3", "4", "5"]


def test_the_docs_own_task_evaluates_predicts_exports_infers_and_serves(own_task, tiny_data, tmp_path):
    from project.extras.deploy.infer import main as infer_main
    from project.extras.deploy.serve import ClassifierAPI

    cwd, run = own_task
    ckpt = best_ckpt(run)
    assert cli(["evaluate", str(ckpt)], cwd) == 0
    assert json.loads((ckpt.parent / "report.json").read_text())["class_names"] == ["1", "2", "3", "4", "5"]
    images = tiny_data / "test"
    assert cli(["predict", "--ckpt_path", str(ckpt), "--input", str(images), "--output",
                str(tmp_path / "preds.csv")], cwd) == 0
    predicted = list(csv.DictReader((tmp_path / "preds.csv").open()))
    assert all(1 <= float(r["expected"]) <= 5 for r in predicted)  # the example's own answer column
    assert cli(["export", "--ckpt_path", str(ckpt), "--formats", "onnx", "--out", str(tmp_path / "export")],
               cwd) == 0
    assert infer_main([str(tmp_path / "export/model.onnx"), str(images), "--output",
                       str(tmp_path / "infer.csv")]) == 0
    inferred = {r["path"]: r for r in csv.DictReader((tmp_path / "infer.csv").open())}
    for row in predicted:
        assert float(inferred[row["path"]]["expected"]) == pytest.approx(float(row["expected"]), abs=1e-3)
    api = ClassifierAPI(ckpt, None)
    api.setup("cpu")
    request = {"raw": base64.b64encode(Path(predicted[0]["path"]).read_bytes()).decode()}
    served = api.encode_response(api.predict(api.decode_request(request)))["predictions"][0]
    assert "expected" in served and served["top1"] == predicted[0]["top1"]


def test_a_table_without_the_own_task_s_column_keeps_the_task_in_its_advice(own_task, tmp_path):
    """data.task=auto would drop the own task: the fix named is the column it reads."""
    from project.data.folders import DataFolderError
    from project.data.tables import choose_task

    cells = {"image": ["a.png"], "grade": ["3"]}
    with pytest.raises(DataFolderError) as err:
        choose_task(tmp_path / "labels.csv", ["image", "grade"], cells, TASK)
    said = str(err.value)
    assert "reads image and rating (a grade)" in said and "rename" in said and "data.task=auto" not in said
    with pytest.raises(DataFolderError, match="set data.task=auto"):  # a built-in task: auto is a fix
        choose_task(tmp_path / "labels.csv", ["image", "grade"], cells, "multiclass")
