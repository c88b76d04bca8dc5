"""``python -m project init DATA``: a config chosen from the data, that runs as it is, each chosen
value the one the data implies and saying why."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from project.data.samples import FolderSplits, Sample
from project.extras.datatools.init import Survey, choices
from tests.conftest import QUICK, cli, one_error, only_run

RUNS_AS_IT_IS = (*QUICK, "--trainer.max_epochs=1", "--trainer.enable_progress_bar=false",
                 "--trainer.enable_model_summary=false")


def value(config: dict, key: str):
    for part in key.split("."):
        config = config[part]
    return config


def init(data: Path, cwd: Path, *extra: str) -> tuple[dict, str]:
    """The config ``init`` writes for ``data`` (parsed) and its text."""
    assert cli(["init", str(data), "--out", "cfg.yaml", *extra], cwd) == 0
    text = (cwd / "cfg.yaml").read_text()
    return yaml.safe_load(text), text


def line_of(text: str, key: str) -> str:
    """The config line that sets ``key``'s leaf (the last one so named)."""
    leaf = key.rsplit(".", 1)[-1]
    return [line for line in text.splitlines() if line.strip().startswith(f"{leaf}:")][-1]


def fits(cwd: Path) -> None:
    assert cli(["fit", "--config", "cfg.yaml", *RUNS_AS_IT_IS], cwd) == 0
    assert list((only_run(cwd / "logs") / "checkpoints").glob("best-*.ckpt"))


@pytest.fixture(scope="module")
def one_folder(tiny_data, tmp_path_factory) -> Path:
    """tiny_data's images as one folder of class folders, 'checker' with 4x the images of the others."""
    out = tmp_path_factory.mktemp("one") / "shapes"
    for cls in sorted(p.name for p in (tiny_data / "train").iterdir()):
        files = sorted(tiny_data.glob(f"*/{cls}/*.png"))
        (out / cls).mkdir(parents=True)
        for f in files if cls == "checker" else files[:4]:
            shutil.copy(f, out / cls / f"{f.parent.parent.name}-{f.name}")
    return out


@pytest.fixture(scope="module")
def label_table(tiny_data, tmp_path_factory) -> Path:
    """tiny_data's training and validation images named in labels.csv (image,label), no split column."""
    out = tmp_path_factory.mktemp("table")
    shutil.copytree(tiny_data, out / "img")
    rows = [f"{p.relative_to(out)},{p.parent.name}" for p in sorted((out / "img").glob("*/*/*.png"))]
    (out / "labels.csv").write_text("image,label\n" + "\n".join(rows) + "\n")
    return out


