"""RunnerType.OPENVINO: OpenVINO's NPU plugin, and its CPU and GPU plugins, behind the engine interface.

- One ``ov.Core`` per process. The model (ONNX, OpenVINO IR, anything ``read_model`` reads) is read once per
  runner; each engine compiles it for its input ports: dims left open (CPU, GPU) or reshaped to static shapes (the
  NPU), with the CPU<->HW view conversion of HW-view ports built in by ``PrePostProcessor``.
- An engine keeps a pool of ``InferRequest`` s. A binding wraps each tensor's memory in an ``ov.Tensor`` once; a
  request is pointed at it with ``set_tensor`` only when it held something else, so a tensor in its port's view is
  never copied on the host. Outputs whose shape only the run tells are written into the bound memory (OpenVINO
  reshapes a tensor within its capacity) and their shapes reported.
- ``start`` runs a job on a request's own asynchronous execution. OpenVINO's Python callbacks are not called when an
  inference fails, so each request has a thread that blocks in ``request.wait()`` (GIL released) and reports the
  end, failures included: nothing polls.
"""

from __future__ import annotations

import glob
import os
import threading
from collections.abc import Mapping, Sequence
from queue import Empty, SimpleQueue
from typing import Any

import numpy as np
import onnx
import openvino as ov
from openvino import _pyopenvino
from openvino.preprocess import PrePostProcessor

from .. import devices, modelfile, qdq
from ..engine import Backend, Done, Engine, OpenedModel, OutputTooSmallError, ResultShapes
from ..ports import Port, PortFactory, PortSpec, spec_of_onnx_port
from ..tensor import NpuTensor
from ..types import (
    DataType,
    DeviceInfo,
    MemoryLayout,
    NpuError,
    NpuUnsupportedError,
    TensorDirection,
    TensorType,
)

ENGINE = "OpenVINO"

_OV_OF: dict[DataType, ov.Type] = {
    DataType.BOOLEAN: ov.Type.boolean,
    DataType.INT8: ov.Type.i8,
    DataType.UINT8: ov.Type.u8,
    DataType.INT16: ov.Type.i16,
    DataType.UINT16: ov.Type.u16,
    DataType.BF16: ov.Type.bf16,
    DataType.FP16: ov.Type.f16,
    DataType.INT32: ov.Type.i32,
    DataType.UINT32: ov.Type.u32,
    DataType.FLOAT32: ov.Type.f32,
    DataType.INT64: ov.Type.i64,
    DataType.UINT64: ov.Type.u64,
    DataType.FLOAT64: ov.Type.f64,
}
_DATA_TYPE_OF: dict[str, DataType] = {t.get_type_name(): d for d, t in _OV_OF.items()}

# Layout permutations (HW shape = CPU shape permuted) that PrePostProcessor can bake in, for 4-D tensors.
_LAYOUT_NAMES = {MemoryLayout.NCHW: "NCHW", MemoryLayout.NHWC: "NHWC"}

# The C++ methods under the Python wrappers: no Python data dispatch per call. infer(inputs, share_outputs,
# decode_strings) releases the GIL while inferring.
_infer = _pyopenvino.InferRequest.infer
_start_async = _pyopenvino.InferRequest.start_async

_core: ov.Core | None = None
_core_lock = threading.Lock()


def core() -> ov.Core:
    """The process's one ``ov.Core`` (plugins load once; compiled-model caching is per core)."""
    global _core
    if _core is None:
        with _core_lock:
            if _core is None:
                _core = ov.Core()
    return _core


def ov_type(data_type: DataType) -> ov.Type:
    return _OV_OF[data_type]


def data_type_of(element_type: ov.Type, what: str) -> DataType:
    dt = _DATA_TYPE_OF.get(element_type.get_type_name())
    if dt is None:
        raise NpuUnsupportedError(f"{what}: element type {element_type.get_type_name()} has no npurt DataType "
                                  f"(supported: {sorted(_DATA_TYPE_OF)})")
    return dt


def device_family(name: str) -> str:
    """"GPU.1" -> "GPU": the device kinds npurt selects between."""
    return name.split(".", 1)[0]


