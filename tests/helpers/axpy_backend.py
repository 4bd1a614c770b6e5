"""A small real backend for testing the Runner contract without an engine: y = a * x + b in numpy.

The "model" is a JSON file: {"a": 2.0, "b": 1.0, "shape": [null, 3, 4, 4], "delay_ms": 0, "target": "",
"engine_async": false, "dynamic": true, "device": "CPU"}. ``shape`` dims may be null (dynamic): with "dynamic"
the "device" runs any size there (as OpenVINO's and ONNX Runtime's CPU devices do), else it compiles static shapes
(as the NPU does). With "engine_async" the engine also has requests of its own that run on their own thread and
report their end (``Engine.start``), as OpenVINO's infer requests do.
Like a real engine it consumes each port in the view chosen at creation (``target`` picks the NPU's HW view rules
of formats.hw_view, in force with option hw_view="npu" or "device": "NPU"), so the runner's conversion paths run
for real. Inputs that hold NaN make the "engine" fail (RUNTIME_ERROR), +inf is unsupported (UNSUPPORTED), and
-inf runs out of memory.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from npurt import DataType, DeviceInfo, NpuTensor, NpuUnsupportedError, TensorType
from npurt.engine import Backend, Done, Engine, OpenedModel, OutputTooSmallError
from npurt.formats import convert
from npurt.ports import Port, PortFactory, PortSpec
from npurt.types import TensorDirection


class AxpyEngine(Engine):
    def __init__(self, backend: AxpyBackend, inputs: list[Port], outputs: list[Port]) -> None:
        self.backend = backend
        self.model = backend.model
        self.inputs, self.outputs = inputs, outputs
        self.dynamic = not inputs[0].is_static
        self.closed = False

    def bind(self, inputs: Sequence[NpuTensor], outputs: Sequence[NpuTensor]) -> Any:
        if self.model.get("bind_raises"):  # an engine's unexpected failure while preparing tensors
            raise RuntimeError("bind failed")
        # the memory (numpy views), never the NpuTensor objects: a runner's plan cache keeps bindings
        return (inputs[0].info, inputs[0].numpy(), outputs[0].info, outputs[0].raw_bytes())

    def run(self, binding: Any, context: Any = None) -> Any:
        x_info, x_mem, y_info, y_bytes = binding
        y = self._compute(x_info, x_mem)
        if self.dynamic:
            if y.nbytes > y_bytes.nbytes:
                raise OutputTooSmallError("y", y.shape, y.nbytes, y_bytes.nbytes)
            y_bytes[: y.nbytes].view(np.float32)[:] = y.ravel()
            return [y.shape]
        self._store(y, y_info, y_bytes)
        return None

    def start(self, binding: Any, done: Done, context: Any = None) -> bool:
        if not self.model.get("engine_async"):
            return False

        def request() -> None:
            try:
                shapes = self.run(binding)
            except BaseException as e:  # noqa: BLE001 - reported as the engine's requests do
                done(e, None)
            else:
                done(None, shapes)

        threading.Thread(target=request, name="axpy-request").start()
        with self.backend.lock:
            self.backend.started += 1
        return True

    def run_arrays(self, arrays: Sequence[np.ndarray], context: Any = None) -> list[np.ndarray]:
        (x,) = arrays
        return [self._compute(self.inputs[0].engine.replace(shape=x.shape), x)]

    def _compute(self, x_info: Any, x_mem: np.ndarray) -> np.ndarray:
        backend = self.backend
        with backend.lock:
            backend.active += 1
            backend.peak_active = max(backend.peak_active, backend.active)
        try:
            port = self.inputs[0]
            if port.view is TensorType.HW and port.converts:
                x = np.empty(port.cpu.shape, np.float32)
                convert(NpuTensor(port.hw.replace(tensor_type=TensorType.CPU), x_mem), NpuTensor(port.cpu, x))
            else:
                x = np.array(x_mem, np.float32)
            if np.isnan(x).any():
                raise RuntimeError("engine failure: NaN input")
            if np.isposinf(x).any():
                raise NpuUnsupportedError("+inf inputs are not supported by this engine")
            if np.isneginf(x).any():
                raise MemoryError("engine ran out of device memory")
            delay = float(x.flat[0]) if self.model.get("delay_from_input") else self.model.get("delay_ms", 0)
            if delay:
                time.sleep(delay / 1000.0)
            return (np.float32(self.model["a"]) * x + np.float32(self.model["b"])).astype(np.float32)
        finally:
            with backend.lock:
                backend.active -= 1

    def _store(self, y: np.ndarray, y_info: Any, y_bytes: np.ndarray) -> None:
        port = self.outputs[0]
        if port.view is TensorType.HW and port.converts:
            hw = port.hw.replace(tensor_type=TensorType.CPU, direction=TensorDirection.OUTPUT)
            convert(NpuTensor(port.cpu.replace(direction=TensorDirection.INPUT), y), NpuTensor(hw, y_bytes))
        else:
            y_bytes[: y.nbytes].view(np.float32)[:] = y.ravel()

    def close(self) -> None:
        self.closed = True


class AxpyBackend(Backend):
    name = "AXPY"

    def __init__(self, model_path: Path, options: Any) -> None:
        super().__init__(model_path, options)
        self.model = json.loads(Path(model_path).read_text())
        self.target = self.model.get("target", "")
        self.active = 0
        self.peak_active = 0
        self.started = 0  # requests started on the "engine" (engine_async)
        self.lock = threading.Lock()

    def open(self) -> OpenedModel:
        shape = tuple(self.model["shape"])
        device = self.model.get("device", "CPU")
        info = DeviceInfo(requested=self.options.device, attached=device, engine="numpy", engine_version=np.__version__)
        return OpenedModel(info, [PortSpec("x", DataType.FLOAT32, shape)], [PortSpec("y", DataType.FLOAT32, shape)],
                           dynamic_shapes=self.model.get("dynamic", True) and device != "NPU")

    def compile(self, inputs: list[Port], ports: PortFactory) -> Engine:
        shape = tuple(None if d < 0 else d for d in inputs[0].cpu.shape)
        out = ports.make(PortSpec("y", DataType.FLOAT32, shape), TensorDirection.OUTPUT)
        return AxpyEngine(self, inputs, [out])


def write_model(path: Path, **fields: Any) -> Path:
    model = {"a": 2.0, "b": 1.0, "shape": [1, 3, 4, 4], "target": ""}
    model.update(fields)
    path.write_text(json.dumps(model))
    return path
