"""Bad data, crashes and bad configs lose nothing: check-data, skipping, kills, exact resume."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from project.callbacks.resilience import AtomicCheckpointIO
from project.data.demo import make_demo
from project.diagnose.check_data import main as check_data
from project.diagnose.check_data import scan
from tests.conftest import fit_args, only_run, run_cli, scalars


def _save(img: Image.Image, path: Path, **kwargs) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, **kwargs)


@pytest.fixture(scope="module")
def bad_data(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A trainable folder holding one of each file-level problem; returns it and what to expect."""
    root = tmp_path_factory.mktemp("bad") / "data"
    make_demo(root, train_per_class=8, val_per_class=4, test_per_class=4, image_size=32,
              num_classes=3, seed=2)
    train = root / "train" / "circle"
    good = next(iter(sorted(train.glob("*.png"))))
    rgb = Image.open(good).convert("RGB")
    expect = {}

    def add(rel: str, reason: str) -> Path:
        expect[str(root / rel)] = reason
        return root / rel

    add("train/circle/truncated.png", "cannot be decoded").write_bytes(good.read_bytes()[:200])
    add("train/cross/empty.jpg", "empty file").write_bytes(b"")
    add("val/checker/notes.png", "cannot be decoded").write_text("not an image at all")
    _save(rgb, add("train/circle/photo.txt", "with extension '.txt'"), format="PNG")
    _save(rgb, add("train/cross/jpeg_named.png", "content is JPEG"), format="JPEG")
    _save(rgb.convert("L"), add("train/circle/gray.png", "mode L (grayscale)"))
    _save(rgb.convert("RGBA"), add("train/checker/alpha.png", "mode RGBA"))
    _save(rgb.convert("P"), add("train/checker/palette.png", "mode P (palette)"))
    _save(rgb.convert("CMYK"), add("train/cross/cmyk.jpg", "mode CMYK"), format="JPEG")
    deep = Image.fromarray(np.asarray(rgb.convert("L"), np.uint16) * 257)
    _save(deep, add("train/cross/deep16.png", "high bit depth"))
    exif = Image.Exif()
    exif[0x0112] = 6
    _save(rgb, add("train/circle/rotated.jpg", "EXIF orientation 6"), format="JPEG", exif=exif)
    _save(rgb.resize((80, 80)), add("train/checker/huge.png", "very large"))
    os.symlink(root / "missing.png", add("train/cross/dangling.png", "broken symbolic link"))
    shutil.copy(good, add("test/circle/leaked.png", "identical to"))
    _save(rgb, root / "train/circle/kreis_ü_图.png")  # non-ASCII names work silently
    nested = root.parent / "elsewhere" / "inner"
    _save(rgb, nested / "linked.png")
    os.symlink(nested.parent, root / "train" / "circle" / "linked_folder")  # nested symlink
    return root, expect


def test_check_data_reports_each_problem_by_path(bad_data):
    root, expect = bad_data
    findings = scan(root, max_pixels=5000)
    for path, reason in expect.items():
        assert any(f.path == path and reason in f.reason for f in findings), (path, reason)
    flagged = {f.path for f in findings}
    assert str(root / "train/circle/kreis_ü_图.png") not in flagged
    result = run_cli(["check-data", str(root), "--max_megapixels", "0.005"], cwd=root.parent)
    assert result.returncode == 0, result.stdout  # trainable: bad files are only skipped
    assert "training can proceed" in result.stdout and "truncated.png" in result.stdout


@pytest.mark.parametrize("problem", ["missing_in_split", "single_class", "empty_class"])
def test_check_data_fails_on_structural_problems(tmp_path, problem, capsys):
    root = make_demo(tmp_path / "d", 2, 1, 1, image_size=16, num_classes=3)
    if problem == "missing_in_split":
        shutil.rmtree(root / "val" / "cross")
        expected = "missing ['cross']"
    elif problem == "single_class":
        for split in ("train", "val", "test"):
            for c in ("checker", "cross"):
                shutil.rmtree(root / split / c)
        expected = "only one class folder"
    else:
        for f in (root / "train" / "cross").iterdir():
            f.unlink()
        expected = "class folders without images"
    assert check_data([str(root)]) == 1  # the command's own function (the CLI start costs ~10 s)
    assert expected in capsys.readouterr().out
    fit = run_cli(["fit", *fit_args(root)], cwd=tmp_path)  # training stops with the same words
    assert fit.returncode == 2 and expected in fit.stderr and "Traceback" not in fit.stderr