def npu_unavailable_reason(available: Sequence[str]) -> str:
    """Why OpenVINO cannot use an NPU here ("" when it can): what OpenVINO, /dev/accel and /sys/module say."""
    if any(device_family(d) == "NPU" for d in available):
        return ""
    reasons = [f"no 'NPU' in OpenVINO's available_devices {list(available)}"]
    nodes = sorted(glob.glob("/dev/accel/accel*"))
    reasons.append(f"accel nodes {nodes} present" if nodes else "no /dev/accel/accel* device node")
    if os.path.isdir("/sys/module/intel_vpu"):
        reasons.append("the intel_vpu driver is loaded (is the NPU user-mode driver / level-zero installed?)")
    else:
        reasons.append("the intel_vpu kernel driver is not loaded (/sys/module/intel_vpu is absent)")
    return "; ".join(reasons)


def gpu_unavailable_reason(available: Sequence[str]) -> str:
    if any(device_family(d) == "GPU" for d in available):
        return ""
    nodes = sorted(glob.glob("/dev/dri/renderD*"))
    return (f"no 'GPU' in OpenVINO's available_devices {list(available)}; "
            + (f"render nodes {nodes} present (is the Intel GPU compute runtime installed?)" if nodes
               else "no /dev/dri/renderD* device node"))


def _layout_pair(port: Port) -> tuple[str, str] | None:
    """(tensor layout, model layout) for PrePostProcessor, None when the HW view keeps the CPU layout."""
    cpu, hw = port.cpu, port.hw
    if hw.memory_layout is MemoryLayout.GENERIC and hw.memory_layout_order:
        order = hw.memory_layout_order
        if order == tuple(range(len(order))):
            return None
        names = [f"d{i}" for i in range(len(order))]
        return "[" + ",".join(names[i] for i in order) + "]", "[" + ",".join(names) + "]"
    if hw.memory_layout in (cpu.memory_layout, MemoryLayout.UNKNOWN) and hw.shape == cpu.shape:
        return None
    if len(cpu.shape) == 4 and hw.memory_layout in _LAYOUT_NAMES and cpu.memory_layout in _LAYOUT_NAMES:
        return _LAYOUT_NAMES[hw.memory_layout], _LAYOUT_NAMES[cpu.memory_layout]
    raise NpuUnsupportedError(
        f"tensor {port.name!r}: the HW view {hw.describe()} cannot be built into an OpenVINO model "
        f"(PrePostProcessor does layout permutations and element types; CPU view {cpu.describe()})")


def _partial_shape(shape: Sequence[int]) -> ov.PartialShape:
    return ov.PartialShape([int(d) for d in shape])  # -1 (DYNAMIC_DIM) is OpenVINO's dynamic dim too


def _spec_shape(pshape: ov.PartialShape) -> tuple[int | None, ...]:
    return tuple(d.get_length() if d.is_static else None for d in pshape)


