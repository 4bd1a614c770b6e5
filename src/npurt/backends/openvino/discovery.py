"""OpenVINO's side of device discovery and types: the process's one Core, its devices and why an NPU or GPU is
missing, and npurt's DataTypes as OpenVINO element types."""

from __future__ import annotations

import glob
import os
import threading
from collections.abc import Sequence

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
