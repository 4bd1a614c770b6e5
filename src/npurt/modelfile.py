"""A fast reader of an ONNX model's own ports, straight from the protobuf wire format.

npurt needs a model's inputs and outputs (names, order, element types, dims) as the ONNX file declares them, before and
independently of what an engine makes of them. ``onnx.load`` parses every initializer and node into protobuf objects;
this reader walks the wire format over an mmap of the file instead and skips every payload it does not need (weights,
node inputs and outputs, doc strings), so only the pages holding the graph's structure are touched.

The walk follows protobuf's own rules where they change the answer: a field whose wire type does not match its
declaration is an unknown field (skipped), the last of a scalar field given twice wins, a message field given twice is
merged (read here as the concatenation of its slices), a oneof member replaces another, and an unknown value of a
closed (proto2) enum leaves the field as it was. Field numbers are those of ``onnx/onnx.proto``.

It validates the wire structure of every message it walks (the model, its graphs, nodes, attributes, tensors' top
level, port types) and skips the insides of the rest by their length, so it can accept a file whose skipped payloads
are malformed where ``onnx.load`` would refuse it. Whatever the input, it ends with a result or a ``ValueError``.
"""

from __future__ import annotations

import mmap
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Literal, get_args

from .onnx_fields import (
    ATTR_G,
    ATTR_GRAPHS,
    ATTR_SPARSE_TENSOR,
    ATTR_SPARSE_TENSORS,
    ATTR_T,
    ATTR_TENSORS,
    DIM_PARAM,
    DIM_VALUE,
    ENTRY_KEY,
    ENTRY_VALUE,
    FUNCTION_NODE,
    GRAPH_INITIALIZER,
    GRAPH_INPUT,
    GRAPH_NODE,
    GRAPH_OUTPUT,
    GRAPH_SPARSE_INITIALIZER,
    MODEL_FUNCTIONS,
    MODEL_GRAPH,
    MODEL_IR_VERSION,
    MODEL_METADATA_PROPS,
    MODEL_OPSET_IMPORT,
    NODE_ATTRIBUTE,
    NODE_DOMAIN,
    NODE_OP_TYPE,
    OPSET_DOMAIN,
    OPSET_VERSION,
    SHAPE_DIM,
    SPARSE_INDICES,
    SPARSE_VALUES,
    TENSOR_DATA_LOCATION,
    TENSOR_EXTERNAL_DATA,
    TENSOR_NAME,
    TENSOR_TYPE_ELEM_TYPE,
    TENSOR_TYPE_SHAPE,
    VALUE_NAME,
    VALUE_TYPE,
)
from .protowire import LEN, MAX_DEPTH, Span, field_tag, fields, int32, int64, text

__all__ = [
    "ELEMENT_TYPE_NAMES",
    "OnnxModelInfo",
    "OnnxPort",
    "PortKind",
    "element_type_name",
    "read_onnx_ports",
    "read_onnx_ports_from_bytes",
]

PortKind = Literal["tensor", "sequence", "map", "optional", "sparse_tensor", "unknown"]
PORT_KINDS: frozenset[str] = frozenset(get_args(PortKind))
Dim = int | str | None

# TensorProto.DataType, by number (onnx.proto); checked against onnx's own enum by the tests.
ELEMENT_TYPE_NAMES: tuple[str, ...] = (
    "UNDEFINED", "FLOAT", "UINT8", "INT8", "UINT16", "INT16", "INT32", "INT64", "STRING", "BOOL", "FLOAT16", "DOUBLE",
    "UINT32", "UINT64", "COMPLEX64", "COMPLEX128", "BFLOAT16", "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2",
    "FLOAT8E5M2FNUZ", "UINT4", "INT4", "FLOAT4E2M1", "FLOAT8E8M0", "UINT2", "INT2", "FLOAT6E2M3", "FLOAT6E3M2",
)


def element_type_name(elem_type: int) -> str:
    """The TensorProto.DataType name of an element type number (``UNKNOWN_<n>`` for one this table lacks)."""
    if 0 <= elem_type < len(ELEMENT_TYPE_NAMES):
        return ELEMENT_TYPE_NAMES[elem_type]
    return f"UNKNOWN_{elem_type}"


