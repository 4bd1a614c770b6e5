"""What `npurt devices` reports: each backend's own discovery (its engine's devices and its NPU's verdict), the
kernel's accel nodes, NPU drivers, DMA-BUF heaps and udmabuf, and which memory provider allocation really gets.

A backend reports what only its engine can tell (``Backend.discover``: OpenVINO on the process's one Core, ONNX
Runtime's providers and EP devices); this module adds what is npurt's own (the kernel, memory) and the verdict. The
functions return plain dicts (JSON-ready); the CLI only formats them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .factory import RunnerFactory, auto_order

ACCEL_DIR = "/dev/accel"
DMA_HEAP_DIR = "/dev/dma_heap"
UDMABUF_NODE = "/dev/udmabuf"
NPU_DRIVERS = {"intel_vpu": "Intel NPU (Core Ultra) kernel driver", "amdxdna": "AMD XDNA NPU (Ryzen AI) kernel driver"}


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
    from .tensor import allocate_tensor
    from .types import DataType, NpuTensorInfo

    expected = expected_memory_provider(kernel)
    report: dict[str, Any] = {"expected": expected, "actual": None, "note": None}
    try:
        probe = allocate_tensor(NpuTensorInfo(name="probe", data_type=DataType.UINT8, shape=(4096,)))
        report["actual"] = probe.provider
        del probe
    except Exception as e:  # noqa: BLE001
        report["note"] = f"a probe allocation failed: {type(e).__name__}: {e}"
        return report
    if report["actual"] != expected:
        # The chain (dma_heap -> udmabuf -> memfd -> host) skips a provider whose node is there but refuses this
        # process (permissions, a udmabuf size limit): say which one the probe fell past.
        report["note"] = (f"allocation gets {report['actual']!r} memory, though the device nodes here suggest "
                          f"{expected!r}: the provider chain (dma_heap -> udmabuf -> memfd -> host) fell past it "
                          "(`npurt._native.Buffer.allocate(4096, 'auto').fallback_reasons` says why)")
    return report


def discover() -> dict[str, Any]:
    """Everything `npurt devices` reports, plus a verdict: is an NPU usable, and if not, what would be needed.

    Each registered backend reports its engine (under the engine's key: ``openvino``, ``onnxruntime``; the first
    report of an engine stands for the backends that share it) and its NPU; a backend whose discovery fails is
    reported with its error, never raised."""
    report: dict[str, Any] = {}
    installed: dict[str, Any] = {}
    npus: list[dict[str, Any]] = []
    classes = RunnerFactory.available_backends()
    for name, sees_npu in auto_order(classes):
        cls = classes[name]
        installed[name] = {"class": f"{cls.__module__}.{cls.__qualname__}", "npu_present": sees_npu}
        try:
            found = cls.discover()
        except Exception as e:  # noqa: BLE001 - report, never raise
            installed[name]["error"] = f"{type(e).__name__}: {e}"
            continue
        if found is None:
            continue
        report.setdefault(found.engine, dict(found.engine_report))
        if found.npu is not None:
            npus.append({"backend": name, **found.npu})
    kernel = discover_kernel()
    present = [n for n in npus if n["present"]]
    emulated = [n for n in npus if n.get("emulated")]
    if present:
        verdict = "NPU present: " + ", ".join(n["name"] for n in present)
    else:
        verdict = "no NPU is present on this machine: models run on the CPU (or GPU) devices of the engines"
        if emulated:
            verdict += "; " + ", ".join(f"{n['name']} runs as an emulator (the NPU's compiler and numerics, not its "
                                        "speed)" for n in emulated)
    return {
        "npu_present": bool(present),
        "verdict": verdict,
        "needed": [] if present else [f"{n['name']} (backend {n['backend']}): " + "; ".join(n["needed"])
                                      for n in npus if n["needed"]],
        "npus": npus,
        "backends": {"installed": installed, "failed": dict(sorted(RunnerFactory.backend_errors().items()))},
        "openvino": report.get("openvino", {"installed": False, "error": "no installed backend reports OpenVINO"}),
        "onnxruntime": report.get("onnxruntime", {"installed": False,
                                                  "error": "no installed backend reports ONNX Runtime"}),
        "kernel": kernel,
        "memory": discover_memory(kernel),
    }
