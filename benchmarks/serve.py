"""The server under load, on 127.0.0.1 only: requests/s and latency percentiles of
``python -m project serve`` at several concurrencies, batching off and on, torch vs ONNX
Runtime FP32 vs INT8, for the demo model at its size and resnet18 at 224 px.

    python -m benchmarks.serve [--requests 96] [--quick]          (make bench-serve)

Each server is started fresh; the client sends a fixed number of requests (or stops at the
time cap), each a different demo image, from as many threads as the concurrency, and checks
that every answer names its own image. The models are untrained (a 2-step fit): speed does not
depend on the weights.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]


def checkpoint(data: Path, size: int, workdir: Path, backbone: str = "resnet18") -> Path:
    """A 2-step fit at ``size`` px: a checkpoint of this project's format."""
    from project.cli import main

    workdir.mkdir(parents=True, exist_ok=True)
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        assert main(["fit", "--config", str(REPO / "configs/train.yaml"), f"--data.data_dir={data}",
                     f"--model.backbone={backbone}", "--model.weights=null", f"--model.input.size={size}",
                     "--trainer.max_steps=2", "--trainer.limit_val_batches=1",
                     "--trainer.enable_progress_bar=false", "--data.batch_size=8"]) == 0
    finally:
        os.chdir(cwd)
    return next(workdir.glob("logs/*/version_*/checkpoints/last.ckpt"))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a server about to start)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "project", "serve", "--port", str(self.port), *args]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO,
                                     start_new_session=True)
        for _ in range(240):
            try:
                if requests.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except requests.ConnectionError:
                time.sleep(0.5)
        raise RuntimeError(f"the server {' '.join(args)} did not start")

    def close(self) -> None:
        stop(self.proc)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM (the server stops its workers), then the whole process group if anything lingers
    (the server starts in a session of its own)."""
    proc.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def load(url: str, images: list[Path], n: int, concurrency: int, cap_s: float) -> dict:
    """``n`` requests (image i % len) from ``concurrency`` threads, stopping at ``cap_s``."""
    start = time.perf_counter()

    def one(i: int) -> float | None:
        if time.perf_counter() - start > cap_s:
            return None
        path = images[i % len(images)]
        t = time.perf_counter()
        reply = requests.post(f"{url}/predict", files={"file": (path.name, path.read_bytes(), "image/png")},
                              timeout=120)
        reply.raise_for_status()
        assert reply.json()["predictions"][0]["path"] == path.name  # its own answer
        return time.perf_counter() - t

    with ThreadPoolExecutor(concurrency) as pool:
        latencies = [t for t in pool.map(one, range(n)) if t is not None]
    wall = time.perf_counter() - start
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
    return {"rps": len(latencies) / wall, "p50": 1000 * q[49], "p95": 1000 * q[94], "p99": 1000 * q[98],
            "done": len(latencies)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=96, help="requests per concurrency level")
    p.add_argument("--cap", type=float, default=60.0, help="seconds per level at most")
    p.add_argument("--quick", action="store_true", help="the demo model, torch, 16 requests: that it runs")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    from project.data.demo import make_demo
    from project.extras.deploy.export import export_checkpoint

    levels = (1, 8) if a.quick else (1, 8, 32)
    n = 16 if a.quick else a.requests
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = make_demo(tmp / "data", train_per_class=8, val_per_class=4, test_per_class=8, image_size=48,
                         num_classes=4)
        images = sorted((data / "test").rglob("*.png"))
        models = [("demo model, 48 px", 48)] + ([] if a.quick else [("resnet18, 224 px", 224)])
        print(f"# Serving under load\n\n{os.cpu_count()} CPUs, 127.0.0.1; {n} requests per level (at most "
              f"{a.cap:.0f} s), one image each; p50/p95/p99 latency in ms\n")
        print("| model | engine | batching | concurrency | requests/s | p50 | p95 | p99 |")
        print("|---|---|---|---|---|---|---|---|")
        for name, size in models:
            ckpt = checkpoint(data, size, tmp / f"fit{size}")
            engines = [("torch", ["--ckpt_path", str(ckpt)])]
            if not a.quick:
                out = tmp / f"export{size}"
                with contextlib.redirect_stdout(io.StringIO()):
                    export_checkpoint(ckpt, out, ["onnx", "int8"], str(data), calibration_images=32,
                                      repeats=1)
                engines += [("ONNX FP32", ["--onnx", str(out / "model.onnx")]),
                            ("ONNX INT8", ["--onnx", str(out / "model.int8.onnx")])]
            for engine, args in engines:
                for batching, extra in (("off", []), ("on (32, 10 ms)", ["--max_batch_size", "32",
                                                                      "--batch_timeout", "0.01"])):
                    server = Server(*args, *extra)
                    try:
                        load(server.url, images, 8, 2, a.cap)  # warm-up
                        for c in levels:
                            r = load(server.url, images, n, c, a.cap)
                            print(f"| {name} | {engine} | {batching} | {c} | {r['rps']:.1f} | "
                                  f"{r['p50']:.0f} | {r['p95']:.0f} | {r['p99']:.0f} |", flush=True)
                    finally:
                        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
