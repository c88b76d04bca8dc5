"""The data module: discovery, splits, stratification, transforms, samplers, demo data."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.accelerators import CPUAccelerator, CUDAAccelerator

from project.data import FolderDataModule
from project.data.demo import make_demo
from project.data.folders import DataFolderError, discover
from project.data.images import ImageCache
from project.data.samplers import EpochSampler
from project.errors import ConfigError


@pytest.fixture(scope="module")
def flat_data(tmp_path_factory) -> Path:
    """One folder of class folders, no splits: 10, 20 and 30 images."""
    root = tmp_path_factory.mktemp("flat")
    src = make_demo(root / "src", train_per_class=30, val_per_class=0, test_per_class=0,
                    image_size=16, num_classes=3)
    flat = root / "flat"
    for cls, n in (("checker", 10), ("circle", 20), ("cross", 30)):
        (flat / cls).mkdir(parents=True)
        for f in sorted((src / "train" / cls).iterdir())[:n]:
            shutil.copy(f, flat / cls / f.name)
    return flat


def test_split_folders_are_used_as_they_are(tiny_data):
    dm = FolderDataModule(tiny_data, image_size=32, num_workers=0)
    assert dm.class_names == ["checker", "circle", "cross"] and dm.num_classes == 3
    assert (len(dm.splits.train), len(dm.splits.val), len(dm.splits.test)) == (24, 12, 12)


def test_single_folder_gets_a_seeded_stratified_split(flat_data):
    splits = discover(flat_data, val_fraction=0.2, test_fraction=0.1, seed=3)
    sizes = {name: Counter(s.label for s in getattr(splits, name)) for name in ("train", "val", "test")}
    assert sizes["test"] == {0: 1, 1: 2, 2: 3}  # 10 % of each class
    assert sizes["val"] == {0: 2, 1: 4, 2: 6}  # 20 % of each class
    assert sizes["train"] == {0: 7, 1: 14, 2: 21}
    every = [s.path for name in ("train", "val", "test") for s in getattr(splits, name)]
    assert len(every) == len(set(every)) == 60  # disjoint and complete
    again = discover(flat_data, val_fraction=0.2, test_fraction=0.1, seed=3)
    assert again.val == splits.val
    assert discover(flat_data, val_fraction=0.2, test_fraction=0.1, seed=4).val != splits.val


def test_eval_transforms_are_deterministic_and_train_transforms_are_not(tiny_data):
    dm = FolderDataModule(tiny_data, image_size=32, num_workers=0, cache="none")
    dm.setup("fit")
    val = dm.datasets["val"]
    assert torch.equal(val[0][0], val[0][0])
    train = dm.datasets["train"]
    assert torch.equal(train[(0, 7)][0], train[(0, 7)][0])  # same seed, same variant
    assert not torch.equal(train[(0, 7)][0], train[(0, 8)][0])  # new seed, new variant
    assert val[0][0].shape == (3, 32, 32) and val[0][0].dtype == torch.float32


def test_augmentation_does_not_depend_on_num_workers(tiny_data):
    torch.manual_seed(0)
    batches = {}
    for workers in (0, 2):
        dm = FolderDataModule(tiny_data, image_size=32, batch_size=8, num_workers=workers,
                              persistent_workers=False, cache="none")
        dm.setup("fit")
        batches[workers] = next(iter(dm.train_dataloader()))
    assert torch.equal(batches[0][0], batches[2][0]) and torch.equal(batches[0][1], batches[2][1])


def test_sampler_draws_anew_each_epoch_and_balances_classes():
    targets = torch.tensor([0] * 90 + [1] * 10)
    from project.data.samplers import class_balanced_weights

    sampler = EpochSampler(100, class_balanced_weights(targets, 2), seed=5)
    sampler.set_epoch(0)
    first = [i for i, _ in sampler]
    sampler.set_epoch(1)
    second = [i for i, _ in sampler]
    assert first != second
    sampler = EpochSampler(100, class_balanced_weights(targets, 2), seed=5)
    sampler.set_epoch(0)
    assert [i for i, _ in sampler] == first  # seeded: same epoch, same draw
    counts = Counter(int(targets[i]) for epoch in range(20) for i, _ in _draw(sampler, epoch))
    assert 0.4 < counts[1] / (counts[0] + counts[1]) < 0.6


def _draw(sampler: EpochSampler, epoch: int):
    sampler.set_epoch(epoch)
    return list(sampler)


@pytest.mark.parametrize("problem", ["missing", "file", "no_classes", "one_class", "empty_class"])
def test_bad_layouts_name_the_folder_and_the_fix(tmp_path, problem):
    root = tmp_path / "data"
    if problem == "file":
        root.write_text("not a folder")
    elif problem != "missing":
        root.mkdir()
    if problem == "one_class":
        (root / "cats").mkdir()
        (root / "cats" / "a.png").write_bytes(b"")
    if problem == "empty_class":
        for c in ("cats", "dogs"):
            (root / c).mkdir()
        (root / "cats" / "a.png").write_bytes(b"")
    with pytest.raises(DataFolderError) as info:
        _ = FolderDataModule(root).num_classes
    message = str(info.value)
    assert str(root) in message
    expected = {"missing": "does not exist", "file": "is a file", "no_classes": "no class folders",
                "one_class": "at least two classes", "empty_class": "without images in"}[problem]
    assert expected in message


def test_demo_is_deterministic_and_imbalance_shrinks_later_classes(tmp_path):
    a = make_demo(tmp_path / "a", 6, 2, 2, image_size=24, num_classes=3, imbalance=0.5, seed=9)
    b = make_demo(tmp_path / "b", 6, 2, 2, image_size=24, num_classes=3, imbalance=0.5, seed=9)
    files = sorted(p.relative_to(a) for p in a.rglob("*.png"))
    assert files == sorted(p.relative_to(b) for p in b.rglob("*.png"))
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    counts = [len(list((a / "train" / c).iterdir())) for c in ("checker", "circle", "cross")]
    assert counts == [6, 4, 3]
    assert not (tmp_path / "a.tmp").exists()
    with pytest.raises(FileExistsError):
        make_demo(tmp_path / "a", 6, 2, 2, image_size=24, num_classes=3)


@pytest.mark.parametrize(("setting", "value", "allowed"), [
    ("image_size", 0, ">= 1"), ("batch_size", 0, ">= 1"), ("num_workers", -1, ">= 0"),
    ("prefetch_factor", 0, ">= 1"), ("hflip", 1.5, "[0, 1]"),
    ("crop_ratio", 0.0, "(0, 1]"), ("cache_gb", 0.0, "above 0"),
    ("val_fraction", -0.1, "[0, 1)"), ("test_fraction", 1.0, "[0, 1)"),
])
def test_out_of_range_settings_fail_at_construction_naming_the_key(tiny_data, setting, value, allowed):
    with pytest.raises(ConfigError) as info:
        FolderDataModule(tiny_data, **{setting: value})
    assert f"data.{setting} must be" in str(info.value) and allowed in str(info.value)


def test_fractions_must_leave_a_training_set(flat_data):
    with pytest.raises(ConfigError, match=r"data.val_fraction \+ data.test_fraction must be below 1"):
        FolderDataModule(flat_data, val_fraction=0.5, test_fraction=0.5)
    with pytest.raises(ConfigError, match="data.test_fraction must be in"):
        discover(flat_data, test_fraction=1.0)  # was a ZeroDivisionError


def test_empty_test_split_advice_fits_the_layout(tiny_data, flat_data, tmp_path):
    no_test = tmp_path / "no_test"
    shutil.copytree(tiny_data, no_test, ignore=shutil.ignore_patterns("test"))
    with pytest.raises(ConfigError) as info:
        FolderDataModule(no_test, num_workers=0, cache="none").setup("test")
    assert "add a test/ folder" in str(info.value) and "set data.test_fraction" not in str(info.value)
    with pytest.raises(ConfigError) as info:  # a flat folder: the fraction is what splits it
        FolderDataModule(flat_data, test_fraction=0.0, num_workers=0, cache="none").setup("test")
    assert "set data.test_fraction above 0" in str(info.value)


class _MyCPU(CPUAccelerator):
    pass


class _MyCUDA(CUDAAccelerator):
    pass


def test_accelerators_are_recognised_by_type_not_by_class_name(tiny_data):
    dm = FolderDataModule(tiny_data, image_size=32, cache="none")
    dm.trainer = SimpleNamespace(accelerator=_MyCPU())
    assert dm.workers() == 0  # the CPU rule: no loader processes
    dm.trainer = SimpleNamespace(accelerator=_MyCUDA())
    dm.num_workers = 0
    assert dm._loader(dm.make_dataset("val"), range(4)).pin_memory  # CUDA: pinned batches


def test_sampler_keeps_every_item_and_cache_has_no_unused_api(tiny_data):
    sampler = EpochSampler(10, num_replicas=3, rank=0)
    assert sampler.drop_last is False and len(sampler) == 4  # Lightning reads drop_last
    with pytest.raises(TypeError):
        EpochSampler(10, drop_last=True)  # the unused branch is gone
    assert not hasattr(ImageCache, "nbytes")
