"""Large photos: decoded at the size the transforms need, the same pixels on every path, the
cache holding the reduced images, and ``resize-data``."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from benchmarks import photos
from project.common.pixels import REDUCE_FILTER, REDUCING_GAP, read_rgb
from project.common.preprocessing import IMAGENET_STD, Preprocessing
from project.data.datasets import ImageDataset
from project.data.folders import Sample
from project.data.images import ImageCache, decode, decoded_bytes, needed_side
from project.data.transforms import eval_transforms
from project.extras.datatools.resize import MANIFEST
from project.extras.datatools.resize import main as resize_data
from project.extras.deploy.infer import preprocess

ORIENTATION = 0x0112


def photo(path: Path, w: int = 1600, h: int = 1200, orientation: int | None = None, seed: int = 0,
          fmt: str = "JPEG") -> Path:
    """A gradient with noise: smooth like a photo, with fine detail for the filters to differ on."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    arr = np.stack([x * 255 / w, y * 255 / h, (x + y) * 255 / (w + h)], -1)
    arr += rng.normal(0, 6, arr.shape).astype(np.float32)
    img = Image.fromarray(arr.clip(0, 255).astype(np.uint8))
    path.parent.mkdir(parents=True, exist_ok=True)
    params = {"quality": 92} if fmt == "JPEG" else {}
    if orientation is not None:
        exif = Image.Exif()
        exif[ORIENTATION] = orientation
        params["exif"] = exif
    img.save(path, format=fmt, **params)
    return path


def reference(path: Path, side: int) -> np.ndarray:
    """Full decode, then the same single resize: what the reduced decode must approximate."""
    full = Image.fromarray(read_rgb(str(path)))
    w, h = full.size
    size = (side, int(side * h / w)) if w <= h else (int(side * w / h), side)
    return np.asarray(full.resize(size, REDUCE_FILTER, reducing_gap=REDUCING_GAP))


def test_decode_side_is_one_rule_for_eval_and_training():
    pre = Preprocessing(224, 0.875)
    assert needed_side(pre) == needed_side(pre, None) == pre.resize_size == 256
    assert needed_side(pre, (0.6, 1.0)) == 290  # ceil(224 / sqrt(0.6)): the smallest crop keeps 224 px
    assert needed_side(pre, (0.35, 1.0)) == 379  # ceil(224 / sqrt(0.35)); the largest share does not matter
    assert needed_side(pre, (0.35, 0.5)) == 379
    assert needed_side(pre, (0.25, 0.25)) == 448  # exact, no float round-up
    assert needed_side(pre, (1.0, 1.0)) == 256  # the eval resize is the floor
    assert needed_side(Preprocessing(224, 0.5), (0.8, 0.8)) == 448


def test_decode_side_setting_sizes_the_training_images_and_not_evaluation(tmp_path):
    from project.data import FolderDataModule
    from project.errors import ConfigError

    for split in ("train", "val"):
        for k, cls in enumerate(("cat", "dog")):
            photo(tmp_path / split / cls / "a.jpg", seed=k)
    expected = {"auto": 83, 120: 120, 50: 73, "full": 1200}  # 83 = ceil(64 / sqrt(0.6)); 73 the eval resize
    for setting, side in expected.items():
        dm = FolderDataModule(str(tmp_path), batch_size=2, cache="none", decode_side=setting)
        dm.preprocessing = Preprocessing(64)
        dm.setup("fit")
        assert min(dm.datasets["train"].load(0).shape[1:]) == side, setting
        assert min(dm.datasets["val"].load(0).shape[1:]) == 73, setting  # what the eval resize needs
        assert dm.train_dataloader() is not None
    with pytest.raises(ConfigError, match="data.decode_side must be auto, full or a number of pixels"):
        FolderDataModule(str(tmp_path), decode_side=0)


def test_large_jpeg_decodes_at_the_reduced_size_close_to_the_full_decode(tmp_path):
    path = photo(tmp_path / "big.jpg")
    for side in (256, 290, 500):
        reduced = read_rgb(str(path), side)
        assert min(reduced.shape[:2]) == side and reduced.shape[2] == 3
        assert reduced.shape[1] == int(side * 1600 / 1200)  # long side truncated as torchvision does
        ref = reference(path, side)
        assert reduced.shape == ref.shape
        assert np.abs(reduced.astype(np.int16) - ref).mean() < 3  # within 3/255 on average
    assert tuple(decode(str(path), 256).shape) == (3, 256, 341)
    assert read_rgb(str(path)).shape == (1200, 1600, 3)  # None: full size, as before


def test_non_jpeg_is_reduced_once_too(tmp_path):
    path = photo(tmp_path / "big.png", 900, 600, fmt="PNG")
    reduced = read_rgb(str(path), 200)
    assert reduced.shape == (200, 300, 3)
    assert np.array_equal(reduced, reference(path, 200))  # no DCT scaling: exactly the one resize


