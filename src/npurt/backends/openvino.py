"""RunnerType.OPENVINO: the Runner contract over OpenVINO (NPU plugin, plus its CPU and GPU plugins).

- One ``ov.Core`` per process, created on first use.
- The model (ONNX, OpenVINO IR or anything ``read_model`` reads) is read once per runner; each input-shape
  signature gets its own compiled model: the read model cloned, reshaped to the static shapes (the NPU
  compiles only static shapes), with the CPU<->HW view conversion of the HW-configured ports baked in by
  ``PrePostProcessor``.
- Each compiled model keeps a pool of ``InferRequest`` s. A tensor reaches the engine as an ``ov.Tensor``
  over its own memory, built and ``set_tensor``-ed once per (request, port, tensor) and reused, so a tensor
  in its port's view is never copied on the host.
- ``execute_async`` jobs without a callback start on those requests with ``start_async`` (the runner's
  ``_start`` / ``_await`` hooks), so no runner thread stands between the caller and OpenVINO's executor.
"""

from __future__ import annotations

import glob
import math
import os
import threading
from collections.abc import Callable, Sequence
from queue import Empty, SimpleQueue
from typing import Any

import onnx
import openvino as ov
from openvino.preprocess import PrePostProcessor

from .. import devices, qdq
from ..runner import Compiled, Port, PortSpec, Runner
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
}
_DATA_TYPE_OF: dict[str, DataType] = {t.get_type_name(): d for d, t in _OV_OF.items()}

# Layout permutations (HW shape = CPU shape permuted) that PrePostProcessor can bake in, for 4-D tensors.
_LAYOUT_NAMES = {MemoryLayout.NCHW: "NCHW", MemoryLayout.NHWC: "NHWC"}

_core: ov.Core | None = None
_core_lock = threading.Lock()

# The C++ base of InferRequest.infer: with no inputs it skips the Python data dispatcher and, with
# share_outputs=True, returns views instead of copies of the outputs. It releases the GIL while inferring.
try:
    _infer_base = ov.InferRequest.__mro__[1].infer
    _start_async_base = ov.InferRequest.__mro__[1].start_async  # the same for start_async(inputs, userdata)
except (AttributeError, IndexError):  # pragma: no cover - a future binding without the split
    _infer_base = _start_async_base = None


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


class _Slot:
    """One InferRequest with the tensors bound to it, per port (inputs then outputs)."""

    __slots__ = ("request", "bound", "keys", "ports")

    def __init__(self, request: ov.InferRequest, ports: list[Any]) -> None:
        self.request = request
        self.ports = ports  # ov.ConstOutput per port, inputs then outputs
        self.bound: list[NpuTensor | None] = [None] * len(ports)  # the NpuTensor last bound per port
        self.keys: list[tuple[int, int]] = [(0, 0)] * len(ports)  # (address, size) of that tensor's memory

    def bind(self, k: int, t: NpuTensor, element_type: ov.Type) -> None:
        """Point port k at t's memory: reuse the ov.Tensor when the memory is the same, else wrap it once."""
        key = (t.get_virtual_address(), t.nbytes)
        if key != self.keys[k]:
            # Shares the memory (no copy): the flat bytes reinterpreted with the engine's shape and type.
            wrapped = ov.Tensor(t.raw_bytes(), list(t.info.shape), element_type)
            self.request.set_tensor(self.ports[k], wrapped)
            self.keys[k] = key
        self.bound[k] = t

    def bind_all(self, inputs: list[NpuTensor], outputs: list[NpuTensor], element_types: list[ov.Type]) -> None:
        """Bind a run's tensors, inputs then outputs, where they differ from what is bound."""
        bound, k = self.bound, 0
        for t in (*inputs, *outputs):
            if bound[k] is not t:
                self.bind(k, t, element_types[k])
            k += 1