class ModelPorts:
    """How the model's own ports (ONNX order) map onto OpenVINO's model.

    OpenVINO's ONNX frontend may keep an input under another name (Dropout's input takes its output's name) and
    folds an output that is an input passed through (a Sum or Max of one input, Dropout at inference) into that
    input: the compiled model never writes such an output, so the engine copies the input into it (counted).
    """

    def __init__(self, param_of: list[int | None], result_of: list[int], alias_of: list[int | None]) -> None:
        self.param_of = param_of  # model input i -> index of OpenVINO's parameter (None: OpenVINO dropped it)
        self.result_of = result_of  # model output j -> index of OpenVINO's result
        self.alias_of = alias_of  # model output j -> the model input it passes through, where it does

    @classmethod
    def of(cls, model: ov.Model, ins: Sequence[PortSpec], outs: Sequence[PortSpec]) -> ModelPorts:
        params = list(model.inputs)
        param_of: list[int | None] = [None] * len(ins)
        taken: set[int] = set()
        for i, spec in enumerate(ins):
            k = next((k for k, p in enumerate(params) if k not in taken and spec.name in p.get_names()), None)
            if k is not None:
                param_of[i] = k
                taken.add(k)
        # what is left pairs up in order: OpenVINO keeps the order of the inputs it keeps
        left = [k for k in range(len(params)) if k not in taken]
        for i, k in zip([i for i, k in enumerate(param_of) if k is None], left):
            param_of[i] = k
        input_of_param = {k: i for i, k in enumerate(param_of) if k is not None}
        results = list(model.outputs)
        result_of, alias_of = [], []
        for spec in outs:
            k = next((k for k, r in enumerate(results)
                      if r.get_node().get_friendly_name().removesuffix("/sink_port_0") == spec.name), None)
            if k is None:
                k = next((k for k, r in enumerate(results) if spec.name in r.get_names()), None)
            if k is None:
                raise NpuError(f"output {spec.name!r}: OpenVINO's model has no such output (its outputs: "
                               f"{[sorted(r.get_names()) for r in results]})")
            result_of.append(k)
            source = results[k].get_node().input_value(0).get_node()
            alias = None
            if source.get_type_name() == "Parameter":
                param = next((n for n, p in enumerate(params) if p.get_node() is source or
                              p.get_node().get_friendly_name() == source.get_friendly_name()), None)
                alias = input_of_param.get(param) if param is not None else None
            alias_of.append(alias)
        return cls(param_of, result_of, alias_of)

    def compiled(self, compiled_model: ov.CompiledModel) -> ModelPorts:
        """The map for a compiled model: compiling may fold more outputs into inputs (an Einsum "->" of a scalar,
        an Identity chain); such an output shares a tensor name with the input it passes through."""
        ins, outs = list(compiled_model.inputs), list(compiled_model.outputs)
        alias_of = list(self.alias_of)
        for j, k in enumerate(self.result_of):
            if alias_of[j] is not None:
                continue
            names = outs[k].get_names()
            alias_of[j] = next((i for i, p in enumerate(self.param_of)
                                if p is not None and names & ins[p].get_names()), None)
        return ModelPorts(self.param_of, self.result_of, alias_of)


# ---------------------------------------------------------------------------------------------------- requests
class _Binding:
    """A set of tensors as OpenVINO takes them: an ov.Tensor over each one's memory (ports OpenVINO has), and the
    outputs the engine must fill itself (inputs passed through), as (output index, source bytes, target bytes)."""

    __slots__ = ("wrapped", "fills")

    def __init__(self, wrapped: list[ov.Tensor], fills: list[tuple[int, np.ndarray, np.ndarray, tuple[int, ...]]]
                 ) -> None:
        self.wrapped = wrapped
        self.fills = fills


class _Request:
    """One InferRequest, the ov.Tensors it holds per port, and (once async is used) the thread that reports the
    end of its asynchronous runs."""

    __slots__ = ("request", "held", "engine", "go", "done", "fills", "thread", "closing", "pooled")

    def __init__(self, engine: OpenVINOEngine, pooled: bool = True) -> None:
        self.engine = engine
        self.pooled = pooled  # in the engine's pool, or a stream's own (its variables are the stream's state)
        self.request = engine.compiled_model.create_infer_request()
        self.held: list[Any] = [None] * len(engine.ov_ports)  # the ov.Tensor each port points at
        self.go = threading.Lock()  # released by start(): the reporting thread waits for the run
        self.go.acquire()
        self.done: Done | None = None
        self.fills: list = []
        self.thread: threading.Thread | None = None
        self.closing = False

    def point(self, wrapped: Sequence[Any]) -> None:
        """Point the request's ports at a binding's tensors, where it holds others."""
        held, ports, request = self.held, self.engine.ov_ports, self.request
        for k, t in enumerate(wrapped):
            if held[k] is not t:
                request.set_tensor(ports[k], t)
                held[k] = t

    def finish(self, fills: Sequence[tuple[int, np.ndarray, np.ndarray, tuple[int, ...]]]) -> ResultShapes:
        """After a run: fill the passed-through outputs; the shapes of outputs the run decided."""
        engine = self.engine
        shapes: list[tuple[int, ...] | None] | None = None
        if engine.dynamic_outputs:
            shapes = [None] * len(engine.outputs)
            for j, p in zip(engine.bound_outputs, engine.ov_outputs):
                if not engine.outputs[j].is_static:  # the numpy view's shape: ~1 us, Tensor.shape ~15 us
                    shapes[j] = self.request.get_tensor(p).data.shape
        for j, src, dst, shape in fills:
            n = src.nbytes
            if n > dst.nbytes:
                raise OutputTooSmallError(engine.outputs[j].name, shape, n, dst.nbytes)
            dst[:n] = src
            engine.count_copy(n)
            if not engine.outputs[j].is_static:
                shapes = shapes if shapes is not None else [None] * len(engine.outputs)
                shapes[j] = shape
        return shapes

    def start(self, done: Done, fills: list) -> None:
        self.done, self.fills = done, fills
        if self.thread is None:
            self.thread = threading.Thread(target=self._report, name="npurt-ov-request", daemon=True)
            self.thread.start()
        _start_async(self.request, {}, None)
        self.go.release()

    def _report(self) -> None:
        """Block in wait() (GIL released) for each started run; hand its end to the runner."""
        while True:
            self.go.acquire()
            if self.closing:
                return
            error: BaseException | None = None
            shapes: ResultShapes = None
            try:
                self.request.wait()
                shapes = self.finish(self.fills)
            except BaseException as e:  # noqa: BLE001 - the run's failure is the job's status
                error = self.engine.translate(e)
            done, self.done, self.fills = self.done, None, []
            if self.pooled:
                self.engine.release(self)  # free before the job ends: its callback may start the next one
            if done is not None:
                done(error, shapes)
            done = error = None  # the job's tensors must not live on here until the next run

    def stop(self) -> None:
        """End the reporting thread and wait for it: a thread left inside OpenVINO at interpreter exit aborts the
        process ("terminate called without an active exception")."""
        thread = self.thread
        if thread is None:
            return
        self.closing = True
        try:
            self.go.release()
        except RuntimeError:  # a run was started and not yet picked up: the thread sees closing after it
            pass
        if thread is not threading.current_thread():
            thread.join()


