"""Wiring: every command, make target, metric name and setting reaches where it is used. Each test
fails on a slip that would otherwise pass unnoticed (a misspelt command path, a target missing from
``make help``, a metric silently averaged, a setting a checkpoint drops)."""

from __future__ import annotations

import importlib
import inspect
import logging
import re
import shutil
import subprocess

import pytest
import torch
from lightning import Trainer
from torch.utils.data import DataLoader, TensorDataset

import project.cli
from project.checkpoints import datamodule_for, load_model, read_checkpoint
from project.cli import main
from project.commands import COMMANDS
from project.data import FolderDataModule
from project.errors import ConfigError
from project.model import ImageClassifier
from tests.conftest import QUICK, REPO, best_ckpt, chdir, cli, fit_args, one_error, only_run, scalars, scratch

MAKEFILE = REPO / "Makefile"


# -- the command table -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_names_a_function_that_exists(name):
    module, _, function = COMMANDS[name].partition(":")
    assert function, f"COMMANDS[{name!r}] = {COMMANDS[name]!r} is not 'module:function'"
    found = getattr(importlib.import_module(module), function, None)
    assert callable(found), f"COMMANDS[{name!r}]: {module} has no function {function!r}"


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_answers_help_with_its_usage(name, capsys, tmp_path):
    with chdir(tmp_path), pytest.raises(SystemExit) as exit_:  # an empty folder: no run to act on
        main([name, "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and f"usage: python -m project {name}" in out, out
    if name in TAKES_FIT_OVERRIDES:  # passed on to the run's config: the help says they exist
        assert "--key=value" in out, out


TAKES_FIT_OVERRIDES = ("evaluate", "resume", "overfit", "lr-find", "find-batch-size", "suspects")


def test_the_top_level_help_lists_every_command_and_lightnings(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    out = capsys.readouterr().out
    listed = re.search(r"^Project commands \(each takes --help\): (.*)$", out, re.M)
    assert exit_.value.code == 0 and listed, out
    assert listed.group(1).split(", ") == list(COMMANDS)
    assert "{fit,validate,test}" in out, out  # Lightning's own, less predict: that name is ours


# -- the Makefile ----------------------------------------------------------------------------------
def make_rules() -> tuple[dict[str, str], set[str]]:
    """The Makefile's rules (target -> its ``## help`` text, "" without one) and its .PHONY names.
    File targets (``$(STAMP)``, paths) are left out: they are not commands."""
    text = MAKEFILE.read_text().replace("\\\n", " ")
    rules: dict[str, str] = {}
    phony: set[str] = set()
    for line in text.splitlines():
        if line.startswith(".PHONY:"):
            phony |= set(line.split(":", 1)[1].split())
        rule = re.match(r"([^\s:=#.$][^\s:=#]*)\s*:(?!=)[^#]*(?:##\s*(.*))?$", line)
        if rule and "/" not in rule.group(1):
            assert rule.group(1) not in rules, f"Makefile: target {rule.group(1)} is defined twice"
            rules[rule.group(1)] = (rule.group(2) or "").strip()
    return rules, phony


def test_every_make_target_has_help_text_and_is_phony():
    rules, phony = make_rules()
    assert {"help", "train", "test", "test-fast"} <= set(rules), sorted(rules)  # the parser sees them
    assert [t for t, text in rules.items() if not text] == [], "targets without '## help text'"
    assert sorted(set(rules) - phony) == [], "targets missing from .PHONY"
    assert sorted(phony - set(rules)) == [], ".PHONY names without a rule"


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_help_lists_every_target_with_its_text():
    rules, _ = make_rules()
    out = subprocess.run(["make", "-s", "-f", MAKEFILE.name, "help"], cwd=MAKEFILE.parent, text=True,
                         capture_output=True, timeout=30, check=True).stdout  # help installs nothing
    listed = dict(re.findall(r"^  (\S+)\s+(.*)$", out, re.M))
    assert listed == rules, out


# -- one value per metric name in an evaluation epoch -------------------------------------------------
class LogsValAccTwice(ImageClassifier):
    """The slip: a second validation result logged under the name the checkpoints follow."""

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        if not self.trainer.sanity_checking:
            self.log("val/acc", 0.0)


def test_a_metric_logged_twice_in_one_validation_epoch_fails_the_run(tiny_data, tmp_path, monkeypatch,
                                                                      capsys):
    monkeypatch.setattr(project.cli, "ImageClassifier", LogsValAccTwice)  # the class the CLI builds
    assert cli(["fit", *fit_args(tiny_data, *QUICK, epochs=1)], tmp_path) == 2
    error = one_error(capsys.readouterr().err)
    assert "metric 'val/acc' is logged twice in one validation epoch" in error, error
    assert "on_validation_epoch_end, twice" in error and "val_<name>/" in error, error


class LogsInValidationStep(ImageClassifier):
    """Validation that also logs ``step_name`` from validation_step (Lightning accumulates it over
    the batches into one epoch value, as the epoch hook's own values)."""

    step_name = "val/extra"

    def validation_step(self, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        super().validation_step(batch, batch_idx)
        self.log(self.step_name, 1.0, batch_size=len(batch[1]))


def test_a_name_logged_from_a_step_and_an_epoch_hook_fails_per_batch_names_pass():
    model = LogsInValidationStep(num_classes=5, weights=None, input=32)
    images = TensorDataset(torch.randn(4, 3, 32, 32), torch.arange(4) % 5)
    loaders = [DataLoader(images, batch_size=2), DataLoader(images, batch_size=2)]
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)
    for name in ("val/extra", "val/extra", "val/loss"):  # an epoch's record does not count in the next
        model.step_name = name  # two loaders: Lightning logs NAME/dataloader_idx_0 and _1, no clash
        results = {k: v for r in trainer.validate(model, loaders, verbose=False) for k, v in r.items()}
        assert {f"{name}/dataloader_idx_0", f"{name}/dataloader_idx_1", "val/acc"} <= set(results)
    # one loader: the step's val/loss and the epoch's would silently replace one another
    with pytest.raises(ConfigError, match=r"metric 'val/loss' is logged twice in one validation epoch "
                                          r"\(by validation_step and on_validation_epoch_end\)"):
        trainer.validate(model, loaders[:1], verbose=False)


# -- settings through a checkpoint -----------------------------------------------------------------
# non-default values, so that a setting the checkpoint drops or a reload resets shows
CHANGED = {"model.label_smoothing": 0.1, "model.head_lr_mult": 5.0, "model.base_batch_size": 16,
           "model.channels_last": False, "data.split_seed": 3, "data.balanced_sampling": True,
           "data.on_bad_image": "error"}
RESET_ON_LOAD = {"weights", "compile", "optimizer", "scheduler"}  # load_model's choice, on purpose


@pytest.fixture(scope="module")
def quick_run(tiny_data, tmp_path_factory):
    """A 2-epoch run (a sanity check and two validation epochs) with the settings of CHANGED."""
    settings = [f"--{key}={str(value).lower() if isinstance(value, bool) else value}"
                for key, value in CHANGED.items()]
    with scratch(tmp_path_factory, "wiring") as cwd:
        assert cli(["fit", *fit_args(tiny_data, *QUICK, *settings)], cwd) == 0
        yield only_run(cwd / "logs")


def test_a_normal_fit_logs_each_validation_metric_once_an_epoch(quick_run):
    # the run passed the guard through its sanity check and two validation epochs
    assert len(scalars(quick_run)["val/acc"]) == 2


def test_every_model_and_data_setting_survives_a_checkpoint(quick_run):
    ckpt = best_ckpt(quick_run)
    stored = read_checkpoint(ckpt)
    model_stored, data_stored = stored["hyper_parameters"], stored["datamodule_hyper_parameters"]
    model_keys = set(inspect.signature(ImageClassifier.__init__).parameters) - {"self"}
    data_keys = set(inspect.signature(FolderDataModule.__init__).parameters) - {"self"}
    assert sorted(model_keys - set(model_stored)) == [], "model settings the checkpoint lacks"
    assert sorted(data_keys - set(data_stored)) == [], "data settings the checkpoint lacks"
    for key, value in CHANGED.items():
        section, name = key.split(".")
        assert (model_stored if section == "model" else data_stored)[name] == value, key
    model = load_model(ckpt)
    reloaded = {k: model.hparams[k] for k in model_keys - RESET_ON_LOAD}
    assert reloaded == {k: model_stored[k] for k in model_keys - RESET_ON_LOAD}
    data = datamodule_for(ckpt, model)
    assert dict(data.hparams) == {**{k: data_stored[k] for k in data_keys}, "cache": "none"}  # one pass


def test_settings_a_checkpoint_holds_but_the_code_does_not_know_are_named(quick_run, tmp_path, caplog):
    ckpt = read_checkpoint(best_ckpt(quick_run))
    ckpt["hyper_parameters"]["made_up_setting"] = 1
    ckpt["datamodule_hyper_parameters"]["made_up_data_setting"] = 2
    torch.save(ckpt, tmp_path / "future.ckpt")
    with caplog.at_level(logging.WARNING, logger="project"):
        model = load_model(tmp_path / "future.ckpt")
    assert "does not know" in caplog.text and "made_up_setting" in caplog.text, caplog.text
    assert "made_up_data_setting" not in caplog.text  # each notice names its own part
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="project"):
        data = datamodule_for(tmp_path / "future.ckpt", model)
    assert "does not know" in caplog.text and "made_up_data_setting" in caplog.text, caplog.text
    assert data.hparams.split_seed == 3 and "made_up_data_setting" not in data.hparams


class LogsTrainingUnderVal(ImageClassifier):
    """The slip: a number computed on training batches, logged under val/."""

    def training_step(self, batch, batch_idx: int):
        loss = super().training_step(batch, batch_idx)
        self.log("val/train_acc", self.train_acc)
        return loss


def test_a_val_metric_from_training_batches_fails_the_run_in_one_line(tiny_data, tmp_path, monkeypatch,
                                                                        capsys):
    monkeypatch.setattr(project.cli, "ImageClassifier", LogsTrainingUnderVal)
    assert cli(["fit", *fit_args(tiny_data, *QUICK, epochs=1)], tmp_path) == 2
    error = one_error(capsys.readouterr().err)
    assert "metric 'val/train_acc' is logged in training: val/ names hold what validation data" in error


@pytest.mark.parametrize(("arg", "says"), [
    ("--data.labls=x.csv", "no such key: --data.labls (did you mean --data.labels?)"),
    ("--model.input.size=abc", "model.input.size=abc is not valid: it takes an integer or null"),
    ("--data.cache=disk", "data.cache=disk is not valid: it takes one of none, memory, auto"),
    ("--model.head.kind=conv", "model.head.kind=conv is not valid: it takes one of linear, mlp"),
])
def test_an_argument_the_parser_refuses_is_one_line_not_its_usage(arg, says, tmp_path, capsys):
    assert cli(["fit", "--config", str(REPO / "configs" / "train.yaml"), arg], tmp_path) == 2
    err = capsys.readouterr().err
    assert one_error(err) == f"error: {says}; python -m project fit --help lists every key"
    assert len(err.splitlines()) == 1 and "usage:" not in err


@pytest.mark.parametrize(("text", "says"), [
    ("data:\n  labls: x.csv\n", "no such key in the config: data.labls (did you mean data.labels?)"),
    ("data:\n  batch_size: [\n", "is not YAML the parser can read (expected the node content"),
    ("data:\n\tbatch_size: 3\n", "found character '\\t' that cannot start any token at line 2"),
])
def test_a_config_file_the_parser_refuses_is_one_line(text, says, tmp_path, capsys):
    config = tmp_path / "mine.yaml"
    config.write_text(text)
    train = REPO / "configs" / "train.yaml"
    assert cli(["fit", "--config", str(train), "--config", str(config)], tmp_path) == 2
    err = capsys.readouterr().err
    assert says in one_error(err) and len(err.splitlines()) == 1
