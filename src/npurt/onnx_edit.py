"""ONNX graph edits: reading a model's ports from its graph, and building HW views into the graph ONNX Runtime loads.

At a HW input the session consumes the HW tensor (Cast -> Transpose -> Reshape -> Slice back to the model's
tensor); at a HW output it produces it (Pad -> Reshape -> Transpose -> Cast). Port names stay the model's; the
model's own tensors are renamed ``<name>__npurt_cpu``. Where the model's opset is too old for a bfloat16 Cast the
model is converted to opset 13 first. The layout of each view comes from ``formats`` (the one owner of layout rules).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from . import formats, qdq
from .onnx_build import GraphBuilder, Step
from .onnx_graph import graph_inputs
from .onnx_proto import rename_uses, set_shape
from .ports import Port
from .types import DataType, NpuUnsupportedError, TensorType

MIN_OPSET_FOR_EDITS = 13  # Cast to/from bfloat16 needs opset 13
INTERNAL_SUFFIX = "__npurt_cpu"

ONNX_TO_DTYPE: dict[int, DataType] = {
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
    TensorProto.DOUBLE: DataType.FLOAT64,
}
DTYPE_TO_ONNX = {v: k for k, v in ONNX_TO_DTYPE.items()}


def opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


class GraphEditor:
    """Adds the CPU<->HW conversions at a graph's ports, with unique names for the nodes it adds."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.graph = model.graph
        self.head: list[onnx.NodeProto] = []  # conversions of inputs: run first
        self.tail: list[onnx.NodeProto] = []  # conversions of outputs: run last

    @staticmethod
    def _permute(b: GraphBuilder, shape: tuple[int, ...], perm: tuple[int, ...], result: tuple[int, ...]
                 ) -> list[Step]:
        """Steps that permute a tensor of ``shape`` by ``perm`` and leave it shaped ``result``.

        ONNX Runtime's Transpose is slow on 5-D tensors (10x slower than the equivalent 2-D transpose on a
        640x640 HCWNC4 frame, measured here), so size-1 axes are dropped and axes that stay together merged.
        """
        reduced, rperm = _reduce_transpose(shape, perm)
        steps: list[Step] = []
        if rperm != tuple(range(len(rperm))):
            if tuple(reduced) != tuple(shape):
                steps.append(("Reshape", {}, [b.const(list(reduced))]))
            steps.append(("Transpose", {"perm": list(rperm)}, []))
        steps.append(("Reshape", {}, [b.const(list(result))]))
        return steps

    def _steps_to_cpu(self, port: Port, b: GraphBuilder) -> list[Step]:
        """Nodes that turn the HW tensor into the model's (CPU) tensor: move data in the HW type, cast last."""
        hw, cpu, name = port.hw, port.cpu, port.name
        view = formats.ViewMap.of(cpu, hw)
        steps: list[Step] = []
        inverse = tuple(int(i) for i in np.argsort(view.layout.perm))
        if view.layout.group:
            n, c, h, w = cpu.shape
            split = view.layout.split(cpu.shape)
            steps += self._permute(b, hw.shape, inverse, (n, split[1] * split[2], h, w))
            if split[1] * split[2] != c:
                steps.append(("Slice", {}, [b.const([0]), b.const([c]), b.const([1])]))
        elif not view.layout.is_identity:
            steps += self._permute(b, hw.shape, inverse, cpu.shape)
        if view.hw_type != view.cpu_type:
            steps.append(("Cast", {"to": onnx_type(cpu.data_type, name)}, []))
        return steps

    def _steps_to_hw(self, port: Port, b: GraphBuilder) -> list[Step]:
        """Nodes that turn the model's (CPU) tensor into the HW tensor: pad, cast, then move data in the HW type."""
        hw, cpu, name = port.hw, port.cpu, port.name
        view = formats.ViewMap.of(cpu, hw)
        steps: list[Step] = []
        moves: list[Step] = []
        if view.layout.group:
            split = view.layout.split(cpu.shape)
            padding = split[1] * split[2] - cpu.shape[1]
            if padding:
                steps.append(("Pad", {}, [b.const([0, 0, 0, 0, 0, padding, 0, 0])]))
            moves = self._permute(b, split, view.layout.perm, hw.shape)
        elif not view.layout.is_identity:
            moves = self._permute(b, cpu.shape, view.layout.perm, hw.shape)
        if view.hw_type != view.cpu_type:
            steps.append(("Cast", {"to": onnx_type(hw.data_type, name)}, []))
        return steps + moves

    def input_to_hw(self, port: Port) -> None:
        b = GraphBuilder(self.graph, f"{port.name}__npurt_in")
        steps = self._steps_to_cpu(port, b)
        if not steps:
            return
        internal = port.name + INTERNAL_SUFFIX
        rename_uses(self.graph, port.name, internal, outputs_too=False)
        b.chain(port.name, internal, steps)
        self.head += b.nodes
        value = next(v for v in self.graph.input if v.name == port.name)
        set_shape(value, port.hw.shape, onnx_type(port.hw.data_type, port.name))

    def output_to_hw(self, port: Port) -> None:
        b = GraphBuilder(self.graph, f"{port.name}__npurt_out")
        steps = self._steps_to_hw(port, b)
        if not steps:
            return
        if not any(port.name in node.output for node in self.graph.node):
            raise NpuUnsupportedError(f"output {port.name!r} is not computed by a node (it is a graph input or a "
                                      "constant); its HW view cannot be baked into the model: use the CPU view")
        internal = port.name + INTERNAL_SUFFIX
        rename_uses(self.graph, port.name, internal, outputs_too=True)
        b.chain(internal, port.name, steps)
        self.tail += b.nodes
        value = next(v for v in self.graph.output if v.name == port.name)
        set_shape(value, port.hw.shape, onnx_type(port.hw.data_type, port.name))

    def finish(self) -> bool:
        if not (self.head or self.tail):
            return False
        nodes = [*self.head, *self.graph.node, *self.tail]
        del self.graph.node[:]
        self.graph.node.extend(nodes)
        return True


