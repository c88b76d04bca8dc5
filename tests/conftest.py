"""Shared fixtures: tiny generated data sets and a runner for the real command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from project.data.demo import make_demo

REPO = Path(__file__).resolve().parents[1]
TRAIN_CONFIG = REPO / "configs" / "train.yaml"


@pytest.fixture(autouse=True)
def _no_downloads(tmp_path_factory, monkeypatch):
    """Every test gets an empty TORCH_HOME and HF_HOME, offline, so nothing can come from a real
    cache or the network."""
    home = tmp_path_factory.mktemp("torch_home")
    monkeypatch.setenv("TORCH_HOME", str(home))
    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.mktemp("hf_home")))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return home


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """3 classes, 8 train / 4 val / 4 test images each, 32 px."""
    out = tmp_path_factory.mktemp("data") / "tiny"
    return make_demo(out, train_per_class=8, val_per_class=4, test_per_class=4,
                     image_size=32, num_classes=3, seed=1)


def fit_args(data: Path, *extra: str, epochs: int = 2) -> list[str]:
    """A real but tiny run of the default config: small images, no pretrained download."""
    return [
        "--config", str(TRAIN_CONFIG),
        f"--data.data_dir={data}",
        "--data.image_size=32",
        "--data.batch_size=8",
        "--data.num_workers=0",
        "--model.weights=null",
        f"--trainer.max_epochs={epochs}",
        "--trainer.enable_progress_bar=false",
        "--trainer.log_every_n_steps=1",
        *extra,
    ]


def run_cli(args: list[str], cwd: Path, env: dict | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m project ARGS`` in ``cwd``, as a user would run it."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "project", *args], cwd=cwd, env=full_env,
        capture_output=True, text=True, timeout=timeout,
    )


def only_run(logs: Path) -> Path:
    """The single run folder under ``logs`` (asserting there is exactly one)."""
    runs = sorted(p.parent for p in logs.rglob("config.yaml"))
    assert len(runs) == 1, runs
    return runs[0]


def scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    """All scalar series of a TensorBoard run folder, read back with TensorBoard's reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.fixture(scope="session")
def trained_run(tiny_data, tmp_path_factory) -> Path:
    """One real 3-epoch run shared by the evaluation and export tests; its run folder."""
    cwd = tmp_path_factory.mktemp("trained")
    result = run_cli(["fit", *fit_args(tiny_data, epochs=3)], cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return only_run(cwd / "logs")


def best_ckpt(run: Path) -> Path:
    return next((run / "checkpoints").glob("best-*.ckpt"))
