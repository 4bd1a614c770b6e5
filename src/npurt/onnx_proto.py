"""ONNX's protobuf messages, and the few helpers npurt builds graphs with, without the onnx package's import.

``import onnx`` runs the package's ``__init__``: onnx.helper (with ml_dtypes), onnx.serialization (protobuf's
json_format and text_format), onnx.compose, onnx.gen_proto (argparse), importlib.metadata (email) ... ~110-160 ms of
a decoder's cold load on a shared 2-core machine, against ~20-35 ms for the messages alone (protobuf's runtime
included). The messages are onnx's own generated module (``onnx/onnx_ml_pb2.py``), loaded by itself where onnx is
not imported yet: protobuf's upb runtime keeps one descriptor and one class per message, so these are the very
classes ``onnx`` gives (its later import adds the same file again, which protobuf takes as the same) and the two mix
freely. Under another protobuf runtime, or where the generated module is not found, this imports onnx (the same
classes, at the package's price).

The helpers build what ``onnx.helper`` / ``onnx.numpy_helper`` build, field for field, for the values npurt gives
them (numbers, strings, tensors and lists of them; numeric arrays); anything else goes to onnx's own.
"""

from __future__ import annotations

import importlib
import importlib.util
import numbers
import sys
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from onnx import (
        AttributeProto,
        GraphProto,
        ModelProto,
        NodeProto,
        OperatorSetIdProto,
        TensorProto,
        TensorShapeProto,
        TypeProto,
        ValueInfoProto,
    )

__all__ = ["AttributeProto", "GraphProto", "ModelProto", "NodeProto", "OperatorSetIdProto", "TensorProto",
           "TensorShapeProto", "TypeProto", "ValueInfoProto", "from_array", "make_attribute", "make_empty_value_info",
           "make_graph", "make_model", "make_node", "make_tensor_value_info", "messages", "np_dtype_to_tensor_dtype",
           "rename_uses", "set_shape", "tensor_dtype_to_np_dtype", "to_array"]

_MESSAGES = frozenset(("AttributeProto", "GraphProto", "ModelProto", "NodeProto", "OperatorSetIdProto", "TensorProto",
                       "TensorShapeProto", "TypeProto", "ValueInfoProto"))
_ONNX_PB2 = "onnx.onnx_ml_pb2"
_lock = threading.Lock()
_loaded: ModuleType | None = None


def messages() -> ModuleType:
    """onnx's generated module of the ONNX messages (``onnx.onnx_ml_pb2``'s classes), loaded once."""
    global _loaded
    if _loaded is None:
        with _lock:
            if _loaded is None:
                # (onnx's own where imported: through the import system, which waits for an import in progress on
                # another thread instead of taking a module still being set up)
                _loaded = importlib.import_module(_ONNX_PB2) if _ONNX_PB2 in sys.modules else _load()
    return _loaded


def _load() -> ModuleType:
    runtime = importlib.import_module("google.protobuf.internal.api_implementation")
    if runtime.Type() == "upb":  # (one class per descriptor: see the module)
        try:
            spec = importlib.util.find_spec("onnx")  # (finds the package without running it)
            locations = list(spec.submodule_search_locations or []) if spec is not None else []
            path = next((Path(p) / "onnx_ml_pb2.py" for p in locations if (Path(p) / "onnx_ml_pb2.py").is_file()),
                        None)
            if path is not None:
                own = importlib.util.spec_from_file_location("npurt._onnx_ml_pb2", path)
                if own is not None and own.loader is not None:
                    module = importlib.util.module_from_spec(own)
                    own.loader.exec_module(module)
                    return module
        except Exception:  # noqa: BLE001 - the package's own import below says what is wrong, if anything is
            pass
    import onnx

    pb2: ModuleType = onnx.onnx_ml_pb2
    return pb2


