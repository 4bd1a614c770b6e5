"""What the engine measures: npurt's runner, and the raw engines called as a user calls them.

- ``RunnerSubject``: ``runner.execute`` on runner-allocated tensors in one view; ``execute_async`` with one tensor
  set per request kept in flight (``measure.keep_in_flight``).
- ``RawOpenVINOSubject``: ``InferRequest.infer(share_outputs=True)`` with the input tensors set once (the only
  guaranteed zero-copy path of OpenVINO's Python API); an ``AsyncInferQueue`` with its own inputs per request.
- ``RawOnnxRuntimeSubject``: ``InferenceSession.run(None, feeds)``; ``requests`` threads calling it.

Inputs: ``random_feeds`` (reproducible from a seed) in the model's own (CPU) view; ``runner_tensors`` puts them into
runner-allocated tensors of either view, with concrete shapes where the runner's ports are dynamic.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..formats import convert
from ..runner import Runner
from ..tensor import NpuTensor
from ..types import DataType, NpuTensorInfo, StatusCode, TensorDirection, TensorType
from .measure import BenchError, Budget, CallSubject, Subject, keep_in_flight

OPENVINO_CALL = "InferRequest.infer(share_outputs=True) with input tensors set once; AsyncInferQueue for throughput"
ONNXRUNTIME_CALL = "InferenceSession.run(None, feeds); as many threads calling it for throughput"


def random_array(shape: Sequence[int], dtype: Any, rng: np.random.Generator) -> np.ndarray:
    """Random data for one input: floats in [0, 1), integers in [0, 10), booleans half true."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, 10, size=shape).astype(dtype)
    return rng.random(shape, dtype=np.float32).astype(dtype)