@pytest.fixture(scope="module")
def count_table(tmp_path_factory) -> Path:
    """60 images of 32 px with 1 to 6 bright squares, labels.csv (image,count): a regression."""
    out = tmp_path_factory.mktemp("counts")
    rng = np.random.default_rng(0)
    (out / "img").mkdir()
    rows = ["image,count"]
    for k in range(60):
        pixels = rng.integers(0, 60, (32, 32, 3), dtype=np.uint8)
        count = int(rng.integers(1, 7))
        for cell in rng.choice(16, size=count, replace=False):
            y, x = (cell // 4) * 8 + 1, (cell % 4) * 8 + 1
            pixels[y:y + 6, x:x + 6] = 230
        Image.fromarray(pixels).save(out / "img" / f"{k:03d}.png")
        rows.append(f"img/{k:03d}.png,{count}")
    (out / "labels.csv").write_text("\n".join(rows) + "\n")
    return out


def test_class_folders_with_splits_get_a_config_that_runs_as_it_is(tiny_data, tmp_path):
    config, text = init(tiny_data, tmp_path, "--weights", "null")
    assert value(config, "trainer.logger.init_args.name") == "tiny"  # the folder's name
    assert value(config, "data.data_dir") == str(tiny_data) and value(config, "data.labels") is None
    assert value(config, "model.weights") is None
    assert value(config, "model.input.size") == 32  # random weights: the images' 32 px
    assert value(config, "model.input.crop_ratio") == 1.0  # small images: no center crop
    scratch = yaml.safe_load((Path(__file__).parents[1] / "configs/presets/scratch.yaml").read_text())
    assert value(config, "model.lr") == scratch["model"]["lr"] != 0.01
    assert value(config, "model.scheduler.init_args.warmup_epochs") == 0
    assert value(config, "model.scheduler.init_args.cosine_interval") == "epoch"
    assert "val_fraction" not in config["data"] and config["data"]["balanced_sampling"] is False
    assert "median short side (32 px)" in line_of(text, "model.input.size")
    assert "mirrored" in line_of(text, "data.augmentation.hflip")  # flips: kept, and said why
    assert "scratch.yaml" in line_of(text, "model.lr")
    fits(tmp_path)


def test_one_imbalanced_folder_gets_a_split_and_balanced_draws(one_folder, tmp_path, capsys):
    config, text = init(one_folder, tmp_path, "--weights", "null")
    out = capsys.readouterr().out
    assert "make train CONFIG=cfg.yaml" in out and "make evaluate" in out  # the next commands
    assert config["data"]["val_fraction"] == 0.15 and config["data"]["test_fraction"] == 0.15
    assert "one folder of class folders" in line_of(text, "data.val_fraction")
    assert config["data"]["balanced_sampling"] is True
    assert "'checker' has" in line_of(text, "data.balanced_sampling")
    assert value(config, "trainer.logger.init_args.name") == "shapes"
    fits(tmp_path)


def test_a_labels_table_without_splits_gets_its_task_and_a_split(label_table, tmp_path):
    config, text = init(label_table, tmp_path, "--labels", str(label_table / "labels.csv"),
                        "--weights", "null")
    assert config["data"]["labels"] == str(label_table / "labels.csv")
    assert "task multiclass" in text and "the table has no split column" in line_of(text, "data.val_fraction")
    assert config["data"]["balanced_sampling"] is False  # 16 images each
    fits(tmp_path)


def test_a_multilabel_table_gets_a_config_that_runs(multilabel_data, tmp_path):
    config, text = init(multilabel_data, tmp_path, "--labels", str(multilabel_data / "labels.csv"),
                        "--weights", "null")
    assert "task multilabel" in text and value(config, "model.input.crop_ratio") == 1.0
    scratch = yaml.safe_load((Path(__file__).parents[1] / "configs/presets/scratch.yaml").read_text())
    assert value(config, "model.lr") == 2 * scratch["model"]["lr"]  # BCE's smaller gradients
    assert "x2 for the multilabel task" in line_of(text, "model.lr")
    fits(tmp_path)


def test_a_table_of_numbers_gets_a_regression_config_that_runs(count_table, tmp_path):
    config, text = init(count_table, tmp_path, "--labels", str(count_table / "labels.csv"),
                        "--weights", "null")
    assert "task regression" in text and "outputs: count" in text
    assert "balanced_sampling: false" in text and "class_weights" not in text  # no classes to balance
    fits(tmp_path)


def survey_of(sides: list[int], counts: dict[str, int] | None = None, labels_per_image: int = 1,
              task: str | None = None) -> Survey:
    """A survey as read from images of ``sides`` px, ``counts`` images per class (no files)."""
    counts = counts or {"a": 10, "b": 10}
    names = list(counts)
    if labels_per_image == 1:
        train = [Sample(f"{n}{i}.png", k) for k, n in enumerate(names) for i in range(counts[n])]
    else:
        train = [Sample(f"{i}.png", [1] * len(names)) for i in range(10)]
    splits = FolderSplits(names, train, train[:2], train[:2], task)
    return Survey("data/mine", None, splits, ["train", "val", "test"], short_sides=sides)


def chosen(found: Survey, weights: str | None = "DEFAULT") -> dict[str, object]:
    return {key: v for key, v, _ in choices(found, weights, "resnet18", "mine")}


@pytest.mark.parametrize(("sides", "weights", "size"), [
    ([480, 500, 520], "DEFAULT", 224),  # photos, ImageNet weights: the weights' own size
    ([20, 28, 28], "DEFAULT", 64),  # far smaller than 224: twice their size, at least 64
    ([40, 48, 56], "DEFAULT", 96),
    ([480, 500, 520], None, 384),  # random weights: near the images, at most 384
    ([100, 120, 140], None, 120),
    ([20, 28, 28], None, 32),  # at least 32
])
def test_the_input_size_follows_the_weights_and_the_images(sides, weights, size):
    assert chosen(survey_of(sides), weights)["model.input.size"] == size


@pytest.mark.parametrize(("weights", "size"), [(None, 224), ("DEFAULT", 224),
                                               ("IMAGENET1K_SWAG_E2E_V1", 384)])
def test_a_network_built_for_one_size_gets_that_size_whatever_the_images(weights, size):
    """vit_b_16 refuses any size but the one it is built for (its weights' own): at the images'
    64 px its fit would stop at once."""
    picked = {key: v for key, v, _ in choices(survey_of([20, 28, 28]), weights, "vit_b_16", "mine")}
    assert picked["model.input.size"] == size


def test_small_images_and_grids_are_evaluated_whole_photos_keep_the_weights_crop():
    assert chosen(survey_of([32, 32]))["model.input.crop_ratio"] == 1.0
    assert "model.input.crop_ratio" not in chosen(survey_of([300, 400]))
    assert chosen(survey_of([300, 400], labels_per_image=2))["model.input.crop_ratio"] == 1.0


def test_pretrained_weights_keep_the_fine_tuning_schedule():
    picked = chosen(survey_of([300]), "DEFAULT")
    assert picked["model.weights"] == "DEFAULT" and "model.lr" not in picked


def test_multilabel_from_pretrained_weights_gets_the_tasks_higher_lr():
    """BCE's smaller gradient per logit wants a higher LR from any weights, not only from random ones."""
    from project.tasks.multilabel.task import MultiLabel

    train = yaml.safe_load((Path(__file__).parents[1] / "configs/train.yaml").read_text())
    found = survey_of([300], labels_per_image=2, task="multilabel")
    picked = {key: (v, why) for key, v, why in choices(found, "DEFAULT", "resnet18", "mine")}
    assert picked["model.lr"][0] == train["model"]["lr"] * MultiLabel.lr_scale > train["model"]["lr"]
    assert "train.yaml" in picked["model.lr"][1] and "multilabel task" in picked["model.lr"][1]
    assert "model.scheduler.init_args.warmup_epochs" not in picked  # the fine-tuning schedule stays


def test_balancing_starts_past_three_to_one():
    assert "data.balanced_sampling" not in chosen(survey_of([64], {"a": 30, "b": 10}))
    assert chosen(survey_of([64], {"a": 31, "b": 10}))["data.balanced_sampling"] is True


def test_init_refuses_a_missing_folder_and_an_existing_config_in_one_line(tiny_data, tmp_path, capsys):
    assert cli(["init", str(tmp_path / "nowhere")], tmp_path) == 2
    assert "does not exist" in one_error(capsys.readouterr().err)
    (tmp_path / "cfg.yaml").write_text("mine\n")
    assert cli(["init", str(tiny_data), "--out", "cfg.yaml"], tmp_path) == 2
    assert "--force" in one_error(capsys.readouterr().err)
    assert (tmp_path / "cfg.yaml").read_text() == "mine\n"


def test_init_writes_no_config_whose_fit_would_stop_at_once(tiny_data, tmp_path, capsys):
    tiny = tmp_path / "two_each"  # two images a class: one for train, one for test, none for val
    for name in ("circle", "cross"):
        shutil.copytree(tiny_data / "train" / name, tiny / name, ignore=lambda d, files: sorted(files)[2:])
    assert cli(["init", str(tiny), "--out", "cfg.yaml"], tmp_path) == 2
    assert "the classes are too small to spare an image" in one_error(capsys.readouterr().err)
    assert not (tmp_path / "cfg.yaml").exists()


def test_init_never_overwrites_the_projects_own_configs(tiny_data, tmp_path, capsys):
    """A data folder named train/ makes configs/train.yaml the default --out: with --force it would
    replace the template every later init starts from."""
    from tests.conftest import REPO

    folder = tmp_path / "mine" / "train"
    shutil.copytree(tiny_data, folder)
    for own in ("configs/train.yaml", "configs/presets/ddp.yaml"):
        before = (REPO / own).read_bytes()
        assert cli(["init", str(folder), "--out", str(REPO / own), "--force"], tmp_path) == 2
        error = one_error(capsys.readouterr().err)
        assert "project's own configs" in error and "--out configs/mine-train.yaml" in error
        assert (REPO / own).read_bytes() == before


def test_every_make_target_that_reads_the_config_takes_config():
    """``make train CONFIG=configs/mine.yaml`` (what init prints) runs that config alone, and so does
    every target that reads it; the default is train.yaml with the demo's own settings on top."""
    import subprocess

    from tests.conftest import REPO

    def command(target: str, *variables: str) -> str:
        out = subprocess.run(["make", "-n", target, "STORAGE=x", *variables], cwd=REPO, text=True,
                             capture_output=True, check=True).stdout
        return next(line for line in out.splitlines() if " -m project " in line)

    for target in ("train", "train-ddp", "overfit", "lr-find", "find-batch-size", "suspects", "sweep",
                   "sweep-worker", "profile"):
        mine = command(target, "CONFIG=configs/mine.yaml")
        assert "--config configs/mine.yaml" in mine and "demo.yaml" not in mine and "train.yaml" not in mine
        assert "--config configs/train.yaml --config configs/demo.yaml" in command(target), target


def test_init_backbone_is_written_and_sizes_the_input_by_its_own_weights(tiny_data, tmp_path):
    picked = {key: v for key, v, _ in choices(survey_of([480, 500]), "DEFAULT", "efficientnet_b3", "mine",
                                               own_backbone=True)}
    assert picked["model.backbone"] == "efficientnet_b3"
    assert picked["model.input.size"] == 300  # torchvision's EfficientNet-B3 weights: 300 px, not 224
    config, text = init(tiny_data, tmp_path, "--weights", "null", "--backbone", "mobilenet_v3_small")
    assert value(config, "model.backbone") == "mobilenet_v3_small" and "init --backbone" in text
    fits(tmp_path)


def test_random_weights_and_small_images_train_with_the_plain_loops_light_augmentation():
    light = {"data.augmentation.crop_scale": [0.8, 1.0], "data.augmentation.color_jitter": 0}
    for sides, weights in (([300, 400], None), ([32], None), ([32], "DEFAULT")):
        picked = chosen(survey_of(sides), weights)
        low, high = picked["data.augmentation.crop_scale"]
        ratio = picked.get("model.input.crop_ratio", 0.875)  # else the weights' (ImageNet's) center crop
        assert low <= ratio ** 2 <= high and low == min(0.8, int(ratio ** 2 * 100) / 100), (sides, weights)
        assert picked["data.augmentation.color_jitter"] == 0
    photos = chosen(survey_of([300, 400]), "DEFAULT")  # fine-tuned on photos: train.yaml's
    assert not set(light) & set(photos)
