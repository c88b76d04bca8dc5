"""The troubleshooting table as tools: each diagnostic triggered by a deliberately broken set-up."""

from __future__ import annotations

import csv
import hashlib
import logging
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from project.callbacks import default_callbacks
from project.callbacks.guards import TrainingHealthError
from project.callbacks.monitors import DataWaitMonitor, GradNormLogger
from project.data import FolderDataModule
from project.diagnose.tools import run_overfit
from project.model import ImageClassifier
from tests.conftest import fit_args, run_cli


def _trainer(tmp_path, callbacks=(), **kwargs) -> L.Trainer:
    options = dict(max_epochs=1, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, limit_val_batches=1,
                   default_root_dir=tmp_path)
    options.update(kwargs)
    return L.Trainer(callbacks=[*default_callbacks(), *callbacks], **options)


def _model(**kwargs) -> ImageClassifier:
    return ImageClassifier(num_classes=3, class_names=["checker", "circle", "cross"],
                           weights=None, image_size=32, **kwargs)


def _data(tiny_data, **kwargs) -> FolderDataModule:
    return FolderDataModule(tiny_data, image_size=32, batch_size=8, num_workers=0, **kwargs)


class _NaNData(FolderDataModule):
    def train_dataloader(self):
        x = torch.randn(16, 3, 32, 32)
        x[0, 0, :4, :4] = float("nan")
        return DataLoader(TensorDataset(x, torch.randint(0, 3, (16,))), batch_size=8)


def test_nan_inputs_are_reported_and_stop_the_run(tiny_data, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="project"), pytest.raises(TrainingHealthError) as err:
        _trainer(tmp_path).fit(_model(), _NaNData(tiny_data, image_size=32, num_workers=0))
    assert "contain 16 NaN/Inf values" in caplog.text
    message = str(err.value)
    assert "non-finite gradients at step 0" in message and "non-finite 16" in message
    assert "net.conv1.weight" in message  # names the layers


def test_huge_lr_stops_at_the_first_bad_step_and_keeps_the_last_good_checkpoint(tiny_data, tmp_path):
    ckpts = tmp_path / "ckpts"
    healthy = ModelCheckpoint(dirpath=ckpts, save_last=True)
    _trainer(tmp_path, [healthy], enable_checkpointing=True).fit(_model(), _data(tiny_data))
    last = ckpts / "last.ckpt"
    digest = hashlib.sha256(last.read_bytes()).hexdigest()

    broken = ModelCheckpoint(dirpath=ckpts, save_last=True)
    with pytest.raises(TrainingHealthError) as err:
        _trainer(tmp_path, [broken], enable_checkpointing=True, max_epochs=3).fit(
            _model(lr=1e6), _data(tiny_data))
    message = str(err.value)
    assert "non-finite gradients" in message and "largest gradient norms" in message
    assert "lower model.lr" in message and "gradient_clip_val" in message
    assert hashlib.sha256(last.read_bytes()).hexdigest() == digest
    torch.load(last, weights_only=True)  # still loadable


class _PlainListModel(ImageClassifier):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.extra = [nn.Linear(3, 3), nn.Linear(3, 3)]  # the pitfall: not registered

    def forward(self, x):
        out = super().forward(x)
        for layer in self.extra:
            out = layer(out)
        return out


def test_layers_in_a_plain_list_are_named_before_training(tiny_data, tmp_path):
    model = _PlainListModel(num_classes=3, class_names=["a", "b", "c"], weights=None)
    with pytest.raises(TrainingHealthError) as err:
        _trainer(tmp_path).fit(model, _data(tiny_data))
    message = str(err.value)
    assert "extra[0] (Linear)" in message and "extra[1] (Linear)" in message
    assert "nn.ModuleList" in message


class _SlowDataset(Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, i):
        time.sleep(0.05)
        return torch.randn(3, 32, 32), i % 3


class _SlowData(FolderDataModule):
    def train_dataloader(self):
        return DataLoader(_SlowDataset(), batch_size=8)


def _logged(logger, key: str) -> list[float]:
    """Values of ``key`` in a CSVLogger's metrics.csv."""
    with open(Path(logger.log_dir) / "metrics.csv") as f:
        return [float(row[key]) for row in csv.DictReader(f) if row.get(key)]


def _columns(logger) -> list[str]:
    with open(Path(logger.log_dir) / "metrics.csv") as f:
        return next(csv.reader(f))


def test_slow_data_is_measured_and_warned_about(tiny_data, tmp_path, caplog):
    logger = L.pytorch.loggers.CSVLogger(tmp_path)
    monitor = DataWaitMonitor(threshold=0.2)
    with caplog.at_level(logging.WARNING, logger="project"):
        _trainer(tmp_path, [monitor], logger=logger).fit(_model(), _SlowData(tiny_data))
    assert "spent waiting for data" in caplog.text and "data.num_workers" in caplog.text
    assert _logged(logger, "perf/data_wait_frac")[-1] > 0.2


def test_grad_norms_are_logged_per_block_and_per_parameter_only_when_asked(tiny_data, tmp_path):
    blocks = ["stem", "layer1", "layer2", "layer3", "layer4", "head"]
    logger = L.pytorch.loggers.CSVLogger(tmp_path, name="blocks")
    trainer = _trainer(tmp_path, [GradNormLogger(every_n_steps=1)], logger=logger,
                       log_every_n_steps=1)
    trainer.fit(_model(), _data(tiny_data))
    tags = {k for k in _columns(logger) if k.startswith("grad")}
    assert tags == {f"grad_norm/{b}" for b in [*blocks, "total"]}
    per_block = [_logged(logger, f"grad_norm/{b}")[0] for b in blocks]
    total = _logged(logger, "grad_norm/total")[0]
    assert min(per_block) > 0 and abs(sum(v * v for v in per_block) ** 0.5 - total) < 1e-3 * total

    logger = L.pytorch.loggers.CSVLogger(tmp_path, name="params")
    trainer = _trainer(tmp_path, [GradNormLogger(every_n_steps=1, per_parameter=True)],
                       logger=logger, log_every_n_steps=1)
    trainer.fit(_model(), _data(tiny_data))
    assert _logged(logger, "grad_2.0_norm/net.conv1.weight")[0] > 0


def test_healthy_run_passes_every_guard(tiny_data, tmp_path):
    trainer = _trainer(tmp_path, max_epochs=2)
    trainer.fit(_model(), _data(tiny_data))
    assert trainer.global_step == 6 and trainer.state.finished


def test_overfit_passes_on_a_healthy_model(tiny_data, tmp_path):
    result = run_cli(["overfit", *fit_args(tiny_data), "--steps", "60"], cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "PASS" in result.stdout


def test_overfit_fails_with_zero_lr(tiny_data, tmp_path):
    result = run_cli(["overfit", *fit_args(tiny_data), "--model.lr=0", "--steps", "20"],
                     cwd=tmp_path)
    assert result.returncode == 1
    assert "FAIL" in result.stdout and "the learning rate is 0.0" in result.stdout


def test_overfit_fails_with_a_fully_frozen_model(tiny_data, tmp_path, capsys):
    model = _model()
    model.requires_grad_(False)
    trainer = L.Trainer(max_steps=10, overfit_batches=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, limit_val_batches=0)
    assert run_overfit(trainer, model, _data(tiny_data, augment=False), 0.1) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "every parameter is frozen" in out
