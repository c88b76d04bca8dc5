"""python -m project serve: a real LitServe server on 127.0.0.1, its answers against predict's and
infer.py's, batching of concurrent requests, and bad uploads that never take it down."""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from PIL import Image

from benchmarks.serve import stop
from tests.conftest import best_ckpt, cli, free_port

pytestmark = pytest.mark.slow  # servers in their own processes


@pytest.fixture(scope="module")
def start_server(tmp_path_factory):
    started = []

    def start(*args: str) -> str:
        port = free_port()
        log = (tmp_path_factory.mktemp("serve") / "server.log").open("w")
        proc = subprocess.Popen([sys.executable, "-m", "project", "serve", "--port", str(port), *args],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        started.append(proc)
        url = f"http://127.0.0.1:{port}"
        for _ in range(240):
            if proc.poll() is not None:
                raise AssertionError(f"the server exited: {Path(log.name).read_text()[-3000:]}")
            try:
                if requests.get(f"{url}/health", timeout=1).status_code == 200:
                    return url
            except requests.ConnectionError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"no /health within 120 s: {Path(log.name).read_text()[-3000:]}")

    yield start
    for proc in started:
        stop(proc)


@pytest.fixture(scope="module")
def served(trained_run, start_server) -> str:
    return start_server("--ckpt_path", str(best_ckpt(trained_run)), "--max_batch_size", "8",
                        "--batch_timeout", "0.05", "--max_upload_mb", "1")


def _images(tiny_data: Path) -> list[Path]:
    return sorted((tiny_data / "test").rglob("*.png"))[:8]


