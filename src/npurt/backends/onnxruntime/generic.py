"""RunnerType.ONNXRUNTIME: ONNX Runtime with any execution provider it offers, by name or by its device policy.

- Option ``execution_provider``: EP names in order of preference, each with provider options. The first that can
  run here is used; each one passed over is in ``device_info.skipped`` with why. An EP that ONNX Runtime does not
  have is never a silent CPU run: it is skipped with its reason, and the runner falls back to the CPU provider only
  as option ``fallback`` allows (a warning says so), else raises.
- Option ``ep_policy``: ONNX Runtime's device policies (PREFER_NPU, MAX_EFFICIENCY, ...), applied as ONNX Runtime
  orders devices (``provider_policy_context.cc``: NPU, then GPU, then CPU; the EP of the device's own vendor first;
  its default CPU EP last). Two things differ, both said in ``device_info``: an emulated device (Qualcomm's HTP
  emulator, which ONNX Runtime lists as a CPU device) is never chosen by a policy, and an EP npurt knows gets
  npurt's provider options (the QNN EP cannot run without them: ONNX Runtime's own policies fail with "Could not
  determine default backend path for device" once it is registered).
- Neither: option ``device`` chooses among ONNX Runtime's devices: AUTO takes a present NPU, then a GPU, then the
  CPU; "NPU" takes an emulated NPU too, because it was asked for.

Installed plugin EP packages (``onnxruntime-qnn``, ``onnxruntime-ep-*``) are registered first (``plugins``).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import onnxruntime as ort

from ...devices import Selection
from ...engine import Discovery
from ...options import RunnerOptions
from ...types import NpuError, NpuFallbackWarning
from . import plugins
from .adapter import DEVICE_FAMILIES, OrtBackend
from .discovery import device_family, emulated_device, engine_report
from .providers import CPU_EP, QNN_EP, VITISAI_EP, ExecutionProvider
from .qnn import QnnProvider
from .vitisai import VitisAIProvider

# Device families of EPs that ONNX Runtime builds in (not listed in get_ep_devices on every build)
BUILT_IN_DEVICES = {
    "CUDAExecutionProvider": "GPU", "TensorrtExecutionProvider": "GPU", "ROCMExecutionProvider": "GPU",
    "MIGraphXExecutionProvider": "GPU", "DmlExecutionProvider": "GPU", "WebGpuExecutionProvider": "GPU",
    "OpenVINOExecutionProvider": "NPU", "VitisAIExecutionProvider": "NPU", "QNNExecutionProvider": "NPU",
    "CoreMLExecutionProvider": "NPU", "NnapiExecutionProvider": "NPU", "XnnpackExecutionProvider": "CPU",
    "DnnlExecutionProvider": "CPU", "ACLExecutionProvider": "CPU", "ArmNNExecutionProvider": "CPU",
    CPU_EP: "CPU",
}


class AnyProvider(ExecutionProvider):
    """An EP npurt has no module of its own for: added by its device where ONNX Runtime lists one (plugin EPs, and
    the EPs a build lists there), else by name."""

    def __init__(self, name: str, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(options)
        self.ep_name = name
        listed = plugins.ep_devices(name)
        self.ep_device = listed[0] if listed else None
        self.plugin = self.ep_device is not None
        self.device = device_family(self.ep_device) if self.ep_device is not None else BUILT_IN_DEVICES.get(name,
                                                                                                          "GPU")

    def unavailable_reason(self) -> str:
        if self.ep_device is not None or self.ep_name in ort.get_available_providers():
            return ""
        return (f"ONNX Runtime {ort.__version__} has no {self.ep_name}: its providers are "
                f"{', '.join(ort.get_available_providers())}, and no installed plugin EP package provides it")

    def describe(self) -> str:
        if self.ep_device is None:
            return self.ep_name
        return f"{self.ep_name} ({self.ep_device.ep_vendor}, {self.device} {self.ep_device.device.vendor})"

    def add_to(self, so: ort.SessionOptions, provider_options: Mapping[str, str]) -> list[Any]:
        if self.plugin:
            so.add_provider_for_devices([self.ep_device], dict(provider_options))
            return []
        return super().add_to(so, provider_options)

    def cache_parts(self) -> dict[str, Any] | None:
        return None  # what its compiled models depend on is unknown to npurt: nothing is kept in its cache


def provider_for(name: str, options: Mapping[str, Any] | None = None) -> ExecutionProvider:
    """The npurt module's EP for the names it knows (with its defaults), else a plain one."""
    if name == QNN_EP:
        return QnnProvider(options)
    if name == VITISAI_EP:
        return VitisAIProvider(options)
    if name == CPU_EP:
        return ExecutionProvider(options)
    return AnyProvider(name, options)


