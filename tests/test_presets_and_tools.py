"""Every preset parses over the default config; the diagnosis tools; kills and resumes."""

from __future__ import annotations

import functools
import importlib
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml

from project.common.files import list_images
from project.data import FolderDataModule
from project.extras.deploy.predict import input_files
from project.extras.diagnose.tools import run_overfit
from project.model import ImageClassifier
from tests.conftest import REPO, TRAIN_CONFIG, cli, fit_args, only_run, scalars

PRESETS = sorted((REPO / "configs" / "presets").glob("*.yaml"))


def assert_within(preset: object, parsed: object, where: str = "") -> None:
    """Each value the preset sets is in the parsed config (which adds defaults around it);
    lists of classes (callbacks) are checked by their class paths."""
    if isinstance(preset, dict):
        for key, value in preset.items():
            if key.endswith("+"):  # appended: each class is in the parsed list
                paths = [c["class_path"] for c in parsed[key[:-1]]]
                assert all(c["class_path"] in paths for c in value), f"{where}.{key}"
                continue
            assert isinstance(parsed, dict) and key in parsed, f"{where}.{key} missing"
            assert_within(value, parsed[key], f"{where}.{key}")
    elif not (isinstance(preset, list) and any(isinstance(v, dict) for v in preset)):
        assert parsed == preset, f"{where}: {parsed!r} != {preset!r}"


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_each_preset_parses_over_the_default_config(preset: Path, capsys, tmp_path):
    args = ["fit", "--config", str(TRAIN_CONFIG), "--config", str(preset), "--print_config"]
    assert cli(args, tmp_path) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert_within(yaml.safe_load(preset.read_text()) or {}, printed)


def test_the_fsdp_preset_builds_a_sharded_strategy():
    spec = yaml.safe_load((REPO / "configs/presets/fsdp.yaml").read_text())["trainer"]["strategy"]
    module, _, name = spec["class_path"].rpartition(".")
    strategy = getattr(importlib.import_module(module), name)(**spec["init_args"])
    policy = strategy.kwargs["auto_wrap_policy"]
    assert isinstance(policy, functools.partial)
    assert policy.keywords["min_num_params"] == spec["init_args"]["min_params"]
    assert strategy.sharding_strategy.name == spec["init_args"]["sharding_strategy"]
    assert strategy.kwargs["use_orig_params"] is True and not set(spec["init_args"]) & set(strategy.kwargs)


def test_predict_lists_images_exactly_as_training_does(tmp_path):
    root = tmp_path / "images"
    (root / "a").mkdir(parents=True)
    (root / ".hidden").mkdir()
    (tmp_path / "elsewhere").mkdir()
    for path in (root / "a" / "x.png", root / "a" / ".y.png", root / ".hidden" / "z.png",
                 tmp_path / "elsewhere" / "w.JPG", root / "a" / "notes.txt"):
        path.write_bytes(b"")
    (root / "linked").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    expected = [str(root / "a" / "x.png"), str(root / "linked" / "w.JPG")]
    assert list_images(root) == expected == input_files(root)  # hidden skipped, links followed


def test_overfit_passes_on_a_healthy_model_and_names_the_causes_of_a_failure(tiny_data, tmp_path, capsys):
    assert cli(["overfit", *fit_args(tiny_data), "--steps", "40"], tmp_path) == 0
    assert "PASS" in capsys.readouterr().out
    assert cli(["overfit", *fit_args(tiny_data), "--model.lr=0", "--steps", "5"], tmp_path) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "the learning rate is 0.0" in out
    model = ImageClassifier(num_classes=5, weights=None, input=32)
    model.requires_grad_(False)
    trainer = L.Trainer(max_steps=5, overfit_batches=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, limit_val_batches=0)
    dm = FolderDataModule(tiny_data, batch_size=8, augmentation=None, preprocessing=model.preprocessing)
    assert run_overfit(trainer, model, dm, 0.1) == 1
    assert "every parameter is frozen" in capsys.readouterr().out


