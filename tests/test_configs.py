"""Every config and preset parses; the FSDP preset builds its strategy."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, TRAIN_CONFIG, run_cli

PRESETS = sorted((REPO / "configs" / "presets").glob("*.yaml"))


def test_presets_exist():
    names = {p.stem for p in PRESETS}
    assert {"cpu", "ddp", "multinode", "fsdp", "adamw", "debug", "profile", "bf16",
            "precision-32"} <= names


def test_a_preset_parses_through_the_command_line(tmp_path):
    ddp = REPO / "configs/presets/ddp.yaml"
    result = run_cli(["fit", "--config", str(TRAIN_CONFIG), "--config", str(ddp), "--print_config"],
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "trainer:" in result.stdout and "strategy: ddp" in result.stdout


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_preset_parses_over_the_default_config(preset: Path, capsys):
    """The CLI's own parser, in this process (the subprocess start costs ~10 s per preset)."""
    from project.cli import ProjectCLI

    with pytest.raises(SystemExit) as done:
        ProjectCLI(args=["fit", "--config", str(TRAIN_CONFIG), "--config", str(preset), "--print_config"])
    assert done.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["trainer"] and printed["model"] and printed["data"]
    preset_values = yaml.safe_load(preset.read_text()) or {}
    assert_within(preset_values, printed)


def assert_within(preset: object, parsed: object, where: str = "") -> None:
    """Each value the preset sets is in the parsed config (which adds defaults around it);
    lists of classes (callbacks) are left out: the CLI may merge them."""
    if isinstance(preset, dict):
        for key, value in preset.items():
            assert isinstance(parsed, dict) and key in parsed, f"{where}.{key} missing"
            assert_within(value, parsed[key], f"{where}.{key}")
    elif not (isinstance(preset, list) and any(isinstance(v, dict) for v in preset)):
        assert parsed == preset, f"{where}: {parsed!r} != {preset!r}"


def test_fsdp_preset_builds_a_sharded_strategy():
    """configs/presets/fsdp.yaml as the CLI reads it: its class_path instantiated with its
    init_args, and each value found again in the strategy object."""
    import functools
    import importlib

    import torch
    import yaml

    from project.strategies import ShardedStrategy

    spec = yaml.safe_load((REPO / "configs" / "presets" / "fsdp.yaml").read_text())["trainer"]["strategy"]
    module, _, name = spec["class_path"].rpartition(".")
    init_args = spec.get("init_args") or {}
    strategy = getattr(importlib.import_module(module), name)(**init_args)
    assert isinstance(strategy, ShardedStrategy)

    policy = strategy.kwargs["auto_wrap_policy"]
    assert isinstance(policy, functools.partial)
    found = {  # where each preset value must end up
        "min_params": policy.keywords["min_num_params"],
        "sharding_strategy": strategy.sharding_strategy.name,
        "cpu_offload": strategy.cpu_offload.offload_params,
    }
    assert set(init_args) <= set(found), f"the test does not know where {set(init_args) - set(found)} go"
    assert {k: found[k] for k in init_args} == init_args
    # Unknown keys would pass through **kwargs into FSDP's constructor, failing only on a GPU.
    assert not set(init_args) & set(strategy.kwargs)
    # The policy wraps a submodule exactly when it holds at least min_params parameters...
    min_params = found["min_params"]
    leaf = torch.nn.Linear(1, 1)
    assert policy(module=leaf, recurse=False, nonwrapped_numel=min_params)
    assert not policy(module=leaf, recurse=False, nonwrapped_numel=min_params - 1)
    # ...and what the class fixes for this project holds with the preset too.
    assert strategy.kwargs["use_orig_params"] is True
    assert strategy._state_dict_type == "full"
