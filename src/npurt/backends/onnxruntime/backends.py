"""The ONNX Runtime backends, each the one adapter (``backend.OrtBackend``) with its EP: RunnerType.VAIML (the
Vitis AI EP), RunnerType.QNN (the QNN EP's HTP) and RunnerType.ONNXRUNTIME (any EP, by name or device policy)."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

import onnxruntime as ort

from ...devices import Selection
from ...engine import Discovery
from ...types import NpuUnsupportedError
from . import plugins
from .backend import OrtBackend
from .discovery import device_family, emulated, engine_report
from .generic import select_provider
from .providers import ExecutionProvider
from .qnn import MODULE, QNN_OPTION_KEYS, QnnProvider, is_emulator_host, qualcomm_npu_report
from .vitisai import VITISAI_EP, VITISAI_OPTION_KEYS, VitisAIProvider, amd_npu_report


class VaimlBackend(OrtBackend):
    """RunnerType.VAIML: ONNX Runtime with the Vitis AI EP (AMD NPUs), or its CPU provider."""

    name = "VAIML"
    target = "VAIML"

    @classmethod
    def discover(cls) -> Discovery:
        return Discovery("onnxruntime", engine_report(), amd_npu_report())

    @classmethod
    def npu_present(cls) -> bool:
        return VITISAI_EP in ort.get_available_providers()

    def provider_option_keys(self) -> tuple[str, ...]:
        return VITISAI_OPTION_KEYS

    def make_provider(self, provider_options: Mapping[str, Any]) -> ExecutionProvider:
        return VitisAIProvider(provider_options)


class QnnBackend(OrtBackend):
    """RunnerType.QNN: ONNX Runtime with the QNN EP's HTP (Qualcomm NPUs; the HTP emulator on x86-64), or its CPU
    provider."""

    name = "QNN"
    target = "QNN"

    @classmethod
    def discover(cls) -> Discovery:
        return Discovery("onnxruntime", engine_report(), qualcomm_npu_report())

    @classmethod
    def npu_present(cls) -> bool:
        """A real Hexagon NPU (never the emulator)."""
        if importlib.util.find_spec(MODULE) is None or is_emulator_host():
            return False
        return QnnProvider().unavailable_reason() == ""

    def provider_option_keys(self) -> tuple[str, ...]:
        return QNN_OPTION_KEYS

    def make_provider(self, provider_options: Mapping[str, Any]) -> ExecutionProvider:
        precision = self.options.inference_precision
        if precision == "bf16":
            raise NpuUnsupportedError("inference_precision='bf16': the HTP computes floats in FP16 (its precision "
                                      "mode) or FP32; int8 / uint16 come from a QDQ model")
        return QnnProvider(provider_options, fp16=precision != "f32")


class OnnxRuntimeBackend(OrtBackend):
    """RunnerType.ONNXRUNTIME: any EP ONNX Runtime offers, by name (``execution_provider``) or by its device
    policy (``ep_policy``), or by option ``device``."""

    name = "ONNXRUNTIME"
    selects_execution_providers = True

    @classmethod
    def discover(cls) -> Discovery:
        return Discovery("onnxruntime", engine_report())

    @classmethod
    def npu_present(cls) -> bool:
        plugins.register_all()
        return any(device_family(d) == "NPU" and not emulated(d) for d in plugins.ep_devices())

    def select(self, provider_options: Mapping[str, Any]) -> tuple[ExecutionProvider, Selection]:
        return select_provider(self.options, provider_options)
