"""QDQ boundaries: model inputs that feed only a QuantizeLinear, outputs that come only from a DequantizeLinear.

At such a boundary the HW view of the tensor is the quantized int8/uint8/uint16 tensor itself (uint16: the
activations of A16W8 models, which Qualcomm's HTP takes): the runner
reports its ``QuantParameters`` (``get_quant_parameters``), converts CPU tensors with them
(``formats.convert(..., quant=...)``), and the engine compiles the model without the boundary node
(``strip_boundaries``), so no float tensor crosses the boundary at all.

A boundary needs a constant scalar scale (an initializer or a Constant node) and a constant scalar zero
point of type int8, uint8 or uint16 (absent means uint8 0, or the type ``output_dtype`` names, as in ONNX);
per-axis and blocked quantization are not boundaries.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from .types import DataType, QuantParameters, RoundingMode, TensorDirection, TensorType

if TYPE_CHECKING:
    from .ports import PortSpec

_QUANT_TYPES = {TensorProto.INT8: DataType.INT8, TensorProto.UINT8: DataType.UINT8, TensorProto.UINT16: DataType.UINT16}
_ZERO_POINT_TYPES = {np.dtype(np.int8): DataType.INT8, np.dtype(np.uint8): DataType.UINT8,
                     np.dtype(np.uint16): DataType.UINT16}
_ELEM_TYPES = {v: k for k, v in _QUANT_TYPES.items()}


@dataclass(frozen=True)
class QdqBoundary:
    """One model input or output whose HW view is the quantized tensor."""

    name: str
    direction: TensorDirection
    quant: QuantParameters
    data_type: DataType  # DataType.INT8, UINT8 or UINT16
    nodes: tuple[str, ...]  # first outputs of the nodes strip_boundaries removes (Q / DQ, Identity after a DQ)


def _constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Values of the graph's initializers and Constant nodes, by tensor name."""
    values = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    for node in graph.node:
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx"):
            continue
        for attr in node.attribute:
            if attr.name == "value":
                values[node.output[0]] = numpy_helper.to_array(attr.t)
            elif attr.name == "value_float":
                values[node.output[0]] = np.array(attr.f, np.float32)
            elif attr.name == "value_int":
                values[node.output[0]] = np.array(attr.i, np.int64)
    return values


def _node_params(node: onnx.NodeProto, constants: dict[str, np.ndarray], input_type: int | None = None
                 ) -> tuple[QuantParameters, DataType] | None:
    """Scalar constant scale and zero point of a QuantizeLinear / DequantizeLinear node, or None. ``input_type``:
    the element type of a DequantizeLinear's input where known (without a zero point, the quantized type is that
    of its input: its ``output_dtype``, from opset 23, names the float type it makes)."""
    if node.domain not in ("", "ai.onnx"):
        return None
    attrs = {a.name: a for a in node.attribute}
    if "block_size" in attrs and attrs["block_size"].i != 0:
        return None
    scale = constants.get(node.input[1]) if len(node.input) > 1 else None
    if scale is None or scale.size != 1 or scale.dtype != np.float32:
        return None
    zp_name = node.input[2] if len(node.input) > 2 else ""
    if zp_name:
        zp = constants.get(zp_name)
        if zp is None or zp.size != 1 or zp.dtype not in _ZERO_POINT_TYPES:
            return None
        data_type = _ZERO_POINT_TYPES[zp.dtype]
        zero_point = int(zp.reshape(()))
    else:
        if node.op_type == "QuantizeLinear":
            quantized = attrs["output_dtype"].i if "output_dtype" in attrs else TensorProto.UINT8
        else:
            quantized = input_type if input_type is not None else TensorProto.UNDEFINED
        if quantized not in _QUANT_TYPES:
            return None
        data_type = _QUANT_TYPES[quantized]
        zero_point = 0
    value = float(scale.reshape(()))
    if not (np.isfinite(value) and value > 0):
        return None
    return QuantParameters(value, zero_point, RoundingMode.ROUND_TO_NEAREST_EVEN), data_type


def _element_type(name: str, producer: Mapping[str, onnx.NodeProto], constants: dict[str, np.ndarray],
                  value_types: Mapping[str, int]) -> int | None:
    """A tensor's element type where the graph says it: that of the QuantizeLinear making it, else its recorded
    type (value_info); None where unknown."""
    node = producer.get(name)
    if node is not None and node.op_type == "QuantizeLinear":
        params = _node_params(node, constants)
        if params is not None:
            return _ELEM_TYPES[params[1]]
    known = value_types.get(name)
    return known if known else None


def _node_id(node: onnx.NodeProto) -> str:
    return str(node.output[0])  # tensor names are unique (SSA); node names need not be