@pytest.mark.slow
def test_lr_find_and_find_batch_size_suggest_settings_for_the_users_own_command(tiny_data, tmp_path, capsys):
    """lr-find's LR is applied to every layer as it is: with lr_scaling, model.lr is that LR
    unscaled (batch 8 of base 64: x8). Both print the fit command of the user's own config."""
    args = fit_args(tiny_data, "--model.lr_scaling=linear", epochs=10)  # 20 steps of 4 batches an epoch
    assert cli(["lr-find", *args, "--num_training", "20", "--output", str(tmp_path / "lr.png")],
               tmp_path) == 0
    assert (tmp_path / "lr.png").read_bytes().startswith(b"\x89PNG")
    out = capsys.readouterr().out
    applied = float(re.search(r"Suggested learning rate: ([0-9.e-]+)", out).group(1))
    command = re.search(r"Use it with: (.*)", out).group(1)
    assert command.startswith(f"python -m project fit --config {TRAIN_CONFIG} --data.data_dir={tiny_data}")
    assert float(command.rsplit("--model.lr=", 1)[1]) == pytest.approx(applied * 8, rel=0.01)
    assert "lr_scaling=linear multiplies it by 0.125 for this global batch of 8" in out

    assert cli(["find-batch-size", *fit_args(tiny_data), "--max_trials", "2"], tmp_path) == 0
    out = capsys.readouterr().out
    assert "Batch size 4 fits; the search stopped at --max_trials 2" in out
    assert f"python -m project fit --config {TRAIN_CONFIG} " in out and " --data.batch_size=4 " in out


@pytest.mark.slow
def test_the_profile_preset_leaves_no_checkpoint_for_later_commands_to_pick(tiny_data, tmp_path):
    preset = str(REPO / "configs/presets/profile.yaml")
    assert cli(["fit", *fit_args(tiny_data, "--config", preset, "--trainer.limit_train_batches=2",
                                 "--trainer.limit_val_batches=1")], tmp_path) == 0
    assert (tmp_path / "logs" / "profile").is_dir() and not list((tmp_path / "logs").rglob("*.ckpt"))


@pytest.mark.slow
def test_two_runs_with_the_same_seed_give_identical_metrics(tiny_data, tmp_path):
    losses = []
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        args = fit_args(tiny_data, "--trainer.deterministic=true", epochs=1)
        assert cli(["fit", *args], tmp_path / name) == 0
        losses.append(scalars(only_run(tmp_path / name / "logs"))["val/loss"])
    assert losses[0] == losses[1]


def _start(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "project", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _wait_for_checkpoint(cwd: Path, proc: subprocess.Popen, after: float = 0.0, timeout: float = 180) -> None:
    """Until a ``last.ckpt`` written after ``after`` (a modification time) exists."""
    deadline = time.monotonic() + timeout
    while not [p for p in cwd.glob("logs/*/*/checkpoints/last.ckpt") if p.stat().st_mtime > after]:
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.2)


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_exits_cleanly(tiny_data, tmp_path):
    proc = _start(["fit", *fit_args(tiny_data, epochs=200)], tmp_path)
    _wait_for_checkpoint(tmp_path, proc)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output[-3000:]
    assert "SIGTERM: stopped at epoch" in output
    run = only_run(tmp_path / "logs")
    stopped = torch.load(run / "checkpoints/last.ckpt", weights_only=True)["global_step"]
    assert cli(["resume", f"--trainer.max_epochs={stopped // 5 + 2}"], tmp_path) == 0
    assert torch.load(run / "checkpoints/last.ckpt", weights_only=True)["global_step"] > stopped


@pytest.mark.slow
def test_sigkill_at_random_moments_always_leaves_a_loadable_checkpoint(tiny_data, tmp_path):
    every_step = ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
                  "--trainer.callbacks.every_n_train_steps=1", "--trainer.callbacks.filename=last",
                  "--trainer.callbacks.enable_version_counter=false"]
    rng = random.Random(0)
    written = 0.0
    for args in (["fit", *fit_args(tiny_data, *every_step, epochs=6)], ["resume"]):
        proc = _start(args, tmp_path)  # killed while training: once fresh, once resumed
        _wait_for_checkpoint(tmp_path, proc, after=written)
        time.sleep(rng.uniform(0.2, 3.0))
        proc.kill()
        proc.wait()
        last = next(tmp_path.glob("logs/*/*/checkpoints/last.ckpt"))
        torch.load(last, weights_only=True)  # never truncated
        written = last.stat().st_mtime
    assert cli(["resume"], tmp_path) == 0
    assert torch.load(next(tmp_path.glob("logs/*/*/checkpoints/last.ckpt")), weights_only=True)["epoch"] == 5


def test_a_preset_that_replaces_the_callbacks_keeps_the_ones_every_run_needs():
    """A preset's ``callbacks:`` replaces train.yaml's list; one without the guards and resilience
    would make the CLI add them with a notice meant for a user's wrong config."""
    from project.cli import REQUIRED_CALLBACKS

    for preset in PRESETS:
        callbacks = (yaml.safe_load(preset.read_text()).get("trainer") or {}).get("callbacks")
        if callbacks is not None:
            present = {c.get("class_path") for c in callbacks}
            assert set(REQUIRED_CALLBACKS) <= present, (preset.name, set(REQUIRED_CALLBACKS) - present)
