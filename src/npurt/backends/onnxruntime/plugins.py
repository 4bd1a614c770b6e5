"""Plugin execution providers: EP libraries that ship as their own Python packages and register with ONNX Runtime.

ONNX Runtime 1.22+ loads an EP from a shared library (``register_execution_provider_library``); its devices then
appear in ``get_ep_devices()`` and a session takes one with ``SessionOptions.add_provider_for_devices``. Such EPs
ship on PyPI as packages with a ``get_library_path()``: ``onnxruntime-qnn`` (Qualcomm), ``onnxruntime-ep-openvino``,
``onnxruntime-ep-nv-tensorrt-rtx``... This module finds the installed ones and registers each library once per
process (registering one twice raises in ONNX Runtime; a library is never unregistered while sessions may use it).
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import threading
from dataclasses import dataclass
from typing import Any

import onnxruntime as ort

# Packages whose module names ONNX Runtime's plugin EPs ship under; other installed distributions named
# onnxruntime-ep-* are found too.
KNOWN_PACKAGES = ("onnxruntime_qnn", "onnxruntime_ep_openvino", "onnxruntime_ep_nv_tensorrt_rtx")
_DISTRIBUTION = re.compile(r"^onnxruntime[-_](qnn|ep[-_].+)$", re.IGNORECASE)


@dataclass(frozen=True)
class PluginPackage:
    """One installed plugin EP package and what registering it did."""

    module: str
    version: str
    library: str = ""
    ep_names: tuple[str, ...] = ()  # the EPs its library provides (where the package says)
    registered: bool = False
    error: str = ""  # why it is not registered

    def to_dict(self) -> dict[str, Any]:
        return {"module": self.module, "version": self.version, "library": self.library,
                "ep_names": list(self.ep_names), "registered": self.registered, "error": self.error or None}


_lock = threading.Lock()
_registered: dict[str, PluginPackage] = {}  # module -> its package, once registration was tried


def installed_modules() -> list[str]:
    """The plugin EP packages installed here, by module name (nothing imported)."""
    from importlib import metadata  # (here, not at the top: a CPU load never reads the distributions, ~40 ms)

    found = set()
    for dist in metadata.distributions():
        name = dist.metadata["Name"] or ""
        if _DISTRIBUTION.match(name):
            found.add(name.replace("-", "_").lower())
    for module in KNOWN_PACKAGES:
        if importlib.util.find_spec(module) is not None:
            found.add(module)
    return sorted(found)


def register(module: str) -> PluginPackage:
    """Import a plugin EP package and register its library with ONNX Runtime, once per process."""
    with _lock:
        done = _registered.get(module)
        if done is not None:
            return done
        _registered[module] = package = _register(module)
        return package


def register_all() -> list[PluginPackage]:
    return [register(m) for m in installed_modules()]


def _register(module: str) -> PluginPackage:
    from importlib import metadata

    try:
        version = metadata.version(module.replace("_", "-"))
    except metadata.PackageNotFoundError:
        version = "unknown"
    if not hasattr(ort, "register_execution_provider_library"):
        return PluginPackage(module, version, error=f"ONNX Runtime {ort.__version__} cannot load plugin EPs "
                                                    "(register_execution_provider_library needs 1.22 or newer)")
    try:
        package = importlib.import_module(module)
        library = str(package.get_library_path())
    except Exception as e:  # noqa: BLE001 - a broken package must not hide the others
        return PluginPackage(module, version, error=f"{module} cannot be imported: {type(e).__name__}: {e}")
    names = _ep_names(package)
    registration = names[0] if names else module
    try:
        ort.register_execution_provider_library(registration, library)
    except Exception as e:  # noqa: BLE001 - registered already (by the app itself), or a library that fails to load
        if not any(d.ep_name in names for d in ort.get_ep_devices()):
            return PluginPackage(module, version, library, names, error=f"registering {library} failed: {e}")
    return PluginPackage(module, version, library, names, registered=True)


def _ep_names(package: Any) -> tuple[str, ...]:
    for attribute in ("get_ep_names", "get_ep_name"):
        getter = getattr(package, attribute, None)
        if callable(getter):
            value = getter()
            return tuple(value) if isinstance(value, (list, tuple)) else (str(value),)
    name = getattr(package, "EP_NAME", None)
    return (str(name),) if name else ()


def ep_devices(ep_name: str | None = None) -> list[Any]:
    """ONNX Runtime's EP devices (``OrtEpDevice``), of one EP where named; [] where this build has no discovery."""
    getter = getattr(ort, "get_ep_devices", None)
    if getter is None:
        return []
    return [d for d in getter() if ep_name is None or d.ep_name == ep_name]