@dataclass(frozen=True)
class OnnxPort:
    """One graph input or output as the ONNX file declares it.

    ``elem_type`` and ``shape`` describe tensors and sparse tensors; for the other kinds they are 0 (UNDEFINED) and
    None. ``shape`` is None for an unknown rank, else one entry per dim: an int (dim_value; 0 is a static zero-size
    dim), a str (dim_param, a symbolic dim) or None (a dim with neither).
    """

    name: str
    kind: PortKind
    elem_type: int
    shape: tuple[Dim, ...] | None

    @property
    def elem_type_name(self) -> str:
        return element_type_name(self.elem_type)


@dataclass(frozen=True)
class OnnxModelInfo:
    """What an ONNX model file says about itself, without its weights.

    ``inputs`` leaves out graph inputs that name an initializer (old IR versions list every initializer as an input).
    ``operator_domains`` holds the domain of every node, subgraphs and model-local functions included, as written
    ("" is the default domain); ``operator_types`` every node's op_type, the same nodes.
    ``uses_external_data`` is True when any tensor the model holds (initializers, sparse initializers, node attribute
    tensors, in subgraphs too) keeps its data in an external file; ``external_data_files`` are those files' locations
    as the tensors name them (relative to the model's directory; "" for an external tensor that names none).
    """

    ir_version: int
    opset_imports: Mapping[str, int] = field(hash=False)
    inputs: tuple[OnnxPort, ...]
    outputs: tuple[OnnxPort, ...]
    node_count: int  # nodes of the main graph, not counting subgraphs
    operator_domains: frozenset[str]
    operator_types: frozenset[str]
    has_subgraphs: bool
    uses_external_data: bool
    external_data_files: frozenset[str]
    metadata_props: Mapping[str, str] = field(hash=False)

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.outputs)


def read_onnx_ports(path: str | os.PathLike[str], nodes: bool = True) -> OnnxModelInfo:
    """Read the ports of the ONNX model file at ``path`` (external data files are neither needed nor opened).

    ``nodes=False`` skips the nodes (a runner's load needs the ports only: a large model has thousands of nodes);
    then ``node_count`` is 0, ``operator_domains`` and ``operator_types`` are empty and ``has_subgraphs`` False,
    unread. Raises ValueError
    when ``path`` is a directory, not a regular file or not an ONNX model, and OSError when it cannot be opened.
    """
    path = Path(path)
    mode = path.stat().st_mode
    if stat.S_ISDIR(mode):
        raise ValueError(f"{path} is a directory, not an ONNX model file")
    if not stat.S_ISREG(mode):  # a FIFO would block open() until a writer comes; a device has no size to map
        raise ValueError(f"{path} is not a regular file, so not an ONNX model file")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise ValueError(f"{path} is not an ONNX model: the file is empty")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped, memoryview(mapped) as view:
            try:
                return _read_model(view, nodes)
            except ValueError as e:
                raise ValueError(f"{path} is not an ONNX model: {e}") from None


def read_onnx_ports_from_bytes(data: bytes | bytearray | memoryview) -> OnnxModelInfo:
    """Read the ports of a serialized ModelProto held in memory. Raises ValueError when it is not an ONNX model."""
    with memoryview(data) as raw, raw.cast("B") as view:
        if len(view) == 0:
            raise ValueError("not an ONNX model: the buffer is empty")
        try:
            return _read_model(view)
        except ValueError as e:
            raise ValueError(f"not an ONNX model: {e}") from None


# --- ONNX messages ---------------------------------------------------------------------------------------------------
# The fields each message is read for (the tags: onnx_fields).

# ModelProto
_MODEL_FIELDS = frozenset((MODEL_IR_VERSION, MODEL_GRAPH, MODEL_OPSET_IMPORT, MODEL_METADATA_PROPS,
                           MODEL_FUNCTIONS))
