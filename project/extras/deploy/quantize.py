"""INT8 static quantization with ONNX Runtime's quantizer (QDQ, U8S8, per-channel weights).

Activation ranges are calibrated on real training images passed through the evaluation
transforms: the quantized model then sees the same input distribution it will see in use.
"""

from __future__ import annotations

import errno
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from project.common.files import atomic_path
from project.extras.deploy.exporters import ExportError

CALIBRATION_METHODS = ("minmax", "entropy", "percentile")


class _Batches:
    """ONNX Runtime's CalibrationDataReader protocol over an iterable of NCHW arrays."""

    def __init__(self, input_name: str, batches: Iterable[np.ndarray]) -> None:
        self.input_name = input_name
        self.iterator = iter(batches)

    def get_next(self) -> dict | None:
        batch = next(self.iterator, None)
        return None if batch is None else {self.input_name: batch}


def quantize_int8(fp32_path: Path, int8_path: Path, calibration: Iterable[np.ndarray],
                  method: str = "minmax") -> None:
    """Write an INT8 QDQ copy of ``fp32_path`` (metadata kept), loadable in ONNX Runtime."""
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    methods = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
               "percentile": CalibrationMethod.Percentile}
    if method not in methods:
        raise ExportError(f"--calibration_method must be one of {CALIBRATION_METHODS}")
    source = onnx.load(str(fp32_path))
    input_name = source.graph.input[0].name
    # the pre-processed model and the files ONNX Runtime writes beside it, removed whatever happens
    with atomic_path(int8_path) as tmp, tempfile.TemporaryDirectory(prefix=".int8-", dir=tmp.parent) as work:
        prepared = Path(work) / "prepared.onnx"
        try:
            quant_pre_process(str(fp32_path), str(prepared), skip_symbolic_shape=False)
            quantize_static(
                str(prepared), str(tmp), _Batches(input_name, calibration),
                # unsigned activations, signed weights (U8S8): what x86 integer kernels
                # (AVX2/AVX-512 VNNI) run fastest; S8S8 ran slower than FP32 on such a CPU
                quant_format=QuantFormat.QDQ, per_channel=True,
                activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                calibrate_method=methods[method],
            )
        except Exception as err:  # ONNX Runtime's writers leave a truncated file on a full disk,
            # and the next step's error is about its contents: less room than a model is the cause
            if shutil.disk_usage(tmp.parent).free < fp32_path.stat().st_size:
                raise OSError(errno.ENOSPC, "no space left to quantize", str(tmp.parent)) from err
            raise
        quantized = onnx.load(str(tmp))
        onnx.helper.set_model_props(
            quantized, {p.key: p.value for p in source.metadata_props} | {"quantization": "int8"}
        )
        onnx.save(quantized, str(tmp))
        onnx.checker.check_model(str(tmp))
