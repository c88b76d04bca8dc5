"""End to end through the real CLI: fit, TensorBoard logs, checkpoints, resume, bad input."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import fit_args, only_run, run_cli, scalars


def test_fit_logs_metrics_and_writes_loadable_checkpoints(tiny_data, tmp_path):
    result = run_cli(["fit", *fit_args(tiny_data)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = only_run(tmp_path / "logs")
    series = scalars(run)
    for tag in ("train/loss", "train/acc", "val/loss", "val/acc", "val/f1_macro",
                "lr-SGD/backbone", "lr-SGD/head"):
        assert tag in series, f"{tag} missing from {sorted(series)}"
    assert len(series["val/acc"]) == 2  # one point per epoch
    # without pretrained weights every layer is new: the head gets no larger LR
    assert series["lr-SGD/head"] == series["lr-SGD/backbone"]
    lrs = [v for _, v in series["lr-SGD/backbone"]]
    # 6 steps: the 3-epoch warmup is clipped to 20 % of the run (1 step), then cosine
    assert lrs[0] == pytest.approx(1e-4) and lrs[1] == pytest.approx(0.01)
    assert lrs[1:] == sorted(lrs[1:], reverse=True)
    assert "warmup of 3 epochs (9 steps) clipped to 1 steps" in result.stderr

    ckpts = run / "checkpoints"
    best = list(ckpts.glob("best-*.ckpt"))
    assert (ckpts / "last.ckpt").is_file() and len(best) == 1
    for path in (ckpts / "last.ckpt", best[0]):
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        assert ckpt["hyper_parameters"]["class_names"] == ["checker", "circle", "cross"]
        assert {"state_dict", "optimizer_states", "lr_schedulers", "epoch"} <= ckpt.keys()
    assert "best checkpoint" in result.stdout and str(best[0].name) in result.stdout


def test_resume_continues_same_run_with_optimizer_state(tiny_data, tmp_path):
    args = fit_args(tiny_data, "--model.optimizer=torch.optim.AdamW", epochs=1)
    first = run_cli(["fit", *args], cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    run = only_run(tmp_path / "logs")
    steps_per_epoch = torch.load(run / "checkpoints/last.ckpt", weights_only=True)["global_step"]

    resumed = run_cli(["resume", "--trainer.max_epochs=2"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert only_run(tmp_path / "logs") == run  # same folder: the curves continue
    ckpt = torch.load(run / "checkpoints/last.ckpt", weights_only=True)
    assert ckpt["epoch"] == 1 and ckpt["global_step"] == 2 * steps_per_epoch
    # AdamW counts its steps: a re-initialised optimiser would only have the second epoch's.
    adam_steps = {float(s["step"]) for s in ckpt["optimizer_states"][0]["state"].values()}
    assert adam_steps == {2.0 * steps_per_epoch}
    val_points = [step for step, _ in scalars(run)["val/acc"]]
    assert len(val_points) == 2 and val_points[0] < val_points[1]


def test_resume_without_checkpoint_is_an_error(tmp_path):
    result = run_cli(["resume"], cwd=tmp_path)
    assert result.returncode == 2
    assert "error: no run with checkpoints under 'logs/'" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "logs").exists()


def test_wrong_data_dir_fails_with_one_clear_line(tmp_path):
    result = run_cli(["fit", *fit_args(tmp_path / "nope")], cwd=tmp_path)
    assert result.returncode == 2
    assert f"error: data.data_dir '{tmp_path / 'nope'}' does not exist" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "logs").exists()


def test_unknown_config_key_fails_naming_the_key(tiny_data, tmp_path):
    result = run_cli(["fit", *fit_args(tiny_data), "--model.learning_rate=0.1"], cwd=tmp_path)
    assert result.returncode != 0
    assert "learning_rate" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "logs").exists()