# FunctionProto (a model-local function): its nodes (field 7; a GraphProto's are field 1)
_FUNCTION_FIELDS = frozenset((FUNCTION_NODE,))
# OperatorSetIdProto
_OPSET_FIELDS = frozenset((OPSET_DOMAIN, OPSET_VERSION))
# StringStringEntryProto
_ENTRY_FIELDS = frozenset((ENTRY_KEY, ENTRY_VALUE))
# GraphProto
_GRAPH_FIELDS = frozenset((GRAPH_NODE, GRAPH_INITIALIZER, GRAPH_INPUT, GRAPH_OUTPUT, GRAPH_SPARSE_INITIALIZER))
_SUBGRAPH_FIELDS = frozenset((GRAPH_NODE, GRAPH_INITIALIZER, GRAPH_SPARSE_INITIALIZER))
# the ports alone: the nodes are skipped over, not yielded (a third of a cached load's reading of PP-OCR's classifier)
_GRAPH_PORT_FIELDS = _GRAPH_FIELDS - {GRAPH_NODE}
# NodeProto
_NODE_FIELDS = frozenset((NODE_OP_TYPE, NODE_ATTRIBUTE, NODE_DOMAIN))
# AttributeProto
_ATTR_FIELDS = frozenset((ATTR_T, ATTR_G, ATTR_TENSORS, ATTR_GRAPHS, ATTR_SPARSE_TENSOR, ATTR_SPARSE_TENSORS))
# TensorProto
_TENSOR_FIELDS = frozenset((TENSOR_NAME, TENSOR_DATA_LOCATION, TENSOR_EXTERNAL_DATA))
_DATA_LOCATIONS = (0, 1)  # DEFAULT, EXTERNAL: the values of this closed enum
_EXTERNAL = 1
# SparseTensorProto
_SPARSE_FIELDS = frozenset((SPARSE_VALUES, SPARSE_INDICES))
# ValueInfoProto
_VALUE_FIELDS = frozenset((VALUE_NAME, VALUE_TYPE))
# TypeProto: the members of its oneof value (7 is an opaque type)
_TYPE_KINDS: dict[int, PortKind] = {
    field_tag(1, LEN): "tensor", field_tag(4, LEN): "sequence", field_tag(5, LEN): "map",
    field_tag(9, LEN): "optional", field_tag(8, LEN): "sparse_tensor", field_tag(7, LEN): "unknown"}
_TYPE_FIELDS = frozenset(_TYPE_KINDS)
# TypeProto.Tensor and TypeProto.SparseTensor
_TENSOR_TYPE_FIELDS = frozenset((TENSOR_TYPE_ELEM_TYPE, TENSOR_TYPE_SHAPE))
# TensorShapeProto and its Dimension
_SHAPE_FIELDS = frozenset((SHAPE_DIM,))
_DIM_FIELDS = frozenset((DIM_VALUE, DIM_PARAM))


class _Walk:
    """What the walk of all graphs (main graph and subgraphs) gathers."""

    __slots__ = ("domains", "op_types", "has_subgraphs", "uses_external_data", "external_files", "nodes")

    def __init__(self, nodes: bool = True) -> None:
        self.nodes = nodes  # whether to walk the nodes (their domains, subgraphs and attribute tensors)
        self.domains: set[str] = set()
        self.op_types: set[str] = set()
        self.has_subgraphs = False
        self.uses_external_data = False
        self.external_files: set[str] = set()


def _read_model(buf: memoryview, nodes: bool = True) -> OnnxModelInfo:
    try:
        return _read_model_fields(buf, nodes)
    except ValueError:
        if bytes(buf[:64]).lstrip().startswith(b"<"):
            raise ValueError("it is XML (an OpenVINO IR .xml?), not an ONNX protobuf") from None
        raise


def _read_model_fields(buf: memoryview, nodes: bool = True) -> OnnxModelInfo:
    ir_version: int | None = None
    graph: list[Span] = []
    functions: list[Span] = []
    opsets: dict[str, int] = {}
    metadata: dict[str, str] = {}
    for tag, a, b in fields(buf, 0, len(buf), 0, _MODEL_FIELDS):
        if tag == MODEL_GRAPH:
            graph.append((a, b))
        elif tag == MODEL_FUNCTIONS:
            functions.append((a, b))
        elif tag == MODEL_IR_VERSION:
            ir_version = int64(a)
        elif tag == MODEL_OPSET_IMPORT:
            domain, version = _opset(buf, a, b)
            opsets[domain] = version
        else:
            key, value = _string_pair(buf, a, b)
            metadata[key] = value
    if ir_version is None:
        raise ValueError("it has no IR version (ModelProto field 1)")
    if ir_version <= 0:
        raise ValueError(f"its IR version is {ir_version}")
    if not graph:
        raise ValueError("it has no graph (ModelProto field 7)")
    if ir_version >= 3 and not opsets:
        raise ValueError(f"it has IR version {ir_version} but no opset_import (ModelProto field 8)")

    walk = _Walk(nodes)
    node_count, initializers, inputs, outputs = _walk_graph(buf, graph, 1, walk, main=True)
    if nodes:  # the nodes of model-local functions are nodes of the model too (their operators, tensors, subgraphs)
        for start, end in functions:
            for _, a, b in fields(buf, start, end, 1, _FUNCTION_FIELDS):
                _walk_node(buf, a, b, 2, walk)
    return OnnxModelInfo(
        ir_version=ir_version,
        opset_imports=MappingProxyType(opsets),
        inputs=tuple(p for p in inputs if p.name not in initializers),
        outputs=tuple(outputs),
        node_count=node_count,
        operator_domains=frozenset(walk.domains),
        operator_types=frozenset(walk.op_types),
        has_subgraphs=walk.has_subgraphs,
        uses_external_data=walk.uses_external_data,
        external_data_files=frozenset(walk.external_files),
        metadata_props=MappingProxyType(metadata),
    )


