"""Device selection with reasons: which device a backend attaches, and why not the others (`npurt devices`' report
of what this machine has is ``discovery``)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass

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