def _post(url: str, path: Path) -> dict:
    with path.open("rb") as f:
        reply = requests.post(f"{url}/predict", files={"file": (path.name, f, "image/png")}, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()["predictions"][0]


def test_served_answers_are_predict_s_to_the_digit(served, trained_run, tiny_data, tmp_path):
    images = _images(tiny_data)
    out = tmp_path / "preds.csv"
    assert cli(["predict", "--ckpt_path", str(best_ckpt(trained_run)), "--input",
                str(tiny_data / "test"), "--output", str(out)], tmp_path) == 0
    expected = {Path(r["path"]).name: r for r in csv.DictReader(out.open())}
    for path in images:
        row = _post(served, path)
        assert row["path"] == path.name and row["predicted"] == expected[path.name]["predicted"]
        for k in (1, 2, 3):
            assert row[f"top{k}"] == expected[path.name][f"top{k}"]
            want = float(expected[path.name][f"top{k}_prob"])
            assert float(row[f"top{k}_prob"]) == pytest.approx(want, abs=1e-5)
    raw = requests.post(f"{served}/predict", data=images[0].read_bytes(),
                        headers={"Content-Type": "image/png"}, timeout=60)
    assert raw.status_code == 200
    assert float(raw.json()["predictions"][0]["top1_prob"]) == pytest.approx(
        float(_post(served, images[0])["top1_prob"]), abs=1e-5)


def test_concurrent_requests_each_get_their_own_answer(served, tiny_data):
    images = _images(tiny_data)
    alone = {p.name: _post(served, p) for p in images}
    with ThreadPoolExecutor(8) as pool:  # batched together by the server, answered one by one
        together = list(pool.map(lambda p: _post(served, p), images * 3))
    for path, row in zip(images * 3, together, strict=True):
        assert row["path"] == path.name and row["top1"] == alone[path.name]["top1"]
        # another batch, another rounding of the same numbers
        assert float(row["top1_prob"]) == pytest.approx(float(alone[path.name]["top1_prob"]), abs=1e-5)
    files = [("file", (p.name, p.read_bytes(), "image/png")) for p in images[:3]]
    several = requests.post(f"{served}/predict", files=files, timeout=60).json()["predictions"]
    assert [r["path"] for r in several] == [p.name for p in images[:3]]


def _png(size: tuple[int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("L", size).save(buffer, format="PNG")
    return buffer.getvalue()


def test_bad_uploads_are_4xx_with_one_line_and_the_server_keeps_answering(served, tiny_data):
    good = _images(tiny_data)[0].read_bytes()
    cases = {
        "not an image": ({"files": {"file": ("notes.txt", b"just some text", "text/plain")}}, 415),
        "truncated image": ({"files": {"file": ("cut.png", good[: len(good) // 2], "image/png")}}, 415),
        "empty body": ({"data": b"", "headers": {"Content-Type": "image/png"}}, 400),
        "wrong content type": ({"data": good, "headers": {"Content-Type": "text/plain"}}, 415),
        "decompression bomb": ({"files": {"file": ("huge.png", _png((10_000, 10_000)), "image/png")}}, 413),
        "above the size limit": ({"data": os.urandom(2 * 2**20), "headers": {"Content-Type": "image/png"}},
                                 413),
        "no file field": ({"files": {"other": ("x.png", good, "image/png")}}, 400),
        "a form of text": ({"data": {"file": "x"}}, 415),
    }
    for name, (kwargs, status) in cases.items():
        reply = requests.post(f"{served}/predict", timeout=60, **kwargs)
        assert reply.status_code == status, (name, reply.status_code, reply.text)
        detail = reply.json()["detail"]
        assert isinstance(detail, str) and "\n" not in detail, (name, detail)
    assert requests.get(f"{served}/health", timeout=10).status_code == 200
    assert _post(served, _images(tiny_data)[0])["predicted"]


def test_info_names_the_model_and_its_hash(served, trained_run):
    import hashlib

    info = requests.get(f"{served}/info", timeout=10).json()["model"]
    ckpt = best_ckpt(trained_run)
    assert info["sha256"] == hashlib.sha256(ckpt.read_bytes()).hexdigest() and info["file"] == str(ckpt)
    assert info["classes"] == ["checker", "circle", "cross", "dots", "square"] and info["temperature"] > 0
    assert info["preprocessing"]["image_size"] == 32


def test_info_reports_the_min_confidence_in_force(trained_run, tmp_path):
    """--min_confidence overrides the checkpoint's stored policy in the answers: /info says so too."""
    import torch

    from project.extras.deploy.serve import model_info

    full = torch.load(best_ckpt(trained_run), weights_only=True)
    full["hyper_parameters"]["min_confidence"] = 0.9
    torch.save(full, tmp_path / "strict.ckpt")
    assert model_info(tmp_path / "strict.ckpt", None)["answers"]["min_confidence"] == 0.9
    assert model_info(tmp_path / "strict.ckpt", None, "0.1")["answers"]["min_confidence"] == "0.1"


def test_an_onnx_file_is_served_as_infer_py_answers(trained_run, tiny_data, start_server, tmp_path):
    from project.extras.deploy.export import export_checkpoint
    from project.extras.deploy.infer import OnnxClassifier, classify

    export_checkpoint(best_ckpt(trained_run), tmp_path / "export", ["onnx"], repeats=1)
    model = tmp_path / "export" / "model.onnx"
    url = start_server("--onnx", str(model))
    path = _images(tiny_data)[0]
    expected = classify(OnnxClassifier(model), [str(path)])[0]
    row = _post(url, path)
    assert row["predicted"] == expected["predicted"]
    assert float(row["top1_prob"]) == pytest.approx(float(expected["top1_prob"]), abs=1e-5)


def test_below_min_confidence_the_answer_is_unsure():
    from project.common.predictions import unsure

    assert unsure({"predicted": "cat", "confidence": "0.420000"}, 0.5) == {
        "predicted": "unsure", "confidence": "0.420000", "unsure": True}
    assert unsure({"predicted": "cat", "confidence": "0.920000"}, 0.5)["predicted"] == "cat"


def test_the_page_classifies_an_uploaded_image_with_its_heat_map(trained_run, tiny_data, start_server,
                                                                 chromium):
    """In a real browser: pick a demo image, read the bars, see the Grad-CAM and the unsure state."""
    from selenium.webdriver.common.by import By

    url = start_server("--ckpt_path", str(best_ckpt(trained_run)), "--min_confidence", "0.999999")
    path = _images(tiny_data)[0]
    expected = _post(url, path)
    chromium.get(url + "/")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "classes" not in chromium.find_element(By.ID, "model").text:
        time.sleep(0.2)  # /info read: the page knows to ask for the heat map
    chromium.find_element(By.ID, "pick").send_keys(str(path))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not chromium.find_elements(By.CSS_SELECTOR, ".result img.cam"):
        time.sleep(0.2)
    names = [e.text for e in chromium.find_elements(By.CSS_SELECTOR, ".result .name")]
    probs = [float(e.text) for e in chromium.find_elements(By.CSS_SELECTOR, ".result .prob")]
    assert names == [expected[f"top{k}"] for k in (1, 2, 3)]
    assert probs[0] == pytest.approx(float(expected["top1_prob"]), abs=1e-4)
    answer = chromium.find_element(By.CSS_SELECTOR, ".result .answer")
    assert "unsure" in answer.text and "unsure" in answer.get_attribute("class")
    cam = chromium.find_element(By.CSS_SELECTOR, ".result img.cam").get_attribute("src")
    assert cam.startswith("data:image/png;base64,") and len(cam) > 200

