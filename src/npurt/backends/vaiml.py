"""RunnerType.VAIML: ONNX Runtime with the Vitis AI execution provider, or ONNX Runtime's CPU provider.

The Vitis AI provider ships only in the Ryzen AI SDK's onnxruntime build (not on PyPI). Where it is
missing the runner falls back to the CPU provider as the ``fallback`` option allows, and says so. Which
provider each node went to is read from the session (graph assignment info), not assumed.

HW views (formats.hw_view, target "VAIML") are baked into the ONNX graph the session loads: at a HW
input the session consumes the HW tensor (Cast -> Transpose -> Reshape -> Slice back to the model's
tensor), at a HW output it produces it (Pad -> Reshape -> Transpose -> Cast). Port names stay the
model's; the model's own tensors are renamed ``<name>__npurt_cpu``. Tensors are bound with IOBinding by
address (zero copy); bindings are cached per thread and per set of tensors, so a repeated
``execute`` with the same tensors runs without rebinding.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import platform
import threading
import weakref
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from .. import devices, formats, qdq
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

log = logging.getLogger("npurt")

VITISAI_EP = "VitisAIExecutionProvider"
CPU_EP = "CPUExecutionProvider"
BACKEND_NAME = "ONNX Runtime (Vitis AI EP)"
# engine_options keys that are Vitis AI provider options; every other key configures the session.
VITISAI_OPTION_KEYS = ("config_file", "cache_dir", "cache_key", "target", "xclbin", "encryption_key")
OPTIMIZATION_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
MIN_OPSET_FOR_EDITS = 13  # Cast to/from bfloat16 needs opset 13
BINDINGS_PER_THREAD = 4  # cached IOBindings per thread and compiled variant (double/triple buffering)
INTERNAL_SUFFIX = "__npurt_cpu"

_ONNX_TO_DTYPE = {
    TensorProto.FLOAT: DataType.FLOAT32,
    TensorProto.FLOAT16: DataType.FP16,
    TensorProto.BFLOAT16: DataType.BF16,
    TensorProto.INT8: DataType.INT8,
    TensorProto.UINT8: DataType.UINT8,
    TensorProto.INT16: DataType.INT16,
    TensorProto.UINT16: DataType.UINT16,
    TensorProto.INT32: DataType.INT32,
    TensorProto.UINT32: DataType.UINT32,
    TensorProto.INT64: DataType.INT64,
    TensorProto.UINT64: DataType.UINT64,
    TensorProto.BOOL: DataType.BOOLEAN,
}
_DTYPE_TO_ONNX = {v: k for k, v in _ONNX_TO_DTYPE.items()}
_FLOAT_ONNX = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)


# ---------------------------------------------------------------------------------------- discovery
def _accel_nodes() -> list[str]:
    try:
        return sorted(f"/dev/accel/{n}" for n in os.listdir("/dev/accel"))
    except OSError:
        return []


def npu_unavailable_reason() -> str:
    """Why the Vitis AI NPU cannot be used here ("" when it can)."""
    providers = ort.get_available_providers()
    if VITISAI_EP in providers:
        return ""
    accel = _accel_nodes()
    driver = Path("/sys/module/amdxdna").exists()
    return (f"the Vitis AI execution provider is not installed: ONNX Runtime {ort.__version__} "
            f"({Path(ort.__file__).parent}) has providers {providers}, and {VITISAI_EP} ships only in the "
            f"Ryzen AI SDK's onnxruntime build; "
            + (f"accel nodes {accel}" if accel else "no /dev/accel nodes")
            + ("; amdxdna driver loaded" if driver else "; amdxdna driver not loaded (/sys/module/amdxdna absent)"))


# ---------------------------------------------------------------------------------------- model reading
def _value_spec(value: onnx.ValueInfoProto, what: str) -> PortSpec:
    tt = value.type.tensor_type
    if not value.type.HasField("tensor_type"):
        raise NpuUnsupportedError(f"{what} {value.name!r} is not a tensor ({value.type.WhichOneof('value')})")
    dtype = _ONNX_TO_DTYPE.get(tt.elem_type)
    if dtype is None:
        raise NpuUnsupportedError(f"{what} {value.name!r} has ONNX element type "
                                  f"{TensorProto.DataType.Name(tt.elem_type)}, which npurt does not support")
    if not tt.HasField("shape"):
        raise NpuUnsupportedError(f"{what} {value.name!r} has no shape (unknown rank) in the model")
    shape: list[int | None] = []
    names: list[str | None] = []
    for d in tt.shape.dim:
        static = d.HasField("dim_value") and d.dim_value > 0
        shape.append(int(d.dim_value) if static else None)
        names.append(d.dim_param if d.HasField("dim_param") and d.dim_param else None)
    return PortSpec(value.name, dtype, tuple(shape), dim_names=tuple(names))


def _graph_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    initializers = {i.name for i in graph.initializer}
    return [v for v in graph.input if v.name not in initializers]


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def _set_shape(value: onnx.ValueInfoProto, shape: tuple[int, ...], elem_type: int | None = None) -> None:
    tt = value.type.tensor_type
    if elem_type is not None:
        tt.elem_type = elem_type
    tt.ClearField("shape")
    tt.shape.SetInParent()  # a scalar still has a (rank-0) shape
    for d in shape:
        tt.shape.dim.add().dim_value = int(d)


def _rename_uses(graph: onnx.GraphProto, old: str, new: str, outputs_too: bool) -> None:
    """Rename tensor ``old`` to ``new`` in node inputs (and outputs), also inside subgraphs that see it."""
    for node in graph.node:
        for i, n in enumerate(node.input):
            if n == old:
                node.input[i] = new
        if outputs_too:
            for i, n in enumerate(node.output):
                if n == old:
                    node.output[i] = new
        for attr in node.attribute:
            subgraphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subgraphs:
                shadowed = {v.name for v in sub.input} | {i.name for i in sub.initializer}
                if old not in shadowed:
                    _rename_uses(sub, old, new, outputs_too=False)
    for vi in graph.value_info:
        if vi.name == old:
            vi.name = new


class _GraphEditor:
    """Adds the CPU<->HW conversions at a graph's ports, with unique names for the nodes it adds."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.graph = model.graph
        self.head: list[onnx.NodeProto] = []  # conversions of inputs: run first
        self.tail: list[onnx.NodeProto] = []  # conversions of outputs: run last

    def _const(self, port: str, values: list[int]) -> str:
        name = f"{port}__npurt_const{len(self.graph.initializer)}"
        self.graph.initializer.append(numpy_helper.from_array(np.asarray(values, np.int64), name))
        return name

    def _chain(self, port: str, src: str, dst: str, steps: list[tuple[str, dict[str, Any], list[str]]]
               ) -> list[onnx.NodeProto]:
        nodes = []
        cur = src
        for k, (op, attrs, extra) in enumerate(steps):
            out = dst if k == len(steps) - 1 else f"{port}__npurt_{k}_{op.lower()}"
            nodes.append(helper.make_node(op, [cur, *extra], [out], name=f"{port}__npurt_{op}_{k}", **attrs))
            cur = out
        return nodes

    def _permute(self, name: str, shape: tuple[int, ...], perm: tuple[int, ...], result: tuple[int, ...]
                 ) -> list[tuple[str, dict[str, Any], list[str]]]:
        """Steps that permute a tensor of ``shape`` by ``perm`` and leave it shaped ``result``.

        ONNX Runtime's Transpose is slow on 5-D tensors (10x slower than the equivalent 2-D transpose on a
        640x640 HCWNC4 frame, measured here), so size-1 axes are dropped and axes that stay together merged.
        """
        reduced, rperm = _reduce_transpose(shape, perm)
        steps: list[tuple[str, dict[str, Any], list[str]]] = []
        if rperm != tuple(range(len(rperm))):
            if tuple(reduced) != tuple(shape):
                steps.append(("Reshape", {}, [self._const(name, list(reduced))]))
            steps.append(("Transpose", {"perm": list(rperm)}, []))
        steps.append(("Reshape", {}, [self._const(name, list(result))]))
        return steps

    def _steps_to_cpu(self, port: Port) -> list[tuple[str, dict[str, Any], list[str]]]:
        """Nodes that turn the HW tensor into the model's (CPU) tensor: move data in the HW type, cast last."""
        hw, cpu, name = port.hw, port.cpu, port.name
        steps: list[tuple[str, dict[str, Any], list[str]]] = []
        layout = hw.memory_layout
        if layout in formats.CHANNEL_GROUP:
            n, c, h, w = cpu.shape
            k = formats.CHANNEL_GROUP[layout]
            padded = -(-c // k) * k
            inverse = tuple(int(i) for i in np.argsort(formats._HCWNC_PERMUTATION))
            steps += self._permute(name, hw.shape, inverse, (n, padded, h, w))
            if padded != c:
                steps.append(("Slice", {}, [self._const(name, [0]), self._const(name, [c]), self._const(name, [1])]))
        else:
            perm = _layout_perm(port)
            if perm is not None:
                inverse = tuple(int(i) for i in np.argsort(perm))
                steps += self._permute(name, hw.shape, inverse, cpu.shape)
        if hw.data_type != cpu.data_type:
            steps.append(("Cast", {"to": _onnx_type(cpu.data_type, name)}, []))
        return steps

    def _steps_to_hw(self, port: Port) -> list[tuple[str, dict[str, Any], list[str]]]:
        """Nodes that turn the model's (CPU) tensor into the HW tensor: pad, cast, then move data in the HW type."""
        hw, cpu, name = port.hw, port.cpu, port.name
        steps: list[tuple[str, dict[str, Any], list[str]]] = []
        layout = hw.memory_layout
        moves: list[tuple[str, dict[str, Any], list[str]]] = []
        if layout in formats.CHANNEL_GROUP:
            n, c, h, w = cpu.shape
            k = formats.CHANNEL_GROUP[layout]
            groups = -(-c // k)
            if groups * k != c:
                steps.append(("Pad", {}, [self._const(name, [0, 0, 0, 0, 0, groups * k - c, 0, 0])]))
            moves = self._permute(name, (n, groups, k, h, w), formats._HCWNC_PERMUTATION, hw.shape)
        else:
            perm = _layout_perm(port)
            if perm is not None:
                moves = self._permute(name, cpu.shape, perm, hw.shape)
        if hw.data_type != cpu.data_type:
            steps.append(("Cast", {"to": _onnx_type(hw.data_type, name)}, []))
        return steps + moves

    def input_to_hw(self, port: Port) -> None:
        steps = self._steps_to_cpu(port)
        if not steps:
            return
        internal = port.name + INTERNAL_SUFFIX
        _rename_uses(self.graph, port.name, internal, outputs_too=False)
        self.head += self._chain(port.name, port.name, internal, steps)
        value = next(v for v in self.graph.input if v.name == port.name)
        _set_shape(value, port.hw.shape, _onnx_type(port.hw.data_type, port.name))

    def output_to_hw(self, port: Port) -> None:
        steps = self._steps_to_hw(port)
        if not steps:
            return
        if not any(port.name in node.output for node in self.graph.node):
            raise NpuUnsupportedError(f"output {port.name!r} is not computed by a node (it is a graph input or a "
                                      "constant); its HW view cannot be baked into the model: use the CPU view")
        internal = port.name + INTERNAL_SUFFIX
        _rename_uses(self.graph, port.name, internal, outputs_too=True)
        self.tail += self._chain(port.name, internal, port.name, steps)
        value = next(v for v in self.graph.output if v.name == port.name)
        _set_shape(value, port.hw.shape, _onnx_type(port.hw.data_type, port.name))

    def finish(self) -> bool:
        if not (self.head or self.tail):
            return False
        nodes = [*self.head, *self.graph.node, *self.tail]
        del self.graph.node[:]
        self.graph.node.extend(nodes)
        return True


def _onnx_type(dtype: DataType, name: str) -> int:
    t = _DTYPE_TO_ONNX.get(dtype)
    if t is None:
        raise NpuUnsupportedError(f"tensor {name!r}: no ONNX element type for {dtype.name}")
    return t


def _layout_perm(port: Port) -> tuple[int, ...] | None:
    """The permutation from the CPU tensor's axes to the HW view's (None when they are the same)."""
    hw, cpu = port.hw, port.cpu
    if hw.memory_layout == cpu.memory_layout or hw.memory_layout is MemoryLayout.UNKNOWN:
        return None
    if hw.memory_layout is MemoryLayout.GENERIC and hw.memory_layout_order:
        perm = tuple(hw.memory_layout_order)
    elif hw.memory_layout is MemoryLayout.NHWC and cpu.memory_layout is MemoryLayout.NCHW:
        perm = (0, 2, 3, 1)
    elif hw.memory_layout is MemoryLayout.NCHW and cpu.memory_layout is MemoryLayout.NCHW:
        perm = None
    else:
        raise NpuUnsupportedError(f"tensor {port.name!r}: cannot bake {cpu.memory_layout.name} -> "
                                  f"{hw.memory_layout.name} into the ONNX graph")
    return None if perm is None or perm == tuple(range(len(perm))) else perm


def _reduce_transpose(shape: tuple[int, ...], perm: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The smallest transpose equivalent to ``perm`` on ``shape``: size-1 axes dropped, and input axes that
    stay adjacent and in order in the output merged. Returns (reduced input shape, reduced permutation)."""
    keep = [a for a in range(len(shape)) if shape[a] != 1]
    index = {a: i for i, a in enumerate(keep)}
    order = [index[a] for a in perm if a in index]  # output order of the kept input axes
    dims = [shape[a] for a in keep]
    groups: list[list[int]] = []  # runs of input axes, in output order
    for a in order:
        if groups and groups[-1][-1] + 1 == a:
            groups[-1].append(a)
        else:
            groups.append([a])
    by_input = sorted(range(len(groups)), key=lambda g: groups[g][0])
    reduced = tuple(int(np.prod([dims[a] for a in groups[g]])) for g in by_input)
    position = {g: i for i, g in enumerate(by_input)}
    return reduced, tuple(position[g] for g in range(len(groups)))


def _check_hw_port(port: Port) -> None:
    hw, cpu = port.hw, port.cpu
    if port.quant is not None:
        return  # a QDQ boundary: the engine takes the quantized tensor once the boundary node is stripped
    if hw.data_type != cpu.data_type:
        floats = (DataType.FLOAT32, DataType.FP16, DataType.BF16)
        if hw.data_type not in floats or cpu.data_type not in floats:
            raise NpuUnsupportedError(
                f"tensor {port.name!r}: HW view {hw.data_type.name} of a {cpu.data_type.name} tensor is not "
                "supported by the VAIML backend (only QDQ boundaries have a quantized HW view); use the CPU view")


# ---------------------------------------------------------------------------------------- engine state
class _Engine:
    """One ONNX Runtime session for one input-shape signature, and its per-thread IOBinding cache."""

    def __init__(self, session: ort.InferenceSession, inputs: list[Port], outputs: list[Port]) -> None:
        self.session = session
        self.c_session = session._sess  # the pybind object: run_with_iobinding without the wrapper's checks
        self.cpu = ort.OrtDevice.make("cpu", 0)._get_c_device()
        self.in_binds = [(p.name, _onnx_type(p.engine.data_type, p.name), list(p.engine.shape)) for p in inputs]
        self.out_binds = [(p.name, _onnx_type(p.engine.data_type, p.name), list(p.engine.shape)) for p in outputs]
        self.local = threading.local()
        self.bindings_made = 0  # for tests and diagnostics: how often the cache missed

    def binding(self, inputs: list[NpuTensor], outputs: list[NpuTensor]) -> Any:
        """The calling thread's IOBinding for these tensors, made once and reused while they live.

        Keyed by the tensors' identity and checked through weak references (an NpuTensor's memory never
        changes, so the same live objects mean the same buffers); the addresses are read only on a miss.
        """
        tensors = (*inputs, *outputs)
        key = tuple(map(id, tensors))
        cache = getattr(self.local, "cache", None)
        if cache is None:
            cache = self.local.cache = {}
        entry = cache.get(key)
        if entry is not None:
            refs, binding = entry
            if all(ref() is t for ref, t in zip(refs, tensors)):
                return binding
        if self.c_session is None:
            raise NpuError("the runner is closed")
        binding = ort.capi._pybind_state.SessionIOBinding(self.c_session)
        for (name, etype, shape), t in zip(self.in_binds, inputs):
            binding.bind_input(name, self.cpu, etype, shape, t.get_virtual_address())
        for (name, etype, shape), t in zip(self.out_binds, outputs):
            binding.bind_output(name, self.cpu, etype, shape, t.get_virtual_address())
        if len(cache) >= BINDINGS_PER_THREAD:
            cache.pop(next(iter(cache)))
        cache[key] = (tuple(weakref.ref(t) for t in tensors), binding)
        self.bindings_made += 1
        return binding

    def close(self) -> None:
        self.c_session = None
        self.session = None  # type: ignore[assignment]
        self.local = threading.local()


def _cpu_fingerprint() -> str:
    """What an optimized model may depend on: ORT's ALL level adds CPU-specific (NCHWc) kernels."""
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "model name")):
                    flags += line
                if line.startswith("flags"):
                    break
    except OSError:
        pass
    return f"{platform.machine()}|{flags}"


