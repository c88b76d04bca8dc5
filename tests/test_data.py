"""The data module: discovery, splits (copies kept together), transforms, samplers, demo data."""

from __future__ import annotations

import dataclasses
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch
from torchvision.transforms import v2

from project.common.preprocessing import Preprocessing
from project.data import FolderDataModule
from project.data.demo import make_demo
from project.data.folders import DataFolderError, discover
from project.data.samplers import EpochSampler, ShardSampler
from project.data.samples import Sample
from project.data.splits import stratified_split
from project.data.transforms import Augmentation, train_transforms
from project.errors import ConfigError
from project.extras.datatools.check_data import scan
from project.model import ImageClassifier
from project.tasks.single.task import inverse_frequency
from tests.conftest import CLASSES


@pytest.fixture(scope="module")
def flat_data(tmp_path_factory) -> Path:
    """One folder of class folders, no splits: 10, 20 and 30 images."""
    root = tmp_path_factory.mktemp("flat")
    src = make_demo(root / "src", 30, 0, 0, image_size=16, num_classes=3)
    flat = root / "flat"
    for cls, n in (("checker", 10), ("circle", 20), ("cross", 30)):
        (flat / cls).mkdir(parents=True)
        for f in sorted((src / "train" / cls).iterdir())[:n]:
            shutil.copy(f, flat / cls / f.name)
    return flat


def test_split_folders_are_used_as_they_are(tiny_data):
    dm = FolderDataModule(tiny_data, num_workers=0)
    assert dm.class_names == CLASSES and dm.num_classes == 5
    assert (len(dm.splits.train), len(dm.splits.val), len(dm.splits.test)) == (40, 20, 20)


@pytest.mark.parametrize("names", [("train", "valid", "test"), ("Training", "Validation", "Testing")])
def test_split_folders_go_by_other_common_names_and_two_for_a_split_fail(names, tiny_data, tmp_path):
    """Roboflow's exports write valid/, some sets Training/ and Testing/: read as their splits, not
    as classes or left out without a word."""
    data = tmp_path / "data"
    for split, name in zip(("train", "val", "test"), names, strict=True):
        shutil.copytree(tiny_data / split, data / name)
    dm = FolderDataModule(data, num_workers=0)
    assert dm.class_names == CLASSES
    assert (len(dm.splits.train), len(dm.splits.val), len(dm.splits.test)) == (40, 20, 20)
    assert all(f"/{names[1]}/" in s.path for s in dm.splits.val)
    shutil.copytree(data / names[1], data / "val" if names[1] != "val" else data / "valid")
    with pytest.raises(DataFolderError, match=r"has 2 val folders \(.*\): keep one"):
        _ = FolderDataModule(data).num_classes


def test_single_folder_gets_a_seeded_stratified_split(flat_data):
    splits = discover(flat_data, val_fraction=0.2, test_fraction=0.1, seed=3)
    for name in ("train", "val", "test"):  # every class on every side
        assert set(Counter(s.label for s in getattr(splits, name))) == {0, 1, 2}
    every = [s.path for name in ("train", "val", "test") for s in getattr(splits, name)]
    assert len(every) == len(set(every)) == 60  # disjoint and complete
    assert discover(flat_data, val_fraction=0.2, test_fraction=0.1, seed=3).val == splits.val
    assert discover(flat_data, val_fraction=0.2, test_fraction=0.1, seed=4).val != splits.val


def test_each_class_keeps_about_its_share_in_each_split():
    samples = [Sample(f"/d/{c}/{i}.jpg", c) for c in range(3) for i in range(400)]
    keep, held = stratified_split(samples, 0.2, seed=0)
    for c in range(3):
        assert 60 <= sum(s.label == c for s in held) <= 100  # 80 expected; 4 standard deviations
    assert len(keep) + len(held) == 1200 and not {s.path for s in keep} & {s.path for s in held}
    pair = [Sample("/d/a/1.jpg", 0), Sample("/d/a/2.jpg", 0)]
    for fraction in (0.01, 0.99):  # a class of two keeps one image on each side
        assert [len(side) for side in stratified_split(pair, fraction, seed=0)] == [1, 1]


def test_repeated_file_names_are_told_apart_by_their_folders():
    """``<id>/image.jpg``: keyed on the name alone every image would draw the same side."""
    samples = [Sample(f"/d/{i:03d}/image.jpg", i % 3) for i in range(150)]
    keep, held = stratified_split(samples, 0.2, seed=3)
    for c in range(3):
        assert 3 <= sum(s.label == c for s in held) <= 20  # 10 expected


