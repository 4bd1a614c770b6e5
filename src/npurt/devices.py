"""Device selection with reasons (and, for `npurt devices`, discovery of what this machine has)."""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .types import NpuError, NpuFallbackWarning

AUTO_ORDER = ("NPU", "GPU", "CPU")


@dataclass(frozen=True)
class Selection:
    requested: str
    attached: str
    fell_back: bool = False
    reason: str = ""
    skipped: tuple[tuple[str, str], ...] = ()


def select_device(requested: str, unavailable: Mapping[str, str], present: set[str] | frozenset[str],
                  fallback: str, backend: str) -> Selection:
    """Pick the device a backend attaches to.

    ``present``: the backend's usable devices ("NPU", "GPU", "CPU"); ``unavailable``: device -> why it is not
    usable (for the reports). An explicit device that is absent falls back to CPU only when ``fallback`` is
    "cpu", and never silently (a NpuFallbackWarning, and the reason in the Selection); with "error" it raises.
    AUTO takes NPU, then GPU, then CPU, and records why each skipped candidate was skipped.
    """
    def why(device: str) -> str:
        return unavailable.get(device) or f"{backend} has no {device} device on this machine"

    if requested == "AUTO":
        skipped: list[tuple[str, str]] = []
        for device in AUTO_ORDER:
            if device in present:
                return Selection(requested, device, skipped=tuple(skipped))
            skipped.append((device, why(device)))
        raise NpuError(f"{backend}: no usable device: " + "; ".join(f"{d}: {w}" for d, w in skipped))
    if requested in present:
        return Selection(requested, requested)
    reason = why(requested)
    if fallback != "cpu" or "CPU" not in present:
        raise NpuError(f"{backend}: device {requested} is not available: {reason}"
                       + ("" if fallback != "cpu" else "; and there is no CPU device to fall back to"))
    warnings.warn(f"npurt {backend}: {requested} requested but not available ({reason}); running on CPU "
                  "(option fallback='error' makes this an error)", NpuFallbackWarning, stacklevel=4)
    return Selection(requested, "CPU", fell_back=True, reason=reason, skipped=((requested, reason),))


# ---------------------------------------------------------------------------------------------------------------
# Discovery for `npurt devices`: each function returns plain dicts (JSON-ready); the CLI only formats them.

ACCEL_DIR = "/dev/accel"
DMA_HEAP_DIR = "/dev/dma_heap"
UDMABUF_NODE = "/dev/udmabuf"
NPU_DRIVERS = {"intel_vpu": "Intel NPU (Core Ultra) kernel driver", "amdxdna": "AMD XDNA NPU (Ryzen AI) kernel driver"}
VITIS_AI_EP = "VitisAIExecutionProvider"


def _first_line(e: BaseException) -> str:
    """An engine's exception text, reduced to its most specific line (OpenVINO prefixes a chain of locations)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip() and not ln.strip().startswith("Exception from")]
    if not lines:
        return type(e).__name__
    # "Cannot load library \"/long/site-packages/path/libX.so\": ..." -> the library's name is what matters
    return re.sub(r'"?/(?:[^"\s/]+/)+([^"\s/]+)"?', r"\1", lines[-1])


def discover_openvino() -> dict[str, Any]:
    """OpenVINO: version, each available device with its full name, and the NPU and GPU plugins' state."""
    report: dict[str, Any] = {"installed": False, "version": None, "devices": [], "plugins": {}, "error": None}
    try:
        import openvino as ov
    except Exception as e:  # noqa: BLE001 - report, never raise
        report["error"] = f"openvino cannot be imported: {_first_line(e)}"
        return report
    report["installed"] = True
    report["version"] = ov.__version__
    core = ov.Core()
    try:
        devices = list(core.available_devices)
    except Exception as e:  # noqa: BLE001
        report["error"] = f"listing devices failed: {_first_line(e)}"
        devices = []
    for name in devices:
        entry: dict[str, Any] = {"name": name, "full_name": None}
        try:
            entry["full_name"] = str(core.get_property(name, "FULL_DEVICE_NAME"))
        except Exception as e:  # noqa: BLE001
            entry["error"] = _first_line(e)
        report["devices"].append(entry)
    for plugin in ("NPU", "GPU"):
        state: dict[str, Any] = {"loaded": False, "devices": [], "why_not": None}
        try:
            core.get_versions(plugin)
            state["loaded"] = True
            state["devices"] = [d for d in devices if d == plugin or d.startswith(plugin + ".")]
            if not state["devices"]:
                state["why_not"] = f"the {plugin} plugin loads but finds no {plugin} device"
        except Exception as e:  # noqa: BLE001
            state["why_not"] = f"the {plugin} plugin does not load: {_first_line(e)}"
        report["plugins"][plugin] = state
    return report


