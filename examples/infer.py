"""The one thing a pipeline needs from an engine: an "infer" callable per model.

``infer(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]`` (a list in the model's output order is taken
too). ``npurt.Runner.run`` is one; ``ort_infer`` and ``ov_infer`` below are the engines called directly, so
that the same pipeline runs through npurt and through ONNX Runtime or OpenVINO and the results can be compared.
Each adapter holds one engine request: call it from one thread at a time.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import Any

import numpy as np

Outputs = Mapping[str, np.ndarray] | Sequence[np.ndarray]
Infer = Callable[[dict[str, np.ndarray]], Outputs]

ModelPath = str | os.PathLike[str]


def output(result: Outputs, name: str, index: int) -> np.ndarray:
    """One output of an infer call: by name from a dict, by position from a list."""
    if isinstance(result, Mapping):
        return result[name]
    return result[index]


def first_output(result: Outputs) -> np.ndarray:
    if isinstance(result, Mapping):
        return next(iter(result.values()))
    return result[0]


def ort_infer(path: ModelPath, threads: int = 0) -> Infer:
    """ONNX Runtime's CPU provider used directly: ``InferenceSession(path).run``, outputs by name.

    ``threads`` is the intra-op pool size; 0 lets ONNX Runtime take one thread per physical core.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(os.fspath(path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]

    def infer(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names, session.run(None, feeds)))

    return infer


@cache
def _ov_core() -> Any:
    import openvino as ov

    return ov.Core()


def ov_infer(path: ModelPath, device: str = "CPU") -> Infer:
    """OpenVINO used directly: the model compiled with its own dynamic shapes, computing in f32, inputs and outputs
    shared with OpenVINO (``infer(feeds, share_inputs=True, share_outputs=True)``: no copy of either, as OpenVINO
    advises for speed). The outputs are views of the request's tensors, which the next call overwrites: a caller
    copies what it keeps beyond that.

    ``INFERENCE_PRECISION_HINT`` f32, because OpenVINO's CPU plugin computes in bf16 by default on CPUs with
    AVX-512 BF16 or AMX, and its results then differ from ONNX Runtime's by about 1e-2.
    """
    compiled = _ov_core().compile_model(os.fspath(path), device, {"INFERENCE_PRECISION_HINT": "f32"})
    request = compiled.create_infer_request()
    ports = [(o, o.get_any_name()) for o in compiled.outputs]

    def infer(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        result = request.infer(feeds, share_inputs=True, share_outputs=True)
        return {name: result[port] for port, name in ports}

    return infer


class ShapeLog:
    """Wraps infer callables; counts the input shapes each one was called with (how many distinct shapes a
    stream of inputs asks an engine to handle) and the time spent in each."""

    def __init__(self) -> None:
        self.calls: dict[str, Counter[tuple[tuple[int, ...], ...]]] = {}
        self.seconds: dict[str, float] = {}

    def wrap(self, model: str, infer: Infer) -> Infer:
        self.calls.setdefault(model, Counter())
        self.seconds.setdefault(model, 0.0)

        def logged(feeds: dict[str, np.ndarray]) -> Outputs:
            self.calls[model][tuple(tuple(v.shape) for v in feeds.values())] += 1
            start = time.perf_counter()
            try:
                return infer(feeds)
            finally:
                self.seconds[model] += time.perf_counter() - start

        return logged

    def clear(self) -> None:
        for model in self.calls:
            self.calls[model].clear()
            self.seconds[model] = 0.0

    def distinct(self, model: str) -> int:
        return len(self.calls.get(model, ()))