class OpenVINOEngine(Engine):
    """A compiled model and its pool of infer requests."""

    def __init__(self, compiled_model: ov.CompiledModel, inputs: list[Port], outputs: list[Port], pm: ModelPorts,
                 device: str, properties: dict[str, Any], limit: int, count_copy: Any) -> None:
        self.compiled_model = compiled_model
        self.inputs, self.outputs = inputs, outputs
        self.device = device
        self.properties = properties
        self.count_copy = count_copy
        compiled_in, compiled_out = list(compiled_model.inputs), list(compiled_model.outputs)
        # the model's ports OpenVINO has (inputs it kept, outputs it computes), in the model's order
        self.bound_inputs = [i for i, k in enumerate(pm.param_of) if k is not None]
        self.bound_outputs = [j for j, a in enumerate(pm.alias_of) if a is None]
        self.aliases = [(j, a) for j, a in enumerate(pm.alias_of) if a is not None]
        self.ov_inputs = [compiled_in[pm.param_of[i]] for i in self.bound_inputs]  # type: ignore[index]
        self.ov_outputs = [compiled_out[pm.result_of[j]] for j in self.bound_outputs]
        self.ov_ports = self.ov_inputs + self.ov_outputs
        self.element_types = [p.get_element_type() for p in self.ov_ports]
        self.dynamic_outputs = any(not p.is_static for p in outputs)
        # run_arrays' output tensors start empty where the run decides the shape (OpenVINO then sizes them)
        self.output_shapes = [ov.Shape([0 if d < 0 else d for d in outputs[j].engine.shape])
                              for j in self.bound_outputs]
        self.started_async = False  # whether start() has used OpenVINO's asynchronous execution
        try:
            self.optimal_requests = max(1, int(compiled_model.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")))
        except RuntimeError:
            self.optimal_requests = 1
        self.limit = max(1, limit)  # requests made at most
        self.made: list[_Request] = []
        self.contexts: list[_Request] = []  # streams' own requests
        self._free: SimpleQueue[_Request] = SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        first = self._new()  # one up front: the first run pays no request creation
        self.state_names = [state.name for state in first.request.query_state()]
        self._free.put(first)

    def _new(self) -> _Request:
        request = _Request(self)
        self.made.append(request)
        return request

    def acquire(self, block: bool = True) -> _Request | None:
        """A free request; a new one while fewer than ``limit`` exist; else wait for one (None if not ``block``)."""
        try:
            return self._free.get_nowait()
        except Empty:
            pass
        with self._lock:
            if len(self.made) < self.limit:
                return self._new()
        if not block:
            return None
        return self._free.get()  # requests of ended asynchronous runs come back by themselves

    def release(self, request: _Request) -> None:
        self._free.put(request)

    @property
    def requests(self) -> list[ov.InferRequest]:
        return [r.request for r in self.made]

    # -- the engine interface ------------------------------------------------------------------------------
    def bind(self, inputs: Sequence[NpuTensor], outputs: Sequence[NpuTensor]) -> _Binding:
        # Shares the memory (no copy): the bytes reinterpreted with the engine's shape and element type.
        tensors = [inputs[i] for i in self.bound_inputs] + [outputs[j] for j in self.bound_outputs]
        wrapped = [ov.Tensor(t.raw_bytes(), list(t.info.shape), et) for t, et in zip(tensors, self.element_types)]
        fills = [(j, inputs[a].raw_bytes(), outputs[j].raw_bytes(), inputs[a].info.shape) for j, a in self.aliases]
        return _Binding(wrapped, fills)

    def _infer(self, request: _Request) -> None:
        if self.started_async:
            # Once start() has used OpenVINO's asynchronous execution, run() goes there too: OpenVINO's CPU plugin,
            # given both infer() on callers' threads and start_async() on one compiled model, grows its memory by
            # ~50 MiB steps under CPU contention (seen with plain OpenVINO: +300 to +550 MiB over 20,000 mixed
            # calls beside two busy loops; flat with either kind alone).
            _start_async(request.request, {}, None)
            request.request.wait()
        else:
            _infer(request.request, {}, True, True)

    def run(self, binding: _Binding, context: _Request | None = None) -> ResultShapes:
        request = context or self.acquire()
        assert request is not None
        try:
            request.point(binding.wrapped)
            self._infer(request)
            return request.finish(binding.fills)
        except OutputTooSmallError:
            raise
        except Exception as e:
            raise self.translate(e) from None
        finally:
            if request.pooled:
                self.release(request)

    def start(self, binding: _Binding, done: Done, context: _Request | None = None) -> bool:
        request = context or self.acquire(block=False)
        if request is None:
            return False
        self.started_async = True
        try:
            request.point(binding.wrapped)
            request.start(done, binding.fills)
        except Exception:
            if request.pooled:
                self.release(request)  # it never started
            raise
        return True

    def run_arrays(self, arrays: Sequence[np.ndarray], context: _Request | None = None) -> list[np.ndarray]:
        request = context or self.acquire()
        assert request is not None
        try:
            r, held = request.request, request.held
            k = 0
            for port, i, et in zip(self.ov_inputs, self.bound_inputs, self.element_types):
                a = arrays[i]
                # shares the array's memory; this constructor also takes read-only arrays (shared_memory=True
                # refuses them)
                t = held[k] = ov.Tensor(a, shared_memory=True) if a.flags.writeable else ov.Tensor(a, list(a.shape), et)
                r.set_tensor(port, t)
                k += 1
            # Outputs in new tensors of OpenVINO's own per call: it sizes them to what the run produces (from an
            # empty shape), and each result array keeps its tensor alive: nothing is copied.
            outs = []
            for port, shape, et in zip(self.ov_outputs, self.output_shapes, self.element_types[k:]):
                t = held[k] = ov.Tensor(et, shape)
                r.set_tensor(port, t)
                outs.append(t)
                k += 1
            self._infer(request)
            results: list[np.ndarray] = [None] * len(self.outputs)  # type: ignore[list-item]
            for j, t in zip(self.bound_outputs, outs):
                results[j] = t.data
            for j, a in self.aliases:  # an input passed through: a copy of it
                results[j] = arrays[a].copy()
                self.count_copy(arrays[a].nbytes)
            return results
        except Exception as e:
            raise self.translate(e) from None
        finally:
            if request.pooled:
                self.release(request)

    # -- variables (stateful models: ReadValue / Assign) -----------------------------------------------------
    def open_context(self) -> _Request | None:
        """A stream's own infer request: OpenVINO keeps a model's variables per request."""
        if not self.state_names:
            return None
        with self._lock:
            request = _Request(self, pooled=False)
            self.contexts.append(request)
        return request

    def close_context(self, context: _Request | None) -> None:
        if context is not None:
            context.stop()
            with self._lock:
                if context in self.contexts:
                    self.contexts.remove(context)

    def get_state(self, context: _Request | None) -> dict[str, np.ndarray]:
        if context is None:
            return {}
        return {v.name: np.array(v.state.data) for v in context.request.query_state()}

    def set_state(self, context: _Request | None, state: Mapping[str, np.ndarray]) -> None:
        if context is None:
            super().set_state(context, state)
            return
        variables = {v.name: v for v in context.request.query_state()}
        for name, value in state.items():
            variable = variables[name]
            want = tuple(variable.state.shape)
            a = np.ascontiguousarray(value, dtype=variable.state.data.dtype)
            if a.shape != want:
                raise ValueError(f"state {name!r}: shape {list(a.shape)}, expected {list(want)}")
            variable.state = ov.Tensor(a)  # OpenVINO copies it into the request's own state

    def reset_state(self, context: _Request | None) -> None:
        if context is not None:
            context.request.reset_state()

    def translate(self, e: BaseException) -> BaseException:
        """OpenVINO's capacity error for a dynamic output as OutputTooSmallError; the rest as they are."""
        text = str(e)
        if "Could set new shape" in text and "m_capacity" in text:
            shape = text.rsplit("Could set new shape:", 1)[-1].strip().splitlines()[0].strip("[] ")
            try:
                needed = tuple(int(d) for d in shape.split(","))
            except ValueError:
                needed = ()
            name = next((p.name for p in self.outputs if not p.is_static), "?")
            return OutputTooSmallError(name, needed) if needed else e
        return e

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for request in (*self.made, *self.contexts):
            request.stop()
        self.made, self.contexts = [], []
        while True:
            try:
                self._free.get_nowait()
            except Empty:
                break


# ---------------------------------------------------------------------------------------------------- backend
class OpenVINOBackend(Backend):
    """RunnerType.OPENVINO: a model on an OpenVINO device (NPU, GPU, CPU), HW views for the Intel NPU."""

    name = "OPENVINO"
    target = "OPENVINO"

    @classmethod
    def npu_present(cls) -> bool:
        try:
            return any(device_family(d) == "NPU" for d in core().available_devices)
        except RuntimeError:
            return False

    def open(self) -> OpenedModel:
        ov_core = core()
        available = list(ov_core.available_devices)
        present = {device_family(d) for d in available}
        unavailable = {"NPU": npu_unavailable_reason(available), "GPU": gpu_unavailable_reason(available)}
        if "CPU" not in present:
            unavailable["CPU"] = f"no 'CPU' in OpenVINO's available_devices {available}"
        selection = devices.select_device(self.options.device, {k: v for k, v in unavailable.items() if v},
                                          present, self.options.fallback, ENGINE)
        self.device = selection.attached
        try:
            full_name = str(ov_core.get_property(self.device, "FULL_DEVICE_NAME"))
        except RuntimeError:
            full_name = ""
        info = DeviceInfo(requested=selection.requested, attached=selection.attached, engine=ENGINE,
                          engine_version=ov.get_version(), fell_back=selection.fell_back, reason=selection.reason,
                          skipped=selection.skipped, full_name=full_name)
        try:
            self.model = ov_core.read_model(str(self.model_path))
        except RuntimeError as e:
            raise NpuError(f"OpenVINO cannot read the model {self.model_path}: {e}") from None
        if self.model_path.suffix.lower() == ".onnx":
            # The ports are the ONNX model's own, whatever OpenVINO made of them (see ModelPorts).
            onnx_info = modelfile.read_onnx_ports(self.model_path)
            ins = [spec_of_onnx_port(p, "input") for p in onnx_info.inputs]
            outs = [spec_of_onnx_port(p, "output") for p in onnx_info.outputs]
        else:
            ins = [self._spec(p, f"input {i}") for i, p in enumerate(self.model.inputs)]
            outs = [self._spec(p, f"output {i}") for i, p in enumerate(self.model.outputs)]
        self.map = ModelPorts.of(self.model, ins, outs)
        # QDQ boundaries are read from the ONNX graph where NPU views apply: their HW view is the quantized tensor,
        # and HW ports get the boundary Quantize/DequantizeLinear removed from what OpenVINO compiles.
        self.onnx_model: onnx.ModelProto | None = None
        npu_views = self.options.hw_view == "npu" or self.device == "NPU"
        if npu_views and self.model_path.suffix.lower() == ".onnx":
            boundaries = qdq.find_boundaries(onnx.load(str(self.model_path), load_external_data=False))
            if boundaries:
                self.onnx_model = onnx.load(str(self.model_path))
                ins, outs = qdq.annotate_specs(ins, boundaries), qdq.annotate_specs(outs, boundaries)
        self.in_specs, self.out_specs = ins, outs
        return OpenedModel(info, ins, outs, dynamic_shapes=self.device in ("CPU", "GPU"))

    @staticmethod
    def _spec(port: Any, fallback_name: str) -> PortSpec:
        names = port.get_names()
        node_name = port.get_node().get_friendly_name()
        # The ONNX frontend names an output's Result "<graph output name>/sink_port_0"; prefer that one of the
        # tensor's several names, so tensor names match ONNX Runtime's.
        sink = node_name.removesuffix("/sink_port_0")
        name = sink if sink in names else port.get_any_name() if names else node_name or fallback_name
        pshape = port.get_partial_shape()
        if pshape.rank.is_dynamic:
            raise NpuUnsupportedError(f"tensor {name!r} has a dynamic rank; npurt needs a known rank")
        return PortSpec(name=name, data_type=data_type_of(port.get_element_type(), f"tensor {name!r}"),
                        shape=_spec_shape(pshape))

    def compile(self, inputs: list[Port], ports: PortFactory) -> Engine:
        strip = qdq.quantized_hw_ports(inputs) + [
            s.name for s in self.out_specs
            if s.quant is not None and self.options.tensor_type(TensorDirection.OUTPUT, s.name) is TensorType.HW]
        if strip and self.onnx_model is not None:
            model = core().read_model(qdq.strip_boundaries(self.onnx_model, strip).SerializeToString())
        else:
            model = self.model.clone()
        shapes = [list(p.cpu.shape) for p in inputs]
        pm = self.map
        reshape = {model.input(k): _partial_shape(inputs[i].cpu.shape) for i, k in enumerate(pm.param_of)
                   if k is not None and tuple(-1 if d.is_dynamic else d.get_length()
                                              for d in model.input(k).get_partial_shape()) != inputs[i].cpu.shape}
        if reshape:
            try:
                model.reshape(reshape)
            except RuntimeError as e:
                raise NpuError(f"cannot reshape the model to input shapes {shapes}: {e}") from None
        outputs = []
        for j, spec in enumerate(self.out_specs):
            source = pm.alias_of[j]
            if source is not None:  # the output is an input passed through: it has the input's shape
                shape: tuple[int | None, ...] = tuple(None if d < 0 else d for d in inputs[source].cpu.shape)
            else:
                shape = _spec_shape(model.output(pm.result_of[j]).get_partial_shape())
            if None in shape and self.device == "NPU":
                raise NpuUnsupportedError(
                    f"output {spec.name!r} stays dynamic ({list(shape)}) for input shapes {shapes}; the NPU needs "
                    "static outputs (a data-dependent shape cannot be compiled for it)")
            outputs.append(ports.make(spec.with_shape(shape), TensorDirection.OUTPUT))
        for port in outputs:
            if port.view is TensorType.HW and port.converts and not port.is_static:
                raise NpuUnsupportedError(f"output {port.name!r}: its shape is known only after a run, so its HW "
                                          f"view {port.hw.describe()} cannot be built in; use the CPU view")
        model = self._bake_hw_views(model, inputs, outputs, pm)
        properties = self.properties()
        try:
            compiled_model = core().compile_model(model, self.device, properties)
        except RuntimeError as e:
            raise NpuError(f"OpenVINO could not compile {self.model_path.name} for {self.device} with input "
                           f"shapes {shapes} and properties {properties}: {e}") from None
        compiled_in, compiled_out = list(compiled_model.inputs), list(compiled_model.outputs)
        pm = pm.compiled(compiled_model)
        for j, k in enumerate(pm.result_of):  # OpenVINO may know an output's dims only once compiled
            port, shape = outputs[j], tuple(-1 if d.is_dynamic else d.get_length()
                                            for d in compiled_out[k].get_partial_shape())
            if pm.alias_of[j] is None and shape != port.engine.shape and not port.converts and \
                    all(p in (-1, c) for p, c in zip(port.engine.shape, shape)):
                outputs[j] = ports.make(self.out_specs[j].with_shape(tuple(None if d < 0 else d for d in shape)),
                                        TensorDirection.OUTPUT)
        for what, pairs in (("input", [(inputs[i], compiled_in[k]) for i, k in enumerate(pm.param_of)
                                       if k is not None]),
                            ("output", [(outputs[j], compiled_out[k]) for j, k in enumerate(pm.result_of)
                                        if pm.alias_of[j] is None])):
            for port, ov_port in pairs:  # the engine must consume exactly the port's view
                shape = tuple(-1 if d.is_dynamic else d.get_length() for d in ov_port.get_partial_shape())
                et = ov_port.get_element_type()
                if shape != port.engine.shape or et != ov_type(port.engine.data_type):
                    raise NpuError(f"{what} {port.name!r}: the compiled model takes {list(shape)} "
                                   f"{et.get_type_name()}, expected the {port.view.name} view "
                                   f"{port.engine.describe()}")
        limit = self.options.max_concurrent_runs or max(2, _optimal_requests(compiled_model))
        return OpenVINOEngine(compiled_model, inputs, outputs, pm, self.device, properties, limit, self.count_copy)

    @staticmethod
    def _bake_hw_views(model: ov.Model, inputs: list[Port], outputs: list[Port], pm: ModelPorts) -> ov.Model:
        """Build the CPU<->HW conversion of HW-view ports into the model (PrePostProcessor)."""
        ppp: PrePostProcessor | None = None
        for direction, ps, index in ((TensorDirection.INPUT, inputs, pm.param_of),
                                     (TensorDirection.OUTPUT, outputs, pm.result_of)):
            for n, port in enumerate(ps):
                i = index[n]
                if port.view is not TensorType.HW or not port.converts:
                    continue
                if i is None or (direction is TensorDirection.OUTPUT and pm.alias_of[n] is not None):
                    raise NpuUnsupportedError(f"{direction.name.lower()} {port.name!r}: OpenVINO passes it through "
                                              "or drops it, so its HW view cannot be built in; use the CPU view")
                layouts = _layout_pair(port)
                if layouts is None and port.hw.data_type is port.cpu.data_type:
                    continue
                if ppp is None:
                    ppp = PrePostProcessor(model)
                info = ppp.input(i) if direction is TensorDirection.INPUT else ppp.output(i)
                info.tensor().set_element_type(ov_type(port.hw.data_type))
                if layouts is not None:
                    info.tensor().set_layout(ov.Layout(layouts[0]))
                    info.model().set_layout(ov.Layout(layouts[1]))
        return model if ppp is None else ppp.build()

    def properties(self) -> dict[str, Any]:
        """The properties every engine is compiled with: npurt's choices, then engine_options untouched."""
        opts = self.options
        properties: dict[str, Any] = {}
        if opts.cache_dir is not None:
            properties["CACHE_DIR"] = str(opts.cache_dir)
        if opts.performance_hint is not None:
            properties["PERFORMANCE_HINT"] = opts.performance_hint
            if opts.performance_hint == "THROUGHPUT" and opts.max_concurrent_runs:
                properties["PERFORMANCE_HINT_NUM_REQUESTS"] = opts.max_concurrent_runs
        if opts.num_threads is not None:
            properties["INFERENCE_NUM_THREADS"] = opts.num_threads
        # The CPU plugin infers in bf16 on CPUs with AVX-512 BF16 / AMX unless told f32; f32 keeps results
        # equal to ONNX Runtime's. Other devices keep their own default (f16 on NPU and GPU).
        precision = opts.inference_precision or ("f32" if self.device == "CPU" else None)
        if precision is not None:
            properties["INFERENCE_PRECISION_HINT"] = precision
        properties.update(opts.engine_options)  # passed through untouched: the engine validates them
        return properties

    def engine_settings(self) -> dict[str, str]:
        return {k: str(v) for k, v in self.properties().items() if k != "CACHE_DIR"}

    def default_max_concurrent_runs(self, engine: Engine | None) -> int:
        if isinstance(engine, OpenVINOEngine):
            return engine.optimal_requests
        return 2


def _optimal_requests(compiled_model: ov.CompiledModel) -> int:
    try:
        return max(1, int(compiled_model.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")))
    except RuntimeError:
        return 1


__all__ = ["OpenVINOBackend", "OpenVINOEngine", "core", "npu_unavailable_reason", "ov_type", "data_type_of"]
