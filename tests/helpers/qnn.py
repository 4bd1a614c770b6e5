"""The QNN EP for the tests: whether it can be had here, raw ONNX Runtime + QNN sessions, and the test models."""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from npurt.models import default_samples
from npurt.onnx_edit import static_model

# npurt's defaults for the HTP (docs/devices.md): the same options on the raw side
QNN_OPTIONS = {"backend_type": "htp", "enable_htp_fp16_precision": "1", "soc_model": "60"}


def wheel_exists_here() -> str:
    """"" where PyPI has an onnxruntime-qnn wheel for this machine, else why not."""
    if sys.version_info < (3, 11):
        return "onnxruntime-qnn has wheels for Python >= 3.11 only"
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "aarch64"):
        return f"onnxruntime-qnn has no Linux wheel for {platform.system()} {platform.machine()} (the suite's " \
               "QNN tests run on Linux x86-64 or aarch64)"
    return ""


def require_qnn() -> None:
    """Skip, saying why, where no wheel exists; fail where one exists and it is not installed (the test extra
    installs it there: a missing EP must not turn the suite green)."""
    why = wheel_exists_here()
    if why:
        pytest.skip(why)
    if importlib.util.find_spec("onnxruntime_qnn") is None:
        pytest.fail("onnxruntime-qnn is not installed, though a wheel exists for this machine: install the test "
                    "extra (pip install '.[test]')")


def raw_qnn_session(model: str | Path, options: dict[str, str]) -> ort.InferenceSession:
    """ONNX Runtime + QNN EP used directly, as its documentation shows, with graph assignment recorded."""
    from npurt.backends.onnxruntime import plugins

    plugins.register("onnxruntime_qnn")  # once per process (ONNX Runtime refuses a second registration)
    (device,) = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"][:1]
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    so.add_provider_for_devices([device], options)
    return ort.InferenceSession(str(model), so)


def qdq_model(tmp_path: Path, activations: str = "uint8") -> Path:
    """npurt's default model quantized to QDQ by onnxruntime.quantization, calibrated on its own samples: uint8
    weights, and uint8 activations or uint16 ones (A16W8, which the HTP takes; Q/DQ at opset 21)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from npurt.models import DEFAULT_MODEL

    images = default_samples()[0]

    class Samples(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter([{"image": images[k:k + 1]} for k in range(32)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    fixed = static_model(DEFAULT_MODEL, {"image": [1, 1, 8, 8]}, tmp_path / "default_b1.onnx")
    target = tmp_path / f"default_qdq_{activations}.onnx"
    os.environ.setdefault("ORT_LOGGING_LEVEL", "3")
    activation_type = {"uint8": QuantType.QUInt8, "uint16": QuantType.QUInt16}[activations]
    quantize_static(fixed, str(target), Samples(), quant_format=QuantFormat.QDQ,
                    activation_type=activation_type, weight_type=QuantType.QUInt8)
    return target
