"""Sweeps: the search space file, a real Optuna study of tiny training runs, pruning, resuming."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path

import optuna
import pytest
import yaml

from project.errors import ConfigError
from project.extras.sweep.space import cli_value, load_space, nested
from project.extras.sweep.study import make_pruner
from tests.conftest import cli, fit_args, scalars, scratch

SPACE = """\
model.lr: {log_uniform: [0.005, 0.05]}
data.augmentation.color_jitter: {uniform: [0.0, 0.3]}
data.augmentation.crop_scale: {choice: [[0.6, 1.0], [0.8, 1.0]]}
"""


SWEEP3 = ["--n_trials", "3", "--seeds", "2", "--study", "demo"]


def _space(tmp: Path, text: str = SPACE) -> Path:
    path = tmp / "space.yaml"
    path.write_text(text)
    return path


def _study(cwd: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{cwd}/logs/sweeps/{name}.db")


# -- The space file -------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "named"), [
    ("model.lr: {log_uniform: [0.0, 0.1]}", "model.lr"),       # a log range cannot start at 0
    ("model.lr: {uniform: [0.1]}", "model.lr"),                # not [low, high]
    ("model.lr: {normal: [0, 1]}", "model.lr"),                # no such distribution
    ("data.augmentation.hflip: {choice: []}", "data.augmentation.hflip"),
    ("model.scheduler.init_args.warmup_epochs: {int: [0.5, 3]}", "warmup_epochs"),
    ("- model.lr", "mapping"),
])
def test_bad_space_entries_name_the_key_and_the_fix(tmp_path, text, named):
    with pytest.raises(ConfigError, match=named) as err:
        load_space(_space(tmp_path, text))
    assert "space.yaml" in str(err.value) or named == "mapping"


def test_missing_space_file_says_what_to_pass(tmp_path):
    with pytest.raises(ConfigError, match="--sweep"):
        load_space(tmp_path / "nope.yaml")


def test_space_samples_every_kind_and_turns_values_into_overrides(tmp_path):
    space = load_space(_space(tmp_path, SPACE + "model.scheduler.init_args.warmup_epochs: {int: [0, 3]}\n"
                              "model.backbone: {choice: [resnet18, mobilenet_v3_small]}\n"))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(5):
        trial = study.ask()
        values = {p.key: p.suggest(trial) for p in space}
        assert 0.005 <= values["model.lr"] <= 0.05 and 0.0 <= values["data.augmentation.color_jitter"] <= 0.3
        assert values["data.augmentation.crop_scale"] in ([0.6, 1.0], [0.8, 1.0])  # lists survive Optuna
        assert values["model.scheduler.init_args.warmup_epochs"] in range(4)
        study.tell(trial, 0.0)
    assert cli_value([0.6, 1.0]) == "[0.6, 1.0]" and cli_value(None) == "null" and cli_value(True) == "true"
    assert nested({"model.optimizer.init_args.weight_decay": 0.1}) == {
        "model": {"optimizer": {"init_args": {"weight_decay": 0.1}}}}


def test_pruner_specs():
    assert isinstance(make_pruner("median:2:0"), optuna.pruners.MedianPruner)
    assert isinstance(make_pruner("halving"), optuna.pruners.SuccessiveHalvingPruner)
    with pytest.raises(ConfigError, match="--pruner"):
        make_pruner("hyperband:x")


def test_the_default_space_fits_the_training_config():
    from project.extras.sweep.space import check_against_config

    repo = Path(__file__).resolve().parents[1]
    check_against_config(load_space(repo / "configs/sweep.yaml"),
                         ["--config", str(repo / "configs/train.yaml")], "configs/sweep.yaml")


def test_unknown_key_fails_before_any_trial(tiny_data, tmp_path, capsys):
    space = _space(tmp_path, SPACE + "model.lrr: {log_uniform: [0.001, 0.1]}\n")
    assert cli(["sweep", "--sweep", str(space), "--n_trials", "2", *fit_args(tiny_data)], tmp_path) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "'model.lrr'" in err and "model.lr" in err
    assert not (tmp_path / "logs").exists()  # no database, no run folder


def test_a_study_continues_only_with_the_settings_it_was_started_with(tiny_data, tmp_path, capsys):
    """The settings are compared as parsed: an edited config file is another study (its name is
    the same), a respelt argument is not."""
    config = tmp_path / "mine.yaml"
    config.write_text("model:\n  label_smoothing: 0.0\n")
    space = _space(tmp_path, SPACE + "model.head_lr_mult: {choice: [3, 10]}\n")
    args = ["sweep", "--sweep", str(space), "--n_trials", "0", "--study", "s",
            *fit_args(tiny_data), "--config", str(config)]
    assert cli(args, tmp_path) == 0  # no trial: the study and its settings only
    assert "searches model.head_lr_mult, which changes nothing from random weights" in capsys.readouterr().out
    # respelt, and nothing a trial's result depends on: a value the space searches, a worker's loaders
    respelt = [a for a in args if not a.startswith("--data.batch_size")] + ["--data.batch_size", "8"]
    assert cli([*respelt, "--model.lr=0.3", "--data.num_workers=1"], tmp_path) == 0
    config.write_text("model:\n  label_smoothing: 0.1\n")
    capsys.readouterr()
    assert cli(args, tmp_path) == 2
    err = capsys.readouterr().err
    assert "study 's' was started with other settings" in err
    assert "config.model.label_smoothing: was 0.0, now 0.1" in err and "--study NEW_NAME" in err


@pytest.mark.slow
def test_a_loss_or_error_metric_is_minimised_unless_told(tiny_data, tmp_path, capsys):
    from project.extras.sweep.command import better

    assert [better(m) for m in ("val/mae_best", "val/acc_best", "val_extra/loss")] == ["min", "max", "min"]
    for metric, direction in (("val/loss", "minimize"), ("val/per_output/mae/age", "minimize"),
                              ("val/macro_f1", "maximize")):
        assert cli(["sweep", "--sweep", str(_space(tmp_path)), "--n_trials", "0", "--study", metric[4:9],
                    "--metric", metric, *fit_args(tiny_data)], tmp_path) == 0
        assert f"{direction} {metric}," in capsys.readouterr().out
        assert _study(tmp_path, metric[4:9]).direction.name == direction.upper()


def test_run_folders_of_a_study_whose_storage_is_gone_are_not_written_into(tiny_data, tmp_path, capsys):
    old = tmp_path / "logs/sweeps/s/trial_000"
    old.mkdir(parents=True)
    (old / "config.yaml").write_text("another study's run")
    assert cli(["sweep", "--sweep", str(_space(tmp_path)), "--n_trials", "1", "--study", "s",
                *fit_args(tiny_data)], tmp_path) == 2
    err = capsys.readouterr().err
    assert "holds run folders (trial_000) of trials that study 's'" in err and "--study NEW_NAME" in err
    assert (old / "config.yaml").read_text() == "another study's run"


def test_a_plot_skipped_now_leaves_no_earlier_one_behind(tmp_path):
    from project.extras.sweep.results import save_plots

    study = optuna.create_study()
    x = optuna.distributions.FloatDistribution(0, 1)
    for value in (0.1, 0.2):  # the same result: no importance to plot
        study.add_trial(optuna.trial.create_trial(params={"x": value}, distributions={"x": x}, value=0.5))
    (tmp_path / "importance.png").write_bytes(b"an earlier report's")
    assert [n.split(":")[0] for n in save_plots(study, tmp_path)] == ["importance.png skipped"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curves.png", "history.png"]


@pytest.mark.parametrize("storage", ["/proc/nope/study.log", "sqlite:////proc/nope/study.db",
                                     "{tmp}/notes.txt/study.log"])
def test_a_storage_whose_folder_cannot_be_made_fails_before_any_trial(storage, tiny_data, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("a file where the storage's folder should be")
    storage = storage.format(tmp=tmp_path)
    assert cli(["sweep", "--sweep", str(_space(tmp_path)), "--n_trials", "2", "--storage", storage,
                *fit_args(tiny_data)], tmp_path) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --storage ") and "pass a file in a folder you can write" in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "logs").exists() and not list(tmp_path.rglob("*.claim"))  # no run, no lock


def test_a_trial_run_reports_to_its_study_through_the_public_storage_api(tmp_path, monkeypatch):
    from project.extras.sweep import pruning
    from project.extras.sweep.study import open_storage, open_study

    url = f"sqlite:///{tmp_path}/study.db"
    study = open_study("s", open_storage(url), "maximize", "median:1:0")
    for value in (0.9, 0.8):  # two finished trials that reached 0.9 and 0.8 at epoch 0
        study.add_trial(optuna.trial.create_trial(value=value, intermediate_values={0: value}))
    trial = study.ask()
    for key, value in ((pruning.ENV_STORAGE, url), (pruning.ENV_STUDY, "s"),
                       (pruning.ENV_TRIAL, str(trial.number)), (pruning.ENV_PRUNER, "median:1:0")):
        monkeypatch.setenv(key, value)
    running = pruning.RunningTrial()
    running.report(0.1, 0)
    assert running.should_prune()  # below the median of the others at epoch 0
    assert optuna.load_study(study_name="s", storage=url).trials[-1].intermediate_values == {0: 0.1}


# -- A real sweep ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sweep3(tiny_data, tmp_path_factory) -> Iterator[tuple[Path, str]]:
    """Three trials of one epoch each on tiny data (the default median pruner waits for three),
    then the best settings again with two more seeds; the sweep's printed output."""
    with scratch(tmp_path_factory, "sweep") as cwd:
        out = io.StringIO()
        with redirect_stdout(out):  # the sweep here, its trials in their own processes
            code = cli(["sweep", "--sweep", str(_space(cwd)), *SWEEP3, *fit_args(tiny_data, epochs=1)], cwd)
        assert code == 0, out.getvalue()[-3000:]
        yield cwd, out.getvalue()


