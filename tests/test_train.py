"""The training path through the command line: what a run logs and saves, resume, bad input."""

from __future__ import annotations

import csv
import shutil

import pytest
import torch
import yaml

from project.cli import ProjectCLI
from project.tasks.single.metrics import summary_metrics
from tests.conftest import (
    CLASSES,
    QUICK,
    TRAIN_CONFIG,
    best_ckpt,
    cli,
    fit_args,
    one_error,
    only_run,
    run_cli,
    scalars,
)


def test_a_run_logs_the_overview_first_and_per_class_series_after_it(trained_run):
    series = scalars(trained_run)
    for tag in ("train/loss", "train/acc", "train/lr", "val/loss", "val/acc", "val/acc_best",
                "val/macro_acc", "val/macro_f1",
                *(f"val/per_class/{k}/{c}" for k in ("precision", "recall", "f1") for c in CLASSES)):
        assert tag in series, f"{tag} missing from {sorted(series)}"
    assert len(series["val/acc"]) == 3  # one point per epoch
    assert series["val/acc_best"][-1][1] == max(v for _, v in series["val/acc"])
    # TensorBoard opens the first two tag groups: every chart is in train/ or val/ (no `epoch`)
    assert {tag.split("/")[0] for tag in series} == {"train", "val"}
    assert sorted(t for t in series if t.startswith("train/")) == ["train/acc", "train/loss", "train/lr"]
    lrs = [v for _, v in series["train/lr"]]
    # 5 steps an epoch, 15 in all: the 3-epoch warmup is clipped to 20 % of the run (3 steps), from
    # 1 % of the LR, then a cosine to 0 (pretrained weights absent: the head's LR equals this one)
    assert lrs[0] == pytest.approx(1e-4) and max(lrs) == pytest.approx(0.01, rel=0.01)
    peak = lrs.index(max(lrs))
    assert lrs[:peak + 1] == sorted(lrs[:peak + 1]) and lrs[peak:] == sorted(lrs[peak:], reverse=True)


def test_a_run_keeps_its_settings_checkpoints_and_dashboards(trained_run):
    hparams = yaml.safe_load((trained_run / "hparams.yaml").read_text())
    assert hparams["model/backbone"] == "resnet18" and hparams["data/batch_size"] == 8
    assert hparams["pretrained"] is False and hparams["effective_lr"] == 0.01
    ckpts = trained_run / "checkpoints"
    assert (ckpts / "last.ckpt").is_file() and best_ckpt(trained_run).is_file()
    for path in (ckpts / "last.ckpt", best_ckpt(trained_run)):
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        assert ckpt["hyper_parameters"]["class_names"] == CLASSES
        assert ckpt["hyper_parameters"]["head"] == {"kind": "linear", "hidden": 512, "dropout": 0.0}
        assert {"state_dict", "optimizer_states", "lr_schedulers", "epoch", "rng_states"} <= ckpt.keys()

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = EventAccumulator(str(trained_run), size_guidance={"images": 0, "tensors": 0})
    acc.Reload()
    assert set(acc.Tags()["images"]) == {"val/per_class/confusion_matrix"}  # grids: the analysis preset
    assert len(acc.Images("val/per_class/confusion_matrix")) == 3
    assert acc.Images("val/per_class/confusion_matrix")[0].encoded_image_string.startswith(b"\x89PNG")
    assert "val/confused_pairs/text_summary" in acc.Tags()["tensors"]
    assert "input/first_batch/text_summary" in acc.Tags()["tensors"]  # text, not one-dot charts
    content = acc.PluginTagToContent("hparams")
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert [m.name.tag for m in experiment.metric_infos] == summary_metrics(5)
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    assert start.session_start_info.hparams["model/backbone"].string_value == "resnet18"


