"""What a run does is visible in its config: callbacks, guards added back, checkpoint names,
range checks, and the DDP preset on a laptop."""

from __future__ import annotations

import pytest
import yaml

from project.callbacks import REQUIRED_CALLBACKS
from project.errors import ConfigError
from tests.conftest import REPO, TRAIN_CONFIG, fit_args, only_run, run_cli


def _class_paths(entries) -> list[str]:
    return [e["class_path"] for e in entries]


def test_print_config_lists_every_callback_of_a_run(tmp_path):
    result = run_cli(["fit", "--config", str(TRAIN_CONFIG), "--print_config"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    printed = yaml.safe_load(result.stdout)["trainer"]
    listed = _class_paths(yaml.safe_load(TRAIN_CONFIG.read_text())["trainer"]["callbacks"])
    assert _class_paths(printed["callbacks"]) == listed
    assert set(REQUIRED_CALLBACKS) <= set(listed)
    for name in ("Dashboards", "GradNormLogger", "DataWaitMonitor", "OverfitHint", "RunSummary",
                 "TestReport", "BadImageReport", "LearningRateMonitor"):
        assert any(p.endswith("." + name) for p in listed), name
    assert _class_paths(printed["plugins"]) == ["project.callbacks.resilience.AtomicCheckpointIO"]


def test_a_run_without_the_guards_adds_them_and_says_so(tiny_data, tmp_path):
    result = run_cli(["fit", *fit_args(tiny_data, "--trainer.callbacks=[]", epochs=1)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    notice = next(line for line in result.stderr.splitlines() if "Notice: added callbacks" in line)
    for path in REQUIRED_CALLBACKS:
        assert path.rsplit(".", 1)[1] in notice
    saved = yaml.safe_load((only_run(tmp_path / "logs") / "config.yaml").read_text())
    assert set(REQUIRED_CALLBACKS) <= set(_class_paths(saved["trainer"]["callbacks"]))


def test_periodic_checkpoint_has_the_documented_name(tiny_data, tmp_path):
    result = run_cli(["fit", *fit_args(tiny_data, "--trainer.limit_train_batches=1",
                                       "--trainer.limit_val_batches=1", epochs=5)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    names = {p.name for p in (only_run(tmp_path / "logs") / "checkpoints").glob("*.ckpt")}
    assert "epoch04.ckpt" in names and "last.ckpt" in names


def test_out_of_range_model_setting_fails_in_one_line(tiny_data, tmp_path):
    result = run_cli(["fit", *fit_args(tiny_data, "--model.lr=-1", epochs=1)], cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "model.lr" in errors[0], result.stderr[-2000:]
    assert not (tmp_path / "logs").exists()  # nothing half-written


@pytest.mark.parametrize("setting", [
    "--model.lr=-1", "--model.head_lr_mult=0", "--model.label_smoothing=1.5",
    "--model.warmup_epochs=-2", "--model.base_batch_size=0",
])
def test_out_of_range_model_settings_fail_naming_the_key(tiny_data, tmp_path, monkeypatch, setting):
    """The CLI's own parser and classes, in this process (the error the command prints is the
    message of this ConfigError, as the test above shows once)."""
    from project.cli import ProjectCLI

    monkeypatch.chdir(tmp_path)
    key = setting.split("=")[0].removeprefix("--")
    with pytest.raises(ConfigError) as err:
        ProjectCLI(args=fit_args(tiny_data, setting, epochs=1), run=False)
    assert str(err.value).startswith(key) and "\n" not in str(err.value), str(err.value)
    assert not (tmp_path / "logs").exists()  # nothing half-written


@pytest.mark.distributed
def test_ddp_preset_runs_on_cpu_with_sync_batchnorm_turned_off(tiny_data, tmp_path):
    result = run_cli(["fit", *fit_args(tiny_data, "--config", str(REPO / "configs/presets/ddp.yaml"),
                                       "--trainer.accelerator=cpu", "--trainer.devices=2",
                                       "--trainer.limit_train_batches=2",
                                       "--trainer.limit_val_batches=1", epochs=1)],
                     cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "sync_batchnorm turned off" in result.stderr
    assert "SyncBatchNorm layers only work with GPU" not in result.stderr


def test_profile_preset_leaves_no_checkpoint_for_later_commands_to_pick(tiny_data, tmp_path):
    result = run_cli(["fit", *fit_args(tiny_data, "--config", str(REPO / "configs/presets/profile.yaml"),
                                       "--trainer.limit_train_batches=2",
                                       "--trainer.limit_val_batches=1")], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "logs" / "profile").is_dir()
    assert not list((tmp_path / "logs").rglob("*.ckpt"))


def test_inference_lists_images_exactly_as_training_does(tmp_path):
    from project.common.files import list_images
    from project.deploy.infer import image_paths
    from project.deploy.predict import input_files

    root = tmp_path / "images"
    (root / "a").mkdir(parents=True)
    (root / ".hidden").mkdir()
    (tmp_path / "elsewhere").mkdir()
    for path in (root / "a" / "x.png", root / "a" / ".y.png", root / ".hidden" / "z.png",
                 tmp_path / "elsewhere" / "w.JPG", root / "a" / "notes.txt"):
        path.write_bytes(b"")
    (root / "linked").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    expected = [str(root / "a" / "x.png"), str(root / "linked" / "w.JPG")]
    assert list_images(root) == expected  # hidden files and folders skipped, links followed
    assert image_paths(root) == expected == input_files(root)