@pytest.mark.slow
def test_sweep_writes_study_runs_table_best_and_plots(sweep3):
    cwd, output = sweep3
    folder = cwd / "logs/sweeps/demo"
    study = _study(cwd, "demo")
    trials = study.get_trials()
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 3  # median waits for 3
    for t in trials:  # one ordinary run folder per trial, TensorBoard logs under one logdir
        run = folder / f"trial_{t.number:03d}"
        assert (run / "config.yaml").is_file() and list(run.glob("events.out.tfevents.*"))
        assert (run / "checkpoints/last.ckpt").is_file()
        config = yaml.safe_load((run / "config.yaml").read_text())
        assert config["model"]["lr"] == pytest.approx(t.params["model.lr"])
        crop_scale = yaml.safe_load(t.params["data.augmentation.crop_scale"])
        assert config["data"]["augmentation"]["crop_scale"] == crop_scale
    with open(folder / "trials.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["trial"]) for r in rows] == [0, 1, 2]
    assert {"value", "state", "duration_s", "model.lr", "data.augmentation.crop_scale"} <= set(rows[0])
    for name in ("history.png", "curves.png"):
        assert (folder / name).stat().st_size > 1000
    best = yaml.safe_load((folder / "best.yaml").read_text())
    assert best["model"]["lr"] == pytest.approx(study.best_trial.params["model.lr"])
    assert "--config logs/sweeps/demo/best.yaml" in output  # the ready command line


@pytest.mark.slow
def test_best_yaml_reproduces_the_best_trial(sweep3, tiny_data, tmp_path):
    cwd, _ = sweep3
    best = _study(cwd, "demo").best_trial
    assert cli(["fit", *fit_args(tiny_data, epochs=1), "--config",
                str(cwd / "logs/sweeps/demo/best.yaml")], tmp_path) == 0
    run = next((tmp_path / "logs").rglob("config.yaml")).parent
    assert max(v for _, v in scalars(run)["val/acc"]) == pytest.approx(best.value, abs=1e-6)


@pytest.mark.slow
def test_seed_runs_of_the_best_settings_and_a_rerun_that_trains_nothing(sweep3, tiny_data, capsys):
    """``--seeds 2`` re-ran the best settings with seeds 43 and 44 and reported mean and
    standard deviation; the same command again starts no trial and reuses both seed runs."""
    cwd, output = sweep3
    with open(cwd / "logs/sweeps/demo/seeds.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["seed"] for r in rows] == ["43", "44"]
    values = [float(r["value"]) for r in rows]
    assert f"mean {sum(values) / 2:.4f}" in output and "std " in output
    best = _study(cwd, "demo").best_trial.number
    config = yaml.safe_load((cwd / f"logs/sweeps/demo/trial_{best:03d}_seed44/config.yaml").read_text())
    assert config["seed_everything"] == 44

    assert cli(["sweep", "--sweep", str(cwd / "space.yaml"), *SWEEP3, *fit_args(tiny_data, epochs=1)],
               cwd) == 0
    again = capsys.readouterr().out
    assert len(_study(cwd, "demo").trials) == 3 and "trial 3:" not in again
    assert "re-running" not in again and f"mean {sum(values) / 2:.4f}" in again


@pytest.mark.slow
def test_pruner_stops_a_trial_with_lr_zero(tiny_data, tmp_path, capsys):
    """Two earlier trials reached 0.9 by epoch 0; a trial that cannot learn (LR 0) is stopped
    after its first epoch of three, and recorded as PRUNED."""
    storage = f"sqlite:///{tmp_path}/logs/sweeps/prune.db"
    (tmp_path / "logs/sweeps").mkdir(parents=True)
    study = optuna.create_study(study_name="prune", storage=storage, direction="maximize")
    lr = optuna.distributions.FloatDistribution(0.0, 0.1)
    for _ in range(2):
        study.add_trial(optuna.trial.create_trial(params={"model.lr": 0.05}, distributions={"model.lr": lr},
                                                  value=0.95, intermediate_values={0: 0.9, 1: 0.95}))
    study.enqueue_trial({"model.lr": 0.0})
    space = _space(tmp_path, "model.lr: {uniform: [0.0, 0.1]}\n")
    assert cli(["sweep", "--sweep", str(space), "--study", "prune", "--n_trials", "3",
                "--pruner", "median:2:0", *fit_args(tiny_data, epochs=3)], tmp_path) == 0
    trial = _study(tmp_path, "prune").trials[2]
    assert trial.params["model.lr"] == 0.0 and trial.state == optuna.trial.TrialState.PRUNED
    assert list(trial.intermediate_values) == [0]  # stopped after epoch 0 of 3
    run = tmp_path / "logs/sweeps/prune/trial_002"
    assert len(scalars(run)["val/acc"]) == 1
    assert "PRUNED" in capsys.readouterr().out


@pytest.mark.slow
def test_a_sweep_stopped_by_failed_trials_still_writes_its_table(tiny_data, tmp_path, capsys):
    space = _space(tmp_path, "model.backbone: {choice: [resnet18x]}\n")  # parses, fails when built
    assert cli(["sweep", "--sweep", str(space), "--study", "bad", "--n_trials", "2", "--max_failures", "1",
                *fit_args(tiny_data, epochs=1)], tmp_path) == 2
    captured = capsys.readouterr()
    assert "1 trials in a row failed" in captured.err
    assert "1 trials: 0 complete, 0 pruned, 1 failed" in captured.out
    with open(tmp_path / "logs/sweeps/bad/trials.csv") as f:
        assert [r["state"] for r in csv.DictReader(f)] == ["FAIL"]