def random_feeds(inputs: Mapping[str, tuple[Sequence[int], Any]], seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs ``{name: (shape, dtype)}``, reproducible from ``seed``."""
    rng = np.random.default_rng(seed)
    return {name: random_array(shape, dtype, rng) for name, (shape, dtype) in inputs.items()}


def runner_feeds(runner: Runner, shapes: Mapping[str, Sequence[int]] | None = None, seed: int = 0
                 ) -> dict[str, np.ndarray]:
    """Random inputs for a runner's CPU-view ports; ``shapes`` gives the ports with dynamic dims a size."""
    shapes = shapes or {}
    spec: dict[str, tuple[Sequence[int], Any]] = {}
    for info in runner.get_tensors_info(TensorDirection.INPUT, TensorType.CPU):
        shape = shapes.get(info.name, info.shape)
        if any(d < 0 for d in shape):
            raise ValueError(f"input {info.name!r} has dynamic dims {info.describe()}: give its shape")
        spec[info.name] = (tuple(shape), info.numpy_dtype)
    return random_feeds(spec, seed)


def _concrete(runner: Runner, info: NpuTensorInfo, cpu_shape: Sequence[int]) -> NpuTensorInfo:
    """A port's info in its view, for the concrete CPU-view shape a run uses."""
    if info.is_static:
        return info
    cpu = runner.get_tensor_info_by_name(info.name, TensorType.CPU)
    if info.memory_layout is not cpu.memory_layout or len(info.shape) != len(cpu_shape):
        raise ValueError(f"{info.name!r}: its {info.tensor_type.name} view {info.describe()} is laid out unlike the "
                         "model's and has dynamic dims: pin the input shapes (option shapes) to measure it")
    return info.replace(shape=tuple(cpu_shape))


def runner_tensors(runner: Runner, feeds: Mapping[str, np.ndarray], tensor_type: TensorType = TensorType.HW,
                   output_shapes: Mapping[str, Sequence[int]] | None = None) -> tuple[list[NpuTensor], list[NpuTensor]]:
    """Runner-allocated input and output tensors in ``tensor_type`` views, inputs filled from CPU-view ``feeds``.

    ``output_shapes``: the CPU-view shapes of outputs with dynamic dims (``output_shapes_of`` finds them)."""
    ins = []
    for info in runner.get_tensors_info(TensorDirection.INPUT, tensor_type):
        array = np.ascontiguousarray(feeds[info.name])
        t = runner.allocate_npu_tensor(_concrete(runner, info, array.shape))
        cpu = runner.get_tensor_info_by_name(info.name, TensorType.CPU).replace(shape=array.shape)
        t.begin_cpu_access(write=True)
        try:
            if tensor_type is TensorType.CPU:
                t.numpy()[...] = array
            else:
                convert(NpuTensor(cpu, array), t, quant=runner.get_quant_parameters(info.name))
        finally:
            t.end_cpu_access(write=True)
        ins.append(t)
    outs = []
    for info in runner.get_tensors_info(TensorDirection.OUTPUT, tensor_type):
        shape = info.shape if info.is_static else (output_shapes or {}).get(info.name)
        if shape is None:
            raise ValueError(f"output {info.name!r} has dynamic dims {info.describe()}: give its shape")
        outs.append(runner.allocate_npu_tensor(_concrete(runner, info, shape)))
    return ins, outs


def output_shapes_of(runner: Runner, feeds: Mapping[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    """The CPU-view output shapes a run on ``feeds`` produces (one ``run``)."""
    return {name: tuple(a.shape) for name, a in runner.run(dict(feeds)).items()}


def execute_or_raise(runner: Runner, ins: list[NpuTensor], outs: list[NpuTensor]) -> None:
    status = runner.execute([ins], [outs])
    if status is not StatusCode.SUCCESS:
        raise BenchError(f"execute failed: {status.name}: {runner.last_error}")


class RunnerSubject(Subject):
    """``execute`` on runner-allocated tensors; ``execute_async`` with ``requests`` jobs, each with its tensors."""

    def __init__(self, runner: Runner, feeds: Mapping[str, np.ndarray], requests: int = 1,
                 tensor_type: TensorType = TensorType.HW, label: str = "npurt") -> None:
        self.runner, self.requests, self.label = runner, requests, label
        shapes = output_shapes_of(runner, feeds) if not all(
            i.is_static for i in runner.get_tensors_info(TensorDirection.OUTPUT, tensor_type)) else None
        self.ins, self.outs = runner_tensors(runner, feeds, tensor_type, shapes)
        self.sets = [runner_tensors(runner, feeds, tensor_type, shapes) for _ in range(requests)]

    def step(self) -> None:
        execute_or_raise(self.runner, self.ins, self.outs)

    def run_jobs(self, budget: Budget) -> tuple[int, float]:
        return keep_in_flight(self.runner, self.sets, budget)


def _by_port(compiled: Any, arrays: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The arrays in the compiled model's input order: by name, else by position (OpenVINO's ONNX frontend may
    rename an input or drop an unused one)."""
    values = list(arrays.values())
    out = []
    for i, port in enumerate(compiled.inputs):
        named = next((arrays[n] for n in port.get_names() if n in arrays), None)
        out.append(np.ascontiguousarray(named if named is not None else values[i]))
    return out


class RawOpenVINOSubject(Subject):
    """OpenVINO called directly on a compiled model (see the module's docstring)."""

    call = OPENVINO_CALL

    def __init__(self, compiled: Any, arrays: Mapping[str, np.ndarray], requests: int = 1,
                 label: str = "raw OpenVINO") -> None:
        import openvino as ov

        self.label, self.requests = label, requests
        self._arrays = [_by_port(compiled, arrays)]
        self._arrays += [[a.copy() for a in self._arrays[0]] for _ in range(requests)]
        self.request = compiled.create_infer_request()
        for i, a in enumerate(self._arrays[0]):
            self.request.set_input_tensor(i, ov.Tensor(a, shared_memory=True))
        self.queue = ov.AsyncInferQueue(compiled, requests)
        for request, own in zip(self.queue, self._arrays[1:]):
            for i, a in enumerate(own):
                request.set_input_tensor(i, ov.Tensor(a, shared_memory=True))
        self._done = 0
        lock = threading.Lock()

        def on_done(_request: Any, _userdata: Any) -> None:
            with lock:  # callbacks run on several OpenVINO threads; += is not atomic
                self._done += 1

        self.queue.set_callback(on_done)

    def step(self) -> None:
        self.request.infer(share_outputs=True)

    def run_jobs(self, budget: Budget) -> tuple[int, float]:
        self.queue.wait_all()
        before = self._done
        started = 0
        start = time.perf_counter()
        while not budget.done(started, time.perf_counter() - start):
            self.queue.start_async()  # blocks while every request is busy
            started += 1
        self.queue.wait_all()
        return self._done - before, time.perf_counter() - start

    def close(self) -> None:
        # The queue's callback refers back to this subject: a cycle that the interpreter would otherwise destroy at
        # exit, with the queue's threads still around (std::terminate, seen one exit in three).
        queue = self.__dict__.pop("queue", None)
        if queue is not None:
            queue.wait_all()
            queue.set_callback(lambda *_: None)
            del queue
        self.__dict__.pop("request", None)


class RawOnnxRuntimeSubject(Subject):
    """ONNX Runtime called directly on a session (see the module's docstring)."""

    call = ONNXRUNTIME_CALL

    def __init__(self, session: Any, arrays: Mapping[str, np.ndarray], requests: int = 1,
                 label: str = "raw ONNX Runtime") -> None:
        self.session, self.requests, self.label = session, requests, label
        self.arrays = {n: np.ascontiguousarray(a) for n, a in arrays.items()}
        self.own = [{n: a.copy() for n, a in self.arrays.items()} for _ in range(requests)]
        self.pool = ThreadPoolExecutor(max_workers=requests, thread_name_prefix="raw-ort")

    def step(self) -> None:
        self.session.run(None, self.arrays)

    def run_jobs(self, budget: Budget) -> tuple[int, float]:
        lock = threading.Lock()
        started = done = 0
        start = time.perf_counter()

        def worker(feeds: dict[str, np.ndarray]) -> None:
            nonlocal started, done
            while True:
                with lock:
                    if budget.done(started, time.perf_counter() - start):
                        return
                    started += 1
                self.session.run(None, feeds)
                with lock:
                    done += 1

        for f in [self.pool.submit(worker, a) for a in self.own]:
            f.result()
        return done, time.perf_counter() - start

    def close(self) -> None:
        self.pool.shutdown()


def engine_floor(runner: Runner, ins: Sequence[NpuTensor], outs: Sequence[NpuTensor],
                 label: str = "engine floor") -> Subject:
    """The runner's own compiled engine driven directly on the runner's tensors, bound once: what an inference
    costs without npurt in the path (OpenVINO: the C++ ``infer`` with no Python data dispatch; ONNX Runtime:
    ``run_with_iobinding`` on the runner's session). ``runner.execute`` minus this is npurt's own cost."""
    engine = runner.engine_for()  # the default engine: the pinned shapes', or the dynamic one
    if hasattr(engine, "compiled_model"):
        import openvino as ov

        compiled = engine.compiled_model
        request = compiled.create_infer_request()
        for port, t in zip(list(compiled.inputs) + list(compiled.outputs), list(ins) + list(outs)):
            request.set_tensor(port, ov.Tensor(t.raw_bytes(), list(t.info.shape), port.get_element_type()))
        infer = ov.InferRequest.__mro__[1].infer  # the C++ method under the Python wrapper's data dispatch
        return CallSubject(label, lambda: infer(request, {}, True, True))
    if hasattr(engine, "session"):
        import onnx

        session = engine.session
        binding = session.io_binding()

        def element_type(t: NpuTensor) -> int:  # bfloat16 as its ONNX number: numpy has no bfloat16
            if t.info.data_type is DataType.BF16:
                return onnx.TensorProto.BFLOAT16
            return onnx.helper.np_dtype_to_tensor_dtype(t.info.numpy_dtype)

        for t in ins:
            binding.bind_input(t.info.name, "cpu", 0, element_type(t), list(t.info.shape), t.get_virtual_address())
        for t in outs:
            binding.bind_output(t.info.name, "cpu", 0, element_type(t), list(t.info.shape), t.get_virtual_address())
        return CallSubject(label, lambda: session.run_with_iobinding(binding))
    raise ValueError(f"no engine floor known for {type(engine).__name__}")


__all__ = ["ONNXRUNTIME_CALL", "OPENVINO_CALL", "RawOnnxRuntimeSubject", "RawOpenVINOSubject", "RunnerSubject",
           "engine_floor", "execute_or_raise", "output_shapes_of", "random_array",
           "random_feeds", "runner_feeds", "runner_tensors"]
