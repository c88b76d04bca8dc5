"""A disk that fills: one line naming the folder, nothing half-written, and a run that goes on
once there is room. The fast tests make the writers fail as a full disk makes them fail; the
slow ones fill a real small disk (a tmpfs, where this machine lets the tests mount one)."""

from __future__ import annotations

import contextlib
import errno
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from project.cli import main
from project.common.files import atomic_path
from project.errors import DiskFullError
from project.runs import RunNotFoundError, newest_checkpoint
from tests.conftest import QUICK, best_ckpt, chdir, cli, fit_args, only_run, scalars

FULL = OSError(errno.ENOSPC, "No space left on device")


def fail_as(writer: str) -> None:
    """A full disk as Python's writers meet it, or as torch.save does: its own error, the OSError
    only in the chain."""
    if writer == "python":
        raise FULL
    try:
        raise FULL
    except OSError:
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 66358592") from None


def everything(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("writer", ["python", "torch"])
def test_a_write_that_finds_the_disk_full_is_one_line_and_leaves_nothing(writer, tmp_path):
    full = pytest.raises(DiskFullError, match=f"no space left on the disk holding {tmp_path}")
    with full as caught, atomic_path(tmp_path / "model.ckpt") as tmp:
        tmp.write_bytes(b"half")
        fail_as(writer)
    assert "model.ckpt was not written" in str(caught.value) and "resume" in str(caught.value)
    assert everything(tmp_path) == []  # neither the file nor its temporary copy
    with pytest.raises(ValueError, match="not a disk"), atomic_path(tmp_path / "x.json") as tmp:
        raise ValueError("not a disk")  # any other error is the writer's own


def test_a_full_disk_met_by_a_library_writer_is_one_line(monkeypatch, capsys):
    def fails(*args, **kwargs):
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "logs/run/events.out.tfevents")
        except OSError as err:
            raise RuntimeError("the writer's own words") from err

    monkeypatch.setattr("project.cli.ProjectCLI", fails)
    assert main(["fit"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no space left on the disk writing logs/run/events.out.tfevents: ")
    assert "\n" not in err


def test_resize_data_stops_on_a_full_disk_instead_of_skipping_images(tmp_path, monkeypatch, capsys):
    src, out = tmp_path / "src", tmp_path / "out"
    for name in ("cat/a.png", "cat/b.png", "dog/c.png"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (96, 64), "red").save(src / name)
    written = []

    def save(image, fp, *args, **kwargs):  # the second image finds the disk full
        if written:
            Path(fp).write_bytes(b"part")
            raise FULL
        written.append(fp)
        Path(fp).write_bytes(b"whole")

    monkeypatch.setattr(Image.Image, "save", save)
    assert main(["resize-data", str(src), str(out), "--side", "32", "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert "no space left on the disk holding" in err and "skipped" not in err
    assert everything(out) == ["cat", "cat/a.png"]  # no manifest (not a finished copy), no partial file


def test_resume_without_last_ckpt_takes_the_runs_newest_checkpoint(tmp_path, caplog):
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    with pytest.raises(RunNotFoundError, match="nothing to resume from"):
        newest_checkpoint(folder.parent)
    for name in ("epoch04.ckpt", "best-epoch06-acc0.9.ckpt", ".best.1.tmp.ckpt"):
        (folder / name).write_bytes(b"x")
    with caplog.at_level("INFO", logger="project"):
        assert newest_checkpoint(folder.parent) == folder / "best-epoch06-acc0.9.ckpt"
    assert "no last.ckpt" in caplog.text
    (folder / "last.ckpt").write_bytes(b"x")
    assert newest_checkpoint(folder.parent) == folder / "last.ckpt"


# -- a real small disk ---------------------------------------------------------------------------

@contextlib.contextmanager
def small_disk(path: Path, megabytes: int):
    """A tmpfs of ``megabytes`` at ``path``; the test skips where mounting one is not allowed."""
    path.mkdir(parents=True)
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if made.returncode:
        pytest.skip(f"a small disk needs `mount -t tmpfs` (root): {made.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="tmpfs is Linux's")
def test_a_fit_that_fills_its_disk_stops_in_one_line_and_resumes_once_there_is_room(tiny_data, tmp_path,
                                                                                     capsys):
    # 130 MB: the first checkpoint (90 MB) fits, the second does not
    with small_disk(tmp_path / "disk", 130) as disk:
        assert cli(["fit", *fit_args(tiny_data, *QUICK, epochs=2)], disk) == 2
        err = capsys.readouterr().err
        assert err.strip().splitlines()[-1].startswith("error: no space left on the disk holding"), err
        assert "Traceback" not in err
        run = only_run(disk / "logs")
        saved = everything(run / "checkpoints")
        assert saved == [best_ckpt(run).name], saved  # whole, under its name; no temporary file
        assert torch.load(best_ckpt(run), map_location="cpu", weights_only=False)["epoch"] == 0

        subprocess.run(["mount", "-o", "remount,size=600m", str(disk)], check=True)
        with chdir(disk):
            assert main(["resume", str(run)]) == 0
        last = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
        assert last["epoch"] == 1 and len(scalars(run)["val/acc"]) >= 2  # epoch 1 ran after the resume


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="tmpfs is Linux's")
@pytest.mark.parametrize(("formats", "megabytes"), [("torchscript", 30), ("pt2", 30), ("onnx,int8", 105)])
def test_an_export_onto_a_full_disk_is_one_line_and_leaves_no_hidden_file(formats, megabytes, trained_run,
                                                                           tiny_data, tmp_path, capsys):
    """TorchScript's and pt2's writers used to abort the process (a C++ assertion); INT8's
    pre-processing left a hidden partial file and ended in a protobuf parse error."""
    with small_disk(tmp_path / "disk", megabytes) as disk:
        code = cli(["export", "--ckpt_path", str(best_ckpt(trained_run)), "--formats", formats,
                    "--out", str(disk / "export"), "--data_dir", str(tiny_data),
                    "--calibration_images", "8", "--check_images", "8", "--repeats", "1"], tmp_path)
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err, err
        assert err.strip().splitlines()[-1].startswith("error: no space left on the disk holding"), err
        assert [p for p in everything(disk) if Path(p).name.startswith(".")] == []
