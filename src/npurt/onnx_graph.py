"""An ONNX model's graph read without its weights, and the output shapes that graph decides from pinned inputs.

``onnx.load`` copies every weight into protobuf objects: for the few kilobytes of structure a shape question needs,
a model's whole size in memory, which glibc seldom hands back. ``read_skeleton`` maps the file and hands protobuf the
model's bytes with the large initializers of its main graph cut out (each is recorded as a ``Weight``: its name,
element type, dims, and where its bytes lie in the file), so only the pages holding the structure are touched. Small
initializers stay (shape arithmetic reads them: Reshape targets, Slice bounds); so do integer ones of any size.

``output_shapes`` answers what a runner with pinned input shapes must report: ONNX's shape inference (with data
propagation, over the weights declared as inputs of their dims) and, only where it leaves an output dim open, one
ONNX Runtime session over the same weightless graph, never run (its constant folding resolves Shape chains that
inference leaves open). Neither holds the weights. The same skeleton is what a derived graph (the decoder's static
form) is built on.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .onnx_edit import graph_inputs, set_shape
from .protowire import LEN, VARINT, field_tag, fields, varint

MIN_WEIGHT_BYTES = 1024  # initializers from this size up are weights: left out of the skeleton
_KEPT_TYPES = frozenset((TensorProto.INT32, TensorProto.INT64))  # shape and index tensors: always kept

_MODEL_GRAPH = field_tag(7, LEN)
_GRAPH_NODE = field_tag(1, LEN)
_GRAPH_INITIALIZER = field_tag(5, LEN)
_NODE_OUTPUT = field_tag(2, LEN)
_NODE_OP_TYPE = field_tag(4, LEN)
_NODE_ATTRIBUTE = field_tag(5, LEN)
_NODE_DOMAIN = field_tag(7, LEN)
_NODE_FIELDS = frozenset((_NODE_OUTPUT, _NODE_OP_TYPE, _NODE_ATTRIBUTE, _NODE_DOMAIN))
_ATTR_NAME = field_tag(1, LEN)
_ATTR_T = field_tag(5, LEN)
_ATTR_FIELDS = frozenset((_ATTR_NAME, _ATTR_T))
_TENSOR_DIMS = field_tag(1, VARINT)
_TENSOR_DIMS_PACKED = field_tag(1, LEN)
_TENSOR_DATA_TYPE = field_tag(2, VARINT)
_TENSOR_FLOAT_DATA = field_tag(4, LEN)  # packed: the same little-endian bytes as raw_data
_TENSOR_NAME = field_tag(8, LEN)
_TENSOR_RAW_DATA = field_tag(9, LEN)
_TENSOR_DOUBLE_DATA = field_tag(10, LEN)  # packed, likewise
_TENSOR_DATA_LOCATION = field_tag(14, VARINT)
_TENSOR_PAYLOADS = frozenset(field_tag(n, LEN) for n in (4, 5, 6, 7, 9, 10, 11)) | {field_tag(13, LEN)}
_TENSOR_FIELDS = frozenset((_TENSOR_DIMS, _TENSOR_DIMS_PACKED, _TENSOR_DATA_TYPE, _TENSOR_NAME,
                            _TENSOR_DATA_LOCATION)) | _TENSOR_PAYLOADS


@dataclass(frozen=True)
class Weight:
    """An initializer left out of a skeleton. ``offset`` / ``length``: its little-endian element bytes in ``path``,
    where the file holds them so (raw_data, packed float_data / double_data); else -1 (the tensor message itself,
    ``message``, is then the way to its values)."""

    name: str
    elem_type: int
    dims: tuple[int, ...]
    path: Path
    offset: int
    length: int
    message: tuple[int, int]  # [start, end) of the TensorProto in the file
    external: bool  # its data is in an external file (the message says where)


@dataclass
class Skeleton:
    """A model without its weights: ``model`` is the ModelProto with ``weights`` cut out of its main graph."""

    model: onnx.ModelProto
    weights: dict[str, Weight]
    path: Path

    def weights_as_inputs(self, shapes: Mapping[str, Sequence[int | None]] | None = None) -> onnx.ModelProto:
        """A copy whose left-out weights are graph inputs of their type and dims (what shape inference and a
        session that is never run need of them), and whose inputs named in ``shapes`` have those shapes."""
        model = onnx.ModelProto()
        model.CopyFrom(self.model)
        declared = {v.name for v in model.graph.input}
        for w in self.weights.values():
            if w.name not in declared:
                model.graph.input.append(helper.make_tensor_value_info(w.name, w.elem_type, list(w.dims)))
        for value in graph_inputs(model.graph):
            if shapes is not None and value.name in shapes:
                set_shape(value, shapes[value.name])
        return model


def read_skeleton(path: str | os.PathLike[str], min_weight_bytes: int = MIN_WEIGHT_BYTES) -> Skeleton:
    """The model at ``path`` without the initializers of its main graph that hold ``min_weight_bytes`` or more
    (integer ones kept). Raises ValueError for a file that is not an ONNX model."""
    path = Path(path)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped, \
            memoryview(mapped) as buf:
        cuts: list[tuple[int, int]] = []  # [start, end) of each field removed, tag included
        weights: dict[str, Weight] = {}
        graphs = [(a, b) for _, a, b in fields(buf, 0, len(buf), 0, frozenset((_MODEL_GRAPH,)))]
        for start, end in graphs:
            for tag, a, b in fields(buf, start, end, 1, frozenset((_GRAPH_INITIALIZER, _GRAPH_NODE))):
                if tag == _GRAPH_INITIALIZER:
                    weight = _weight(buf, a, b, path, min_weight_bytes)
                else:  # a Constant node holding a weight (as some exporters write every weight): its value
                    weight = _constant_weight(buf, a, b, path, min_weight_bytes)
                if weight is not None:
                    weights[weight.name] = weight
                    cuts.append((_field_start(buf, a, b, tag), b))
        data = _without(buf, graphs, cuts)
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError
        raise ValueError(f"{path} is not an ONNX model: {e}") from None
    return Skeleton(model, weights, path)


def _constant_weight(buf: memoryview, start: int, end: int, path: Path, min_bytes: int) -> Weight | None:
    """The weight a Constant node of the default domain holds in its ``value`` tensor (named as its output)."""
    outputs: list[str] = []
    op_type = domain = ""
    value: tuple[int, int] | None = None
    for tag, a, b in fields(buf, start, end, 2, _NODE_FIELDS):
        if tag == _NODE_OUTPUT:
            outputs.append(str(buf[a:b], "utf-8"))
        elif tag == _NODE_OP_TYPE:
            op_type = str(buf[a:b], "utf-8")
        elif tag == _NODE_DOMAIN:
            domain = str(buf[a:b], "utf-8")
        else:  # an attribute: a Constant's weight is the tensor of the one named "value"
            attr_name, tensor = "", None
            for attr_tag, c, d in fields(buf, a, b, 3, _ATTR_FIELDS):
                if attr_tag == _ATTR_T:
                    tensor = (c, d)
                else:
                    attr_name = str(buf[c:d], "utf-8")
            if attr_name == "value" and tensor is not None:
                value = tensor
    if op_type != "Constant" or domain not in ("", "ai.onnx") or len(outputs) != 1 or value is None:
        return None
    return _weight(buf, value[0], value[1], path, min_bytes, name=outputs[0])


def _weight(buf: memoryview, start: int, end: int, path: Path, min_bytes: int, name: str = "") -> Weight | None:
    elem_type, location = 0, 0
    dims: list[int] = []
    payload = 0
    raw: tuple[int, int] | None = None
    for tag, a, b in fields(buf, start, end, 2, _TENSOR_FIELDS):
        if tag == _TENSOR_DIMS:
            dims.append(a)
        elif tag == _TENSOR_DIMS_PACKED:
            pos = a
            while pos < b:
                d, pos = varint(buf, pos, b)
                dims.append(d)
        elif tag == _TENSOR_DATA_TYPE:
            elem_type = a
        elif tag == _TENSOR_NAME:
            name = name or str(buf[a:b], "utf-8")
        elif tag == _TENSOR_DATA_LOCATION:
            location = a
        else:
            payload += b - a
            if tag in (_TENSOR_RAW_DATA, _TENSOR_FLOAT_DATA, _TENSOR_DOUBLE_DATA):
                raw = (a, b - a)
    if not name or elem_type in _KEPT_TYPES or (payload < min_bytes and location != 1):
        return None
    offset, length = raw if raw is not None and location != 1 else (-1, -1)
    return Weight(name, elem_type, tuple(dims), path, offset, length, (start, end), location == 1)


def _field_start(buf: memoryview, start: int, end: int, tag: int) -> int:
    """Where the field whose payload is [start, end) begins: its tag and length before it, as protobuf writes them
    (the shortest varints)."""
    size = end - start
    prefix = 1 + len(_varint_bytes(size)) + (1 if tag >= 0x80 else 0)
    first = start - prefix
    if first < 0 or bytes(buf[first:start]) != _varint_bytes(tag) + _varint_bytes(size):
        raise ValueError(f"an initializer at byte {start} is not written as protobuf writes it")
    return first


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _without(buf: memoryview, graphs: list[tuple[int, int]], cuts: list[tuple[int, int]]) -> bytes:
    """The model's bytes with ``cuts`` removed from its graph fields (each graph's length written anew)."""
    if not cuts:
        return bytes(buf)
    out = bytearray()
    pos = 0
    for start, end in graphs:
        field_start = _field_start(buf, start, end, _MODEL_GRAPH)
        out += buf[pos:field_start]
        body = bytearray()
        at = start
        for a, b in sorted(c for c in cuts if start <= c[0] < end):
            body += buf[at:a]
            at = b
        body += buf[at:end]
        out += _varint_bytes(_MODEL_GRAPH) + _varint_bytes(len(body)) + body
        pos = end
    out += buf[pos:]
    return bytes(out)


def output_shapes(skeleton: Skeleton, pinned: Mapping[str, Sequence[int | None]], probes: list[str] | None = None
                  ) -> list[tuple[int | None, ...] | None]:
    """Each graph output's dims for inputs pinned to ``pinned`` (None for a dim the run decides; None for an output
    whose rank is not known), by shape inference, then one session over the weightless graph where inference
    leaves a dim open (``probes`` gets a line for each such session made)."""
    model = skeleton.weights_as_inputs(pinned)
    _constants_as_initializers(model.graph)
    for value in model.graph.output:  # inferred anew: the declared dims are the model's open ones
        value.type.tensor_type.ClearField("shape")
    try:
        for _ in range(_FOLD_ROUNDS):
            inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
            if not _fold_shape_arithmetic(model, inferred):
                break
        shapes = [_dims(v) for v in inferred.graph.output]
    except Exception:  # noqa: BLE001 - inference refuses some graphs the engine runs: the engine answers
        shapes = [None] * len(model.graph.output)
    if all(s is not None and None not in s for s in shapes):
        return shapes
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    # constant folding (the basic level) resolves Shape -> Reshape chains that inference alone leaves open
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    if probes is not None:
        probes.append(f"a shape probe session for {skeleton.path.name}")
    probed = [tuple(d if isinstance(d, int) and d >= 0 else None for d in arg.shape) if arg.shape is not None
              else None for arg in session.get_outputs()]
    return [_better(s, p) for s, p in zip(shapes, probed)]


_FOLD_ROUNDS = 8
_MAX_FOLDED_ELEMENTS = 64  # shape arithmetic: a few ints (an input beyond this is data, not a shape)
_FOLDABLE = frozenset(("Shape", "Cast", "Slice", "Concat", "Gather", "Unsqueeze", "Squeeze", "Add", "Sub", "Mul",
                       "Div", "Identity", "Range", "ReduceProd", "Equal", "Where", "Expand", "Neg", "Max", "Min",
                       "ConstantOfShape", "Floor", "Ceil", "Sqrt", "Reshape"))


def _fold_shape_arithmetic(model: onnx.ModelProto, inferred: onnx.ModelProto) -> bool:
    """Shape arithmetic evaluated where its inputs are known (a Shape of a static tensor, small constants), its
    results made initializers; ONNX's own data propagation skips many ops at older opsets. Returns whether any
    node was folded."""
    from onnx.reference import ReferenceEvaluator

    graph = model.graph
    static = {v.name: d for v in [*inferred.graph.value_info, *inferred.graph.input]
              if (d := _dims(v)) is not None and None not in d}
    known = {t.name: t for t in graph.initializer if _elements(t.dims) <= _MAX_FOLDED_ELEMENTS}
    kept, folded = [], False
    for node in graph.node:
        value = None
        if node.op_type in _FOLDABLE and node.domain in ("", "ai.onnx") and len(node.output) == 1:
            if node.op_type == "Shape" and node.input[0] in static:
                value = _run_alone(ReferenceEvaluator, model, node, {"x": np.array(static[node.input[0]])})
            elif node.op_type != "Shape" and all(not i or i in known for i in node.input):
                value = _run_alone(ReferenceEvaluator, model, node, None, known)
        if value is not None and value.size <= _MAX_FOLDED_ELEMENTS:
            known[node.output[0]] = numpy_helper.from_array(value, node.output[0])
            graph.initializer.append(known[node.output[0]])
            folded = True
        else:
            kept.append(node)
    if folded:
        del graph.node[:]
        graph.node.extend(kept)
    return folded


def _run_alone(evaluator: Any, model: onnx.ModelProto, node: onnx.NodeProto, shape_of: dict[str, np.ndarray] | None,
               known: Mapping[str, TensorProto] | None = None) -> np.ndarray | None:
    """One node evaluated on its own at the model's opsets (a Shape node on a zero tensor of the known shape)."""
    try:
        if shape_of is not None:
            dims = [int(d) for d in shape_of["x"]]
            alone = helper.make_node(node.op_type, ["x"], node.output, **{a.name: helper.get_attribute_value(a)
                                                                           for a in node.attribute})
            feeds = {"x": np.zeros(dims, np.uint8)}
        else:
            assert known is not None
            alone = node
            feeds = {i: numpy_helper.to_array(known[i]) for i in node.input if i}
        graph = helper.make_graph([alone], "fold", [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(
            v.dtype), list(v.shape)) for n, v in feeds.items()], [helper.make_tensor_value_info(
                alone.output[0], TensorProto.UNDEFINED, None)])
        one = helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)
        (out,) = evaluator(one).run(None, feeds)
        return np.asarray(out)
    except Exception:  # noqa: BLE001 - whatever cannot be evaluated here is left to the engine
        return None


def _elements(dims: Sequence[int]) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def _constants_as_initializers(graph: onnx.GraphProto) -> None:
    """Constant nodes' tensors as initializers: shape inference reads an initializer's values (a Reshape's target),
    not a Constant node's."""
    kept = []
    for node in graph.node:
        attrs = {a.name: a for a in node.attribute}
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and set(attrs) == {"value"}:
            tensor = TensorProto()
            tensor.CopyFrom(attrs["value"].t)
            tensor.name = node.output[0]
            graph.initializer.append(tensor)
        else:
            kept.append(node)
    if len(kept) != len(graph.node):
        del graph.node[:]
        graph.node.extend(kept)


def _dims(value: onnx.ValueInfoProto) -> tuple[int | None, ...] | None:
    tt = value.type.tensor_type
    if not tt.HasField("shape"):
        return None
    return tuple(int(d.dim_value) if d.HasField("dim_value") else None for d in tt.shape.dim)


def _better(a: tuple[int | None, ...] | None, b: tuple[int | None, ...] | None) -> tuple[int | None, ...] | None:
    if a is None or b is None or len(a) != len(b):
        return b if a is None else a
    return tuple(x if x is not None else y for x, y in zip(a, b))
