"""One function per export format; each writes to a temporary name, verifies, then renames.

A model that was not loaded back and compared with PyTorch is never left on disk.
"""

from __future__ import annotations

import io
import json
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from project.common.files import atomic_path
from project.errors import ProjectError
from project.extras.deploy.infer import ort_session, to_metadata
from project.tasks import answers

PARITY_BATCHES = (1, 3, 8)
ONNX_OPSET = 18


class ExportError(ProjectError, RuntimeError):
    """An export that failed its verification; its file has been removed."""


def parity_inputs(image_size: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, 3, image_size, image_size, generator=g) for b in PARITY_BATCHES]


def check_parity(name: str, reference: nn.Module, run: Callable[[torch.Tensor], np.ndarray],
                 image_size: int, tolerance: float) -> float:
    """Largest |logit difference| over batches of 1, 3 and 8; raises past ``tolerance``."""
    worst = 0.0
    with torch.inference_mode():
        for x in parity_inputs(image_size):
            expected = reference(x).float().numpy()
            got = np.asarray(run(x))
            if got.shape != expected.shape:
                raise ExportError(f"{name}: output shape {got.shape} != {expected.shape}")
            worst = max(worst, float(np.abs(got - expected).max()))
    if not worst <= tolerance:
        raise ExportError(f"{name}: max |difference| to PyTorch is {worst:.3g} > {tolerance:g}")
    return worst


def onnx_metadata(model) -> dict[str, str]:
    """What a deployment needs to preprocess and name the outputs, stored in the file: the
    preprocessing, the names, and the answer state (task, temperature, thresholds, target scaling)."""
    return {
        "class_names": json.dumps(model.class_names),
        **to_metadata(model.preprocessing),
        "backbone": model.hparams.backbone,
        "input": "float32 NCHW RGB, scaled to 0..1 then normalised with mean/std",
        "output": "raw outputs; project/tasks/answers.py turns them into answers with this metadata",
        **answers.to_metadata(model.answer_state()),
    }


def ort_runner(session) -> Callable[[torch.Tensor], np.ndarray]:
    name = session.get_inputs()[0].name
    return lambda x: session.run(None, {name: x.numpy()})[0]


def export_onnx(model, net: nn.Module, path: Path, tolerance: float = 1e-4) -> float:
    """Dynamo export with a dynamic batch, one self-contained file, checked in ONNX Runtime."""
    import onnx

    size = model.preprocessing.image_size
    example = torch.randn(2, 3, size, size)
    batch = torch.export.Dim("batch", min=1, max=4096)
    with atomic_path(path) as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            net, (example,), dynamo=True, external_data=False, opset_version=ONNX_OPSET,
            input_names=["input"], output_names=["logits"],
            dynamic_shapes={"x": {0: batch}}, verbose=False,
        )
        program.save(str(tmp), external_data=False)
        proto = onnx.load(str(tmp))
        onnx.helper.set_model_props(proto, onnx_metadata(model))
        onnx.save(proto, str(tmp))
        onnx.checker.check_model(str(tmp), full_check=True)
        return check_parity("onnx", net, ort_runner(ort_session(tmp)), size, tolerance)


def export_torchscript(net: nn.Module, path: Path, image_size: int, tolerance: float = 1e-4) -> float:
    """Traced TorchScript (legacy: for libtorch and TorchServe users), reloaded and compared."""
    example = torch.randn(2, 3, image_size, image_size)
    with atomic_path(path) as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit is deprecated upstream; still widely deployed
        traced = torch.jit.trace(net, example)
        buffer = io.BytesIO()  # torch's own file writer aborts the process on a full disk
        torch.jit.save(traced, buffer)
        tmp.write_bytes(buffer.getvalue())
        loaded = torch.jit.load(str(tmp), map_location="cpu")
        return check_parity("torchscript", net, lambda x: loaded(x).numpy(), image_size, tolerance)


def export_pt2(net: nn.Module, path: Path, image_size: int, tolerance: float = 1e-4) -> float:
    """torch.export program (.pt2) with a dynamic batch, reloaded and compared."""
    example = torch.randn(2, 3, image_size, image_size)
    batch = torch.export.Dim("batch", min=1, max=4096)
    with atomic_path(path) as tmp:
        program = torch.export.export(net, (example,), dynamic_shapes={"x": {0: batch}})
        buffer = io.BytesIO()  # as TorchScript's: written from Python, a full disk is an OSError
        torch.export.save(program, buffer)
        tmp.write_bytes(buffer.getvalue())
        loaded = torch.export.load(str(tmp)).module()
        return check_parity("pt2", net, lambda x: loaded(x).numpy(), image_size, tolerance)
