"""What the ONNX Runtime adapter needs to know of one execution provider: the interface its EP modules implement.

The adapter (``adapter.OrtBackend``) is the same for every EP: sessions, IOBinding, shapes, npurt's cache and
placement. An ``ExecutionProvider`` says only what differs: whether the EP can run here and why not, which of the
user's ``engine_options`` are its provider options, how a session gets it, the HW views of its NPU, and what its
compiled models depend on.
"""

from __future__ import annotations

import contextlib
import platform
from collections.abc import Iterator, Mapping
from typing import Any

import onnxruntime as ort

CPU_EP = "CPUExecutionProvider"
QNN_EP = "QNNExecutionProvider"
VITISAI_EP = "VitisAIExecutionProvider"


def emulated(ep_name: str) -> bool:
    """Whether the NPU behind an EP is an emulator on this host: the QNN EP's HTP backend on x86-64 is Qualcomm's
    emulator (there is no Hexagon DSP there)."""
    return ep_name == QNN_EP and platform.machine().lower() in ("x86_64", "amd64")


class ExecutionProvider:
    """One ONNX Runtime execution provider as the adapter uses it. The base class is an EP that ONNX Runtime
    builds in or lists in ``get_available_providers()``, added to a session by name with its options."""

    ep_name: str = CPU_EP
    device: str = "CPU"  # the device family it runs on: "NPU", "GPU" or "CPU"
    target: str = ""  # formats' HW view family on its NPU ("VAIML", "QNN"); "" for the model's own views
    emulated: bool = False  # an emulator of the device: its compiler and numerics, not its speed
    option_keys: tuple[str, ...] = ()  # engine_options keys that are this EP's provider options
    plugin = False  # a plugin EP: a session gets it with add_provider_for_devices, never in a providers list
    takes_precision = False  # whether option inference_precision means something to it
    casts_uint8_wrong = False  # its Cast uint8 -> float32 is wrong: frames go through float16 (onnx_frames)

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.options = {str(k): str(v) for k, v in (options or {}).items()}  # its provider options

    @property
    def label(self) -> str:
        """How messages name the EP's device ("ONNX Runtime (Vitis AI EP)")."""
        return f"ONNX Runtime ({self.ep_name})"

    def unavailable_reason(self) -> str:
        """Why this EP cannot run here ("" when it can)."""
        if self.ep_name in ort.get_available_providers():
            return ""
        return (f"ONNX Runtime {ort.__version__} has no {self.ep_name} (its providers: "
                f"{', '.join(ort.get_available_providers())})")

    def auto_skip_reason(self) -> str:
        """Why device AUTO does not pick this EP though it can run ("" where AUTO may pick it): an emulator is never
        a present device."""
        return ""

    def describe(self) -> str:
        """What runs the model, for device_info's full name and the reports."""
        return self.ep_name

    def provider_options(self, cache_dir: str | None, model_digest: str | None) -> dict[str, str]:
        """The options a session gets for this EP (``model_digest``: the model's content, for EP-side caches)."""
        return dict(self.options)

    def add_to(self, so: ort.SessionOptions, provider_options: Mapping[str, str]) -> list[Any]:
        """Give a session this EP: the ``providers`` list entries for ``InferenceSession`` (a plugin EP is added to
        ``so`` instead, and contributes nothing here)."""
        return [(self.ep_name, dict(provider_options))] if self.ep_name != CPU_EP else []

    def log_severity(self, log_level: str) -> int:
        """ONNX Runtime's log severity for a session with this EP at the runner's option log_level."""
        return {"DEBUG": 1, "INFO": 2, "WARNING": 2, "ERROR": 3}[log_level]

    @contextlib.contextmanager
    def creating_session(self) -> Iterator[None]:
        """Around a session's creation with this EP (an EP library that prints to stdout is kept off it)."""
        yield

    def refusal_reasons(self, model: str, provider_options: Mapping[str, str], optimization: int) -> dict[str, str]:
        """Why the EP refused nodes of a model (ONNX Runtime's node name -> the EP's words), where the EP says;
        {} where it does not."""
        return {}

    def cache_parts(self) -> dict[str, Any] | None:
        """What a session's compiled result depends on besides ONNX Runtime and the model (EP versions, device,
        options); None where npurt's cache keeps nothing for this EP (it keeps its own)."""
        return {"ep": self.ep_name, "options": sorted(self.options.items())} if self.ep_name == CPU_EP else None
