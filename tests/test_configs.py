"""Every config and preset parses; the FSDP preset builds its strategy."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO, TRAIN_CONFIG, run_cli

PRESETS = sorted((REPO / "configs" / "presets").glob("*.yaml"))


def test_presets_exist():
    names = {p.stem for p in PRESETS}
    assert {"cpu", "ddp", "multinode", "fsdp", "adamw", "debug", "profile", "bf16",
            "precision-32"} <= names


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_preset_parses_over_the_default_config(preset: Path, tmp_path):
    result = run_cli(["fit", "--config", str(TRAIN_CONFIG), "--config", str(preset),
                      "--print_config"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "trainer:" in result.stdout


def test_fsdp_preset_builds_a_sharded_strategy():
    from project.strategies import ShardedStrategy

    strategy = ShardedStrategy(min_params=10)
    assert strategy.kwargs["use_orig_params"] is True
    assert strategy._state_dict_type == "full"