def test_images_added_to_a_folder_never_move_a_trained_image_into_val_or_test(flat_data, tmp_path):
    """The user trains, adds images, and resumes or evaluates: the images trained on must still
    be training images, and the ones scored must still be scored, wherever the folder now lives."""
    before = discover(flat_data, val_fraction=0.2, test_fraction=0.1, seed=0)
    grown = tmp_path / "moved"
    shutil.copytree(flat_data, grown)
    for folder in sorted(p for p in grown.iterdir() if p.is_dir()):
        for i, image in enumerate(sorted(folder.iterdir())):  # as many again, under new names
            (folder / f"new_{i:03d}{image.suffix}").write_bytes(image.read_bytes() + bytes([i + 1]))
    after = discover(grown, val_fraction=0.2, test_fraction=0.1, seed=0)

    def sides(found) -> dict[str, str]:
        return {"/".join(Path(s.path).parts[-2:]): split
                for split in ("train", "val", "test") for s in getattr(found, split)}

    old, new = sides(before), sides(after)
    assert len(new) == 2 * len(old)
    assert all(new[name] == "train" for name, side in old.items() if side == "train")
    # a scored image goes back to train only where a class had none drawn for a side (one at most)
    assert sum(new[name] == side for name, side in old.items()) >= len(old) - 3


def test_a_train_folder_alone_gets_a_seeded_val_and_test_split(flat_data, tmp_path):
    """train/ without val/ and test/ is split as one folder is: a test set for evaluate, too."""
    shutil.copytree(flat_data, tmp_path / "only" / "train")
    splits = discover(tmp_path / "only", val_fraction=0.2, test_fraction=0.1, seed=3)
    one_folder = discover(flat_data, val_fraction=0.2, test_fraction=0.1, seed=3)

    def names(found) -> dict[str, list[str]]:
        return {split: sorted(Path(s.path).name for s in getattr(found, split))
                for split in ("train", "val", "test")}

    assert names(splits) == names(one_folder)  # the same seeded draw
    dm = FolderDataModule(tmp_path / "only", num_workers=0, cache="none", test_fraction=0.0)
    with pytest.raises(ConfigError, match="set data.test_fraction above 0"):
        dm.setup("test")
    shutil.copytree(flat_data, tmp_path / "only" / "test")  # a test/ folder beside it: used as it is
    given = discover(tmp_path / "only", val_fraction=0.2, test_fraction=0.1, seed=3)
    assert len(given.test) == 60 and len(given.train) + len(given.val) == 60


def test_identical_files_stay_in_one_split_and_check_data_names_them(flat_data, tmp_path, caplog):
    caplog.set_level("INFO")
    copies = tmp_path / "copies"
    shutil.copytree(flat_data, copies)
    originals = sorted((copies / "cross").iterdir())[:5]
    for original in originals:  # 5 images of cross, each copied 6 times
        for k in range(6):
            shutil.copy(original, original.with_name(f"{original.stem}_copy{k}.png"))
    splits = discover(copies, val_fraction=0.2, test_fraction=0.2, seed=0)
    split_of = {s.path: name for name in ("train", "val", "test") for s in getattr(splits, name)}
    for original in originals:
        group = [str(original)] + [str(original.with_name(f"{original.stem}_copy{k}.png")) for k in range(6)]
        assert len({split_of[p] for p in group}) == 1, group
    assert "30 files in" in caplog.text and "byte-identical copies" in caplog.text
    warnings = [f for f in scan(copies) if "identical" in f.reason]
    assert len(warnings) == 30
    assert all("the automatic split keeps the copies in one split" in f.reason for f in warnings)


def test_eval_is_deterministic_and_training_draws_from_the_seed(tiny_data):
    dm = FolderDataModule(tiny_data, num_workers=0, cache="none")
    dm.preprocessing = Preprocessing(32)
    dm.setup("fit")
    val, train = dm.datasets["val"], dm.datasets["train"]
    assert torch.equal(val[0][0], val[0][0]) and val[0][0].shape == (3, 32, 32)
    assert torch.equal(train[(0, 7)][0], train[(0, 7)][0])  # same seed, same variant
    assert not torch.equal(train[(0, 7)][0], train[(0, 8)][0])  # new seed, new variant