class OpenVINOEngine:
    """A compiled model for one input-shape signature and its pool of infer requests."""

    def __init__(self, compiled_model: ov.CompiledModel, device: str, properties: dict[str, Any]) -> None:
        self.compiled_model = compiled_model
        self.device = device
        self.properties = properties
        self.ports = list(compiled_model.inputs) + list(compiled_model.outputs)
        self.element_types = [p.get_element_type() for p in self.ports]
        self.n_inputs = len(compiled_model.inputs)
        self.started_async = False  # whether execute_async has started a request on OpenVINO's executor
        try:
            self.optimal_requests = max(1, int(compiled_model.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")))
        except RuntimeError:
            self.optimal_requests = 1
        self.slots: list[_Slot] = []  # every request made, for inspection
        self._free: SimpleQueue[_Slot] = SimpleQueue()
        self._lock = threading.Lock()
        self._free.put(self._new_slot())  # one up front: the first run pays no request creation

    def _new_slot(self) -> _Slot:
        slot = _Slot(self.compiled_model.create_infer_request(), self.ports)
        self.slots.append(slot)
        return slot

    def acquire(self, limit: int, block: bool = True, reap: Callable[[], None] | None = None) -> _Slot | None:
        """A free request; a new one while fewer than ``limit`` exist; else wait for one to come back (or
        None, if not ``block``). While waiting, ``reap`` is called every few milliseconds: a request held
        by an async job that has ended comes back only when the runner looks at that job."""
        try:
            return self._free.get_nowait()
        except Empty:
            pass
        with self._lock:
            if len(self.slots) < limit:
                return self._new_slot()
        if not block:
            return None
        while True:
            try:
                return self._free.get(timeout=None if reap is None else 0.002)
            except Empty:
                reap()  # type: ignore[misc]

    def release(self, slot: _Slot) -> None:
        self._free.put(slot)

    @property
    def requests(self) -> list[ov.InferRequest]:
        return [s.request for s in self.slots]

    def close(self) -> None:
        self.slots.clear()
        while True:
            try:
                self._free.get_nowait()
            except Empty:
                break


class OpenVINORunner(Runner):
    """RunnerType.OPENVINO: a model on an OpenVINO device (NPU, GPU, CPU), HW views for the Intel NPU."""

    runner_type = "OPENVINO"
    target = "OPENVINO"

    # ---------------------------------------------------------------- hooks
    def _load(self) -> tuple[list[PortSpec], list[PortSpec]]:
        ov_core = core()
        available = list(ov_core.available_devices)
        present = {device_family(d) for d in available}
        unavailable = {"NPU": npu_unavailable_reason(available), "GPU": gpu_unavailable_reason(available)}
        if "CPU" not in present:
            unavailable["CPU"] = f"no 'CPU' in OpenVINO's available_devices {available}"
        selection = devices.select_device(self.options.device, {k: v for k, v in unavailable.items() if v},
                                          present, self.options.fallback, ENGINE)
        self._ov_device = selection.attached
        try:
            full_name = str(ov_core.get_property(self._ov_device, "FULL_DEVICE_NAME"))
        except RuntimeError:
            full_name = ""
        self._device_info = DeviceInfo(
            requested=selection.requested, attached=selection.attached, engine=ENGINE,
            engine_version=ov.get_version(), fell_back=selection.fell_back, reason=selection.reason,
            skipped=selection.skipped, full_name=full_name)
        try:
            self._model = ov_core.read_model(str(self.model_path))
        except RuntimeError as e:
            raise NpuError(f"OpenVINO cannot read the model {self.model_path}: {e}") from None
        ins = [self._spec(p, f"input {i}") for i, p in enumerate(self._model.inputs)]
        outs = [self._spec(p, f"output {i}") for i, p in enumerate(self._model.outputs)]
        # QDQ boundaries are read from the ONNX graph: their HW view is the quantized tensor, and HW ports
        # get the boundary Quantize/DequantizeLinear removed from what OpenVINO compiles.
        self._onnx: onnx.ModelProto | None = None
        if self.model_path.suffix.lower() == ".onnx":
            model = onnx.load(str(self.model_path), load_external_data=False)
            boundaries = qdq.find_boundaries(model)
            if boundaries:
                self._onnx = onnx.load(str(self.model_path))
                ins, outs = qdq.annotate_specs(ins, boundaries), qdq.annotate_specs(outs, boundaries)
        return ins, outs

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
        shape = tuple(d.get_length() if d.is_static else None for d in pshape)
        return PortSpec(name=name, data_type=data_type_of(port.get_element_type(), f"tensor {name!r}"), shape=shape)

    def _compile(self, inputs: list[Port]) -> Compiled:
        strip = qdq.quantized_hw_ports(inputs) + [
            s.name for s in self._out_specs
            if s.quant is not None and self.options.tensor_type(TensorDirection.OUTPUT, s.name) is TensorType.HW]
        if strip and self._onnx is not None:
            model = core().read_model(qdq.strip_boundaries(self._onnx, strip).SerializeToString())
        else:
            model = self._model.clone()
        signature = [list(p.cpu.shape) for p in inputs]
        if any(tuple(d.get_length() if d.is_static else -1 for d in p.get_partial_shape()) != tuple(port.cpu.shape)
               for p, port in zip(model.inputs, inputs)):
            try:
                model.reshape({model.input(i): ov.PartialShape(list(port.cpu.shape)) for i, port in enumerate(inputs)})
            except RuntimeError as e:
                raise NpuError(f"cannot reshape the model to input shapes {signature}: {e}") from None
        outputs = []
        for spec, out in zip(self._out_specs, model.outputs):
            pshape = out.get_partial_shape()
            if pshape.is_dynamic:
                raise NpuUnsupportedError(
                    f"output {spec.name!r} stays dynamic ({pshape}) for input shapes {signature}; the NPU "
                    "needs static outputs (a data-dependent shape cannot be compiled for it)")
            outputs.append(self.make_port(PortSpec(spec.name, spec.data_type, tuple(pshape.to_shape()),
                                                   spec.quant, spec.quant_data_type), TensorDirection.OUTPUT))
        model = self._bake_hw_views(model, inputs, outputs)
        properties = self._properties()
        try:
            compiled_model = core().compile_model(model, self._ov_device, properties)
        except RuntimeError as e:
            raise NpuError(f"OpenVINO could not compile {self.model_path.name} for {self._ov_device} with input "
                           f"shapes {signature} and properties {properties}: {e}") from None
        for what, ports, ov_ports in (("input", inputs, compiled_model.inputs),
                                      ("output", outputs, compiled_model.outputs)):
            for port, ov_port in zip(ports, ov_ports):  # the engine must consume exactly the port's view
                shape, et = tuple(ov_port.get_shape()), ov_port.get_element_type()
                if shape != port.engine.shape or et != ov_type(port.engine.data_type):
                    raise NpuError(f"{what} {port.name!r}: the compiled model takes {list(shape)} "
                                   f"{et.get_type_name()}, expected the {port.view.name} view "
                                   f"{port.engine.describe()}")
        return Compiled(inputs=inputs, outputs=outputs,
                        engine=OpenVINOEngine(compiled_model, self._ov_device, properties))

    @staticmethod
    def _bake_hw_views(model: ov.Model, inputs: list[Port], outputs: list[Port]) -> ov.Model:
        """Build the CPU<->HW conversion of HW-configured ports into the model (PrePostProcessor)."""
        ppp: PrePostProcessor | None = None
        for direction, ports in ((TensorDirection.INPUT, inputs), (TensorDirection.OUTPUT, outputs)):
            for i, port in enumerate(ports):
                if port.view is not TensorType.HW:
                    continue
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

    def _properties(self) -> dict[str, Any]:
        opts = self.options
        properties: dict[str, Any] = {}
        if opts.cache_dir is not None:
            properties["CACHE_DIR"] = str(opts.cache_dir)
        if opts.performance_hint is not None:
            properties["PERFORMANCE_HINT"] = opts.performance_hint
        # The CPU plugin infers in bf16 on CPUs with AVX-512 BF16 / AMX unless told f32; f32 keeps results
        # equal to ONNX Runtime's. Other devices keep their own default (f16 on NPU and GPU).
        precision = opts.inference_precision or ("f32" if self._ov_device == "CPU" else None)
        if precision is not None:
            properties["INFERENCE_PRECISION_HINT"] = precision
        properties.update(opts.engine_options)  # passed through untouched: the engine validates them
        return properties

    def _run(self, compiled: Compiled, inputs: list[NpuTensor], outputs: list[NpuTensor]) -> None:
        engine: OpenVINOEngine = compiled.engine
        slot = engine.acquire(self._max_concurrent, reap=self._reap)
        try:
            slot.bind_all(inputs, outputs, engine.element_types)
            if engine.started_async:
                # Once execute_async has started requests on OpenVINO's executor, execute runs there too:
                # OpenVINO's CPU plugin, given both infer() on callers' threads and start_async() on one
                # compiled model, grows its memory by ~50 MiB steps under CPU contention (seen here with plain
                # OpenVINO: +300 to +550 MiB over 20,000 mixed calls beside two busy loops; flat with either
                # kind alone). Costs ~15 us per execute, only on runners that use both.
                _start_async_base(slot.request, {}, None)  # type: ignore[misc]
                slot.request.wait()
            elif _infer_base is not None:
                _infer_base(slot.request, {}, True, True)
            else:  # pragma: no cover
                slot.request.infer()
        finally:
            engine.release(slot)

    def _start(self, compiled: Compiled, inputs: list[NpuTensor], outputs: list[NpuTensor]) -> Any:
        """Start the inference on a free infer request of the engine's own (no runner thread involved)."""
        engine: OpenVINOEngine = compiled.engine
        if _start_async_base is None:  # pragma: no cover
            return None
        slot = engine.acquire(self._max_concurrent, block=False)
        if slot is None:
            return None
        engine.started_async = True
        try:
            slot.bind_all(inputs, outputs, engine.element_types)
            _start_async_base(slot.request, {}, None)
        except Exception:
            engine.release(slot)  # it never started
            raise
        return engine, slot

    def _await(self, handle: Any, timeout_s: float | None) -> bool:
        engine, slot = handle
        try:
            if timeout_s is None:
                slot.request.wait()  # raises the inference's error
                ended = True
            else:
                ended = slot.request.wait_for(math.ceil(timeout_s * 1000))
        except Exception:
            engine.release(slot)  # the inference failed: the request is free again
            raise
        if ended:
            engine.release(slot)
        return ended

    def _close(self) -> None:
        for compiled in list(self._compiled.values()):
            compiled.engine.close()
        self._compiled = {}

    def _default_max_concurrent_runs(self) -> int:
        return self._default.engine.optimal_requests

    @classmethod
    def npu_present(cls) -> bool:
        try:
            return any(device_family(d) == "NPU" for d in core().available_devices)
        except RuntimeError:
            return False

    # ---------------------------------------------------------------- OpenVINO specifics
    @property
    def compiled_model(self) -> ov.CompiledModel:
        """The compiled model for the default input shapes (for comparisons against plain OpenVINO calls)."""
        self._require_open()
        return self._default.engine.compiled_model

    @property
    def compile_properties(self) -> dict[str, Any]:
        """The properties the models were compiled with (npurt's choices plus engine_options)."""
        self._require_open()
        return dict(self._default.engine.properties)

    def infer_requests(self, shapes: Sequence[Sequence[int]] | None = None) -> list[ov.InferRequest]:
        """The infer requests made so far for input CPU shapes ``shapes`` (default: the default shapes)."""
        self._require_open()
        signature = self._default.signature if shapes is None else tuple(tuple(s) for s in shapes)
        compiled = self._compiled.get(signature)
        if compiled is None:
            raise ValueError(f"no compiled model for input shapes {[list(s) for s in signature]}; compiled: "
                             f"{[[list(s) for s in k] for k in self._compiled]}")
        return compiled.engine.requests


__all__ = ["OpenVINORunner", "OpenVINOEngine", "core", "npu_unavailable_reason", "ov_type", "data_type_of"]