def test_a_float_image_in_0_to_1_is_read_at_full_brightness(tmp_path):
    """Scientific and HDR pipelines write 32-bit float TIFFs in [0, 1]; read as 0..255 they are black."""
    ramp = np.tile(np.linspace(0, 1, 64, dtype=np.float32), (16, 1))
    Image.fromarray(ramp, "F").save(tmp_path / "ramp.tif")
    rgb = read_rgb(str(tmp_path / "ramp.tif"))
    assert rgb.shape == (16, 64, 3) and rgb[0, 0, 0] == 0 and rgb[0, -1, 0] == 255
    Image.fromarray(ramp * 200, "F").save(tmp_path / "eight_bit.tif")  # floats of 8-bit values: kept
    assert read_rgb(str(tmp_path / "eight_bit.tif"))[0, -1, 0] == 200


def test_small_images_are_not_enlarged(tmp_path):
    path = photo(tmp_path / "small.jpg", 300, 200)
    assert read_rgb(str(path), 256).shape == (200, 300, 3)
    assert np.array_equal(read_rgb(str(path), 256), read_rgb(str(path)))
    assert decoded_bytes(str(path), 256) == 3 * 300 * 200


def test_exif_rotation_is_applied_with_the_reduced_decode(tmp_path):
    rotated = photo(tmp_path / "rot.jpg", orientation=6)  # stored landscape, shown portrait
    with Image.open(rotated) as img:
        assert img.size == (1600, 1200) and img.getexif()[ORIENTATION] == 6
    reduced = read_rgb(str(rotated), 256)
    assert reduced.shape == (341, 256, 3)  # portrait, short side 256
    assert np.abs(reduced.astype(np.int16) - reference(rotated, 256)).mean() < 3  # the right way up
    upright = np.rot90(read_rgb(str(photo(tmp_path / "up.jpg")), 256), -1)  # 6: turn 90 deg clockwise
    assert np.abs(reduced.astype(np.int16) - upright).mean() < 3
    assert decoded_bytes(str(rotated), 256) == 3 * 256 * 341


def test_the_same_pixels_on_the_training_eval_path_and_in_infer(tmp_path):
    pre = Preprocessing(224, 0.875, "bilinear")
    paths = [photo(tmp_path / "land.jpg", seed=1), photo(tmp_path / "rot.jpg", orientation=6, seed=2),
             photo(tmp_path / "tiny.jpg", 180, 150, seed=3)]  # smaller than 256: enlarged by both
    side = needed_side(pre)
    assert side == pre.resize_size  # infer reads the same side
    dataset = ImageDataset([Sample(str(p), 0) for p in paths], eval_transforms(pre), short_side=side)
    for i, path in enumerate(paths):
        train_pixels = dataset.load(i).permute(1, 2, 0).numpy()
        infer_pixels = read_rgb(str(path), pre.resize_size)
        assert np.array_equal(train_pixels, infer_pixels)
        x, _ = dataset[i]
        y = preprocess(infer_pixels, pre)
        assert x.shape == y.shape == (3, 224, 224)
        std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
        assert ((x - torch.from_numpy(y)) * std).abs().max() <= 1 / 255 + 1e-6


def test_cache_holds_the_reduced_images_and_the_budget_says_so(tmp_path):
    paths = [str(photo(tmp_path / f"{i}.jpg", seed=i, orientation=6 if i else None)) for i in range(3)]
    cache = ImageCache.decode(paths, short_side=256, threads=2)
    assert [tuple(cache[i].shape) for i in range(3)] == [(3, 256, 341), (3, 341, 256), (3, 341, 256)]
    assert cache.buffer.numel() == sum(decoded_bytes(p, 256) for p in paths) == 3 * 3 * 256 * 341
    assert decoded_bytes(paths[0]) == 3 * 1600 * 1200  # no side: the full size, as before
    assert torch.equal(cache[1], decode(paths[1], 256))  # cached and decoded: the same pixels
    samples, transform = [Sample(p, 0) for p in paths], eval_transforms(Preprocessing())
    assert torch.equal(ImageDataset(samples, transform, cache, short_side=256).load(2), decode(paths[2], 256))