def test_resume_continues_the_run_and_its_loggers_in_the_same_folder(tiny_data, tmp_path, capsys):
    """Two loggers (TensorBoard and CSV), AdamW, one epoch on one folder (the split is drawn), then
    ``resume`` for a second, given the run by its absolute path (the checkpoint stored it relative)."""
    flat = shutil.copytree(tiny_data / "train", tmp_path / "flat")
    loggers = ('--trainer.logger=[{"class_path": "project.callbacks.dashboards.TensorBoard", '
               '"init_args": {"save_dir": "logs", "name": "two"}}, {"class_path": '
               '"lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "logs", "name": "two"}}]')
    adamw = "--model.optimizer=torch.optim.AdamW"
    assert cli(["fit", *fit_args(flat, *QUICK, loggers, adamw, epochs=1)], tmp_path) == 0
    run = tmp_path / "logs" / "two" / "version_0"
    config = (run / "config.yaml").read_text()
    assert {"metrics.csv", "config.yaml", "hparams.yaml", "checkpoints"} <= {p.name for p in run.iterdir()}
    steps = torch.load(run / "checkpoints/last.ckpt", weights_only=True)["global_step"]
    # the checkpoint's model, optimiser and schedule continue: other settings are refused, not dropped
    for change in ("--model.lr=0.5", "--model.backbone=resnet34"):
        assert cli(["resume", change, "--trainer.max_epochs=2"], tmp_path) == 2
        error = one_error(capsys.readouterr().err)
        assert f"{change[2:]} (it has " in error and "would be ignored" in error
    for change in ("--data.split_seed=5", "--data.val_fraction=0.3", "--data.test_fraction=0.2"):
        assert cli(["resume", change, "--trainer.max_epochs=2"], tmp_path) == 2  # would mix the splits
        error = one_error(capsys.readouterr().err)
        assert f"{change[2:]} (drawn with " in error and "would mix its training images" in error
    assert sorted(p.name for p in run.glob("metrics*.csv")) == ["metrics.csv"]  # nothing moved
    assert (run / "config.yaml").read_text() == config
    best = sorted(run.glob("checkpoints/best-*.ckpt"))
    assert cli(["resume", str(run.resolve()), "--trainer.max_epochs=2"], tmp_path) == 0
    now = sorted(run.glob("checkpoints/best-*.ckpt"))  # the best so far was remembered: one best file

    def acc(path) -> float:
        return float(path.stem.rsplit("acc", 1)[1])

    assert len(best) == len(now) == 1 and (now == best or acc(now[0]) > acc(best[0]))
    assert sorted(p.name for p in (tmp_path / "logs" / "two").iterdir()) == ["version_0"]
    ckpt = torch.load(run / "checkpoints/last.ckpt", weights_only=True)
    assert ckpt["epoch"] == 1 and ckpt["global_step"] == 2 * steps
    # AdamW counts its steps: a re-initialised optimiser would only have the second epoch's
    assert {float(s["step"]) for s in ckpt["optimizer_states"][0]["state"].values()} == {2.0 * steps}
    def epochs(name: str) -> set[str]:
        return {row["epoch"] for row in csv.DictReader((run / name).open()) if row.get("val/acc")}

    # Lightning's CSV logger starts its file afresh; the first session's rows are kept beside it
    assert epochs("metrics-0.csv") == {"0"} and epochs("metrics.csv") == {"1"}
    assert len(scalars(run)["val/acc"]) == 2