def test_fit_on_bad_data_skips_undecodable_files_and_counts_them(bad_data, tmp_path):
    root, _ = bad_data
    result = run_cli(["fit", *fit_args(root, "--data.cache=none", epochs=1)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    # truncated.png, empty.jpg and dangling.png in train; notes.png in val
    assert "Skipped 4 undecodable image(s)" in result.stderr + result.stdout
    assert scalars(only_run(tmp_path / "logs"))["data/skipped_images"][-1][1] == 4


def test_atomic_checkpoint_write_never_leaves_a_partial_file(tmp_path, monkeypatch):
    target = tmp_path / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"w": torch.ones(3)}, target)

    def dying_save(obj, f, *args, **kwargs):
        f.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"w": torch.zeros(3)}, target)
    monkeypatch.undo()
    assert torch.equal(torch.load(target, weights_only=True)["w"], torch.ones(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


EVERY_EPOCH = ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
               "--trainer.callbacks.every_n_epochs=1", "--trainer.callbacks.save_top_k=-1",
               "--trainer.callbacks.monitor=val/loss",  # a distinct callback state key
               "--trainer.callbacks.filename=ep{epoch}"]


def test_resume_at_an_epoch_boundary_is_exact(tiny_data, tmp_path):
    common = ["--trainer.deterministic=true", "--data.num_workers=1",
              "--model.optimizer=torch.optim.AdamW", *EVERY_EPOCH]
    straight = tmp_path / "straight"
    straight.mkdir()
    first = run_cli(["fit", *fit_args(tiny_data, *common, epochs=3)], cwd=straight)
    assert first.returncode == 0, first.stderr[-3000:]
    run_a = only_run(straight / "logs")
    boundary = run_a / "checkpoints" / "epepoch=1.ckpt"  # the state after 2 of 3 epochs

    resumed = tmp_path / "resumed"
    resumed.mkdir()
    second = run_cli(["fit", *fit_args(tiny_data, *common, epochs=3),
                      f"--ckpt_path={boundary}"], cwd=resumed)
    assert second.returncode == 0, second.stderr[-3000:]
    run_b = only_run(resumed / "logs")
    a = torch.load(run_a / "checkpoints/last.ckpt", weights_only=True)
    b = torch.load(run_b / "checkpoints/last.ckpt", weights_only=True)
    assert a["global_step"] == b["global_step"]
    for state in ("state_dict", "current_model_state"):  # the EMA weights and the raw ones
        for key, tensor in a[state].items():
            assert torch.equal(tensor, b[state][key]), (state, key)
    assert scalars(run_a)["val/acc"][-1] == scalars(run_b)["val/acc"][-1]


def test_two_runs_with_the_same_seed_give_identical_metrics(tiny_data, tmp_path):
    accs = []
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        result = run_cli(["fit", *fit_args(tiny_data, "--trainer.deterministic=true", epochs=1)],
                         cwd=tmp_path / name)
        assert result.returncode == 0, result.stderr[-3000:]
        accs.append(scalars(only_run(tmp_path / name / "logs"))["val/loss"])
    assert accs[0] == accs[1]


def _start(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "project", *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _wait_for_checkpoint(cwd: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not list(cwd.glob("logs/*/*/checkpoints/last.ckpt")):
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.2)


def test_sigterm_saves_a_checkpoint_and_exits_cleanly(tiny_data, tmp_path):
    proc = _start(["fit", *fit_args(tiny_data, epochs=200)], tmp_path)
    _wait_for_checkpoint(tmp_path, proc)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output[-3000:]
    assert "SIGTERM: stopped at epoch" in output
    run = only_run(tmp_path / "logs")
    stopped = torch.load(run / "checkpoints/last.ckpt", weights_only=True)["global_step"]
    resumed = run_cli(["resume", f"--trainer.max_epochs={stopped // 3 + 2}"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert torch.load(run / "checkpoints/last.ckpt", weights_only=True)["global_step"] > stopped


@pytest.mark.slow
def test_sigkill_at_random_moments_always_leaves_a_loadable_checkpoint(tiny_data, tmp_path):
    every_step = ["--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
                  "--trainer.callbacks.every_n_train_steps=1", "--trainer.callbacks.filename=last",
                  "--trainer.callbacks.enable_version_counter=false"]
    rng = random.Random(0)
    proc = _start(["fit", *fit_args(tiny_data, *every_step, epochs=8)], tmp_path)
    for attempt in range(4):
        _wait_for_checkpoint(tmp_path, proc)
        time.sleep(rng.uniform(0.2, 3.0))
        proc.kill()
        proc.wait()
        last = next(tmp_path.glob("logs/*/*/checkpoints/last.ckpt"))
        torch.load(last, weights_only=True)  # never truncated
        if attempt < 3:
            proc = _start(["resume"], tmp_path)
    final = run_cli(["resume"], cwd=tmp_path)
    assert final.returncode == 0, final.stderr[-3000:]
    last = next(tmp_path.glob("logs/*/*/checkpoints/last.ckpt"))
    assert torch.load(last, weights_only=True)["epoch"] == 7


def test_wrong_type_fails_naming_the_key(tiny_data, tmp_path):
    result = run_cli(["fit", *fit_args(tiny_data), "--trainer.max_epochs=many"], cwd=tmp_path)
    assert result.returncode != 0 and "max_epochs" in result.stderr
    assert "Traceback" not in result.stderr


def test_out_of_range_setting_fails_in_one_line_naming_the_key(tiny_data, tmp_path):
    result = run_cli(["fit", *fit_args(tiny_data), "--data.image_size=0"], cwd=tmp_path)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) <= 3, result.stderr[-3000:]  # no usage block, no torch error from a batch
    assert lines[-1] == "error: data.image_size must be an integer >= 1, got 0"
    assert not (tmp_path / "logs").exists()


def test_checkpoint_of_other_classes_is_refused_before_any_work(trained_run, tmp_path):
    other = make_demo(tmp_path / "other", 2, 1, 1, image_size=32, num_classes=4)
    ckpt = trained_run / "checkpoints" / "last.ckpt"
    for command in (["fit", *fit_args(other), f"--ckpt_path={ckpt}"],
                    ["test", *fit_args(other), f"--ckpt_path={ckpt}"]):
        result = run_cli(command, cwd=tmp_path)
        assert result.returncode == 2, result.stderr[-2000:]
        assert "only in the data: ['dots']" in result.stderr
        assert not (tmp_path / "logs").exists()