def policy_order(devices: list[Any]) -> list[Any]:
    """ONNX Runtime's order of EP devices for its policies: NPU, GPU, CPU; within a type the device of the EP's
    own vendor first; its default CPU EP last; then by EP name."""
    rank = {"NPU": 0, "GPU": 1, "CPU": 2}

    def key(d: Any) -> tuple[int, bool, bool, str]:
        default_cpu = device_family(d) == "CPU" and d.ep_vendor == "Microsoft"
        return rank[device_family(d)], d.device.vendor != d.ep_vendor, default_cpu, d.ep_name

    return sorted(devices, key=key)


def policy_choice(policy: str, devices: list[Any]) -> Any:
    """The device ONNX Runtime's ``policy`` selects first among ``devices`` (ordered by ``policy_order``)."""
    if not devices:
        raise NpuError("ONNX Runtime lists no EP device")
    first = devices[0]
    wanted = {"PREFER_NPU": "NPU", "MAX_EFFICIENCY": "NPU", "MIN_OVERALL_POWER": "NPU",
              "PREFER_GPU": "GPU", "MAX_PERFORMANCE": "GPU"}.get(policy)
    if wanted == "NPU" and device_family(first) == "NPU":
        return first
    if wanted == "GPU":
        gpu = next((d for d in devices if device_family(d) == "GPU"), None)
        if gpu is not None:
            return gpu
    return next(d for d in devices if device_family(d) == "CPU")  # ONNX Runtime's CPU fallback of each policy


def select_provider(options: RunnerOptions, provider_options: Mapping[str, Any]
                    ) -> tuple[ExecutionProvider, Selection]:
    """RunnerType.ONNXRUNTIME's EP and the device it attaches, with the candidates passed over and why."""
    plugins.register_all()
    requested = options.device
    skipped: list[tuple[str, str]] = []
    if options.ep_policy is not None:
        listed = plugins.ep_devices()
        for d in listed:
            if emulated_device(d):
                skipped.append((d.ep_name, f"{d.ep_name} is an emulator (ONNX Runtime lists it as a CPU device); "
                                           "a device policy never picks an emulated NPU"))
        chosen = policy_choice(options.ep_policy, policy_order([d for d in listed if not emulated_device(d)]))
        provider = provider_for(chosen.ep_name, provider_options)
        return provider, Selection(requested, device_family(chosen), skipped=tuple(skipped))
    if not options.execution_provider and requested == "AUTO":
        skipped += _families_passed_over()
    candidates = ([provider_for(n, {**provider_options, **o}) for n, o in options.execution_provider]
                  or _by_device(requested))
    for provider in candidates:
        why_not = provider.unavailable_reason()
        if not why_not and requested not in ("AUTO", provider.device):
            why_not = f"it runs on the {provider.device}, and device {requested} was asked for"
        if not why_not:
            return provider, Selection(requested, provider.device, skipped=tuple(skipped))
        skipped.append((provider.ep_name, why_not))
    why = "; ".join(f"{n}: {w}" for n, w in skipped) or "no EP was given"
    if options.fallback != "cpu":
        raise NpuError(f"ONNX Runtime: none of the execution providers asked for can run here: {why}")
    warnings.warn(f"npurt ONNXRUNTIME: no EP asked for can run here ({why}); running on ONNX Runtime's CPU "
                  "provider (option fallback='error' makes this an error)", NpuFallbackWarning, stacklevel=6)
    return ExecutionProvider(), Selection(requested, "CPU", fell_back=True, reason=why, skipped=tuple(skipped))


def _families_passed_over() -> list[tuple[str, str]]:
    """AUTO: why each device family before the one taken has nothing to run on."""
    listed = plugins.ep_devices()
    passed = []
    for family in ("NPU", "GPU"):
        present = [d for d in listed if device_family(d) == family and not emulated_device(d)]
        if present:
            break
        emulators = [d.ep_name for d in listed if emulated_device(d)] if family == "NPU" else []
        passed.append((family, f"ONNX Runtime lists no {family} device (its EP devices: "
                               f"{', '.join(sorted({d.ep_name for d in listed})) or 'none'})"
                               + (f"; {', '.join(emulators)} is an emulator, never a present NPU" if emulators
                                  else "")))
    return passed


def _by_device(requested: str) -> list[ExecutionProvider]:
    """Option device among ONNX Runtime's devices: AUTO and the named family; "NPU" includes an emulator."""
    devices = policy_order(plugins.ep_devices())
    families = list(DEVICE_FAMILIES) if requested == "AUTO" else [requested]
    chosen = [provider_for(d.ep_name) for family in families for d in devices
              if device_family(d) == family and not emulated_device(d)]
    if requested == "NPU":  # an emulated NPU too, since it was asked for
        chosen += [provider_for(d.ep_name) for d in devices if emulated_device(d)]
    return chosen or [ExecutionProvider()]


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
        return any(device_family(d) == "NPU" and not emulated_device(d) for d in plugins.ep_devices())

    def select(self, provider_options: Mapping[str, Any]) -> tuple[ExecutionProvider, Selection]:
        return select_provider(self.options, provider_options)