def discover_onnxruntime() -> dict[str, Any]:
    """ONNX Runtime: version, available execution providers, and whether the Vitis AI provider is there."""
    report: dict[str, Any] = {"installed": False, "version": None, "providers": [], "vitis_ai": False,
                              "why_not": None, "error": None}
    try:
        import onnxruntime as ort
    except Exception as e:  # noqa: BLE001
        report["error"] = f"onnxruntime cannot be imported: {_first_line(e)}"
        report["why_not"] = report["error"]
        return report
    report["installed"] = True
    report["version"] = ort.__version__
    report["providers"] = list(ort.get_available_providers())
    report["vitis_ai"] = VITIS_AI_EP in report["providers"]
    if not report["vitis_ai"]:
        report["why_not"] = (f"this onnxruntime build has no {VITIS_AI_EP} (the PyPI builds never do; the Ryzen AI "
                             "SDK ships an onnxruntime build with it)")
    return report


def _driver_of_accel(node: str) -> str | None:
    link = Path("/sys/class/accel") / node / "device" / "driver"
    try:
        return os.path.basename(os.readlink(link))
    except OSError:
        return None


def discover_kernel() -> dict[str, Any]:
    """The kernel side: accel device nodes (and their drivers), NPU driver modules, DMA-BUF heaps, udmabuf, memfd."""
    accel = []
    try:
        for node in sorted(os.listdir(ACCEL_DIR)):
            path = os.path.join(ACCEL_DIR, node)
            accel.append({"path": path, "driver": _driver_of_accel(node),
                          "accessible": os.access(path, os.R_OK | os.W_OK)})
    except OSError:
        pass
    drivers = {name: {"loaded": os.path.isdir(f"/sys/module/{name}"), "what": what}
               for name, what in NPU_DRIVERS.items()}
    heaps = []
    try:
        for heap in sorted(os.listdir(DMA_HEAP_DIR)):
            path = os.path.join(DMA_HEAP_DIR, heap)
            heaps.append({"name": heap, "path": path, "accessible": os.access(path, os.R_OK | os.W_OK)})
    except OSError:
        pass
    memfd = False
    if hasattr(os, "memfd_create"):
        try:
            os.close(os.memfd_create("npurt-probe", os.MFD_CLOEXEC | getattr(os, "MFD_ALLOW_SEALING", 0)))
            memfd = True
        except OSError:
            pass
    return {
        "accel_nodes": accel,
        "npu_drivers": drivers,
        "dma_heaps": heaps,
        "udmabuf": {"present": os.path.exists(UDMABUF_NODE),
                    "accessible": os.access(UDMABUF_NODE, os.R_OK | os.W_OK),
                    "module_loaded": os.path.isdir("/sys/module/udmabuf")},
        "memfd": memfd,
    }


def expected_memory_provider(kernel: Mapping[str, Any]) -> str:
    """The provider the "auto" allocation chain (dma_heap -> udmabuf -> memfd -> host) takes, from the nodes."""
    heaps = [h for h in kernel["dma_heaps"] if h["accessible"]]
    if heaps:
        names = [h["name"] for h in heaps]
        return "dma_heap:" + ("system" if "system" in names else names[0])
    if kernel["udmabuf"]["present"] and kernel["udmabuf"]["accessible"] and kernel["memfd"]:
        return "udmabuf"
    if kernel["memfd"]:
        return "memfd"
    return "host"