def test_every_augmentation_setting_reaches_the_transform():
    """A field of ``Augmentation`` that no transform reads would train with the default while
    the logged config says otherwise: each distinct value must change the pipeline."""
    pre = Preprocessing(32)
    values = {"hflip": 0.25, "vflip": 0.75, "crop_scale": (0.3, 0.9), "color_jitter": 0.35,
              "auto_augment": "trivialaugment", "random_erasing": 0.45}
    assert set(values) == {f.name for f in dataclasses.fields(Augmentation)}
    default = repr(train_transforms(pre, Augmentation()))
    for key, value in values.items():  # each setting alone changes the pipeline
        changed = dataclasses.replace(Augmentation(), **{key: value})
        assert repr(train_transforms(pre, changed)) != default, key
    steps = {type(t).__name__: t for t in train_transforms(pre, Augmentation(**values)).transforms}
    assert steps["RandomHorizontalFlip"].p == 0.25 and steps["RandomVerticalFlip"].p == 0.75
    assert steps["RandomResizedCrop"].scale == (0.3, 0.9) and steps["RandomErasing"].p == 0.45
    assert steps["ColorJitter"].brightness == (0.65, 1.35) and "TrivialAugmentWide" in steps
    # the data module builds it by keyword from the config's mapping: nothing can be swapped
    dm = FolderDataModule("unused", augmentation=Augmentation(**values))
    assert dm.hparams.augmentation == {**values, "crop_scale": [0.3, 0.9]}
    stored = dm.hparams.augmentation
    assert FolderDataModule("unused", augmentation=stored).augmentation == Augmentation(**values)


@pytest.mark.parametrize("policy", ["randaugment", "trivialaugment", "augmix"])
def test_an_auto_augment_policy_runs_with_bicubic_weights(policy):
    """timm's weights resize bicubic, which the policies' affine ops refuse on tensors."""
    pre = Preprocessing(32, interpolation="bicubic")
    transform = train_transforms(pre, Augmentation(auto_augment=policy))
    image = torch.randint(0, 256, (3, 40, 40), dtype=torch.uint8)
    for seed in range(20):  # every op of the policy gets its turn
        torch.manual_seed(seed)
        assert transform(image).shape == (3, 32, 32)


def test_data_and_model_get_one_preprocessing_in_python_and_from_the_cli(tiny_data, tmp_path):
    """timm's test_resnet weights normalise with mean 0.5 and crop 95 %: resolved once from the
    model's settings and handed to the data (no setting repeated on the data side, nothing read
    back through a trainer), in Python as by the CLI."""
    import lightning as L

    from project.cli import ProjectCLI
    from tests.conftest import TRAIN_CONFIG, chdir

    model = ImageClassifier(num_classes=5, class_names=CLASSES, backbone="timm/test_resnet.r160_in1k",
                            weights="DEFAULT", input=32)
    assert model.preprocessing.mean == (0.5, 0.5, 0.5) and model.preprocessing.crop_ratio == 0.95
    with chdir(tmp_path):
        built = ProjectCLI(args=["--config", str(TRAIN_CONFIG), f"--data.data_dir={tiny_data}",
                                 "--model.backbone=timm/test_resnet.r160_in1k", "--model.input.size=32",
                                 "--data.batch_size=4"], run=False)
    assert built.datamodule.preprocessing == built.model.preprocessing == model.preprocessing
    assert built.datamodule.trainer is None and built.model.per_device_batch == 4
    dm = FolderDataModule(tiny_data, batch_size=4, num_workers=0, preprocessing=model.preprocessing)
    trainer = L.Trainer(max_steps=1, limit_val_batches=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, dm)
    normalize = [t for t in dm.datasets["val"].transform.transforms if isinstance(t, v2.Normalize)][0]
    assert tuple(normalize.mean) == (0.5, 0.5, 0.5) and dm.short_side("val") == round(32 / 0.95)


def test_loaders_do_not_depend_on_the_number_of_workers(tiny_data):
    batches = {}
    for workers in (0, 2):
        dm = FolderDataModule(tiny_data, batch_size=8, num_workers=workers, persistent_workers=False,
                              cache="none", seed=3)
        dm.preprocessing = Preprocessing(32)
        dm.setup("fit")
        batches[workers] = next(iter(dm.train_dataloader()))
    assert torch.equal(batches[0][0], batches[2][0]) and torch.equal(batches[0][1], batches[2][1])


