"""Loads to time in a fresh process (``npurt.bench.fresh``): npurt's runner, raw OpenVINO, raw ONNX Runtime.

Each function imports what it needs, calls ``probe.baseline()``, then times the load and one inference on random
inputs ``{name: [shape, dtype]}`` and returns ``{"load_ms", "first_inference_ms", ...}``; the loaded model stays
alive (``probe.keep``) until the process reports its memory. Only the standard library is imported at the top of
this module: it is loaded by file in the child, before the clock starts.
"""

from __future__ import annotations

import time
from typing import Any


def _feeds(inputs: dict[str, list[Any]], seed: int = 0) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return {name: rng.random(shape).astype(dtype) if np.dtype(dtype).kind == "f"
            else rng.integers(0, 10, size=shape).astype(dtype) for name, (shape, dtype) in inputs.items()}


def load_npurt(probe: Any, backend: str, model: str, options: dict[str, Any], inputs: dict[str, list[Any]]
               ) -> dict[str, Any]:
    """``RunnerFactory.create_runner(backend, model, options)``, then ``runner.run`` once."""
    from npurt import factory
    from npurt.factory import RunnerFactory

    # Import the engine this load uses before the clock starts, as the raw side imports its own: the backend's
    # alone, as create_runner does for a named backend (AUTO tries them all). A second engine in the process is
    # no cost of npurt's, and it is not free: with openvino imported, ONNX Runtime's first session takes ~5 ms more.
    if backend.upper() == "AUTO":
        RunnerFactory.available_backends()
    else:
        factory.backend_class(backend.upper())
    feeds = _feeds(inputs)
    probe.baseline()
    t0 = time.perf_counter()
    runner = probe.keep(RunnerFactory.create_runner(backend, model, options))
    t1 = time.perf_counter()
    runner.run(feeds)
    t2 = time.perf_counter()
    return {"load_ms": (t1 - t0) * 1e3, "first_inference_ms": (t2 - t1) * 1e3,
            "attached": runner.device_info.attached, "load_steps": [list(s) for s in runner.device_info.load_steps]}


def load_openvino(probe: Any, model: str, device: str, properties: dict[str, str], inputs: dict[str, list[Any]],
                  shapes: dict[str, list[int]] | None = None) -> dict[str, Any]:
    """``ov.Core().compile_model(model, device, properties)`` (with ``shapes``: read, reshape, compile), then one
    ``InferRequest.infer``."""
    import openvino as ov

    feeds = _feeds(inputs)
    probe.baseline()
    t0 = time.perf_counter()
    core = ov.Core()
    if shapes:
        ov_model = core.read_model(model)
        ov_model.reshape(shapes)
        compiled = probe.keep(core.compile_model(ov_model, device, properties))
    else:
        compiled = probe.keep(core.compile_model(model, device, properties))
    t1 = time.perf_counter()
    request = probe.keep(compiled.create_infer_request())
    request.infer(feeds)  # by name: the feeds need not be in the model's input order
    t2 = time.perf_counter()
    return {"load_ms": (t1 - t0) * 1e3, "first_inference_ms": (t2 - t1) * 1e3}


def load_onnxruntime(probe: Any, model: str, inputs: dict[str, list[Any]], providers: list[str] | None = None,
                     optimized: str | None = None) -> dict[str, Any]:
    """``InferenceSession(model, providers=...)``, then one ``run``. ``optimized``: ONNX Runtime's own cache, a
    file ``SessionOptions.optimized_model_filepath`` writes (for a model of 1 MiB or more, with its initializers in a
    file beside it); when it exists it is loaded instead, optimizations off (it is optimized already)."""
    import os

    import onnxruntime as ort

    feeds = _feeds(inputs)
    probe.baseline()
    t0 = time.perf_counter()
    options = ort.SessionOptions()
    if optimized is not None and os.path.exists(optimized):
        model = optimized
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    elif optimized is not None:
        options.optimized_model_filepath = optimized
        options.log_severity_level = 3  # else it warns that the file is for this CPU only: it is, and so is the cache
        if os.path.getsize(model) >= 1 << 20:  # its initializers in a file beside it, mapped at load (as npurt's
            # cache keeps them from 1 MiB, tensors of 64 KiB up: parsed from the protobuf they load slower; the
            # file's size alone: the models timed this way hold their weights in the file)
            options.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                             os.path.basename(optimized) + ".data")
            options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes",
                                             str(64 << 10))
    session = probe.keep(ort.InferenceSession(model, options, providers=providers or ["CPUExecutionProvider"]))
    t1 = time.perf_counter()
    session.run(None, feeds)
    t2 = time.perf_counter()
    return {"load_ms": (t1 - t0) * 1e3, "first_inference_ms": (t2 - t1) * 1e3}
