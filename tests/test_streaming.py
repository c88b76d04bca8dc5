"""Optimized shards: ``optimize-data``, training from the chunks, DDP shares, mid-epoch resume; the
same from an S3-compatible server (moto's, started by the test on 127.0.0.1)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from project.data.datamodule import FolderDataModule
from project.data.demo import make_demo
from project.errors import ConfigError
from project.extras.streaming.optimize import MANIFEST, check_paths
from tests.conftest import cli, fit_args, free_port, one_error, only_run, run_cli, scalars

REPO = Path(__file__).resolve().parents[1]
RECORDER = "--trainer.callbacks+=tests.test_streaming.SampleRecorder"
SAME = ["--data.augmentation=null", "--trainer.precision=32-true"]


class SampleRecorder(Callback):
    """Appends a digest of every trained input to ``$RECORD_DIR/rank<R>.txt``; with
    ``$STOP_AFTER_STEPS`` it sends SIGTERM to its own process after that step (a preemption)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        images, _ = batch
        with open(Path(os.environ["RECORD_DIR"]) / f"rank{trainer.global_rank}.txt", "a") as f:
            for image in images:
                f.write(f"{trainer.current_epoch} {hashlib.sha1(image.numpy().tobytes()).hexdigest()}\n")
        if trainer.global_step == int(os.environ.get("STOP_AFTER_STEPS", 0)):
            os.kill(os.getpid(), signal.SIGTERM)


def recorded(folder: Path) -> dict[str, list[str]]:
    return {p.stem: [line.split()[1] for line in p.read_text().splitlines()]
            for p in sorted(folder.glob("rank*.txt"))}


@pytest.fixture(scope="module")
def chunks(tiny_data, tmp_path_factory) -> Path:
    """``tiny_data`` optimized into LitData chunks, as a user runs it."""
    out = tmp_path_factory.mktemp("optimized") / "tiny"
    assert cli(["optimize-data", str(tiny_data), str(out), "--workers=2"], out.parent) == 0
    return out


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    """moto's S3-compatible server in its standalone mode on 127.0.0.1; its endpoint URL."""
    pytest.importorskip("moto.server", reason="moto[server] is not installed (make install installs it)")
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.2)
    assert proc.poll() is None, log.read_text()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()


def s3_variables(endpoint: str) -> dict[str, str]:
    """What a user sets for an S3-compatible store (the chunk cache is the session's, conftest)."""
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}


@pytest.fixture
def s3_env(s3_server, monkeypatch) -> dict[str, str]:
    env = s3_variables(s3_server)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture(scope="module")
def s3_chunks(tiny_data, s3_server, tmp_path_factory) -> str:
    """``optimize-data tiny s3://shards/tiny``, into a new bucket, as a user runs it; the URL."""
    import boto3

    with pytest.MonkeyPatch.context() as mp:
        for name, value in s3_variables(s3_server).items():
            mp.setenv(name, value)
        boto3.session.Session().client("s3").create_bucket(Bucket="shards")
        assert cli(["optimize-data", str(tiny_data), "s3://shards/tiny", "--workers=2"],
                   tmp_path_factory.mktemp("optimize")) == 0
    return "s3://shards/tiny"


def test_optimize_records_the_splits_and_a_rerun_is_a_no_op(tiny_data, chunks, capsys):
    manifest = json.loads((chunks / MANIFEST).read_text())
    folder = FolderDataModule(data_dir=str(tiny_data))
    assert manifest["classes"] == folder.class_names
    for split in ("train", "val", "test"):
        samples = getattr(folder.splits, split)
        assert manifest["splits"][split]["size"] == len(samples)
        assert Counter(manifest["splits"][split]["labels"]) == Counter(s.label for s in samples)
        assert (chunks / split / "index.json").is_file()
    assert not [p for p in chunks.parent.iterdir() if p.name.startswith(".")]  # no partial left
    before = (chunks / MANIFEST).stat().st_mtime_ns
    assert cli(["optimize-data", str(tiny_data), str(chunks)], chunks.parent) == 0
    assert "up to date" in capsys.readouterr().out
    assert (chunks / MANIFEST).stat().st_mtime_ns == before


def test_streamed_labels_match_the_manifest_in_stored_order(chunks):
    dm = FolderDataModule(data_dir=str(chunks), batch_size=5, num_workers=0, augmentation=None)
    assert dm.streaming and dm.class_names == json.loads((chunks / MANIFEST).read_text())["classes"]
    dm.setup("fit")
    train = dm.datasets["train"]
    assert [train[i][1] for i in range(len(train.targets))] == train.targets
    seen = [label for _, labels in dm.train_dataloader() for label in labels.tolist()]
    assert sorted(seen) == sorted(train.targets)  # every training image once per epoch


