"""OpenVINO's side of device discovery and types: the process's one Core, its devices and why an NPU or GPU is
missing, and npurt's DataTypes as OpenVINO element types."""

from __future__ import annotations

import glob
import os
import re
import threading
from collections.abc import Sequence
from typing import Any

import openvino as ov

from ...types import DataType, NpuUnsupportedError

ENGINE = "OpenVINO"

_OV_OF: dict[DataType, ov.Type] = {
    DataType.BOOLEAN: ov.Type.boolean,
    DataType.INT8: ov.Type.i8,
    DataType.UINT8: ov.Type.u8,
    DataType.INT16: ov.Type.i16,
    DataType.UINT16: ov.Type.u16,
    DataType.BF16: ov.Type.bf16,
    DataType.FP16: ov.Type.f16,
    DataType.INT32: ov.Type.i32,
    DataType.UINT32: ov.Type.u32,
    DataType.FLOAT32: ov.Type.f32,
    DataType.INT64: ov.Type.i64,
    DataType.UINT64: ov.Type.u64,
    DataType.FLOAT64: ov.Type.f64,
}
_DATA_TYPE_OF: dict[str, DataType] = {t.get_type_name(): d for d, t in _OV_OF.items()}

# Layout permutations (HW shape = CPU shape permuted) that PrePostProcessor can bake in, for 4-D tensors.

_core: ov.Core | None = None
_core_lock = threading.Lock()


def core() -> ov.Core:
    """The process's one ``ov.Core`` (plugins load once; compiled-model caching is per core)."""
    global _core
    if _core is None:
        with _core_lock:
            if _core is None:
                _core = ov.Core()
    return _core


def ov_type(data_type: DataType) -> ov.Type:
    return _OV_OF[data_type]


def data_type_of(element_type: ov.Type, what: str) -> DataType:
    dt = _DATA_TYPE_OF.get(element_type.get_type_name())
    if dt is None:
        raise NpuUnsupportedError(f"{what}: element type {element_type.get_type_name()} has no npurt DataType "
                                  f"(supported: {sorted(_DATA_TYPE_OF)})")
    return dt


def device_family(name: str) -> str:
    """"GPU.1" -> "GPU": the device kinds npurt selects between."""
    return name.split(".", 1)[0]


def npu_unavailable_reason(available: Sequence[str]) -> str:
    """Why OpenVINO cannot use an NPU here ("" when it can): what OpenVINO, /dev/accel and /sys/module say."""
    if any(device_family(d) == "NPU" for d in available):
        return ""
    reasons = [f"no 'NPU' in OpenVINO's available_devices {list(available)}"]
    nodes = sorted(glob.glob("/dev/accel/accel*"))
    reasons.append(f"accel nodes {nodes} present" if nodes else "no /dev/accel/accel* device node")
    if os.path.isdir("/sys/module/intel_vpu"):
        reasons.append("the intel_vpu driver is loaded (is the NPU user-mode driver / level-zero installed?)")
    else:
        reasons.append("the intel_vpu kernel driver is not loaded (/sys/module/intel_vpu is absent)")
    return "; ".join(reasons)


def gpu_unavailable_reason(available: Sequence[str]) -> str:
    if any(device_family(d) == "GPU" for d in available):
        return ""
    nodes = sorted(glob.glob("/dev/dri/renderD*"))
    return (f"no 'GPU' in OpenVINO's available_devices {list(available)}; "
            + (f"render nodes {nodes} present (is the Intel GPU compute runtime installed?)" if nodes
               else "no /dev/dri/renderD* device node"))


def first_line(e: BaseException) -> str:
    """An engine's exception text, reduced to its most specific line (OpenVINO prefixes a chain of locations)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip() and not ln.strip().startswith("Exception from")]
    if not lines:
        return type(e).__name__
    # "Cannot load library \"/long/site-packages/path/libX.so\": ..." -> the library's name is what matters
    return re.sub(r'"?/(?:[^"\s/]+/)+([^"\s/]+)"?', r"\1", lines[-1])


def engine_report() -> dict[str, Any]:
    """OpenVINO for `npurt devices`: its version, each available device with its full name, the NPU and GPU
    plugins' state (on the process's one Core)."""
    report: dict[str, Any] = {"installed": True, "version": ov.__version__, "devices": [], "plugins": {},
                              "error": None}
    ov_core = core()
    try:
        devices = list(ov_core.available_devices)
    except Exception as e:  # noqa: BLE001 - report, never raise
        report["error"] = f"listing devices failed: {first_line(e)}"
        devices = []
    for name in devices:
        entry: dict[str, Any] = {"name": name, "full_name": None}
        try:
            entry["full_name"] = str(ov_core.get_property(name, "FULL_DEVICE_NAME"))
        except Exception as e:  # noqa: BLE001
            entry["error"] = first_line(e)
        report["devices"].append(entry)
    for plugin in ("NPU", "GPU"):
        state: dict[str, Any] = {"loaded": False, "devices": [], "why_not": None}
        try:
            ov_core.get_versions(plugin)
            state["loaded"] = True
            state["devices"] = [d for d in devices if d == plugin or d.startswith(plugin + ".")]
            if not state["devices"]:
                state["why_not"] = f"the {plugin} plugin loads but finds no {plugin} device"
        except Exception as e:  # noqa: BLE001
            state["why_not"] = f"the {plugin} plugin does not load: {first_line(e)}"
        report["plugins"][plugin] = state
    return report


def intel_npu_report(engine: dict[str, Any]) -> dict[str, Any]:
    """The Intel NPU's verdict for `npurt devices`: present, or why not and what would be needed."""
    plugin = engine["plugins"].get("NPU", {})
    present = bool(plugin.get("devices"))
    why_not = plugin.get("why_not") or ""
    intel_nodes = [n for n in sorted(glob.glob("/dev/accel/accel*")) if _accel_driver(n) == "intel_vpu"]
    if plugin.get("loaded") and not present:
        why_not += (f" ({', '.join(intel_nodes)} is there: the Intel NPU user-mode driver (level-zero) may be "
                    "missing)" if intel_nodes else " (no /dev/accel node of the intel_vpu driver: the driver is not "
                    "loaded or there is no Intel NPU)")
    needed = []
    if not present:
        if not os.path.isdir("/sys/module/intel_vpu"):
            needed.append("an Intel Core Ultra NPU with the intel_vpu kernel driver loaded")
        if not intel_nodes:
            needed.append("its /dev/accel/accel* node, readable and writable by this user")
        needed.append("the Intel NPU user-mode driver (level-zero NPU driver package) so that OpenVINO's NPU plugin "
                      "lists the device")
    return {"name": "Intel NPU via OpenVINO", "present": present, "emulated": False,
            "why_not": "" if present else why_not, "needed": needed}


def _accel_driver(node: str) -> str | None:
    try:
        return os.path.basename(os.readlink(f"/sys/class/accel/{os.path.basename(node)}/device/driver"))
    except OSError:
        return None