@pytest.mark.parametrize(("args", "message"), [
    (["--data.data_dir=MISSING"], "error: data.data_dir 'MISSING' does not exist"),
    (["--model.input.size=0"], "error: model.input.size must be an integer >= 1, got 0"),
    (["--data.augmentation.hflip=2"], "error: data.augmentation.hflip must be in [0, 1], got 2.0"),
    (["--model.head.kind=mlp", "--model.head.dropout=1.5"], "error: model.head: kind must be linear or mlp"),
    (["--model.head_dropout=0.1"], "error: model.head_dropout is now model.head.dropout: rename it"),
    (["--model.mean=[0.5,0.5,0.5]"], "error: model.mean is now model.input.mean: rename it (model.input"),
    (["--model.input.crop_ratio=1.5"], "error: model.input.crop_ratio must be in (0, 1]"),
    (["--model.backbone=vit_b_16", "--model.weights=null"],  # a fixed-size model at 32 px
     "error: model.backbone vit_b_16 cannot take 32 px images (model.input.size): it needs 224 px: set "
     "model.input.size=224"),
])
def test_bad_settings_fail_in_one_line_before_any_work(tiny_data, tmp_path, capsys, args, message):
    assert cli(["fit", *fit_args(tiny_data), *args], tmp_path) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(message) and "Traceback" not in "\n".join(err)
    assert not (tmp_path / "logs").exists()


def test_unknown_key_and_wrong_type_fail_naming_the_key(tiny_data, tmp_path, capsys):
    assert cli(["fit", *fit_args(tiny_data), "--model.learning_rate=0.1"], tmp_path) != 0
    assert cli(["fit", *fit_args(tiny_data), "--trainer.max_epochs=many"], tmp_path) != 0
    err = capsys.readouterr().err
    assert "learning_rate" in err and "max_epochs" in err and "Traceback" not in err
    assert not (tmp_path / "logs").exists()


def test_commands_on_missing_or_foreign_checkpoints_fail_in_one_line(trained_run, tmp_path, capsys):
    assert cli(["resume"], tmp_path) == 2
    assert "error: no run with checkpoints under 'logs/'" in capsys.readouterr().err
    notes = tmp_path / "notes.pth"
    notes.write_text("not a checkpoint at all\n" * 20)
    for command in (["evaluate", str(notes)], ["test", "--config", str(TRAIN_CONFIG), f"--ckpt_path={notes}"],
                    ["predict", "--ckpt_path", str(notes), "--input", str(tmp_path)],
                    ["export", "--ckpt_path", str(notes)]):
        assert cli(command, tmp_path) == 2, command
        err = capsys.readouterr().err
        assert f"error: '{notes}' is not a readable checkpoint" in err and "Traceback" not in err, err


def test_a_checkpoint_of_other_classes_is_refused_before_any_work(trained_run, tiny_data, tmp_path, capsys):
    from project.data.demo import make_demo

    other = make_demo(tmp_path / "other", 2, 1, 1, image_size=32, num_classes=4)
    ckpt = trained_run / "checkpoints" / "last.ckpt"
    for command in ("fit", "test"):
        assert cli([command, *fit_args(other), f"--ckpt_path={ckpt}"], tmp_path) == 2
        assert "only in the checkpoint: ['square']" in capsys.readouterr().err
    assert not (tmp_path / "logs").exists()


def test_the_cli_adjusts_what_this_machine_cannot_run(tiny_data, monkeypatch, caplog):
    import project.cli

    def parsed(*args: str):
        return ProjectCLI(args=[*fit_args(tiny_data), *args], run=False).config.trainer

    monkeypatch.setattr(project.cli, "cpu_has_bfloat16", lambda: False)
    assert parsed().precision == "32-true"
    assert "becomes 32-true: emulated bf16 runs ~6x slower" in caplog.text
    monkeypatch.setattr(project.cli, "cpu_has_bfloat16", lambda: True)
    assert parsed().precision == "16-mixed"  # Lightning then runs bf16 autocast on the CPU
    assert parsed("--trainer.sync_batchnorm=true").sync_batchnorm is False
    config = ProjectCLI(args=[*fit_args(tiny_data), "--trainer.callbacks=[]"], run=False).config
    assert [c.class_path for c in config.trainer.callbacks] == [
        "project.callbacks.guards.Guards", "project.callbacks.resilience.Resilience"]
    assert "added callbacks that every training run needs" in caplog.text
    assert config.data.seed == 42  # the training draw follows seed_everything