def _opset(buf: memoryview, start: int, end: int) -> tuple[str, int]:
    domain = ""
    version = 0
    for tag, a, b in fields(buf, start, end, 1, _OPSET_FIELDS):
        if tag == OPSET_DOMAIN:
            domain = text(buf, a, b, "opset domain")
        else:
            version = int64(a)
    return domain, version


def _string_pair(buf: memoryview, start: int, end: int) -> tuple[str, str]:
    key = value = ""
    for tag, a, b in fields(buf, start, end, 1, _ENTRY_FIELDS):
        if tag == ENTRY_KEY:
            key = text(buf, a, b, "metadata key")
        else:
            value = text(buf, a, b, "metadata value")
    return key, value


def _walk_graph(buf: memoryview, spans: list[Span], depth: int, walk: _Walk,
                main: bool) -> tuple[int, set[str], list[OnnxPort], list[OnnxPort]]:
    """Walk one graph given as the slices of its (merged) message; ports and initializer names only if ``main``.

    ``depth`` here and below is the nesting depth of the message walked (the model is 0, its graph 1).
    """
    if depth > MAX_DEPTH:
        raise ValueError(f"malformed: messages nested deeper than {MAX_DEPTH}")
    nodes = 0
    initializers: set[str] = set()
    inputs: list[OnnxPort] = []
    outputs: list[OnnxPort] = []
    wanted = _SUBGRAPH_FIELDS if not main else _GRAPH_FIELDS if walk.nodes else _GRAPH_PORT_FIELDS
    for start, end in spans:
        for tag, a, b in fields(buf, start, end, depth, wanted):
            if tag == GRAPH_NODE:
                nodes += 1
                if walk.nodes:
                    _walk_node(buf, a, b, depth + 1, walk)
            elif tag == GRAPH_INITIALIZER:
                initializers.add(_tensor(buf, [(a, b)], depth + 1, walk, main))
            elif tag == GRAPH_SPARSE_INITIALIZER:
                initializers.add(_sparse_tensor(buf, a, b, depth + 1, walk, main))
            elif tag == GRAPH_INPUT:
                inputs.append(_value_info(buf, a, b, depth + 1))
            else:
                outputs.append(_value_info(buf, a, b, depth + 1))
    return nodes, initializers, inputs, outputs


def _walk_node(buf: memoryview, start: int, end: int, depth: int, walk: _Walk) -> None:
    domain = op_type = ""  # absent: protobuf's default, the empty string
    for tag, a, b in fields(buf, start, end, depth, _NODE_FIELDS):
        if tag == NODE_ATTRIBUTE:
            _walk_attribute(buf, a, b, depth + 1, walk)
        elif tag == NODE_OP_TYPE:
            op_type = text(buf, a, b, "node op_type")
        else:
            domain = text(buf, a, b, "node domain")
    walk.domains.add(domain)
    walk.op_types.add(op_type)


def _walk_attribute(buf: memoryview, start: int, end: int, depth: int, walk: _Walk) -> None:
    tensor: list[Span] = []  # the attribute's t, merged when repeated
    graph: list[Span] = []  # the attribute's g, merged when repeated
    for tag, a, b in fields(buf, start, end, depth, _ATTR_FIELDS):
        if tag == ATTR_T:
            tensor.append((a, b))
        elif tag == ATTR_G:
            graph.append((a, b))
        elif tag == ATTR_TENSORS:
            _tensor(buf, [(a, b)], depth + 1, walk, False)
        elif tag == ATTR_GRAPHS:
            walk.has_subgraphs = True
            _walk_graph(buf, [(a, b)], depth + 1, walk, main=False)
        else:
            _sparse_tensor(buf, a, b, depth + 1, walk, False)
    if tensor:
        _tensor(buf, tensor, depth + 1, walk, False)
    if graph:
        walk.has_subgraphs = True
        _walk_graph(buf, graph, depth + 1, walk, main=False)