def find_boundaries(model: onnx.ModelProto) -> dict[str, QdqBoundary]:
    """The model's QDQ boundaries, by input / output name."""
    graph = model.graph
    constants = _constants(graph)
    initializers = {init.name for init in graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    producer: dict[str, onnx.NodeProto] = {}
    for node in graph.node:
        for name in node.input:
            if name:
                consumers.setdefault(name, []).append(node)
        for name in node.output:
            producer[name] = node
    output_names = {o.name for o in graph.output}
    value_types = {v.name: v.type.tensor_type.elem_type for v in (*graph.value_info, *graph.input, *graph.output)
                   if v.type.HasField("tensor_type")}
    found: dict[str, QdqBoundary] = {}
    for inp in graph.input:
        if inp.name in initializers or inp.name in output_names:
            continue
        users = consumers.get(inp.name, [])
        if len(users) != 1 or users[0].op_type != "QuantizeLinear" or users[0].input[0] != inp.name:
            continue
        if users[0].output[0] in output_names:
            continue
        if inp.type.tensor_type.elem_type != TensorProto.FLOAT:
            continue
        params = _node_params(users[0], constants)
        if params is not None:
            found[inp.name] = QdqBoundary(inp.name, TensorDirection.INPUT, params[0], params[1],
                                          (_node_id(users[0]),))
    input_names = {i.name for i in graph.input}
    for out in graph.output:
        if consumers.get(out.name):
            continue
        node = producer.get(out.name)
        chain = []
        # Exporters often end a graph with Identity nodes; DQ -> Identity -> output is still a boundary.
        while node is not None and node.op_type == "Identity" and len(consumers.get(node.input[0], [])) == 1 \
                and node.input[0] not in output_names:
            chain.append(_node_id(node))
            node = producer.get(node.input[0])
        if node is None or node.op_type != "DequantizeLinear":
            continue
        if chain and len(consumers.get(node.output[0], [])) != 1:
            continue
        if node.input[0] in input_names or node.input[0] in constants or node.input[0] in output_names:
            continue
        if out.type.tensor_type.elem_type != TensorProto.FLOAT:
            continue
        params = _node_params(node, constants, _element_type(node.input[0], producer, constants, value_types))
        if params is not None:
            found[out.name] = QdqBoundary(out.name, TensorDirection.OUTPUT, params[0], params[1],
                                          (_node_id(node), *chain))
    return found


def strip_boundaries(model: onnx.ModelProto, names: Iterable[str]) -> onnx.ModelProto:
    """A copy of ``model`` whose named inputs / outputs are the quantized tensors (boundary Q/DQ removed).

    Names and shapes stay; the element type becomes int8 / uint8 / uint16. Constants only the removed nodes used
    are dropped too.
    """
    names = list(names)
    boundaries = find_boundaries(model)
    unknown = [n for n in names if n not in boundaries]
    if unknown:
        raise ValueError(f"strip_boundaries: {unknown} are not QDQ boundaries of the model "
                         f"(its boundaries: {sorted(boundaries)})")
    stripped = onnx.ModelProto()
    stripped.CopyFrom(model)
    graph = stripped.graph
    rename: dict[str, str] = {}  # tensor name -> the boundary name that replaces it
    drop: set[int] = set()
    for name in names:
        b = boundaries[name]
        for i, node in enumerate(graph.node):
            if _node_id(node) not in b.nodes:
                continue
            drop.add(i)
            if node.op_type == "QuantizeLinear":
                rename[node.output[0]] = name  # the quantized tensor is now the graph input itself
            elif node.op_type == "DequantizeLinear":
                rename[node.input[0]] = name  # the quantized tensor is now the graph output itself
        elem = _ELEM_TYPES[b.data_type]
        for value_info in (*graph.input, *graph.output):
            if value_info.name == name:
                value_info.type.tensor_type.elem_type = elem
    kept = [node for i, node in enumerate(graph.node) if i not in drop]
    for node in kept:
        for i, n in enumerate(node.input):
            if n in rename:
                node.input[i] = rename[n]
        for i, n in enumerate(node.output):
            if n in rename:
                node.output[i] = rename[n]
    # Shape information recorded for the renamed tensors is stale (it names tensors that no longer exist).
    stale = [vi for vi in graph.value_info if vi.name in rename or vi.name in names]
    for vi in stale:
        graph.value_info.remove(vi)
    del graph.node[:]
    graph.node.extend(kept)
    _drop_unused_constants(graph)
    return stripped


def _used_names(graph: onnx.GraphProto) -> set[str]:
    """Every tensor name a node of the graph or of its subgraphs (If / Loop / Scan bodies) reads."""
    used = {o.name for o in graph.output}
    for node in graph.node:
        used.update(node.input)
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                used |= _used_names(sub)
    return used


def _drop_unused_constants(graph: onnx.GraphProto) -> None:
    used = _used_names(graph)
    kept = [node for node in graph.node if node.op_type != "Constant" or node.output[0] in used]
    if len(kept) != len(graph.node):
        del graph.node[:]
        graph.node.extend(kept)
    unused = [init for init in graph.initializer if init.name not in used]
    for init in unused:
        graph.initializer.remove(init)
    inputs = {i.name for i in graph.input}
    for init in unused:
        if init.name in inputs:  # an initializer listed as an input (old IR): keep the pair consistent
            graph.input.remove(next(i for i in graph.input if i.name == init.name))


# -- for backends ---------------------------------------------------------------------------------------
def annotate_specs(specs: Sequence[PortSpec], boundaries: Mapping[str, QdqBoundary]) -> list[PortSpec]:
    """``PortSpec`` s with ``quant`` and ``quant_data_type`` set where the tensor is a QDQ boundary (in _load)."""
    out = []
    for spec in specs:
        b = boundaries.get(spec.name)
        out.append(spec if b is None else dataclasses.replace(spec, quant=b.quant, quant_data_type=b.data_type))
    return out


def quantized_hw_ports(ports: Iterable[Any]) -> list[str]:
    """Names of the ``Port`` s whose engine view is the quantized tensor: strip these before compiling."""
    return [p.name for p in ports if p.view is TensorType.HW and p.quant is not None]
