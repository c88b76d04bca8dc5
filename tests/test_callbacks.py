"""The guards, resilience and the run's reports, each triggered by a deliberately broken set-up."""

from __future__ import annotations

import csv
import hashlib
import logging
import os
import shutil
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from project.callbacks import default_callbacks
from project.callbacks.guards import Guards, TrainingHealthError
from project.callbacks.resilience import AtomicCheckpointIO
from project.common.preprocessing import Preprocessing
from project.data import FolderDataModule
from project.data.demo import make_demo
from project.extras.datatools.check_data import scan
from project.extras.diagnose.monitors import DataWaitMonitor, GradNormLogger, OverfitHint
from project.model import ImageClassifier
from tests.conftest import CLASSES, cli, fit_args, only_run, scalars


def _trainer(tmp_path, callbacks=(), **kwargs) -> L.Trainer:
    options = dict(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, limit_val_batches=1, limit_train_batches=2,
                   default_root_dir=tmp_path)
    return L.Trainer(callbacks=[*default_callbacks(), *callbacks], **{**options, **kwargs})


def _model(**kwargs) -> ImageClassifier:
    return ImageClassifier(num_classes=5, class_names=CLASSES, weights=None, input=32, **kwargs)


def _data(tiny_data, **kwargs) -> FolderDataModule:
    return FolderDataModule(tiny_data, batch_size=8, num_workers=0, preprocessing=Preprocessing(32), **kwargs)


class _NaNData(FolderDataModule):
    def train_dataloader(self):
        x = torch.randn(16, 3, 32, 32)
        x[0, 0, :4, :4] = float("nan")
        return DataLoader(TensorDataset(x, torch.randint(0, 5, (16,))), batch_size=8)


def test_nan_inputs_are_reported_and_stop_the_run(tiny_data, tmp_path, caplog):
    with caplog.at_level(logging.INFO), pytest.raises(TrainingHealthError) as err:
        _trainer(tmp_path).fit(_model(), _NaNData(tiny_data, num_workers=0, preprocessing=Preprocessing(32)))
    assert "contain 16 NaN/Inf values" in caplog.text
    message = str(err.value)
    assert "non-finite gradients at step 0" in message and "nonfinite [16, 0, 0]" in message
    assert "net.conv1.weight" in message  # names the layers


def test_a_batch_with_no_finite_value_is_reported_not_a_crash(caplog):
    guards, batch = Guards(), torch.full((2, 3, 4, 4), float("nan"))
    trainer = type("T", (), {"is_global_zero": True, "loggers": []})()
    with caplog.at_level(logging.WARNING):
        guards.on_train_batch_start(trainer, None, (batch, torch.zeros(2)), 0)
    assert "contain 96 NaN/Inf values" in caplog.text
    caplog.clear()
    other_rank = type("T", (), {"is_global_zero": False, "loggers": []})()
    with caplog.at_level(logging.WARNING):  # rank 0's line speaks for the run
        Guards().on_train_batch_start(other_rank, None, (batch, torch.zeros(2)), 0)
    assert caplog.text == ""


def test_a_huge_lr_stops_at_the_first_bad_step_and_keeps_the_last_good_checkpoint(tiny_data, tmp_path):
    ckpts = tmp_path / "ckpts"
    _trainer(tmp_path, [ModelCheckpoint(dirpath=ckpts, save_last=True)], enable_checkpointing=True).fit(
        _model(), _data(tiny_data))
    digest = hashlib.sha256((ckpts / "last.ckpt").read_bytes()).hexdigest()
    with pytest.raises(TrainingHealthError) as err:
        _trainer(tmp_path, [ModelCheckpoint(dirpath=ckpts, save_last=True)], enable_checkpointing=True,
                 max_epochs=3).fit(_model(lr=1e6), _data(tiny_data))
    message = str(err.value)
    assert "non-finite gradients" in message and "largest gradient norms" in message
    assert "lower model.lr" in message and "gradient_clip_val" in message
    assert hashlib.sha256((ckpts / "last.ckpt").read_bytes()).hexdigest() == digest
    torch.load(ckpts / "last.ckpt", weights_only=True)  # still loadable


class _PlainListModel(ImageClassifier):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.extra = [nn.Linear(5, 5), nn.Linear(5, 5)]  # the pitfall: not registered

    def forward(self, x):
        out = super().forward(x)
        for layer in self.extra:
            out = layer(out)
        return out


def test_layers_in_a_plain_list_are_named_before_training(tiny_data, tmp_path):
    model = _PlainListModel(num_classes=5, class_names=CLASSES, weights=None, input=32)
    with pytest.raises(TrainingHealthError) as err:
        _trainer(tmp_path).fit(model, _data(tiny_data))
    message = str(err.value)
    assert "extra[0] (Linear)" in message and "extra[1] (Linear)" in message and "nn.ModuleList" in message