def test_print_config_shows_the_callbacks_of_train_yaml(capsys, tmp_path):
    assert cli(["fit", "--config", str(TRAIN_CONFIG), "--print_config"], tmp_path) == 0
    printed = yaml.safe_load(capsys.readouterr().out)["trainer"]["callbacks"]
    listed = yaml.safe_load(TRAIN_CONFIG.read_text())["trainer"]["callbacks"]
    assert [c["class_path"] for c in printed] == [c["class_path"] for c in listed]
    assert len(listed) <= 10


def test_the_command_line_trains_from_a_new_process(tiny_data, tmp_path):
    """The one start of ``python -m project`` in this tier: the entry point, as a user runs it."""
    result = run_cli(["fit", *fit_args(tiny_data, *QUICK, epochs=1)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (only_run(tmp_path / "logs") / "checkpoints" / "last.ckpt").is_file()
    assert "Run finished after 1 epochs" in result.stdout
    assert "Warning" not in result.stderr.replace("WARNING: pretrained", "")  # no parser or library noise


def test_files_of_the_wrong_kind_are_one_line_and_leave_nothing(tiny_data, tmp_path, capsys):
    """A text file as weights or as an ONNX model, a binary file as the labels table."""
    text, binary = tmp_path / "notes.pth", tmp_path / "table.csv"
    text.write_text("hello notes\n")
    binary.write_bytes(bytes(range(128, 256)) * 4)
    for args, says in (([f"--model.weights={text}"], "is not a readable state dict"),
                       ([f"--data.labels={binary}"], "is not a text table in UTF-8")):
        assert cli(["fit", *fit_args(tiny_data), *args], tmp_path) == 2
        assert says in one_error(capsys.readouterr().err), args
    assert cli(["serve", "--onnx", str(text)], tmp_path) == 2
    assert "is not an ONNX model ONNX Runtime can load" in one_error(capsys.readouterr().err)
    assert not (tmp_path / "logs").exists()


def test_macro_f1_weighs_each_class_and_is_not_accuracy():
    """A model that always answers the majority class: accuracy 0.75, macro F1 far lower."""
    from project.tasks.single.metrics import StageMetrics

    metrics = StageMetrics("val", ["a", "b", "c"])
    target = torch.tensor([0, 0, 0, 0, 0, 0, 1, 2])
    metrics.update(torch.nn.functional.one_hot(torch.zeros(8, dtype=torch.long), 3).float(), target,
                   torch.tensor(1.0))
    values = metrics.compute()
    assert float(values["val/acc"]) == 0.75
    assert float(values["val/macro_f1"]) == pytest.approx((2 * 0.75 / 1.75) / 3)  # a's F1; b and c: 0


def test_confused_pairs_share_is_of_the_true_class():
    from project.tasks.single.views import confused_pairs

    pairs = confused_pairs(torch.tensor([[8, 2, 0], [0, 0, 0], [3, 0, 1]]), ["a", "b", "c"])
    assert [(p["true"], p["predicted"], p["count"]) for p in pairs] == [("c", "a", 3), ("a", "b", 2)]
    assert [p["share_of_true"] for p in pairs] == [0.75, 0.2]  # 3 of c's 4 images; 2 of a's 10


def test_a_new_run_is_not_put_in_a_folder_with_another_run_s_checkpoints(tiny_data, tmp_path, capsys):
    """``fit --run_dir RUN`` of a run that trained: its best, config and last.ckpt would be mixed
    with the new run's; refused before any work, naming resume."""
    run = tmp_path / "old"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "best-epoch01-acc0.5000.ckpt").write_bytes(b"a checkpoint")
    assert cli(["fit", *fit_args(tiny_data), "--run_dir", str(run)], tmp_path) == 2
    assert "holds another run's checkpoints" in one_error(capsys.readouterr().err)
    assert sorted(p.name for p in run.rglob("*")) == ["best-epoch01-acc0.5000.ckpt", "checkpoints"]