def discover_memory(kernel: Mapping[str, Any]) -> dict[str, Any]:
    """Which provider "auto" allocation uses: what an allocation really gets, and what the device nodes predict."""
    expected = expected_memory_provider(kernel)
    report: dict[str, Any] = {"expected": expected, "actual": None, "note": None}
    try:
        from .tensor import allocate_tensor
        from .types import DataType, NpuTensorInfo

        probe = allocate_tensor(NpuTensorInfo(name="probe", data_type=DataType.UINT8, shape=(4096,)))
        report["actual"] = probe.provider
        del probe
    except Exception as e:  # noqa: BLE001
        report["note"] = f"a probe allocation failed: {_first_line(e)}"
        return report
    if report["actual"] != expected:
        # The chain (dma_heap -> udmabuf -> memfd -> host) skips a provider whose node is there but refuses this
        # process (permissions, a udmabuf size limit): say which one the probe fell past.
        report["note"] = (f"allocation gets {report['actual']!r} memory, though the device nodes here suggest "
                          f"{expected!r}: the provider chain (dma_heap -> udmabuf -> memfd -> host) fell past it "
                          "(`npurt._native.Buffer.allocate(4096, 'auto').fallback_reasons` says why)")
    return report


def discover_backends() -> dict[str, Any]:
    """npurt's registered backends, whether each sees its NPU, and the ones that failed to load."""
    from .factory import RunnerFactory

    installed = {}
    for name, cls in sorted(RunnerFactory.available_backends().items()):
        try:
            npu = bool(cls.npu_present())
        except Exception:  # noqa: BLE001
            npu = False
        installed[name] = {"class": f"{cls.__module__}.{cls.__qualname__}", "npu_present": npu}
    return {"installed": installed, "failed": dict(sorted(RunnerFactory.backend_errors().items()))}


def discover() -> dict[str, Any]:
    """Everything `npurt devices` reports, plus a verdict: is an NPU usable, and if not, what would be needed."""
    openvino = discover_openvino()
    onnxruntime = discover_onnxruntime()
    kernel = discover_kernel()
    memory = discover_memory(kernel)
    backends = discover_backends()

    npu_plugin = openvino["plugins"].get("NPU", {})
    intel_npu = bool(npu_plugin.get("devices"))
    if npu_plugin.get("loaded") and not intel_npu:
        intel_nodes = [n["path"] for n in kernel["accel_nodes"] if n["driver"] == "intel_vpu"]
        npu_plugin["why_not"] += (
            f" ({', '.join(intel_nodes)} is there: the Intel NPU user-mode driver (level-zero) may be missing)"
            if intel_nodes else " (no /dev/accel node of the intel_vpu driver: the driver is not loaded or there is "
                                "no Intel NPU)")
    amd_npu = onnxruntime["vitis_ai"] and (kernel["npu_drivers"]["amdxdna"]["loaded"]
                                          or any(n["driver"] == "amdxdna" for n in kernel["accel_nodes"]))
    needed: list[str] = []
    if not intel_npu:
        steps = []
        if not kernel["npu_drivers"]["intel_vpu"]["loaded"]:
            steps.append("an Intel Core Ultra NPU with the intel_vpu kernel driver loaded")
        if not any(n["driver"] == "intel_vpu" for n in kernel["accel_nodes"]):
            steps.append("its /dev/accel/accel* node, readable and writable by this user")
        steps.append("the Intel NPU user-mode driver (level-zero NPU driver package) so that OpenVINO's NPU plugin "
                     "lists the device")
        needed.append("Intel NPU (backend OPENVINO): " + "; ".join(steps))
    if not amd_npu:
        steps = []
        if not kernel["npu_drivers"]["amdxdna"]["loaded"]:
            steps.append("an AMD Ryzen AI NPU with the amdxdna kernel driver loaded (and its /dev/accel/accel* node)")
        if not onnxruntime["vitis_ai"]:
            steps.append(f"the Ryzen AI SDK's onnxruntime build, which has the {VITIS_AI_EP} (instead of the PyPI "
                         "onnxruntime)")
        needed.append("AMD NPU (backend VAIML): " + "; ".join(steps))
    npu_present = intel_npu or amd_npu
    if npu_present:
        verdict = "NPU present: " + ", ".join(w for w, ok in (("Intel NPU via OpenVINO", intel_npu),
                                                                ("AMD NPU via the Vitis AI provider", amd_npu)) if ok)
    else:
        verdict = "no NPU is present on this machine: models run on the CPU (or GPU) devices of the engines"
    return {
        "npu_present": npu_present,
        "verdict": verdict,
        "needed": needed,
        "backends": backends,
        "openvino": openvino,
        "onnxruntime": onnxruntime,
        "kernel": kernel,
        "memory": memory,
    }