# ---------------------------------------------------------------------------------------- the runner
class VaimlRunner(Runner):
    """ONNX Runtime with the Vitis AI EP (NPU) or the CPU provider; HW views baked into the graph."""

    runner_type = "VAIML"
    target = "VAIML"

    @classmethod
    def npu_present(cls) -> bool:
        return VITISAI_EP in ort.get_available_providers()

    # -- load ---------------------------------------------------------------------------------------
    def _load(self) -> tuple[list[PortSpec], list[PortSpec]]:
        try:
            self._model = onnx.load(str(self.model_path))
        except Exception as e:  # noqa: BLE001 - onnx raises several types for a bad file
            # the path exists (the Runner checked): a file that is not a model is the engine's refusal, not a bad
            # argument, as with OpenVINO
            raise NpuError(f"cannot read ONNX model {self.model_path}: {type(e).__name__}: {e}") from None
        self._edit_base: onnx.ModelProto | None = None  # the model at an opset that takes the HW edits
        self._edit_lock = threading.Lock()
        self._engines: list[_Engine] = []
        # At QDQ boundaries the HW view is the quantized tensor, and the boundary Q/DQ leaves the graph.
        boundaries = qdq.find_boundaries(self._model)
        ins = qdq.annotate_specs([_value_spec(v, "input") for v in _graph_inputs(self._model.graph)], boundaries)
        outs = qdq.annotate_specs([_value_spec(v, "output") for v in self._model.graph.output], boundaries)

        engine_opts = dict(self.options.engine_options)
        self._vitis_options = {k: str(engine_opts.pop(k)) for k in VITISAI_OPTION_KEYS if k in engine_opts}
        self._session_options = engine_opts

        npu_reason = npu_unavailable_reason()
        present = {"CPU"} if npu_reason else {"NPU", "CPU"}
        unavailable = {"GPU": "the VAIML backend runs on the Vitis AI NPU or ONNX Runtime's CPU provider; "
                              "it has no GPU device"}
        if npu_reason:
            unavailable["NPU"] = npu_reason
        sel = devices.select_device(self.options.device, unavailable, present, self.options.fallback, BACKEND_NAME)
        self._providers: list[Any] = [CPU_EP]
        if sel.attached == "NPU":
            self._providers = [(VITISAI_EP, self._vitis_options), CPU_EP]
        if self.options.inference_precision not in (None, "f32"):
            log.warning("VAIML: inference_precision=%s is ignored (the Vitis AI EP's compiler picks the NPU's "
                        "precision; the CPU provider computes in the model's types)", self.options.inference_precision)
        self._device_info = DeviceInfo(
            requested=self.options.device, attached=sel.attached, engine="ONNX Runtime", engine_version=ort.__version__,
            fell_back=sel.fell_back, reason=sel.reason, skipped=sel.skipped,
            full_name=VITISAI_EP if sel.attached == "NPU" else CPU_EP)
        return ins, outs

    # -- compile ------------------------------------------------------------------------------------
    def _compile(self, inputs: list[Port]) -> Compiled:
        for p in inputs:
            if p.view is TensorType.HW:
                _check_hw_port(p)
        out_shapes = self._output_shapes(inputs)
        outputs = [self.make_port(dataclasses.replace(spec, shape=shape), TensorDirection.OUTPUT)
                   for spec, shape in zip(self._out_specs, out_shapes)]
        for p in outputs:
            if p.view is TensorType.HW:
                _check_hw_port(p)
        model = self._edited(inputs, outputs)
        session = self._session(model)
        engine = _Engine(session, inputs, outputs)
        self._engines.append(engine)
        self._record_placement(session)
        return Compiled(inputs=inputs, outputs=outputs, engine=engine)

    @staticmethod
    def _fix_inputs(model: onnx.ModelProto, inputs: list[Port]) -> None:
        by_name = {p.name: p for p in inputs}
        for value in _graph_inputs(model.graph):
            port = by_name[value.name]
            _set_shape(value, port.cpu.shape)

    def _output_shapes(self, inputs: list[Port]) -> list[tuple[int, ...]]:
        """Static output shapes for static inputs: from the model if it says, else from ONNX Runtime."""
        declared = [self._static(s.shape) for s in self._out_specs]
        if all(d is not None for d in declared) and all(s.is_static for s in self._in_specs):
            return declared  # type: ignore[return-value]
        fixed = onnx.ModelProto()
        fixed.CopyFrom(self._model)
        self._fix_inputs(fixed, inputs)
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC  # folds shape computations
        so.log_severity_level = 3
        probe = ort.InferenceSession(fixed.SerializeToString(), so, providers=[CPU_EP])
        shapes = [self._static(o.shape) for o in probe.get_outputs()]
        if any(s is None for s in shapes):
            # Shapes that only a run can tell: run once on zeros.
            feeds = {p.name: np.zeros(p.cpu.shape, p.cpu.numpy_dtype) for p in inputs}
            results = probe.run(None, feeds)
            shapes = [tuple(r.shape) for r in results]
        return shapes  # type: ignore[return-value]

    @staticmethod
    def _static(shape: Any) -> tuple[int, ...] | None:
        if all(isinstance(d, int) and d > 0 for d in shape):
            return tuple(shape)
        return None

    def _edited(self, inputs: list[Port], outputs: list[Port]) -> onnx.ModelProto:
        """The model the session loads: the HW views baked in at HW ports, and static shapes for the NPU.

        On the CPU provider the model's own dims stay as they are: ONNX Runtime then runs the very graph that
        ``InferenceSession.run`` on the original model runs (fixing the dims changes its kernel choices and
        the last bit of some results). The Vitis AI EP compiles for static shapes, so there they are fixed.
        """
        quantized = qdq.quantized_hw_ports(inputs + outputs)
        needs_edit = any(p.view is TensorType.HW and p.name not in quantized
                         and p.hw != p.cpu.replace(tensor_type=TensorType.HW) for p in inputs + outputs)
        base = self._model
        if needs_edit and _opset(base) < MIN_OPSET_FOR_EDITS:
            base = self._converted_base()
        if quantized:
            model = qdq.strip_boundaries(base, quantized)  # a copy
        else:
            model = onnx.ModelProto()
            model.CopyFrom(base)
        if self.device_info.attached == "NPU":
            self._fix_inputs(model, inputs)
            for value, port in zip(model.graph.output, outputs):
                _set_shape(value, port.cpu.shape)
        editor = _GraphEditor(model)
        for p in inputs:
            if p.view is TensorType.HW and p.name not in quantized:
                editor.input_to_hw(p)
        for p in outputs:
            if p.view is TensorType.HW and p.name not in quantized:
                editor.output_to_hw(p)
        editor.finish()
        return model

    def _converted_base(self) -> onnx.ModelProto:
        """The model converted to opset 13 (once): bfloat16 Cast needs it; PP-OCR models are opset 11/12."""
        with self._edit_lock:
            if self._edit_base is None:
                try:
                    converted = onnx.version_converter.convert_version(self._model, MIN_OPSET_FOR_EDITS)
                except Exception as e:  # noqa: BLE001
                    raise NpuUnsupportedError(
                        f"the model is opset {_opset(self._model)}; baking BF16 HW views needs opset "
                        f"{MIN_OPSET_FOR_EDITS} and the ONNX version converter failed ({type(e).__name__}: {e}); "
                        "use input_tensor_type/output_tensor_type='CPU'") from None
                converted.ir_version = max(self._model.ir_version, 7)  # opset 13 needs IR 7; ORT 1.31 takes <= 10
                self._edit_base = converted
            return self._edit_base

    def _session(self, model: onnx.ModelProto) -> ort.InferenceSession:
        so = ort.SessionOptions()
        so.log_severity_level = {"DEBUG": 1, "INFO": 2, "WARNING": 2, "ERROR": 3}[self.options.log_level]
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        level = "all"
        for key, value in self._session_options.items():
            if key == "intra_op_num_threads":
                so.intra_op_num_threads = int(value)
            elif key == "inter_op_num_threads":
                so.inter_op_num_threads = int(value)
            elif key == "graph_optimization_level":
                level = str(value).lower()
                if level not in OPTIMIZATION_LEVELS:
                    raise ValueError(f"engine_options 'graph_optimization_level': {value!r} is not one of "
                                     f"{', '.join(OPTIMIZATION_LEVELS)}")
            elif key == "execution_mode":
                so.execution_mode = (ort.ExecutionMode.ORT_PARALLEL if str(value).lower() == "parallel"
                                     else ort.ExecutionMode.ORT_SEQUENTIAL)
            elif key in ("enable_cpu_mem_arena", "enable_mem_pattern", "enable_mem_reuse"):
                setattr(so, key, bool(value))
            else:
                so.add_session_config_entry(key, str(value))
        so.graph_optimization_level = OPTIMIZATION_LEVELS[level]
        on_npu = self.device_info.attached == "NPU"
        if on_npu and self.options.fallback == "error":
            so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        data = model.SerializeToString()
        key = hashlib.sha256(data + repr((ort.__version__, level, self._providers, _cpu_fingerprint()))
                             .encode()).hexdigest()[:32]
        providers = self._providers
        if on_npu:
            vitis = dict(self._vitis_options)
            if self.options.cache_dir is not None:  # the EP's compiled-model cache, keyed by the edited model
                vitis.setdefault("cache_dir", str(self.options.cache_dir))
                vitis.setdefault("cache_key", f"npurt-{key}")
            providers = [(VITISAI_EP, vitis), CPU_EP]
        source: bytes | str = data
        tmp: Path | None = None
        cached: Path | None = None
        if self.options.cache_dir is not None and not on_npu:
            # ORT cannot serialize a model with nodes compiled by an EP, so this cache is for the CPU provider;
            # the Vitis AI EP keeps its own (cache_dir / cache_key above).
            cached = Path(self.options.cache_dir) / f"vaiml-{key}.onnx"
            if cached.exists():
                source = str(cached)
                so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # optimized already
            else:
                cached.parent.mkdir(parents=True, exist_ok=True)
                tmp = cached.with_name(f"{cached.stem}.{os.getpid()}.{threading.get_ident()}.tmp.onnx")
                so.optimized_model_filepath = str(tmp)
                if self.options.log_level != "DEBUG":
                    so.log_severity_level = 3  # ORT warns that an ALL-level model is CPU-specific: it is keyed so
        try:
            session = ort.InferenceSession(source, so, providers=providers)
        except Exception as e:  # noqa: BLE001
            if tmp is not None:
                tmp.unlink(missing_ok=True)
            if on_npu and self.options.fallback == "error":
                raise NpuError(f"{BACKEND_NAME}: the session cannot run entirely on {VITISAI_EP} "
                               f"(fallback='error' forbids CPU nodes): {e}") from None
            raise NpuError(f"{BACKEND_NAME}: cannot create the session for {self.model_path.name}: "
                           f"{type(e).__name__}: {e}") from None
        if tmp is not None and cached is not None:
            try:
                os.replace(tmp, cached)  # atomic: concurrent runners never read half a model
            except OSError as e:
                log.warning("VAIML: cannot store the optimized model in %s: %s", cached, e)
                tmp.unlink(missing_ok=True)
        return session

    def _record_placement(self, session: ort.InferenceSession) -> None:
        """device_info.placement from the session's own graph assignment (first session), and its checks."""
        counts: Counter[str] = Counter()
        for subgraph in session.get_provider_graph_assignment_info():
            counts[subgraph.ep_name] += len(subgraph.get_nodes())
        placement = tuple(sorted(counts.items(), key=lambda kv: (kv[0] != VITISAI_EP, kv[0])))
        info = self.device_info
        if info.attached == "NPU":
            on_cpu = counts.get(CPU_EP, 0)
            if not counts.get(VITISAI_EP):
                msg = (f"{VITISAI_EP} is registered but took no node; all {sum(counts.values())} nodes run on "
                       "the CPU (a cache_dir/cache_key mismatch or an unsupported model does this)")
                if self.options.fallback == "error":
                    raise NpuError(f"{BACKEND_NAME}: {msg}")
                log.warning("VAIML: %s", msg)
                info = dataclasses.replace(info, fell_back=True, reason=msg)
            elif on_cpu and self.options.fallback == "error":
                raise NpuError(f"{BACKEND_NAME}: {on_cpu} nodes fell to {CPU_EP} and fallback='error'")
        if not info.placement:
            info = dataclasses.replace(info, placement=placement)
        self._device_info = info

    # -- run ----------------------------------------------------------------------------------------
    def _run(self, compiled: Compiled, inputs: list[NpuTensor], outputs: list[NpuTensor]) -> None:
        engine: _Engine = compiled.engine
        binding = engine.binding(inputs, outputs)
        c_session = engine.c_session
        if c_session is None:
            raise NpuError("the runner is closed")
        c_session.run_with_iobinding(binding, None)  # releases the GIL

    def _close(self) -> None:
        for engine in self._engines:
            engine.close()
        self._engines.clear()

    def _default_max_concurrent_runs(self) -> int:
        return 2  # VART-ML's default; ONNX Runtime's intra-op pool already uses every core for one run

    # -- diagnostics --------------------------------------------------------------------------------
    def session_for(self, signature: tuple[tuple[int, ...], ...] | None = None) -> ort.InferenceSession:
        """The ONNX Runtime session of a compiled variant (default: the runner's default shapes)."""
        compiled = self._default if signature is None else self._compiled[signature]
        return compiled.engine.session

    def io_binding_for(self, tensors_in: list[NpuTensor], tensors_out: list[NpuTensor],
                       signature: tuple[tuple[int, ...], ...] | None = None) -> Any:
        """The calling thread's cached IOBinding for these engine-view tensors (to inspect what is bound)."""
        compiled = self._default if signature is None else self._compiled[signature]
        return compiled.engine.binding(tensors_in, tensors_out)
