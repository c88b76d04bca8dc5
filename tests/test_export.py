"""Export: verified ONNX, INT8, TorchScript and .pt2, torch-free inference, clean failures."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from project.checkpoints import load_model
from tests.conftest import best_ckpt, run_cli


@pytest.fixture(scope="module")
def exported(trained_run, tiny_data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("exports") / "model"
    result = run_cli(["export", "--ckpt_path", str(best_ckpt(trained_run)), "--out", str(out),
                      "--data_dir", str(tiny_data), "--calibration_images", "16",
                      "--int8_max_drop", "1.0", "--repeats", "2"], cwd=trained_run)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_onnx_matches_pytorch_at_several_batch_sizes_and_carries_metadata(exported, trained_run):
    import onnx
    import onnxruntime as ort

    proto = onnx.load(str(exported / "model.onnx"))
    onnx.checker.check_model(proto)
    meta = {p.key: p.value for p in proto.metadata_props}
    assert json.loads(meta["class_names"]) == ["checker", "circle", "cross"]
    assert meta["image_size"] == "32" and json.loads(meta["mean"])[0] == pytest.approx(0.485)
    assert not list(exported.glob("*.data"))  # one self-contained file

    model = load_model(best_ckpt(trained_run))
    session = ort.InferenceSession(str(exported / "model.onnx"), providers=["CPUExecutionProvider"])
    for batch in (1, 3, 8, 17):
        x = torch.randn(batch, 3, 32, 32)
        with torch.no_grad():
            expected = model(x).numpy()
        got = session.run(None, {"input": x.numpy()})[0]
        assert np.abs(got - expected).max() <= 1e-4


def test_report_covers_every_format_and_int8_is_smaller(exported):
    report = json.loads((exported / "export_report.json").read_text())
    rows = report["formats"]
    assert set(rows) == {"pytorch", "onnx", "int8", "torchscript", "pt2"}
    for name in ("onnx", "torchscript", "pt2"):
        assert rows[name]["max_abs_diff"] <= 1e-4
    for name, row in rows.items():
        assert row["latency_ms_b1"] > 0 and row["latency_ms_b32"] > 0, name
        assert 0 <= row["val_acc"] <= 1, name
    assert rows["int8"]["size_mb"] < 0.5 * rows["onnx"]["size_mb"]
    assert report["threads"] >= 1
    assert "| int8 |" in (exported / "export_report.md").read_text()


def test_torchscript_and_pt2_reload_without_the_project(exported, trained_run, tmp_path):
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        expected = load_model(best_ckpt(trained_run))(x)
    torch.save({"x": x, "expected": expected}, tmp_path / "io.pt")
    script = textwrap.dedent(f"""
        import sys, torch
        io = torch.load({str(tmp_path / 'io.pt')!r})
        ts = torch.jit.load({str(exported / 'model.torchscript.pt')!r})
        pt2 = torch.export.load({str(exported / 'model.pt2')!r}).module()
        for out in (ts(io["x"]), pt2(io["x"])):
            assert (out - io["expected"]).abs().max() <= 1e-4
        assert not any(m == "project" or m.startswith("project.") for m in sys.modules)
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]


def test_torch_free_inference_matches_predict(exported, trained_run, tiny_data, tmp_path):
    blocker = tmp_path / "no_torch"
    (blocker / "torch").mkdir(parents=True)
    (blocker / "torch" / "__init__.py").write_text("raise ImportError('torch is blocked')\n")
    images = tiny_data / "test"
    onnx_csv, torch_csv = tmp_path / "onnx.csv", tmp_path / "torch.csv"
    result = run_cli(["predict", "--ckpt_path", str(best_ckpt(trained_run)), "--input", str(images),
                      "--output", str(torch_csv)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    infer = subprocess.run(
        [sys.executable, "-m", "project.deploy.infer", str(exported / "model.onnx"), str(images),
         "--output", str(onnx_csv)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": str(blocker), "PATH": "/usr/bin:/bin"},
    )
    assert infer.returncode == 0, infer.stderr[-3000:]
    ours = {r["path"]: r for r in csv.DictReader(onnx_csv.open())}
    theirs = {r["path"]: r for r in csv.DictReader(torch_csv.open())}
    assert ours.keys() == theirs.keys() and len(ours) == 12
    for path, row in ours.items():
        assert row["predicted"] == theirs[path]["predicted"], path
        assert float(row["confidence"]) == pytest.approx(float(theirs[path]["confidence"]), abs=0.02)


@pytest.mark.parametrize("problem", ["missing", "corrupt", "not_a_checkpoint", "no_class_names"])
def test_bad_checkpoints_fail_clearly_and_leave_nothing(problem, trained_run, tmp_path):
    ckpt = tmp_path / "model.ckpt"
    if problem == "corrupt":
        ckpt.write_bytes(best_ckpt(trained_run).read_bytes()[:5000])
    elif problem == "not_a_checkpoint":
        torch.save({"weights": torch.zeros(3)}, ckpt)
    elif problem == "no_class_names":
        full = torch.load(best_ckpt(trained_run), weights_only=True)
        full["hyper_parameters"].pop("class_names")
        torch.save(full, ckpt)
    out = tmp_path / "out"
    result = run_cli(["export", "--ckpt_path", str(ckpt), "--out", str(out)], cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and str(ckpt) in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()