def test_an_atomic_checkpoint_write_never_leaves_a_partial_file(tmp_path, monkeypatch):
    target = tmp_path / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"w": torch.ones(3)}, target)

    def dying_save(obj, f, *args, **kwargs):
        f.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"w": torch.zeros(3)}, target)
    monkeypatch.undo()
    assert torch.equal(torch.load(target, weights_only=True)["w"], torch.ones(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_writers_of_one_file_at_once_each_rename_a_whole_file(tmp_path):
    """Sweep workers sharing a study write the same best.yaml when their last trials end together."""
    from concurrent.futures import ThreadPoolExecutor

    from project.common.files import write_text

    target = tmp_path / "best.yaml"
    texts = [f"worker {i}\n" * 2000 for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda t: write_text(target, t), texts * 4))
    assert target.read_text() in texts
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.yaml"]


@pytest.fixture(scope="module")
def bad_data(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A trainable folder holding one of each file-level problem; it and what to expect."""
    root = tmp_path_factory.mktemp("bad") / "data"
    make_demo(root, 8, 4, 4, image_size=32, num_classes=3, seed=2)
    good = sorted((root / "train" / "circle").glob("*.png"))[0]
    rgb = Image.open(good).convert("RGB")
    expect = {}

    def add(rel: str, reason: str) -> Path:
        expect[str(root / rel)] = reason
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        return root / rel

    add("train/circle/truncated.png", "cannot be decoded").write_bytes(good.read_bytes()[:200])
    add("train/cross/empty.jpg", "empty file").write_bytes(b"")
    add("val/checker/notes.png", "cannot be decoded").write_text("not an image at all")
    rgb.save(add("train/circle/photo.txt", "with extension '.txt'"), format="PNG")
    rgb.save(add("train/cross/jpeg_named.png", "content is JPEG"), format="JPEG")
    rgb.convert("L").save(add("train/circle/gray.png", "mode L (grayscale)"))
    rgb.convert("RGBA").save(add("train/checker/alpha.png", "mode RGBA"))
    rgb.convert("P").save(add("train/checker/palette.png", "mode P (palette)"))
    rgb.convert("CMYK").save(add("train/cross/cmyk.jpg", "mode CMYK"), format="JPEG")
    Image.fromarray(np.asarray(rgb.convert("L"), np.uint16) * 257).save(add("train/cross/deep16.png",
                                                                            "high bit depth"))
    exif = Image.Exif()
    exif[0x0112] = 6
    rgb.save(add("train/circle/rotated.jpg", "EXIF orientation 6"), format="JPEG", exif=exif)
    rgb.resize((80, 80)).save(add("train/checker/huge.png", "very large"))
    os.symlink(root / "missing.png", add("train/cross/dangling.png", "broken symbolic link"))
    shutil.copy(good, add("test/circle/leaked.png", "(test repeats train): its score measures memory"))
    shutil.copy(good, add("train/cross/labelled_twice.png", "of class circle: one image with two labels"))
    rgb.rotate(90).save(root / "train/circle/kreis_ü_图.png")  # non-ASCII names work silently
    return root, expect


def test_check_data_reports_each_problem_by_path(bad_data, tmp_path, capsys):
    root, expect = bad_data
    findings = scan(root, max_pixels=5000)
    for path, reason in expect.items():
        assert any(f.path == path and reason in f.reason for f in findings), (path, reason)
    assert str(root / "train/circle/kreis_ü_图.png") not in {f.path for f in findings}
    assert cli(["check-data", str(root), "--max_megapixels", "0.005"], tmp_path) == 0  # only skips
    out = capsys.readouterr().out
    assert "training can proceed" in out and "truncated.png" in out
    shutil.rmtree(tmp_path / "x", ignore_errors=True)
    broken = make_demo(tmp_path / "x", 2, 1, 1, image_size=16, num_classes=3)
    for image in (broken / "test" / "cross").iterdir():
        image.unlink()
    assert any(f.severity == "warning" and f.path == str(broken / "test" / "cross") and "no image of cross "
               "in the test split" in f.reason for f in scan(broken))
    shutil.rmtree(broken / "val" / "cross")
    assert cli(["check-data", str(broken)], tmp_path) == 1
    assert "missing ['cross']" in capsys.readouterr().out


def test_a_run_on_bad_data_skips_undecodable_files_and_counts_them(bad_data, tmp_path, capsys):
    root, _ = bad_data
    assert cli(["fit", *fit_args(root, "--data.cache=none", epochs=1)], tmp_path) == 0
    # truncated.png, empty.jpg and dangling.png in train; notes.png in val
    assert "Skipped 4 undecodable image(s)" in capsys.readouterr().err
    assert scalars(only_run(tmp_path / "logs"))["train/skipped_images"][-1][1] == 4


def _logged(logger, key: str) -> list[float]:
    with open(Path(logger.log_dir) / "metrics.csv") as f:
        return [float(row[key]) for row in csv.DictReader(f) if row.get(key)]


def test_data_waiting_is_measured_and_warned_about(caplog):
    """A fake clock: a step takes 2 s, the loader 4 s between steps."""
    ticks = iter(float(t) for t in range(100))
    monitor = DataWaitMonitor(threshold=0.6, skip_first=0)
    monitor.clock = lambda: next(ticks) * 2  # 2 s between the hooks' calls
    logged = {}
    module = type("M", (), {"log": lambda self, k, v, **kw: logged.update({k: v})})()
    trainer = type("T", (), {"datamodule": None})()
    for i in range(3):
        monitor.on_train_batch_start(trainer, module, None, i)
        monitor.on_train_batch_end(trainer, module, None, None, i)
        next(ticks)  # the loader's time: one more tick passes before the next batch
    with caplog.at_level(logging.WARNING):
        monitor.on_train_epoch_end(trainer, module)
    assert logged["perf/data_wait_frac"] == pytest.approx(8 / 14)  # 2 waits of 4 s, 3 steps of 2 s
    assert "spent waiting for data" not in caplog.text  # 57 % < 60 %
    monitor.threshold = 0.3
    monitor.on_train_epoch_start(trainer, module)
    for i in range(3):
        monitor.on_train_batch_start(trainer, module, None, i)
        monitor.on_train_batch_end(trainer, module, None, None, i)
        next(ticks)
    with caplog.at_level(logging.WARNING):
        monitor.on_train_epoch_end(trainer, module)
    assert "spent waiting for data" in caplog.text and "data.num_workers" in caplog.text


def test_gradient_norms_per_block_add_up_and_overfitting_is_hinted(tiny_data, tmp_path, caplog):
    logger = L.pytorch.loggers.CSVLogger(tmp_path, name="blocks")
    hint = OverfitHint(margin=-1.0, patience=1)  # any gap counts: the hint must fire
    with caplog.at_level(logging.WARNING):
        _trainer(tmp_path, [GradNormLogger(every_n_steps=1), hint], logger=logger, log_every_n_steps=1).fit(
            _model(), _data(tiny_data))
    blocks = ["stem", "layer1", "layer2", "layer3", "layer4", "head"]
    with open(Path(logger.log_dir) / "metrics.csv") as f:
        tags = {k for k in next(csv.reader(f)) if k.startswith("grad")}
    assert tags == {f"grad_norm/{b}" for b in [*blocks, "total"]}
    per_block = [_logged(logger, f"grad_norm/{b}")[0] for b in blocks]
    total = _logged(logger, "grad_norm/total")[0]
    assert min(per_block) > 0 and abs(sum(v * v for v in per_block) ** 0.5 - total) < 1e-3 * total
    assert "HINT: train/acc exceeds val/acc" in caplog.text



def test_gradient_norms_are_each_tensor_s_l2_norm():
    from project.callbacks.guards import gradient_norms

    grads = [torch.randn(3, 4), torch.randn(7), torch.tensor([float("inf"), 1.0])]
    norms = gradient_norms(grads)
    assert norms.dtype == torch.float32 and norms.shape == (3,)
    assert torch.allclose(norms[:2], torch.stack([g.norm() for g in grads[:2]]))
    assert not torch.isfinite(norms[2])


def test_a_nearly_black_first_batch_of_12_bit_images_is_a_warning(tiny_data, tmp_path, caplog):
    """Their values reach 4095 of 65535: read as 16-bit, the brightest pixel is 15 of 255."""
    from project.data.images import decode
    from project.data.transforms import eval_transforms

    pre = Preprocessing(32)
    model = type("M", (), {"preprocessing": pre})()
    trainer = type("T", (), {"is_global_zero": True, "loggers": []})()
    twelve_bit = tmp_path / "cell.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 4096, (40, 40)).astype(np.uint16)).save(twelve_bit)
    assert Image.open(twelve_bit).mode.startswith("I")
    for path, dark in ((twelve_bit, True), (next(tiny_data.rglob("*.png")), False)):
        caplog.clear()
        x = eval_transforms(pre)(decode(str(path), 40))[None]
        with caplog.at_level(logging.WARNING):
            Guards().on_train_batch_start(trainer, model, (x, torch.zeros(1)), 0)
        assert ("first training batch is nearly black" in caplog.text) is dark, caplog.text
