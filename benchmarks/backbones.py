"""Training and ONNX Runtime inference throughput of a few backbones at the demo size.

    python -m benchmarks.backbones [--size 48] [--names resnet18 timm/convnext_atto ...]

Random weights (throughput does not depend on them), batch 32, bf16 autocast for training as
the default config, fp32 ONNX Runtime for inference, this machine's CPU threads.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from project.extras.deploy.exporters import export_onnx
from project.extras.deploy.infer import ort_session
from project.model import ImageClassifier

NAMES = ["resnet18", "timm/resnet18.a1_in1k", "timm/mobilenetv3_small_100.lamb_in1k",
         "timm/efficientnet_b0.ra_in1k", "timm/convnext_atto.d2_in1k"]


def train_rate(model: ImageClassifier, size: int, batch: int = 32, steps: int = 5) -> float:
    opt = torch.optim.SGD(model.param_groups(), lr=0.01, momentum=0.9)
    x, y = torch.randn(batch, 3, size, size), torch.randint(0, 8, (batch,))
    model.train()
    for i in range(steps + 2):
        if i == 2:
            start = time.perf_counter()
        with torch.autocast("cpu", torch.bfloat16):
            loss = model.loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return steps * batch / (time.perf_counter() - start)


def onnx_rate(model: ImageClassifier, size: int, batch: int = 32, runs: int = 10) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.onnx"
        export_onnx(model, model.net.float().eval(), path)
        session = ort_session(path)
        x = torch.randn(batch, 3, size, size).numpy()
        name = session.get_inputs()[0].name
        for _ in range(3):
            session.run(None, {name: x})
        start = time.perf_counter()
        for _ in range(runs):
            session.run(None, {name: x})
        return runs * batch / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", type=int, default=48)
    p.add_argument("--names", nargs="+", default=NAMES)
    a = p.parse_args(argv)
    print(f"{a.size} px, batch 32, {os.cpu_count()} CPU threads\n")
    print("| backbone | params (M) | training img/s (bf16) | ONNX Runtime img/s (fp32) |")
    print("|---|---|---|---|")
    for name in a.names:
        model = ImageClassifier(num_classes=8, backbone=name, weights=None, input=a.size)
        params = sum(p.numel() for p in model.parameters()) / 1e6
        print(f"| `{name}` | {params:.1f} | {train_rate(model, a.size):.0f} | "
              f"{onnx_rate(model, a.size):.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