def onnx_type(dtype: DataType, name: str) -> int:
    t = DTYPE_TO_ONNX.get(dtype)
    if t is None:
        raise NpuUnsupportedError(f"tensor {name!r}: no ONNX element type for {dtype.name}")
    return t


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


def check_hw_port(port: Port) -> None:
    hw, cpu = port.hw, port.cpu
    if port.quant is not None:
        return  # a QDQ boundary: the engine takes the quantized tensor once the boundary node is stripped
    if hw.data_type != cpu.data_type:
        floats = (DataType.FLOAT32, DataType.FP16, DataType.BF16)
        if hw.data_type not in floats or cpu.data_type not in floats:
            raise NpuUnsupportedError(
                f"tensor {port.name!r}: HW view {hw.data_type.name} of a {cpu.data_type.name} tensor is not "
                "supported by the VAIML backend (only QDQ boundaries have a quantized HW view); use the CPU view")


def edited_model(model: onnx.ModelProto, inputs: list[Port], outputs: list[Port], fix_shapes: bool) -> onnx.ModelProto:
    """A copy of ``model`` with the HW views of HW-view ports built in (QDQ boundaries of quantized HW ports
    removed), and with static input and output shapes where ``fix_shapes`` (the Vitis AI EP compiles static
    shapes). Raises NpuUnsupportedError where a view cannot be built in."""
    for p in inputs + outputs:
        if p.view is TensorType.HW:
            check_hw_port(p)
    quantized = qdq.quantized_hw_ports(inputs + outputs)
    # a quantized port's graph tensor is the quantized one once its boundary is stripped: only its layout is built in
    inputs = [_quantized_tensor(p) if p.name in quantized else p for p in inputs]
    outputs = [_quantized_tensor(p) if p.name in quantized else p for p in outputs]
    needs_edit = any(p.view is TensorType.HW and p.converts for p in inputs + outputs)
    base = model
    if needs_edit and opset(base) < MIN_OPSET_FOR_EDITS:
        base = converted_to_opset13(model)
    if quantized:
        edited = qdq.strip_boundaries(base, quantized)  # a copy
    else:
        edited = onnx.ModelProto()
        edited.CopyFrom(base)
    if fix_shapes:
        by_name = {p.name: p for p in inputs}
        for value in graph_inputs(edited.graph):
            set_shape(value, by_name[value.name].cpu.shape)
        for value, port in zip(edited.graph.output, outputs):
            if port.is_static:
                set_shape(value, port.cpu.shape)
    editor = GraphEditor(edited)
    for p in inputs:
        if p.view is TensorType.HW and p.converts:
            editor.input_to_hw(p)
    for p in outputs:
        if p.view is TensorType.HW and p.converts:
            editor.output_to_hw(p)
    editor.finish()
    return edited


def _quantized_tensor(port: Port) -> Port:
    """A QDQ boundary's port as the stripped graph has it: its CPU view (the graph's tensor) quantized too."""
    return dataclasses.replace(port, cpu=port.cpu.replace(data_type=port.hw.data_type))


# the last model converted and its conversion: the model is held, so that no other model object takes its id
_converted: dict[int, tuple[onnx.ModelProto, onnx.ModelProto]] = {}
_converted_lock = threading.Lock()


def converted_to_opset13(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model converted to opset 13 (once per model object): bfloat16 Cast needs it; PP-OCR models are 11/12."""
    with _converted_lock:
        done = _converted.get(id(model))
        if done is not None and done[0] is model:
            return done[1]
        try:
            converted = onnx.version_converter.convert_version(model, MIN_OPSET_FOR_EDITS)
        except Exception as e:  # noqa: BLE001
            raise NpuUnsupportedError(
                f"the model is opset {opset(model)}; building BF16 HW views into it needs opset "
                f"{MIN_OPSET_FOR_EDITS} and the ONNX version converter failed ({type(e).__name__}: {e}); use "
                "input_tensor_type/output_tensor_type='CPU'") from None
        converted.ir_version = max(model.ir_version, 7)  # opset 13 needs IR 7; ORT 1.3x takes <= 10
        _converted.clear()  # one model at a time: a runner converts its own model, once
        _converted[id(model)] = (model, converted)
        return converted


def with_input_shapes(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int | None]]) -> onnx.ModelProto:
    """A copy of ``model`` whose graph inputs named in ``shapes`` have those static shapes (nothing else edited)."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for value in graph_inputs(fixed.graph):
        if value.name in shapes:
            set_shape(value, shapes[value.name])
    return fixed


def static_model(source: str | Path, shapes: Mapping[str, Sequence[int]], target: str | Path) -> Path:
    """The model at ``source`` saved to ``target`` with the inputs named in ``shapes`` at those static shapes, and
    every output whose first (batch) dim is open at their batch: a model fixed by hand, as a user of an NPU's own
    tools writes it (benchmarks and tests compare npurt with that)."""
    model = with_input_shapes(onnx.load(str(source)), shapes)
    batch = next(iter(shapes.values()))[0]
    for value in model.graph.output:
        dims = value.type.tensor_type.shape.dim
        if dims and not dims[0].HasField("dim_value"):
            dims[0].Clear()
            dims[0].dim_value = batch
    onnx.save(model, str(target))
    return Path(target)