def test_split_settings_other_than_the_shards_are_named_and_not_recorded(chunks, caplog):
    """The shards hold optimize-data's split: a fit asking another says so, and its hparams
    (hparams.yaml, TensorBoard) hold the split it trains on."""
    dm = FolderDataModule(data_dir=str(chunks), val_fraction=0.4, split_seed=7, num_workers=0)
    with caplog.at_level(logging.WARNING, logger="project"):
        assert dm.class_names  # the manifest is read
    notice = " ".join(r.getMessage() for r in caplog.records)
    assert "data.val_fraction=0.4 (the shards': 0.15)" in notice and "data.split_seed=7" in notice
    assert "--val-fraction 0.4 --split-seed 7" in notice and "test_fraction" not in notice
    assert (dm.hparams.val_fraction, dm.hparams.split_seed, dm.hparams.test_fraction) == (0.15, 0, 0.15)


@pytest.mark.slow
def test_fit_from_chunks_equals_the_folder_run(tiny_data, chunks, s3_chunks, s3_env, tmp_path):
    """One full-batch step (40 images), no augmentation: the same images, labels and transforms
    give the same model whatever the order, up to float rounding. BatchNorm's backward sums over
    the reordered batch round differently, which the step carries into the loss at ~1e-4. The same
    shards streamed from the S3 server give the very same run as from the disk."""
    values = {}
    for name, data in (("folder", tiny_data), ("chunks", chunks), ("s3", s3_chunks)):
        (tmp_path / name).mkdir()
        assert cli(["fit", *fit_args(data, *SAME, "--data.batch_size=40", epochs=1)], tmp_path / name) == 0
        run = only_run(tmp_path / name / "logs")
        series = scalars(run)
        values[name] = {k: v[-1][1] for k, v in series.items() if k.startswith("val/")}
        ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
        values[name]["classes"] = ckpt["hyper_parameters"]["class_names"]
        values[name]["steps"] = ckpt["global_step"]
    print(values)
    folder, streamed = values["folder"], values["chunks"]
    assert streamed["classes"] == folder["classes"] and streamed["steps"] == folder["steps"] == 1
    assert streamed["val/acc"] == folder["val/acc"]
    assert streamed["val/loss"] == pytest.approx(folder["val/loss"], abs=1e-3)
    assert values["s3"] == streamed  # val/acc, val/loss, classes and steps, exactly


@pytest.mark.slow
@pytest.mark.parametrize("where", ["disk", "s3"])
def test_sigterm_mid_epoch_and_resume_train_every_sample_exactly_once(where, request, tmp_path, monkeypatch):
    source = request.getfixturevalue("chunks" if where == "disk" else "s3_chunks")
    s3 = request.getfixturevalue("s3_env") if where == "s3" else {}
    env = {"RECORD_DIR": str(tmp_path), "PYTHONPATH": str(REPO), "STOP_AFTER_STEPS": "2", **s3}
    args = fit_args(source, *SAME, RECORDER, "--data.batch_size=4", epochs=1)
    first = run_cli(["fit", *args], cwd=tmp_path, env=env)  # the signal goes to its own process
    assert first.returncode == 0, first.stderr[-3000:]
    assert "SIGTERM: stopped at epoch 0, step 2" in first.stderr + first.stdout
    assert len(recorded(tmp_path)["rank0"]) == 8
    monkeypatch.setenv("RECORD_DIR", str(tmp_path))
    assert cli(["resume"], tmp_path) == 0
    seen = Counter(recorded(tmp_path)["rank0"])
    assert sum(seen.values()) == 40 and set(seen.values()) == {1}  # 40 images, none twice


