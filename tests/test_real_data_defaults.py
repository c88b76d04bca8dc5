"""Defaults that fit the images a user brings: the input size is the weights' own unless a config
says otherwise, the demo's 48 px live in the demo's config, and a size far from the images' says so."""

from __future__ import annotations

import io
import logging
from contextlib import redirect_stdout

import yaml

from project.common.preprocessing import Input, Preprocessing
from project.data import FolderDataModule
from project.model.backbones import resolve_preprocessing
from tests.conftest import REPO, TRAIN_CONFIG, cli

DEMO_CONFIG = REPO / "configs" / "demo.yaml"


def printed(*configs) -> dict:
    out = io.StringIO()
    with redirect_stdout(out):
        args = [a for c in configs for a in ("--config", str(c))]
        assert cli(["fit", *args, "--print_config"], REPO) == 0
    return yaml.safe_load(out.getvalue())


def test_the_input_size_defaults_to_the_weights_own():
    assert Input().size is None and printed(TRAIN_CONFIG)["model"]["input"]["size"] is None
    assert resolve_preprocessing("resnet18", "DEFAULT", Input()).image_size == 224
    assert resolve_preprocessing("efficientnet_b3", "DEFAULT", Input()).image_size == 300  # its own, not 224
    assert resolve_preprocessing("resnet18", None, Input()).image_size == 224  # random weights: ImageNet's
    assert resolve_preprocessing("efficientnet_b3", "DEFAULT", Input(size=64)).image_size == 64  # given wins
    # the file the offline warning names, given as a path, is what the hub's folder holds: its input
    hub_file = resolve_preprocessing("efficientnet_b3", "/x/efficientnet_b3_rwightman-b3899882.pth", Input())
    assert (hub_file.image_size, hub_file.interpolation) == (300, "bicubic")
    assert resolve_preprocessing("efficientnet_b3", "/x/mine.pth", Input()).image_size == 224  # another file


def test_the_demo_keeps_its_48_px_and_name_in_its_own_config():
    plain, demo = printed(TRAIN_CONFIG), printed(TRAIN_CONFIG, DEMO_CONFIG)
    assert demo["model"]["input"]["size"] == 48 and demo["trainer"]["logger"]["init_args"]["name"] == "demo"
    assert plain["trainer"]["logger"]["init_args"]["name"] != "demo"
    assert {k: v for k, v in demo["model"].items() if k != "input"} == {
        k: v for k, v in plain["model"].items() if k != "input"}  # nothing else differs


def test_an_input_size_fourfold_off_the_images_is_a_one_line_notice(tiny_data, caplog):
    def notices(size: int) -> list[str]:
        caplog.clear()
        dm = FolderDataModule(str(tiny_data), num_workers=0, cache="none", preprocessing=Preprocessing(size))
        with caplog.at_level(logging.WARNING, logger="project"):
            dm.setup("fit")
        messages = [r.getMessage() for r in caplog.records]
        return [m for m in messages if m.startswith("Notice: model.input.size")]

    assert notices(32) == [] and notices(128) == []  # 32 px images: at most fourfold
    enlarged = notices(224)
    assert len(enlarged) == 1 and "median short side is 32 px" in enlarged[0] and "7x" in enlarged[0]
    shrunk = notices(7)
    assert len(shrunk) == 1 and "shrunk 5x" in shrunk[0]


def test_panoramas_say_what_the_square_crop_keeps_in_fit_and_init(tmp_path, caplog, capsys):
    """8:1 images: the random resized crop falls back to the middle, and evaluation's centre crop
    keeps a ninth of each; a user whose objects sit at the ends must hear it before training."""
    from PIL import Image

    for c, colour in enumerate(["red", "blue"]):
        (tmp_path / "wide" / f"c{c}").mkdir(parents=True)
        for i in range(6):
            image = Image.new("RGB", (256, 32), colour)
            image.putpixel((i, 0), (i, i, i))  # no two files alike (copies would be one unit)
            image.save(tmp_path / "wide" / f"c{c}" / f"{i}.png")
    dm = FolderDataModule(str(tmp_path / "wide"), num_workers=0, cache="none",
                          preprocessing=Preprocessing(32))
    with caplog.at_level(logging.WARNING, logger="project"):
        dm.setup("fit")
    shape = [r.getMessage() for r in caplog.records if "times as long as wide" in r.getMessage()]
    assert len(shape) == 1 and "8.0 times" in shape[0] and "middle 11%" in shape[0]
    assert cli(["init", str(tmp_path / "wide"), "--out", "cfg.yaml"], tmp_path) == 0
    assert "The images are 8.0 times as long as wide" in capsys.readouterr().out
    from project.data.images import aspect_notice

    assert aspect_notice(1.5, 0.875) is None and aspect_notice(2.5, 0.875) is not None


def test_model_input_given_a_number_is_the_size_on_the_command_line(tiny_data, tmp_path):
    from tests.conftest import QUICK, only_run

    args = ["fit", "--config", str(TRAIN_CONFIG), *QUICK, f"--data.data_dir={tiny_data}", "--model.input=40",
            "--trainer.max_steps=1", "--trainer.limit_val_batches=1", "--trainer.enable_progress_bar=false"]
    assert cli(args, tmp_path) == 0
    hparams = yaml.safe_load((only_run(tmp_path / "logs") / "hparams.yaml").read_text())
    assert "'size': 40," in hparams["model/input"]  # the resolved settings, as one value


def test_files_that_training_does_not_read_are_a_one_line_notice(tiny_data, tmp_path, caplog):
    import shutil

    def notices(root) -> list[str]:
        caplog.clear()
        dm = FolderDataModule(str(root), num_workers=0, cache="none", preprocessing=Preprocessing(32))
        with caplog.at_level(logging.WARNING, logger="project"):
            dm.setup("fit")
        return [r.getMessage() for r in caplog.records if "training leaves them out" in r.getMessage()]

    assert notices(tiny_data) == []
    data = shutil.copytree(tiny_data, tmp_path / "data")
    first_class = sorted(p for p in data.rglob("*") if p.is_dir() and any(p.glob("*.png")))[0]
    for name in ("IMG_0001.HEIC", "IMG_0002.heic", "notes.txt"):  # a phone's photos, beside the PNGs
        (first_class / name).write_bytes(b"not read")
    found = notices(data)
    assert len(found) == 1 and "3 other files (.heic 2, .txt 1)" in found[0], found
    assert "check-data" in found[0]


def test_class_names_that_differ_only_in_case_are_a_one_line_notice(tiny_data, tmp_path, caplog):
    import shutil

    data = shutil.copytree(tiny_data, tmp_path / "data")
    for split in ("train", "val", "test"):
        (data / split / "circle").rename(data / split / "Cross")  # beside cross/
    dm = FolderDataModule(str(data), num_workers=0, cache="none", preprocessing=Preprocessing(32))
    with caplog.at_level(logging.WARNING, logger="project"):
        dm.setup("fit")
    said = [r.getMessage() for r in caplog.records if "different classes" in r.getMessage()]
    assert said == ["Notice: 'Cross' and 'cross' are different classes; merge them if they are one"]