def __getattr__(name: str) -> Any:
    if name in _MESSAGES:
        return getattr(messages(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_node(op_type: str, inputs: Sequence[str], outputs: Sequence[str], name: str | None = None,
              domain: str | None = None, **attrs: Any) -> NodeProto:
    """``onnx.helper.make_node``: the attributes sorted by name, a None one left out."""
    node: NodeProto = messages().NodeProto()
    node.op_type = op_type
    node.input.extend(inputs)
    node.output.extend(outputs)
    if name:
        node.name = name
    if domain is not None:
        node.domain = domain
    if attrs:
        node.attribute.extend(make_attribute(key, value) for key, value in sorted(attrs.items()) if value is not None)
    return node


def make_attribute(key: str, value: Any) -> AttributeProto:
    """``onnx.helper.make_attribute`` for a number, a string, a tensor, or a list of numbers or of strings (the type
    inferred as onnx infers it); any other value through onnx's own."""
    proto = messages()
    attr: AttributeProto = proto.AttributeProto()
    attr.name = key
    kinds = proto.AttributeProto
    if isinstance(value, numbers.Integral):
        attr.i, attr.type = int(value), kinds.INT
    elif isinstance(value, numbers.Real):
        attr.f, attr.type = float(value), kinds.FLOAT
    elif isinstance(value, (str, bytes)):
        attr.s, attr.type = _bytes(value), kinds.STRING
    elif isinstance(value, proto.TensorProto):
        attr.t.CopyFrom(value)
        attr.type = kinds.TENSOR
    else:
        items = list(value) if isinstance(value, Iterable) and not isinstance(value, proto.GraphProto) else None
        types = {type(v) for v in items or ()}
        if items and all(issubclass(t, numbers.Integral) for t in types):
            attr.ints.extend(items)
            attr.type = kinds.INTS
        elif items and all(issubclass(t, numbers.Real) for t in types):
            attr.floats.extend(items)
            attr.type = kinds.FLOATS
        elif items and all(issubclass(t, (str, bytes)) for t in types):
            attr.strings.extend(_bytes(v) for v in items)
            attr.type = kinds.STRINGS
        else:  # a graph, a type, sparse tensors, an empty list: onnx's own (and its error)
            from onnx import helper

            made: AttributeProto = helper.make_attribute(key, value)
            return made
    return attr


def _bytes(value: str | bytes) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else value


def make_tensor_value_info(name: str, elem_type: int, shape: Sequence[str | int | None] | None) -> ValueInfoProto:
    """``onnx.helper.make_tensor_value_info``: a None dim left open, a str dim a dim_param; a shape of None no
    shape (a shape of () a scalar's)."""
    value: ValueInfoProto = messages().ValueInfoProto()
    value.name = name
    tensor_type = value.type.tensor_type
    tensor_type.elem_type = elem_type
    if shape is not None:
        tensor_type.shape.dim.extend([])  # (marks the shape present: an empty one is a scalar's, as onnx writes it)
        for d in shape:
            dim = tensor_type.shape.dim.add()
            if isinstance(d, int):
                dim.dim_value = d
            elif isinstance(d, str):
                dim.dim_param = d
            elif d is not None:
                raise ValueError(f"Invalid item in shape: {d}. Needs to be of int or str.")
    return value


def make_empty_value_info(name: str) -> ValueInfoProto:
    """``onnx.helper.make_empty_tensor_value_info``: a name without a type."""
    value: ValueInfoProto = messages().ValueInfoProto()
    value.name = name
    return value


def make_graph(nodes: Sequence[NodeProto], name: str, inputs: Sequence[ValueInfoProto],
               outputs: Sequence[ValueInfoProto], initializer: Sequence[TensorProto] = ()) -> GraphProto:
    """``onnx.helper.make_graph``."""
    graph: GraphProto = messages().GraphProto()
    graph.node.extend(nodes)
    graph.name = name
    graph.input.extend(inputs)
    graph.output.extend(outputs)
    graph.initializer.extend(initializer)
    return graph


def make_model(graph: GraphProto, opset_imports: Sequence[OperatorSetIdProto], ir_version: int) -> ModelProto:
    """``onnx.helper.make_model`` at ``ir_version`` (onnx's sets its own newest, which callers then overwrite)."""
    model: ModelProto = messages().ModelProto()
    model.ir_version = ir_version
    model.graph.CopyFrom(graph)
    model.opset_import.extend(opset_imports)
    return model


def set_shape(value: ValueInfoProto, shape: Sequence[int | None], elem_type: int | None = None) -> None:
    """The value's tensor type at ``shape`` (an open dim named ``<value>:<axis>``, so no two are taken as equal),
    and at ``elem_type`` where given."""
    tt = value.type.tensor_type
    if elem_type is not None:
        tt.elem_type = elem_type
    tt.ClearField("shape")
    tt.shape.SetInParent()  # a scalar still has a (rank-0) shape
    for axis, d in enumerate(shape):
        dim = tt.shape.dim.add()
        if d is None or d < 0:  # left open: a name of its own, so no two open dims are taken as equal
            dim.dim_param = f"{value.name}:{axis}"
        else:
            dim.dim_value = int(d)


def rename_uses(graph: GraphProto, old: str, new: str, outputs_too: bool) -> None:
    """Rename tensor ``old`` to ``new`` in node inputs (and outputs), also inside subgraphs that see it."""
    graph_kind = messages().AttributeProto.GRAPH
    for node in graph.node:
        for i, n in enumerate(node.input):
            if n == old:
                node.input[i] = new
        if outputs_too:
            for i, n in enumerate(node.output):
                if n == old:
                    node.output[i] = new
        for attr in node.attribute:
            subgraphs = [attr.g] if attr.type == graph_kind else list(attr.graphs)
            for sub in subgraphs:
                shadowed = {v.name for v in sub.input} | {i.name for i in sub.initializer}
                if old not in shadowed:
                    rename_uses(sub, old, new, outputs_too=False)
    for vi in graph.value_info:
        if vi.name == old:
            vi.name = new


# TensorProto's element types that are numpy's own dtypes, one element per item (raw_data little-endian)
_NUMPY_TYPES: dict[int, np.dtype[Any]] = {
    1: np.dtype(np.float32), 2: np.dtype(np.uint8), 3: np.dtype(np.int8), 4: np.dtype(np.uint16),
    5: np.dtype(np.int16), 6: np.dtype(np.int32), 7: np.dtype(np.int64), 9: np.dtype(np.bool_),
    10: np.dtype(np.float16), 11: np.dtype(np.float64), 12: np.dtype(np.uint32), 13: np.dtype(np.uint64),
    14: np.dtype(np.complex64), 15: np.dtype(np.complex128)}
_TENSOR_TYPES = {dtype: elem for elem, dtype in _NUMPY_TYPES.items()}
_LITTLE = sys.byteorder == "little"


def tensor_dtype_to_np_dtype(elem_type: int) -> np.dtype[Any]:
    """``onnx.helper.tensor_dtype_to_np_dtype``."""
    found = _NUMPY_TYPES.get(elem_type)
    if found is not None:
        return found
    from onnx import helper

    other: np.dtype[Any] = helper.tensor_dtype_to_np_dtype(elem_type)
    return other


def np_dtype_to_tensor_dtype(dtype: np.dtype[Any]) -> int:
    """``onnx.helper.np_dtype_to_tensor_dtype``."""
    found = _TENSOR_TYPES.get(np.dtype(dtype))
    if found is not None:
        return found
    from onnx import helper

    return int(helper.np_dtype_to_tensor_dtype(dtype))


def from_array(array: np.ndarray, name: str | None = None) -> TensorProto:
    """``onnx.numpy_helper.from_array``: a numeric array's elements as raw_data; other arrays (strings, 4-bit
    types, bfloat16 ...) through onnx's own."""
    elem = _TENSOR_TYPES.get(array.dtype)
    if elem is None or not _LITTLE:
        from onnx import numpy_helper

        made: TensorProto = numpy_helper.from_array(array, name)
        return made
    tensor: TensorProto = messages().TensorProto()
    tensor.dims.extend(array.shape)
    if name:
        tensor.name = name
    tensor.raw_data = array.tobytes()
    tensor.data_type = elem
    return tensor


def to_array(tensor: TensorProto) -> np.ndarray:
    """``onnx.numpy_helper.to_array``: a numeric tensor's raw_data as an array (read-only, over the message's
    bytes); other tensors (typed fields, external data, strings ...) through onnx's own."""
    dtype = _NUMPY_TYPES.get(tensor.data_type)
    if dtype is None or not _LITTLE or not tensor.HasField("raw_data") or tensor.data_location == 1 \
            or tensor.HasField("segment"):
        from onnx import numpy_helper

        made: np.ndarray = numpy_helper.to_array(tensor)
        return made
    return np.frombuffer(tensor.raw_data, dtype=dtype).reshape(tuple(tensor.dims))
