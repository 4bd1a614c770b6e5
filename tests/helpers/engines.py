"""The engines used directly, with the settings the suite gives every runner: differential tests compare npurt
with the engine at the same settings. The suite caps each runner at NPURT_NUM_THREADS engine threads (conftest);
OpenVINO's CPU plugin splits some reductions by thread, so the raw side takes the same thread count."""

from __future__ import annotations

import os
from typing import Any

from npurt.options import NUM_THREADS_ENV


def suite_threads() -> int | None:
    value = os.environ.get(NUM_THREADS_ENV)
    return int(value) if value else None


def ov_cpu_properties(**extra: Any) -> dict[str, Any]:
    """OpenVINO CPU properties of a runner made with the suite's defaults: f32, the suite's thread count."""
    properties: dict[str, Any] = {"INFERENCE_PRECISION_HINT": "f32"}
    threads = suite_threads()
    if threads is not None:
        properties["INFERENCE_NUM_THREADS"] = threads
    properties.update(extra)
    return properties