def test_resize_data_keeps_the_layout_skips_bad_files_and_reruns_as_a_no_op(tmp_path, capsys):
    src, out = tmp_path / "src", tmp_path / "out"
    photo(src / "train" / "cat" / "a.jpg")
    photo(src / "train" / "cat" / "rot.jpg", orientation=6, seed=1)
    photo(src / "train" / "dog" / "deep" / "b.png", 800, 600, fmt="PNG", seed=2)
    photo(src / "val" / "dog" / "small.jpg", 200, 150, seed=3)
    good = photo(src / "val" / "cat" / "c.jpg", seed=4).read_bytes()
    (src / "val" / "cat" / "broken.jpg").write_bytes(good[: len(good) // 2])  # truncated
    (src / "notes.txt").write_text("not an image")
    assert resize_data([str(src), str(out), "--side", "256", "--workers", "2"]) == 0
    report = capsys.readouterr().out
    assert "4 written, 1 copied, 0 up to date, 1 skipped" in report
    assert f"skipped {src / 'val' / 'cat' / 'broken.jpg'}: " in report and "truncated" in report
    made = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert made == [MANIFEST, "train/cat/a.jpg", "train/cat/rot.jpg", "train/dog/deep/b.png",
                    "val/cat/c.jpg", "val/dog/small.jpg"]
    with Image.open(out / "train" / "cat" / "rot.jpg") as img:
        assert img.format == "JPEG" and img.size == (256, 341)  # upright portrait
        assert img.getexif().get(ORIENTATION) is None
    with Image.open(out / "train" / "dog" / "deep" / "b.png") as img:
        assert img.format == "PNG" and img.size == (341, 256)
    small = Path("val", "dog", "small.jpg")
    assert (out / small).read_bytes() == (src / small).read_bytes()  # small and upright: as it was
    training_pixels = read_rgb(str(src / "train" / "cat" / "a.jpg"), 256)
    resized = read_rgb(str(out / "train" / "cat" / "a.jpg")).astype(np.int16)
    assert np.abs(resized - training_pixels).mean() < 2  # what training would have decoded

    times = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    assert resize_data([str(src), str(out), "--side", "256", "--workers", "1"]) == 0
    assert "0 written, 0 copied, 5 up to date, 1 skipped" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == times  # nothing rewritten

    os.utime(src / "train" / "cat" / "a.jpg")  # a newer source is redone
    assert resize_data([str(src), str(out), "--side", "256", "--workers", "1"]) == 0
    assert "1 written, 0 copied, 4 up to date" in capsys.readouterr().out
    assert resize_data([str(src), str(out), "--side", "128", "--workers", "1"]) == 0  # new side: all
    assert "5 written, 0 copied, 0 up to date" in capsys.readouterr().out
    with Image.open(out / "train" / "cat" / "a.jpg") as img:
        assert img.size == (170, 128)

    # a relabelled, a deleted and a now unreadable source: out trains as src does
    (src / "train" / "cat" / "rot.jpg").rename(src / "train" / "dog" / "rot.jpg")
    shutil.rmtree(src / "train" / "dog" / "deep")
    (src / "val" / "dog" / "small.jpg").write_bytes(b"broken")
    photo(out / "mine" / "own.jpg")  # the user's own file in OUT: never touched
    assert resize_data([str(src), str(out), "--side", "128", "--workers", "1"]) == 0
    assert "1 written, 0 copied, 2 up to date, 2 skipped, 3 removed" in capsys.readouterr().out
    made = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    assert made == [MANIFEST, "mine", "mine/own.jpg", "train", "train/cat", "train/cat/a.jpg", "train/dog",
                    "train/dog/rot.jpg", "val", "val/cat", "val/cat/c.jpg"]
    other = tmp_path / "other"  # another source into the same OUT: the first one's copies stay
    photo(other / "x" / "z.jpg")
    assert resize_data([str(other), str(out), "--side", "128", "--workers", "1"]) == 0
    assert "0 removed" in capsys.readouterr().out and (out / "train/cat/a.jpg").is_file()
    assert resize_data([str(src / "train"), str(src), "--side", "128"]) == 2  # OUT holding SRC
    assert "must not hold SRC" in capsys.readouterr().err


def test_resize_data_without_any_image_fails(tmp_path, capsys):
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "a" / "bad.jpg").write_bytes(b"not a jpeg")
    assert resize_data([str(tmp_path / "src"), str(tmp_path / "out"), "--side", "64"]) == 2
    assert "skipped" in capsys.readouterr().out
    assert resize_data([str(tmp_path / "src"), str(tmp_path / "src" / "out"), "--side", "64"]) == 2


@pytest.mark.slow
def test_photos_benchmark_quick_prints_every_table(capsys):
    assert photos.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "## Decode" in out and "## Training loader vs model step" in out and "## Short fit" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    names = [row.split("|")[1].strip() for row in rows]
    train = needed_side(Preprocessing(224, 0.875), (0.6, 1.0))  # the defaults of train.yaml
    for name in ("full size", f"reduced to {train} (training)", "reduced to 256 (evaluation)",
                 "resnet18 training step, bf16 autocast (no data)", f"loader, decode reduced to {train}",
                 "data.cache=auto (default)", "data.cache=none"):
        assert name in names, name
    for row in rows[1:]:
        if row.split("|")[1].strip() in ("decode", "pipeline", "run"):
            continue  # the second table's header
        number = re.findall(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?", row.split("|")[-3])[-1]
        if row.split("|")[1].strip().startswith("data.cache="):  # a wait share may round to 0
            assert 0 <= float(number) < 100 and float(row.split("|")[-2].split()[0]) > 0, row
        else:
            assert float(number) > 0, row
