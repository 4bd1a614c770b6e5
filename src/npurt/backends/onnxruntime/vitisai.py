"""The Vitis AI execution provider (AMD Ryzen AI / Versal NPUs): RunnerType.VAIML.

The EP ships only in the Ryzen AI SDK's onnxruntime build, never on PyPI; where it is missing the runner falls back
to ONNX Runtime's CPU provider as the ``fallback`` option allows, and says so. Its provider options are passed
through from ``engine_options``; with npurt's ``cache_dir`` it gets its own compiled-model cache there (the EP keeps
its compiled models itself: a ``cache_dir`` / ``cache_key`` mismatch makes it run everything on the CPU, which the
adapter's placement check reports).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import onnxruntime as ort

from ...engine import Discovery
from .adapter import OrtBackend
from .discovery import engine_report
from .providers import VITISAI_EP, ExecutionProvider

# engine_options keys that are Vitis AI provider options; every other key configures the session.
VITISAI_OPTION_KEYS = ("config_file", "cache_dir", "cache_key", "target", "xclbin", "encryption_key")


def accel_nodes() -> list[str]:
    try:
        return sorted(f"/dev/accel/{n}" for n in os.listdir("/dev/accel"))
    except OSError:
        return []


class VitisAIProvider(ExecutionProvider):
    ep_name = VITISAI_EP
    device = "NPU"
    target = "VAIML"
    option_keys = VITISAI_OPTION_KEYS

    @property
    def label(self) -> str:
        return "ONNX Runtime (Vitis AI EP)"

    def unavailable_reason(self) -> str:
        providers = ort.get_available_providers()
        if VITISAI_EP in providers:
            return ""
        accel = accel_nodes()
        driver = Path("/sys/module/amdxdna").exists()
        return (f"the Vitis AI execution provider is not installed: ONNX Runtime {ort.__version__} "
                f"({Path(ort.__file__).parent}) has providers {providers}, and {VITISAI_EP} ships only in the "
                f"Ryzen AI SDK's onnxruntime build; "
                + (f"accel nodes {accel}" if accel else "no /dev/accel nodes")
                + ("; amdxdna driver loaded" if driver else "; amdxdna driver not loaded (/sys/module/amdxdna absent)"))

    def provider_options(self, cache_dir: str | None, model_digest: str | None) -> dict[str, str]:
        options = dict(self.options)
        if cache_dir is not None:  # the EP's own compiled-model cache, in npurt's cache_dir
            options.setdefault("cache_dir", cache_dir)
            if model_digest is not None:
                options.setdefault("cache_key", f"npurt-{model_digest[:32]}")
        return options


def amd_npu_report() -> dict[str, Any]:
    """The AMD NPU's verdict for `npurt devices`: present (the Vitis AI EP and the amdxdna driver), or what is
    needed."""
    ep = VITISAI_EP in ort.get_available_providers()
    driver = Path("/sys/module/amdxdna").exists() or any(_driver(n) == "amdxdna" for n in accel_nodes())
    needed = []
    if not driver:
        needed.append("an AMD Ryzen AI NPU with the amdxdna kernel driver loaded (and its /dev/accel/accel* node)")
    if not ep:
        needed.append(f"the Ryzen AI SDK's onnxruntime build, which has the {VITISAI_EP} (instead of the PyPI "
                      "onnxruntime)")
    present = ep and driver
    return {"name": "AMD NPU via the Vitis AI EP", "present": present, "emulated": False,
            "why_not": "" if present else VitisAIProvider().unavailable_reason() or "the amdxdna driver is not loaded",
            "needed": needed}


def _driver(node: str) -> str | None:
    try:
        return os.path.basename(os.readlink(f"/sys/class/accel/{os.path.basename(node)}/device/driver"))
    except OSError:
        return None


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