def _tensor(buf: memoryview, spans: list[Span], depth: int, walk: _Walk, named: bool) -> str:
    """A TensorProto's name (if ``named``, else ""), from its top-level fields; where its data is external, notes
    that and the file its ``location`` entry names (the last one, as onnx reads them)."""
    name: Span | None = None
    data_location = 0
    file: Span | None = None
    for start, end in spans:
        for tag, a, b in fields(buf, start, end, depth, _TENSOR_FIELDS):
            if tag == TENSOR_NAME:
                name = (a, b)
            elif tag == TENSOR_EXTERNAL_DATA:
                key: Span | None = None
                value: Span = (a, a)
                for entry_tag, c, d in fields(buf, a, b, depth + 1, _ENTRY_FIELDS):
                    if entry_tag == ENTRY_KEY:
                        key = (c, d)
                    else:
                        value = (c, d)
                if key is not None and bytes(buf[key[0]:key[1]]) == b"location":
                    file = value
            elif int32(a) in _DATA_LOCATIONS:  # an unknown value of a closed enum leaves the field as it was
                data_location = int32(a)
    if data_location == _EXTERNAL:
        walk.uses_external_data = True
        walk.external_files.add(text(buf, *file, "external data location") if file else "")
    return text(buf, *name, "tensor name") if named and name else ""


def _sparse_tensor(buf: memoryview, start: int, end: int, depth: int, walk: _Walk, named: bool) -> str:
    """A SparseTensorProto's name (that of its values), noting whether its values or indices are external."""
    values: list[Span] = []
    indices: list[Span] = []
    for tag, a, b in fields(buf, start, end, depth, _SPARSE_FIELDS):
        (values if tag == SPARSE_VALUES else indices).append((a, b))
    name = _tensor(buf, values, depth + 1, walk, named)
    _tensor(buf, indices, depth + 1, walk, False)
    return name


def _value_info(buf: memoryview, start: int, end: int, depth: int) -> OnnxPort:
    name = ""
    type_spans: list[Span] = []
    for tag, a, b in fields(buf, start, end, depth, _VALUE_FIELDS):
        if tag == VALUE_NAME:
            name = text(buf, a, b, "port name")
        else:
            type_spans.append((a, b))
    kind, elem_type, shape = _port_type(buf, type_spans, depth + 1)
    return OnnxPort(name, kind, elem_type, shape)


def _port_type(buf: memoryview, spans: list[Span], depth: int) -> tuple[PortKind, int, tuple[Dim, ...] | None]:
    """Kind, element type and shape of a TypeProto (given as the slices of its merged message)."""
    member: int | None = None
    member_spans: list[Span] = []
    for start, end in spans:
        for tag, a, b in fields(buf, start, end, depth, _TYPE_FIELDS):
            if tag != member:  # a oneof: setting another member clears the one before
                member, member_spans = tag, []
            member_spans.append((a, b))
    if member is None:
        return "unknown", 0, None
    kind = _TYPE_KINDS[member]
    if kind != "tensor" and kind != "sparse_tensor":
        return kind, 0, None
    elem_type = 0
    shape_spans: list[Span] = []
    for start, end in member_spans:
        for tag, a, b in fields(buf, start, end, depth + 1, _TENSOR_TYPE_FIELDS):
            if tag == TENSOR_TYPE_ELEM_TYPE:
                elem_type = int32(a)
            else:
                shape_spans.append((a, b))
    if not shape_spans:
        return kind, elem_type, None
    dims: list[Dim] = []
    for start, end in shape_spans:
        for _, a, b in fields(buf, start, end, depth + 2, _SHAPE_FIELDS):
            dims.append(_dim(buf, a, b, depth + 3))
    return kind, elem_type, tuple(dims)


def _dim(buf: memoryview, start: int, end: int, depth: int) -> Dim:
    value: Dim = None
    for tag, a, b in fields(buf, start, end, depth, _DIM_FIELDS):
        value = int64(a) if tag == DIM_VALUE else text(buf, a, b, "dim_param")
    return value
