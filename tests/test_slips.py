"""Slips at the seams of the command line and the own-network backbone (fast tier), each a test
that fails when the slip comes back: an unknown or broken command, an own network's head_name or
weights, an optimizer LR nothing reads, a printed setting the fuzz does not know."""

from __future__ import annotations

import pytest
import torch
import yaml

import project.cli
import project.commands
from project.cli import ProjectCLI
from project.model import backbones
from tests import own_backbone
from tests.conftest import QUICK, TRAIN_CONFIG, cli, fit_args, one_error
from tests.test_fuzz import BAD, KINDS, VALID, flat

OWN = "tests.own_backbone:tiny_net"


def test_an_unknown_command_is_one_line_with_the_nearest_and_every_command(tmp_path, capsys):
    assert cli(["stat"], tmp_path) == 2
    line = one_error(capsys.readouterr().err)
    assert line.startswith("error: 'stat' is not a command; did you mean test? Commands: fit, validate, "
                           "test, ")
    assert all(name in line for name in project.commands.COMMANDS)
    assert cli(["zzzz", "--config", "x.yaml"], tmp_path) == 2  # nothing near: no guess
    assert one_error(capsys.readouterr().err).startswith("error: 'zzzz' is not a command. Commands: fit, ")


@pytest.mark.parametrize(("entry", "cause"), [
    ("project.no_such_module:main", "ModuleNotFoundError: No module named 'project.no_such_module'"),
    ("broken_command_module:main", "SyntaxError: "),
    ("project.resume:mian", "AttributeError: "),
])
def test_a_command_that_does_not_load_is_one_line_naming_it(entry, cause, tmp_path, capsys, monkeypatch):
    (tmp_path / "broken_command_module.py").write_text("def main(argv):\n    return (\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(project.commands.COMMANDS, "broken", entry)
    assert cli(["broken", "--help"], tmp_path) == 2
    line = one_error(capsys.readouterr().err)
    assert line.startswith(f"error: command 'broken' cannot start: {entry} does not load") and cause in line


def test_an_own_head_name_that_names_no_layer_is_one_line_listing_the_layers(tiny_data, tmp_path, capsys):
    args = fit_args(tiny_data, "--model.backbone=tests.own_backbone:misnamed_head_net", epochs=1)
    assert cli(["fit", *args], tmp_path) == 2
    line = one_error(capsys.readouterr().err)
    assert "head_name 'fc' names no layer of Sequential (its layers there: 0, 1, 2, 3, 4, 5)" in line


def test_an_own_head_that_cannot_be_replaced_says_why_without_contradiction():
    with pytest.raises(backbones.WeightsError) as mlp:  # (a) a 1x1-conv head: linear, not mlp
        backbones.build("tests.own_backbone:conv_head_net", None, 5, backbones.Head.of("mlp"), 32)
    assert ("model.head=mlp needs a linear classification layer; Sequential's '2' is a Conv2d, which only "
            "model.head=linear replaces") in str(mlp.value)
    assert backbones.build("tests.own_backbone:conv_head_net", None, 5, backbones.Head.of("linear"), 32)
    with pytest.raises(backbones.WeightsError) as other:  # (b) neither Linear nor Conv2d
        backbones.build("tests.own_backbone:wrapped_head_net", None, 5, backbones.Head.of("linear"), 32)
    message = str(other.value)
    assert "'4' is a Sequential, neither nn.Linear nor nn.Conv2d; head_name must name its last" in message
    assert "use model.head=linear" not in message


def known_tiny_net() -> dict[str, torch.Tensor]:
    """A tiny_net's tensors, each filled with values no initialisation draws."""
    state = own_backbone.tiny_net().state_dict()
    return {k: torch.arange(v.numel(), dtype=v.dtype).reshape(v.shape) / 7 + 0.5
            if v.is_floating_point() else v for k, v in state.items()}


@pytest.mark.parametrize("shape", ["state dict", "template checkpoint"])
def test_own_network_weights_reach_the_model_through_the_strict_loader(shape, tmp_path):
    state = known_tiny_net()
    saved = state if shape == "state dict" else {"state_dict": {f"net.{k}": v for k, v in state.items()}}
    torch.save(saved, tmp_path / "own.pth")
    net = backbones.build(OWN, str(tmp_path / "own.pth"), 5, image_size=32).net
    for key in ("0.weight", "0.bias", "1.weight", "1.running_mean"):  # the body, not the new head
        torch.testing.assert_close(net.state_dict()[key], state[key])
    assert net[5].out_features == 5


@pytest.mark.parametrize("slip", ["wrong shape", "missing"])
def test_own_network_weights_that_do_not_fit_are_one_line_naming_the_tensor(slip, tiny_data, tmp_path,
                                                                           capsys):
    state = known_tiny_net()
    if slip == "wrong shape":
        state["0.weight"] = torch.zeros(8, 3, 5, 5)
    else:
        del state["0.weight"]
    torch.save(state, tmp_path / "own.pth")
    args = fit_args(tiny_data, f"--model.backbone={OWN}", f"--model.weights={tmp_path / 'own.pth'}", epochs=1)
    assert cli(["fit", *args], tmp_path) == 2
    line = one_error(capsys.readouterr().err)
    assert f"model.weights file '{tmp_path / 'own.pth'}' does not fit {OWN}" in line and "'0.weight'" in line
    assert not (tmp_path / "logs").exists()


def test_an_optimizer_lr_that_nothing_reads_is_refused_naming_model_lr(tiny_data, tmp_path, capsys):
    args = fit_args(tiny_data, "--model.optimizer.init_args.lr=0.5", epochs=1)
    assert cli(["fit", *args], tmp_path) == 2
    line = one_error(capsys.readouterr().err)
    assert "model.optimizer.init_args.lr=0.5 is not read" in line and "set model.lr=0.5 instead" in line
    # what every saved config.yaml holds (SGD's own default), or model.lr itself, is no conflict
    for lr in ("0.001", "0.01"):
        assert ProjectCLI(args=fit_args(tiny_data, f"--model.optimizer.init_args.lr={lr}"), run=False).model


def test_every_printed_key_has_a_kind(tmp_path, capsys):
    """tests/test_fuzz.py tries bad values of every key in KINDS (slow tier); a key the config
    grows without an entry would go untried, so this check runs in the fast tier."""
    assert cli(["fit", "--config", str(TRAIN_CONFIG), "--print_config"], tmp_path) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    keys = flat(printed["model"], "model.") + flat(printed["data"], "data.")
    assert sorted(keys) == sorted(KINDS), set(keys) ^ set(KINDS)
    assert not [(k, v) for k, v in VALID if v not in BAD[KINDS[k]]], "VALID names a value BAD lacks"



@pytest.mark.parametrize(("setting", "says"), [
    ("--model.optimizer.init_args.differentiable=true", "model.optimizer: a leaf Variable"),
    ("--model.scheduler.init_args.last_epoch=3", "model.scheduler: "),
    ("--model.scheduler=torch.optim.lr_scheduler.ReduceLROnPlateau", "ReduceLROnPlateau steps on a metric"),
])
def test_an_optimizer_or_schedule_that_fails_at_its_first_step_is_one_line_before_the_run(
        setting, says, tiny_data, tmp_path, capsys):
    assert cli(["fit", *fit_args(tiny_data, *QUICK, setting, epochs=1)], tmp_path) == 2
    assert says in one_error(capsys.readouterr().err)
    assert not (tmp_path / "logs").exists()


def test_evaluate_on_a_folder_without_checkpoints_says_what_is_missing(tmp_path, capsys):
    (tmp_path / "logs" / "mine" / "version_0").mkdir(parents=True)
    assert cli(["evaluate", "logs/mine/version_0"], tmp_path) == 2
    line = one_error(capsys.readouterr().err)
    assert "holds no checkpoint" in line and "best-*.ckpt" in line and "resume" not in line


def test_a_callback_list_that_replaced_the_checkpoints_is_named_at_the_start(tiny_data, tmp_path, caplog):
    """``callbacks:`` where ``callbacks+:`` was meant drops train.yaml's checkpoints: the run would
    end without the best checkpoint and last.ckpt that evaluate, export and resume look for."""
    mine = tmp_path / "mine.yaml"
    mine.write_text("trainer:\n  callbacks:\n    - class_path: project.callbacks.summary.RunSummary\n")
    caplog.set_level("INFO", logger="project")
    assert cli(["fit", *fit_args(tiny_data, *QUICK, f"--config={mine}", epochs=1)], tmp_path) == 0
    assert "no checkpoint callback writes the best or last.ckpt checkpoint" in caplog.text
    assert "configs/train.yaml's trainer.callbacks has them" in caplog.text and "`callbacks+:`" in caplog.text
    caplog.clear()
    built = ProjectCLI(args=fit_args(tiny_data, *QUICK, epochs=1), run=False)
    project.cli.notice_missing_checkpoints(built.trainer, "val/acc")  # train.yaml's own list: no notice
    assert "no checkpoint callback" not in caplog.text


def test_a_misspelt_weights_name_lists_each_choice_once():
    from project.model import backbones
    from project.model.sources import WeightsError

    with pytest.raises(WeightsError, match="one of: ") as refused:
        backbones.build("resnet18", "DEFALT", 5)
    choices = str(refused.value).rsplit("one of: ", 1)[1].split(", ")
    assert choices[0] == "DEFAULT" and "IMAGENET1K_V1" in choices and len(choices) == len(set(choices))