def test_the_training_draw_is_seeded_per_epoch_and_balances_classes():
    targets = torch.tensor([0] * 90 + [1] * 10)
    weights = inverse_frequency(targets, 2)[targets]
    assert inverse_frequency(targets, 2).tolist() == pytest.approx([100 / 180, 100 / 20])

    def draw(epoch: int, seed: int = 5, rank: int = 0, replicas: int = 1) -> list[int]:
        sampler = EpochSampler(100, weights, seed=seed, num_replicas=replicas, rank=rank)
        sampler.set_epoch(epoch)
        return [i for i, _ in sampler]

    assert draw(0) == draw(0) and draw(0) != draw(1) and draw(0) != draw(0, seed=6)
    counts = Counter(int(targets[i]) for epoch in range(20) for i in draw(epoch))
    assert 0.4 < counts[1] / sum(counts.values()) < 0.6
    shares = [draw(3, rank=r, replicas=3) for r in range(3)]  # the ranks' shares of one draw
    whole = EpochSampler(100, weights, seed=5, num_replicas=3)
    whole.set_epoch(3)
    assert [i for trio in zip(*shares, strict=True) for i in trio] == whole.global_draw()[0].tolist()
    evaluation = [list(ShardSampler(13, 3, r)) for r in range(3)]
    assert sorted(i for share in evaluation for i in share) == list(range(13))  # each image once
    by_class = [i // 10 for i in range(40)]  # a split as its folders list it: class after class
    first = list(ShardSampler(40))[:8]  # trainer.limit_val_batches=1 of batch 8
    assert len({by_class[i] for i in first}) >= 3, "a limited validation scores the first classes only"
    assert first == list(ShardSampler(40))[:8]  # the same images in every epoch and run


@pytest.mark.parametrize("problem", ["missing", "file", "no_classes", "one_class", "empty_class"])
def test_bad_layouts_name_the_folder_and_the_fix(tmp_path, problem):
    root = tmp_path / "data"
    if problem == "file":
        root.write_text("not a folder")
    elif problem != "missing":
        root.mkdir()
    for c in {"one_class": ["cats"], "empty_class": ["cats", "dogs"]}.get(problem, []):
        (root / c).mkdir()
    if problem in ("one_class", "empty_class"):
        (root / "cats" / "a.png").write_bytes(b"")
    with pytest.raises(DataFolderError) as info:
        _ = FolderDataModule(root).num_classes
    expected = {"missing": "does not exist", "file": "is a file", "no_classes": "no class folders",
                "one_class": "at least two classes", "empty_class": "without images in"}[problem]
    assert str(root) in str(info.value) and expected in str(info.value)


def test_a_class_named_train_in_one_folder_stays_a_class(flat_data, tmp_path):
    data = shutil.copytree(flat_data, tmp_path / "vehicles")
    (data / "circle").rename(data / "Train")  # images of its own: a class, not the training split
    assert FolderDataModule(data).class_names == ["Train", "checker", "cross"]


def test_a_data_set_unpacked_into_a_folder_of_its_own_names_that_folder(tiny_data, tmp_path):
    inner = shutil.copytree(tiny_data, tmp_path / "data" / "dataset")
    mac = tmp_path / "data" / "__MACOSX" / "dataset" / "train" / CLASSES[0]  # a zip made on a Mac
    mac.mkdir(parents=True)
    (mac / "._0.png").write_bytes(b"\x00\x05\x16\x07")  # its AppleDouble files: not images
    with pytest.raises(DataFolderError, match=f"set data.data_dir={inner}$"):
        _ = FolderDataModule(tmp_path / "data").num_classes
    shutil.move(mac.parents[2], inner)  # unpacked one level deeper: never a class or a split
    assert FolderDataModule(inner).class_names == CLASSES


@pytest.mark.parametrize(("setting", "value", "allowed"), [
    ("batch_size", 0, ">= 1"), ("num_workers", -1, ">= 0"), ("prefetch_factor", 0, ">= 1"),
    ("cache_gb", 0.0, "above 0"), ("val_fraction", -0.1, "[0, 1)"), ("test_fraction", 1.0, "[0, 1)"),
    ("decode_side", 0, "auto, full or a number of pixels"),
])
def test_out_of_range_settings_fail_at_construction_naming_the_key(tiny_data, setting, value, allowed):
    with pytest.raises(ConfigError) as info:
        FolderDataModule(tiny_data, **{setting: value})
    assert f"data.{setting} must be" in str(info.value) and allowed in str(info.value)


def test_empty_splits_say_how_to_fill_them(tiny_data, flat_data, tmp_path):
    with pytest.raises(ConfigError, match=r"data.val_fraction \+ data.test_fraction must be below 1"):
        FolderDataModule(flat_data, val_fraction=0.5, test_fraction=0.5)
    no_test = tmp_path / "no_test"
    shutil.copytree(tiny_data, no_test, ignore=shutil.ignore_patterns("test"))
    with pytest.raises(ConfigError) as info:
        FolderDataModule(no_test, num_workers=0, cache="none").setup("test")
    assert "add a test/ folder" in str(info.value) and "set data.test_fraction" not in str(info.value)
    with pytest.raises(ConfigError, match="set data.test_fraction above 0"):
        FolderDataModule(flat_data, test_fraction=0.0, num_workers=0, cache="none").setup("test")
    tiny = tmp_path / "two_each"  # a fraction above 0 already: the classes are what is too small
    for name in ("circle", "cross"):
        shutil.copytree(flat_data / name, tiny / name, ignore=lambda d, files: sorted(files)[2:])
    with pytest.raises(ConfigError, match="data.val_fraction is 0.15, but the classes are too small"):
        FolderDataModule(tiny, num_workers=0, cache="none").setup("fit")


def test_demo_is_deterministic_and_imbalance_shrinks_later_classes(tmp_path):
    a = make_demo(tmp_path / "a", 6, 2, 2, image_size=24, num_classes=3, imbalance=0.5, seed=9)
    b = make_demo(tmp_path / "b", 6, 2, 2, image_size=24, num_classes=3, imbalance=0.5, seed=9)
    files = sorted(p.relative_to(a) for p in a.rglob("*.png"))
    assert files == sorted(p.relative_to(b) for p in b.rglob("*.png"))
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    assert [len(list((a / "train" / c).iterdir())) for c in ("checker", "circle", "cross")] == [6, 4, 3]
    with pytest.raises(FileExistsError):
        make_demo(tmp_path / "a", 6, 2, 2, image_size=24, num_classes=3)


def test_a_data_dir_starting_with_a_tilde_is_the_home_folder(tiny_data, tmp_path, monkeypatch):
    """``--data.data_dir=~/photos``: the shell leaves that ~ alone."""
    monkeypatch.setenv("HOME", str(tmp_path))
    shutil.copytree(tiny_data, tmp_path / "photos")
    dm = FolderDataModule("~/photos", num_workers=0, cache="none")
    assert dm.class_names == CLASSES and dm.hparams.data_dir == str(tmp_path / "photos")


def test_a_table_as_spreadsheets_and_macs_write_it_reads_like_one_written_by_hand(tiny_data, tmp_path):
    """An ``Image`` header, CRLF line ends, a spreadsheet's trailing ``,,`` rows, and names in NFD
    (macOS) over files named in NFC: the same table, not an error."""
    import unicodedata

    from project.data.tables import discover_table

    data = tmp_path / "d"
    (data / "img").mkdir(parents=True)
    rows = []
    for k, image in enumerate(sorted((tiny_data / "train").rglob("*.png"))[:16]):
        name = unicodedata.normalize("NFC", f"café {k:02d}.png")
        shutil.copy(image, data / "img" / name)
        rows.append(f"img/{unicodedata.normalize('NFD', name)},{image.parent.name}")
    (data / "labels.csv").write_bytes(("Image,label\r\n" + "\r\n".join(rows) + "\r\n,\r\n,\r\n").encode())
    found = discover_table(data / "labels.csv", data)
    every = [s.path for part in (found.train, found.val, found.test) for s in part]
    assert len(every) == 16 and all(Path(p).is_file() for p in every)
    assert found.classes == ["checker", "circle"]


def test_class_names_alike_but_for_case_spaces_or_leading_zeros_are_a_notice(caplog):
    import logging

    from project.data.folders import notice_similar_classes

    with caplog.at_level(logging.WARNING, logger="project"):
        notice_similar_classes(["zone=01", "zone=1", "zone=10", "zone=100", "Cat", "cat", "0", "00"])
    assert caplog.messages == ["Notice: 'zone=01' and 'zone=1'; 'Cat' and 'cat'; '0' and '00' are different "
                               "classes; merge them if they are one"]
