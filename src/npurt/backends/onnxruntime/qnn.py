"""Qualcomm's NPU (the Hexagon HTP) through ONNX Runtime's QNN execution provider: RunnerType.QNN.

The EP ships on PyPI as ``onnxruntime-qnn``, a plugin EP (``plugins``). On Snapdragon devices its HTP backend
drives the NPU through FastRPC; on x86-64 the same backend library is Qualcomm's HTP emulator: the NPU's compiler,
partitioning, static shapes, FP16 and integer numerics and context binaries, not its speed. npurt labels the
emulator as such everywhere, and never takes it for a present NPU: AUTO skips it (saying why); ``device="NPU"``
uses it because it was asked for.

npurt's defaults for the EP (``engine_options`` override each): ``backend_type=htp``, and the HTP's FP16 precision
mode (``enable_htp_fp16_precision=1`` with ``soc_model=60``, which the EP requires together) so that float models
compile: the HTP computes floats in FP16, and a float32 graph may fail to finalize on it. ``inference_precision``
"f16" (the default) is that mode; "f32" turns it off (the HTP's float32 path, where its compiler takes the graph);
int8/uint16 come from a QDQ model. These are the emulator's defaults; a device's soc_model differs (see docs).
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import json
import os
import platform
import re
import sys
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import onnxruntime as ort

from ...engine import Discovery
from ...types import NpuError, NpuUnsupportedError
from . import plugins
from .adapter import OrtBackend
from .discovery import engine_report
from .providers import QNN_EP, ExecutionProvider, emulated

MODULE = "onnxruntime_qnn"
EMULATOR = "Qualcomm HTP emulator: the NPU's compiler and numerics, not its speed"
DEFAULT_SOC_MODEL = "60"  # the emulator's (Snapdragon 8 Gen 3's HTP); Snapdragon X Elite laptops are 60 too
# The EP's provider options (every other engine_options key configures the session, ep.context_* included).
QNN_OPTION_KEYS = (
    "backend_type", "backend_path", "profiling_level", "profiling_file_path", "rpc_control_latency", "vtcm_mb",
    "htp_performance_mode", "qnn_saver_path", "qnn_context_priority", "htp_graph_finalization_optimization_mode",
    "soc_model", "htp_arch", "device_id", "enable_htp_fp16_precision", "offload_graph_io_quantization",
    "enable_htp_spill_fill_buffer", "enable_htp_shared_memory_allocator", "dump_json_qnn_graph",
    "json_qnn_graph_dir", "enable_htp_weight_sharing",
)
FASTRPC_NODES = ("/dev/fastrpc-cdsp", "/dev/fastrpc-cdsp-secure", "/dev/adsprpc-smd")
# QNN's op validation in ONNX Runtime's verbose log: "Validation FAILED for 1 nodes in OrtNodeUnit (Erf) :" then
# "Operator type: Erf Node name: erf Node index: 1" and "REASON : Operators of type `Erf` are not supported ..."
_REFUSAL = re.compile(r"Validation FAILED for \d+ nodes in OrtNodeUnit[^\n]*\n\s*Operator type: \S+ Node name: "
                      r"(?P<node>.*?) Node index: \d+\s*\n\s*REASON : (?P<reason>[^\n]*)")
_VALIDATION_PROBE = """
import json, sys
import onnxruntime as ort, onnxruntime_qnn
request = json.loads(sys.argv[1])
ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
device = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"][0]
so = ort.SessionOptions()
so.log_severity_level = 0
so.graph_optimization_level = ort.GraphOptimizationLevel(request["optimization"])
so.add_provider_for_devices([device], request["options"])
ort.InferenceSession(request["model"], so)
"""
_first_use = threading.Lock()
_stdout_checked = False  # the first HTP session of the process has been made (with stdout sent to stderr)


def is_emulator_host() -> bool:
    """Whether the QNN HTP backend here is the emulator: on x86-64 it is always (no Hexagon DSP there)."""
    return emulated(QNN_EP)


def hexagon_reachable() -> str:
    """On ARM64: "" where a Hexagon DSP is reachable (FastRPC nodes and libcdsprpc), else what is missing."""
    if platform.system() == "Windows":  # Windows on Snapdragon: ONNX Runtime's own device discovery lists the NPU
        listed = [int(d.device.type) for d in plugins.ep_devices(QNN_EP)]
        return "" if 2 in listed else (f"ONNX Runtime lists no NPU device for {QNN_EP} (its devices' types: "
                                       f"{listed}; 2 is an NPU)")
    nodes = [n for n in FASTRPC_NODES if os.path.exists(n)] + glob.glob("/dev/fastrpc-*")
    libraries = [p for d in ("/usr/lib", "/usr/lib64", "/usr/lib/aarch64-linux-gnu", "/vendor/lib64")
                 for p in glob.glob(os.path.join(d, "libcdsprpc.so*"))]
    missing = []
    if not nodes:
        missing.append("no FastRPC device node (/dev/fastrpc-cdsp*, /dev/adsprpc-smd)")
    if not libraries:
        missing.append("no libcdsprpc.so (Qualcomm's FastRPC user library)")
    return "; ".join(missing)


def qnn_versions() -> dict[str, str]:
    """The QNN SDK inside the package and the package's own version (the EP's metadata says 0.1.0)."""
    try:
        from onnxruntime_qnn import build_and_package_info as info

        return {"qnn_sdk": str(getattr(info, "qnn_version", "unknown")),
                "package": str(getattr(info, "__version__", "unknown"))}
    except Exception:  # noqa: BLE001 - not installed, or an older package without the module
        return {"qnn_sdk": "unknown", "package": "unknown"}


class QnnProvider(ExecutionProvider):
    ep_name = QNN_EP
    device = "NPU"
    target = "QNN"
    option_keys = QNN_OPTION_KEYS
    plugin = True
    takes_precision = True
    # HTP with FP16 precision (2.51 emulator) gives 0 / 1 for Cast uint8 -> float32 (a bool's values); via float16
    # it is exact. tests/test_frames.py checks the frames' results on it.
    casts_uint8_wrong = True

    def __init__(self, options: Mapping[str, Any] | None = None, fp16: bool = True) -> None:
        defaults = {"backend_type": "htp"}
        if fp16:
            defaults.update(enable_htp_fp16_precision="1", soc_model=DEFAULT_SOC_MODEL)
        super().__init__({**defaults, **{str(k): str(v) for k, v in (options or {}).items()}})
        self.emulated = is_emulator_host()

    @property
    def label(self) -> str:
        return "ONNX Runtime (QNN EP" + (", Qualcomm HTP emulator)" if self.emulated else ", Qualcomm HTP)")

    def unavailable_reason(self) -> str:
        if importlib.util.find_spec(MODULE) is None:
            return ("the QNN execution provider is not installed: onnxruntime-qnn (pip install 'npurt[qnn]'; "
                    "wheels for Linux x86-64 / aarch64 and Windows, Python >= 3.11)")
        package = plugins.register(MODULE)
        if not package.registered:
            return package.error
        if not plugins.ep_devices(QNN_EP):
            return f"{QNN_EP} is registered but ONNX Runtime {ort.__version__} lists no device for it"
        if self.options.get("backend_type", "htp") != "htp":
            return (f"backend_type={self.options['backend_type']!r}: npurt runs the QNN EP's HTP (NPU) backend "
                    "only (onnxruntime-qnn has no libQnnCpu.so: a cpu backend runs every node on ONNX Runtime's "
                    "CPU provider, silently)")
        if not self.emulated:
            return hexagon_reachable()
        return ""

    def auto_skip_reason(self) -> str:
        if self.emulated:
            return (f"{EMULATOR}; AUTO never takes an emulator for a present NPU (ask for device='NPU' on the QNN "
                    "backend to use it)")
        return ""

    def describe(self) -> str:
        return f"{QNN_EP} ({EMULATOR})" if self.emulated else f"{QNN_EP} (Qualcomm HTP)"

    def add_to(self, so: ort.SessionOptions, provider_options: Mapping[str, str]) -> list[Any]:
        devices = plugins.ep_devices(QNN_EP)
        if not devices:
            raise NpuError(f"{QNN_EP}: ONNX Runtime lists no device for it")
        so.add_provider_for_devices(devices[:1], dict(provider_options))
        return []

    def log_severity(self, log_level: str) -> int:
        # The EP warns at every session about features this platform lacks (mapped weights, EPContext encryption):
        # at the default level (INFO) its errors only; option log_level="WARNING" or "DEBUG" shows the rest.
        return {"DEBUG": 1, "INFO": 3, "WARNING": 2, "ERROR": 3}[log_level]

    @contextlib.contextmanager
    def creating_session(self) -> Iterator[None]:
        # The HTP backend's libnative prints a line to stdout on its first use in a process (" # LIBNATIVE: No
        # alternate configuration ..."): an app's stdout (JSON, a pipe) must not get it. It goes to stderr.
        global _stdout_checked
        if _stdout_checked:
            yield
            return
        with _first_use:  # the first session only (others wait for it: one stdout swap at a time)
            if _stdout_checked:
                yield
                return
            _stdout_checked = True
            sys.stdout.flush()
            saved = os.dup(1)
            try:
                os.dup2(2, 1)
                yield
            finally:
                os.dup2(saved, 1)
                os.close(saved)

    def refusal_reasons(self, model: str, provider_options: Mapping[str, str], optimization: int) -> dict[str, str]:
        """The QNN EP says why it refuses a node only in ONNX Runtime's verbose log (op validation): a session made
        again in a child process with that log on stderr, parsed (the app's own stderr and log stay untouched)."""
        import subprocess  # (only here: 7-17 ms of every process's first ONNX Runtime backend, its cached load's 2-3 %)

        request = json.dumps({"model": model, "options": dict(provider_options), "optimization": optimization})
        try:
            child = subprocess.run([sys.executable, "-c", _VALIDATION_PROBE, request], capture_output=True,
                                   text=True, timeout=600, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        except (OSError, subprocess.TimeoutExpired):
            return {}
        return {m["node"]: m["reason"].strip() for m in _REFUSAL.finditer(child.stderr)}

    def cache_parts(self) -> dict[str, Any] | None:
        return {"ep": QNN_EP, **qnn_versions(), "emulated": self.emulated, "options": sorted(self.options.items())}


def qualcomm_npu_report() -> dict[str, Any]:
    """Qualcomm's NPU for `npurt devices`: a real Hexagon HTP, the emulator (on x86-64: never a present NPU), or
    what is missing."""
    provider = QnnProvider()
    why_not = provider.unavailable_reason()
    name = "Qualcomm HTP via the QNN EP"
    if provider.emulated:
        why_not = ("this is an x86-64 machine: the QNN EP's HTP backend here is Qualcomm's emulator"
                   + (f" ({why_not})" if why_not else ", usable with RunnerType.QNN and device='NPU'"))
        needed = ["a Snapdragon device: ARM64 Linux with FastRPC (/dev/fastrpc-cdsp*) and libcdsprpc.so, or Windows "
                  "on ARM64 (ONNX Runtime's device discovery lists its NPU)"]
        return {"name": name, "present": False, "emulated": True, "why_not": why_not, "needed": needed}
    needed = [] if not why_not else [why_not]
    return {"name": name, "present": not why_not, "emulated": False, "why_not": why_not, "needed": needed}


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
