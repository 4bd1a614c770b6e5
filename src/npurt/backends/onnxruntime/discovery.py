"""ONNX Runtime's side of `npurt devices`: its providers, its EP devices (plugin EPs registered first), and which of
them is an emulator."""

from __future__ import annotations

from typing import Any

import onnxruntime as ort

from . import plugins
from .providers import VITISAI_EP, emulated

DEVICE_TYPES = {0: "CPU", 1: "GPU", 2: "NPU"}  # OrtHardwareDeviceType


def device_family(device: Any) -> str:
    """An OrtEpDevice's hardware type: "CPU", "GPU" or "NPU" (as ONNX Runtime lists it: an emulator of an NPU is
    listed on the CPU it runs on)."""
    return DEVICE_TYPES.get(int(device.device.type), "CPU")


def emulated_device(device: Any) -> bool:
    """Whether an EP device is an emulator of an NPU (Qualcomm's HTP emulator on x86-64)."""
    return emulated(str(device.ep_name))


def engine_report() -> dict[str, Any]:
    """ONNX Runtime for `npurt devices`: version, providers, plugin EP packages and every EP device."""
    packages = plugins.register_all()
    providers = list(ort.get_available_providers())
    devices = [{"ep_name": d.ep_name, "ep_vendor": d.ep_vendor, "device_type": device_family(d),
                "device_vendor": d.device.vendor, "emulated": emulated_device(d)} for d in plugins.ep_devices()]
    vitis = VITISAI_EP in providers
    return {"installed": True, "version": ort.__version__, "providers": providers, "ep_devices": devices,
            "plugin_packages": [p.to_dict() for p in packages], "vitis_ai": vitis,
            "why_not": None if vitis else (f"this onnxruntime build has no {VITISAI_EP} (the PyPI builds never do; "
                                           "the Ryzen AI SDK ships an onnxruntime build with it)"),
            "error": None}