@pytest.mark.distributed
@pytest.mark.parametrize("where", ["disk", "s3"])
def test_two_ranks_stream_disjoint_shares_of_the_whole_split(where, request, tmp_path):
    source = request.getfixturevalue("chunks" if where == "disk" else "s3_chunks")
    s3 = request.getfixturevalue("s3_env") if where == "s3" else {}
    ddp = ["--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.strategy=ddp"]
    args = fit_args(source, *SAME, *ddp, RECORDER, "--data.batch_size=4", epochs=1)
    env = {"RECORD_DIR": str(tmp_path), "PYTHONPATH": str(REPO), **s3}
    result = run_cli(["fit", *args], cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    shares = recorded(tmp_path)
    assert sorted(shares) == ["rank0", "rank1"] and len(shares["rank0"]) == len(shares["rank1"]) == 20
    assert not set(shares["rank0"]) & set(shares["rank1"])
    assert len(set(shares["rank0"]) | set(shares["rank1"])) == 40  # the whole training split


def test_undecodable_files_are_named_and_left_out(tiny_data, tmp_path, capsys):
    src = tmp_path / "src"
    shutil.copytree(tiny_data, src)
    broken = src / "train" / "circle" / "broken.jpg"
    broken.write_bytes(b"not a jpeg")
    out = tmp_path / "out"
    assert cli(["optimize-data", str(src), str(out), "--workers=1"], tmp_path) == 0
    out_text = capsys.readouterr().out
    assert f"skipped {broken}" in out_text and "remove or replace the file" in out_text
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["splits"]["train"]["size"] == 40 and manifest["skipped"][0]["path"] == str(broken)


def test_bad_paths_and_incomplete_output_are_refused(tiny_data, tmp_path):
    from project.extras.streaming import optimize

    with pytest.raises(ConfigError, match="is not a folder"):
        check_paths(tmp_path / "missing", tmp_path / "out")
    with pytest.raises(ConfigError, match="inside it"):
        check_paths(tiny_data, tiny_data / "optimized")
    half = tmp_path / "half"
    (half / "train").mkdir(parents=True)
    (half / "train" / "index.json").write_text("{}")
    assert not FolderDataModule(str(half)).streaming  # chunks without project.json: not complete
    with pytest.raises(ConfigError, match="not an optimized data set"):
        check_paths(tiny_data, half)
    flat = tmp_path / "flat"  # images and a labels table: training reads it, optimize-data cannot
    flat.mkdir()
    shutil.copy(next(tiny_data.rglob("*.png")), flat / "a.png")
    (flat / "labels.csv").write_text("image,label\na.png,cat\n")
    with pytest.raises(ConfigError, match=r"but a labels table \(labels.csv\): optimize-data packs"):
        settings = {"val_fraction": 0.15, "test_fraction": 0.15, "split_seed": 0, "max_side": None,
                    "chunk_bytes": "1MB"}
        optimize.run(flat, tmp_path / "flat-shards", settings, 1)


def test_interrupted_optimize_leaves_no_output(tiny_data, tmp_path, monkeypatch):
    from project.extras.streaming import optimize

    def dying(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(optimize, "write_split", dying)
    with pytest.raises(KeyboardInterrupt):
        optimize.main([str(tiny_data), str(tmp_path / "out")])
    assert list(tmp_path.iterdir()) == []


def test_optimize_to_s3_uploads_the_same_shards_and_a_rerun_is_a_no_op(tiny_data, chunks, s3_chunks, s3_env,
                                                                     tmp_path, capsys):
    from project.extras.streaming.objects import list_keys, read_json

    local = sorted(p.relative_to(chunks).as_posix() for p in chunks.rglob("*") if p.is_file())
    assert sorted(list_keys(s3_chunks)) == local
    assert read_json(s3_chunks, MANIFEST) == json.loads((chunks / MANIFEST).read_text())
    assert cli(["optimize-data", str(tiny_data), s3_chunks], tmp_path) == 0
    assert "up to date" in capsys.readouterr().out


@pytest.mark.parametrize(("case", "expected"), [
    ("bucket", "there is no bucket 'no-such-bucket' at http://127.0.0.1:"),
    ("credentials", "no credentials for s3://no-such-bucket/tiny: set AWS_ACCESS_KEY_ID"),
    ("endpoint", "cannot reach the object store at http://127.0.0.1:"),
])
def test_object_storage_problems_are_one_line_before_training(case, expected, s3_env, tmp_path,
                                                              monkeypatch, capsys):
    if case == "credentials":
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.delenv(name)
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
        monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    if case == "endpoint":
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    url = "s3://no-such-bucket/tiny"
    assert cli(["fit", *fit_args(url)], tmp_path) == 2
    assert one_error(capsys.readouterr().err).startswith(f"error: {expected}")
    assert not (tmp_path / "logs").exists()  # nothing started, nothing written
    assert cli(["optimize-data", str(tmp_path), url], tmp_path) == 2  # the same line for writing
    assert one_error(capsys.readouterr().err).startswith(f"error: {expected}")


def test_every_streamed_training_batch_mixes_the_classes(tmp_path):
    """The source lists its images class by class and LitData reads a chunk in blocks of
    neighbouring items: optimize-data stores the training images in a seeded random order and
    each epoch permutes every chunk fully, so no batch holds a single class."""
    src = make_demo(tmp_path / "two", train_per_class=300, val_per_class=2, test_per_class=2, image_size=8,
                    num_classes=2, seed=0)
    out = tmp_path / "shards"
    assert cli(["optimize-data", str(src), str(out), "--workers=1"], tmp_path) == 0
    dm = FolderDataModule(data_dir=str(out), batch_size=32, num_workers=0, augmentation=None)
    dm.setup("fit")
    batches = [set(labels.tolist()) for _, labels in dm.train_dataloader()]
    assert len(batches) == 19 and all(b == {0, 1} for b in batches[:-1]), [sorted(b) for b in batches]
