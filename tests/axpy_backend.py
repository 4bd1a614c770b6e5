"""A small real backend for testing the Runner contract without an engine: y = a * x + b in numpy.

The "model" is a JSON file: {"a": 2.0, "b": 1.0, "shape": [null, 3, 4, 4], "delay_ms": 0, "target": "",
"engine_async": false}. With "engine_async" the "engine" also has requests of its own that run on their own
thread (the ``_start`` / ``_await`` hooks), as OpenVINO's infer requests do.
Like a real engine it consumes each port in the view chosen at creation (``target`` picks the HW view
rules of formats.hw_view), so the runner's conversion paths run for real. Inputs that hold NaN make the
"engine" fail (RUNTIME_ERROR), +inf is unsupported (UNSUPPORTED), and -inf runs out of memory.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from npurt import DataType, DeviceInfo, NpuTensor, NpuUnsupportedError, TensorType
from npurt.formats import convert
from npurt.runner import Compiled, Port, PortSpec, Runner
from npurt.types import TensorDirection


class AxpyRunner(Runner):
    runner_type = "AXPY"

    def __init__(self, model_path: str | Path, options: dict[str, Any] | None = None) -> None:
        self.model = json.loads(Path(model_path).read_text()) if Path(model_path).exists() else {}
        self.target = self.model.get("target", "")
        self.active = 0
        self.peak_active = 0
        self.started = 0  # requests started on the "engine" (engine_async)
        self._active_lock = threading.Lock()
        super().__init__(model_path, options)

    def _load(self) -> tuple[list[PortSpec], list[PortSpec]]:
        shape = tuple(self.model["shape"])
        self._device_info = DeviceInfo(requested=self.options.device, attached="CPU", engine="numpy",
                                       engine_version=np.__version__)
        return ([PortSpec("x", DataType.FLOAT32, shape)], [PortSpec("y", DataType.FLOAT32, shape)])

    def _compile(self, inputs: list[Port]) -> Compiled:
        shape = inputs[0].cpu.shape
        out = self.make_port(PortSpec("y", DataType.FLOAT32, shape), TensorDirection.OUTPUT)
        return Compiled(inputs=inputs, outputs=[out], engine={"shape": shape})

    def _run(self, compiled: Compiled, inputs: list[NpuTensor], outputs: list[NpuTensor]) -> None:
        with self._active_lock:
            self.active += 1
            self.peak_active = max(self.peak_active, self.active)
        try:
            x_port, y_port = compiled.inputs[0], compiled.outputs[0]
            x = self._as_cpu(inputs[0], x_port)
            if np.isnan(x).any():
                raise RuntimeError("engine failure: NaN input")
            if np.isposinf(x).any():
                raise NpuUnsupportedError("+inf inputs are not supported by this engine")
            if np.isneginf(x).any():
                raise MemoryError("engine ran out of device memory")
            delay = float(x.flat[0]) if self.model.get("delay_from_input") else self.model.get("delay_ms", 0)
            if delay:
                time.sleep(delay / 1000.0)
            y = (np.float32(self.model["a"]) * x + np.float32(self.model["b"])).astype(np.float32)
            self._from_cpu(y, outputs[0], y_port)
        finally:
            with self._active_lock:
                self.active -= 1

    def _start(self, compiled: Compiled, inputs: list[NpuTensor], outputs: list[NpuTensor]) -> Any:
        if not self.model.get("engine_async"):
            return None
        request: dict[str, Any] = {}

        def run() -> None:
            try:
                self._run(compiled, inputs, outputs)
            except BaseException as e:  # noqa: BLE001 - handed to _await, as an engine's request keeps it
                request["error"] = e

        request["thread"] = threading.Thread(target=run, name="axpy-request")
        request["thread"].start()
        self.started += 1
        return request

    def _await(self, handle: Any, timeout_s: float | None) -> bool:
        handle["thread"].join(timeout_s)
        if handle["thread"].is_alive():
            return False
        if "error" in handle:
            raise handle["error"]
        return True

    @staticmethod
    def _as_cpu(t: NpuTensor, port: Port) -> np.ndarray:
        if port.view is TensorType.CPU:
            return t.numpy().copy()
        out = np.empty(port.cpu.shape, np.float32)
        convert(t, NpuTensor(port.cpu, out))
        return out

    @staticmethod
    def _from_cpu(y: np.ndarray, t: NpuTensor, port: Port) -> None:
        if port.view is TensorType.CPU:
            t.numpy()[...] = y
        else:
            convert(NpuTensor(port.cpu.replace(direction=TensorDirection.INPUT), y), t)


def write_model(path: Path, **fields: Any) -> Path:
    model = {"a": 2.0, "b": 1.0, "shape": [1, 3, 4, 4], "target": ""}
    model.update(fields)
    path.write_text(json.dumps(model))
    return path
