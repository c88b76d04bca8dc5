"""Shared fixtures: tiny generated data sets, an in-process command line, one trained run."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from benchmarks.serve import free_port  # noqa: F401  (the tests' too)
from project.cli import main
from project.data.demo import make_demo

REPO = Path(__file__).resolve().parents[1]
TRAIN_CONFIG = REPO / "configs" / "train.yaml"
EMA_PRESET = REPO / "configs" / "presets" / "ema.yaml"
CLASSES = ["checker", "circle", "cross", "dots", "square"]


# LitData reads its chunk cache folder once, on import: one per test process, removed at the end
LITDATA_CACHE = Path(tempfile.gettempdir()) / f"project-tests-litdata-{os.getpid()}"
os.environ["LITDATA_CACHE_DIR"] = str(LITDATA_CACHE)


def pytest_unconfigure(config) -> None:
    shutil.rmtree(LITDATA_CACHE, ignore_errors=True)


def pytest_collection_modifyitems(config, items) -> None:
    """Files with multi-process tests first, then those with slow ones: pytest-xdist hands out
    whole files in this order, and a long file handed out last would leave a worker idle."""
    def weight(item) -> int:
        marks = FILE_MARKS.setdefault(item.path, set())
        return 0 if "distributed" in marks else 1 if "slow" in marks else 2

    for item in items:
        FILE_MARKS.setdefault(item.path, set()).update(m.name for m in item.iter_markers())
    items.sort(key=weight)  # stable: the order within a file and within a group is kept


FILE_MARKS: dict[Path, set[str]] = {}


def pytest_configure(config) -> None:
    """Under pytest-xdist (make test), each worker takes its share of the cores, and so do the
    processes its tests start: torch's default of every core per process would oversubscribe."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        threads = str(max(1, (os.cpu_count() or 1) // workers))
        os.environ["OMP_NUM_THREADS"] = threads
        import torch

        torch.set_num_threads(int(threads))


@contextlib.contextmanager
def scratch(tmp_path_factory, name: str):
    """A folder removed once its fixture is done with it. pytest keeps the folders of
    ``tmp_path_factory`` until the session ends; a run's checkpoints are 90 MB each here, and a
    suite that kept every fixture's runs until the end would fill a small disk."""
    path = tmp_path_factory.mktemp(name)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def _no_downloads(tmp_path_factory, monkeypatch):
    """An empty TORCH_HOME and HF_HOME, offline: nothing comes from a real cache or the network."""
    with scratch(tmp_path_factory, "torch_home") as home, scratch(tmp_path_factory, "hf_home") as hf:
        monkeypatch.setenv("TORCH_HOME", str(home))
        monkeypatch.setenv("HF_HOME", str(hf))
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        yield home


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """5 classes, 8 train / 4 val / 4 test images each, 32 px."""
    out = tmp_path_factory.mktemp("data") / "tiny"
    return make_demo(out, train_per_class=8, val_per_class=4, test_per_class=4, image_size=32,
                     num_classes=5, seed=1)


@pytest.fixture(scope="session")
def multilabel_data(tiny_data, tmp_path_factory) -> Path:
    """120 mosaics of 2x2 cells (32 px), one to three cells filled with tiny_data's shapes, in one
    flat folder with ``labels.csv`` (image, labels): an image's labels are the shapes it shows."""
    import csv

    import numpy as np
    from PIL import Image

    out = tmp_path_factory.mktemp("multilabel")
    pool = sorted(tiny_data.rglob("*.png"))
    rng = np.random.default_rng(0)
    (out / "img").mkdir()
    rows = []
    for k in range(120):
        canvas, labels = Image.new("RGB", (32, 32)), set()
        for cell in rng.choice(4, size=rng.integers(1, 4), replace=False):
            shape = pool[rng.integers(len(pool))]
            labels.add(shape.parent.name)
            tile = Image.open(shape).convert("RGB").resize((16, 16))
            canvas.paste(tile, ((cell % 2) * 16, (cell // 2) * 16))
        canvas.save(out / "img" / f"{k:03d}.png")
        rows.append({"image": f"img/{k:03d}.png", "labels": ";".join(sorted(labels))})
    with open(out / "labels.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["image", "labels"])
        writer.writeheader()
        writer.writerows(rows)
    return out


# a fit of two batches an epoch: for tests of what a run does, not of what it learns
QUICK = ("--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1")


def fit_args(data: Path, *extra: str, epochs: int = 2) -> list[str]:
    """A real but tiny run of the default config: small images, no pretrained download."""
    return ["--config", str(TRAIN_CONFIG), f"--data.data_dir={data}", "--model.input.size=32",
            "--data.batch_size=8", "--data.num_workers=0", "--model.weights=null",
            f"--trainer.max_epochs={epochs}", "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false", "--trainer.log_every_n_steps=1", *extra]


@contextlib.contextmanager
def chdir(path: Path):
    before = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def cli(args: list[str], cwd: Path) -> int:
    """``python -m project ARGS`` in this process (what the command line runs, without the
    start-up of a new interpreter); the exit status."""
    with chdir(cwd):
        try:
            return main(args)
        except SystemExit as exit_:  # the config parser's own errors
            return exit_.code if isinstance(exit_.code, int) else 2


def one_error(stderr: str) -> str:
    """The one ``error:`` line a refused command prints (notices may come before it), asserting
    there is exactly one and no traceback."""
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr
    return errors[0]


def run_cli(args: list[str], cwd: Path, env: dict | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m project ARGS`` in a new process, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "project", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


@pytest.fixture
def chromium(tmp_path):
    """Headless chromium through selenium, at 1920 x 1080; skipped, saying why, without it."""
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        pytest.skip("chromium and chromedriver are not installed (make browser installs them)")
    webdriver = pytest.importorskip("selenium.webdriver")
    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1920,1080"):
        options.add_argument(flag)
    options.binary_location = shutil.which("chromium")
    driver = webdriver.Chrome(service=webdriver.ChromeService(shutil.which("chromedriver")), options=options)
    yield driver
    driver.quit()


def only_run(logs: Path) -> Path:
    """The single run folder under ``logs`` (asserting there is exactly one)."""
    runs = sorted({p.parent for p in logs.rglob("events.out.tfevents*")} |
                  {p.parent.parent for p in logs.rglob("checkpoints/*.ckpt")})
    assert len(runs) == 1, runs
    return runs[0]


def scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series of a TensorBoard run folder, read back with TensorBoard's reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def best_ckpt(run: Path) -> Path:
    return next((run / "checkpoints").glob("best-*.ckpt"))


@pytest.fixture(scope="session")
def trained_run(tiny_data, tmp_path_factory) -> Path:
    """One real 3-epoch run shared by the evaluation and export tests, with the EMA preset (so
    they read the averaged weights, as such a run's users do); its run folder."""
    cwd = tmp_path_factory.mktemp("trained")
    assert cli(["fit", *fit_args(tiny_data, f"--config={EMA_PRESET}", epochs=3)], cwd) == 0
    return only_run(cwd / "logs")
