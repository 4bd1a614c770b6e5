"""An ONNX model's graph read without its weights, and the output shapes that graph decides from pinned inputs.

``onnx.load`` copies every weight into protobuf objects: for the few kilobytes of structure a shape question needs,
a model's whole size in memory, which glibc seldom hands back. ``read_skeleton`` maps the file and keeps the model's
bytes with the large initializers (and weight-holding Constant nodes) of its main graph cut out; each is recorded as
a ``Weight``: its name, element type, dims, and where its bytes lie in the file. Small initializers stay (shape
arithmetic reads them: Reshape targets, Slice bounds); so do integer ones of any size. Nothing here imports the
``onnx`` package (its import alone costs more time and memory than a small model's load): ``Skeleton.model``
parses the bytes into ONNX's messages for the callers that edit the graph (``onnx_proto``: onnx's own classes, without
the package's import).

``output_shapes`` answers what a runner with pinned input shapes must report: ONNX Runtime's own inference over the
weightless graph (the weights declared as inputs of their dims, the pinned inputs at their shapes), with only its
constant folding on (it resolves Shape -> Reshape chains; nothing is run). The session holds no weights.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .onnx_fields import (
    ATTR_NAME,
    ATTR_T,
    GRAPH_INITIALIZER,
    GRAPH_INPUT,
    GRAPH_NODE,
    MODEL_GRAPH,
    NODE_ATTRIBUTE,
    NODE_DOMAIN,
    NODE_OP_TYPE,
    NODE_OUTPUT,
    TENSOR_DATA_LOCATION,
    TENSOR_DATA_TYPE,
    TENSOR_DIMS,
    TENSOR_DIMS_PACKED,
    TENSOR_DOUBLE_DATA,
    TENSOR_FLOAT_DATA,
    TENSOR_NAME,
    TENSOR_RAW_DATA,
    VALUE_NAME,
)
from .protowire import LEN, VARINT, field_tag, fields, varint

if TYPE_CHECKING:
    import onnx

MIN_WEIGHT_BYTES = 1024  # initializers from this size up are weights: left out of the skeleton
_KEPT_TYPES = frozenset((6, 7))  # TensorProto INT32, INT64: shape and index tensors, always kept

_NODE_FIELDS = frozenset((NODE_OUTPUT, NODE_OP_TYPE, NODE_ATTRIBUTE, NODE_DOMAIN))
_ATTR_FIELDS = frozenset((ATTR_NAME, ATTR_T))
_TENSOR_PAYLOADS = frozenset(field_tag(n, LEN) for n in (4, 5, 6, 7, 9, 10, 11)) | {field_tag(13, LEN)}
_TENSOR_FIELDS = frozenset((TENSOR_DIMS, TENSOR_DIMS_PACKED, TENSOR_DATA_TYPE, TENSOR_NAME,
                            TENSOR_DATA_LOCATION)) | _TENSOR_PAYLOADS


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
    """A model without its weights: ``data`` is the serialized ModelProto with ``weights`` cut out of its main
    graph; ``graph`` is [start, end) of its main graph in ``data``."""

    data: bytes
    weights: dict[str, Weight]
    path: Path
    graph: tuple[int, int]

    @property
    def weight_dims(self) -> dict[str, tuple[int, ...]]:
        """Each cut-out weight's dims by name (what a derived form's reader needs of the weights)."""
        return {w.name: w.dims for w in self.weights.values()}

    @property
    def model(self) -> onnx.ModelProto:
        """The weightless model as protobuf objects (``onnx_proto``'s). ValueError where protobuf cannot parse it."""
        from . import onnx_proto

        model: onnx.ModelProto = onnx_proto.messages().ModelProto()
        try:
            model.ParseFromString(self.data)
        except Exception as e:  # noqa: BLE001 - protobuf's DecodeError: a message the skeleton's walk did not open
            raise ValueError(f"{self.path} is not an ONNX model: {e}") from None
        return model

    def probe_model(self, pinned: Mapping[str, tuple[int, Sequence[int | None]]]) -> bytes:
        """The weightless model with its weights declared as graph inputs of their type and dims and the inputs in
        ``pinned`` ({name: (element type, shape)}) at those shapes: what a session that only tells shapes needs."""
        buf = memoryview(self.data)
        start, end = self.graph
        inputs: list[tuple[int, int, str]] = []
        constants: set[str] = set()
        for tag, a, b in fields(buf, start, end, 1, frozenset((GRAPH_INPUT, GRAPH_INITIALIZER))):
            if tag == GRAPH_INPUT:
                inputs.append((a, b, _value_name(buf, a, b)))
            else:
                constants.add(_tensor_name(buf, a, b))
        # an initializer also listed as an input is one ONNX Runtime would let a caller override, and so does not
        # fold: the probe takes it as the constant a runner gives it (npurt feeds none)
        cuts = [(_field_start(buf, a, b, GRAPH_INPUT), b) for a, b, name in inputs
                if name in pinned or name in constants]
        added = b"".join(_field(GRAPH_INPUT, _value_info(name, elem, dims)) for name, (elem, dims) in pinned.items())
        added += b"".join(_field(GRAPH_INPUT, _value_info(w.name, w.elem_type, w.dims))
                          for w in self.weights.values())
        return _without(buf, [self.graph], cuts, added)


def graph_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """A graph's inputs that are not initializers (what a caller feeds)."""
    initializers = {i.name for i in graph.initializer}
    return [v for v in graph.input if v.name not in initializers]


def read_skeleton(path: str | os.PathLike[str], min_weight_bytes: int = MIN_WEIGHT_BYTES, fd: int | None = None
                  ) -> Skeleton:
    """The model at ``path`` without the initializers of its main graph that hold ``min_weight_bytes`` or more
    (integer ones kept); read from ``fd`` where given (the file, opened earlier: the same model even if the path
    was removed or replaced since; left open). Raises ValueError for a file that is not an ONNX model."""
    path = Path(path)
    with contextlib.ExitStack() as stack:
        if fd is None:
            fd = stack.enter_context(open(path, "rb")).fileno()
        stat = os.fstat(fd)
        if stat.st_size == 0:
            raise ValueError(f"{path} is not an ONNX model: the file is empty")
        # a decoder's cold load reads its export three times (its facts, its static form, the form's check): the
        # same file unchanged is walked once (~30 ms a walk of SmolLM2's graph)
        key = (str(path), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, min_weight_bytes)
        with _recent_lock:
            skeleton = _recent.get(key)
        if skeleton is None:
            skeleton = _read_skeleton(fd, path, min_weight_bytes)
            with _recent_lock:
                _recent[key] = skeleton
                while len(_recent) > 4:
                    del _recent[next(iter(_recent))]
        return Skeleton(skeleton.data, dict(skeleton.weights), skeleton.path, skeleton.graph)


_recent_lock = threading.Lock()
_recent: dict[tuple[object, ...], Skeleton] = {}  # the last skeletons read, by their file's identity and state


def _read_skeleton(fd: int, path: Path, min_weight_bytes: int) -> Skeleton:
    with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mapped, memoryview(mapped) as buf:
        cuts: list[tuple[int, int]] = []  # [start, end) of each field removed, tag included
        weights: dict[str, Weight] = {}
        graphs = [(a, b) for _, a, b in fields(buf, 0, len(buf), 0, frozenset((MODEL_GRAPH,)))]
        inputs: list[tuple[int, int]] = []
        for start, end in graphs:
            for tag, a, b in fields(buf, start, end, 1, frozenset((GRAPH_INITIALIZER, GRAPH_NODE, GRAPH_INPUT))):
                if tag == GRAPH_INPUT:
                    inputs.append((a, b))
                    continue
                if tag == GRAPH_INITIALIZER:
                    weight = _weight(buf, a, b, path, min_weight_bytes)
                elif mapped.find(b"Constant", a, b) < 0:  # (not a Constant: its op_type would be in its bytes)
                    continue
                else:  # a Constant node holding a weight (as some exporters write every weight): its value
                    weight = _constant_weight(buf, a, b, path, min_weight_bytes)
                if weight is not None:
                    weights[weight.name] = weight
                    cuts.append((_field_start(buf, a, b, tag), b))
        # an initializer may also be listed as a graph input (an overridable default): that entry goes with it
        cuts += [(_field_start(buf, a, b, GRAPH_INPUT), b) for a, b in inputs if _value_name(buf, a, b) in weights]
        data = _without(buf, graphs, cuts)
    return skeleton_of_bytes(data, path, weights)


def skeleton_of_bytes(data: bytes, path: Path, weights: dict[str, Weight] | None = None) -> Skeleton:
    """A serialized model (weights in it, or cut out and listed in ``weights``) as a Skeleton."""
    graphs = [(a, b) for _, a, b in fields(memoryview(data), 0, len(data), 0, frozenset((MODEL_GRAPH,)))]
    if len(graphs) != 1:
        raise ValueError(f"{path}: an ONNX model has one graph field, this one has {len(graphs)}")
    return Skeleton(data, weights or {}, path, graphs[0])


def _constant_weight(buf: memoryview, start: int, end: int, path: Path, min_bytes: int) -> Weight | None:
    """The weight a Constant node of the default domain holds in its ``value`` tensor (named as its output)."""
    outputs: list[str] = []
    op_type = domain = ""
    value: tuple[int, int] | None = None
    for tag, a, b in fields(buf, start, end, 2, _NODE_FIELDS):
        if tag == NODE_OUTPUT:
            outputs.append(str(buf[a:b], "utf-8"))
        elif tag == NODE_OP_TYPE:
            op_type = str(buf[a:b], "utf-8")
        elif tag == NODE_DOMAIN:
            domain = str(buf[a:b], "utf-8")
        else:  # an attribute: a Constant's weight is the tensor of the one named "value"
            attr_name, tensor = "", None
            for attr_tag, c, d in fields(buf, a, b, 3, _ATTR_FIELDS):
                if attr_tag == ATTR_T:
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
        if tag == TENSOR_DIMS:
            dims.append(a)
        elif tag == TENSOR_DIMS_PACKED:
            pos = a
            while pos < b:
                d, pos = varint(buf, pos, b)
                dims.append(d)
        elif tag == TENSOR_DATA_TYPE:
            elem_type = a
        elif tag == TENSOR_NAME:
            name = name or str(buf[a:b], "utf-8")
        elif tag == TENSOR_DATA_LOCATION:
            location = a
        else:
            payload += b - a
            if tag in (TENSOR_RAW_DATA, TENSOR_FLOAT_DATA, TENSOR_DOUBLE_DATA):
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
    if value < 0:
        raise ValueError(f"a varint of {value}: negative values are not written here")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _without(buf: memoryview, graphs: list[tuple[int, int]], cuts: list[tuple[int, int]], added: bytes = b""
             ) -> bytes:
    """The model's bytes with ``cuts`` removed from its graph fields and ``added`` (encoded fields) appended to the
    last graph (each graph's length written anew)."""
    if not cuts and not added:
        return bytes(buf)
    out = bytearray()
    pos = 0
    for start, end in graphs:
        field_start = _field_start(buf, start, end, MODEL_GRAPH)
        out += buf[pos:field_start]
        body = bytearray()
        at = start
        for a, b in sorted(c for c in cuts if start <= c[0] < end):
            body += buf[at:a]
            at = b
        body += buf[at:end]
        if (start, end) == graphs[-1]:
            body += added
        out += _field(MODEL_GRAPH, bytes(body))
        pos = end
    out += buf[pos:]
    return bytes(out)


# ONNX Runtime's basic-level optimizers other than constant folding: nothing a shape needs, and most of the session's
# cost over a large graph (names ONNX Runtime does not know are ignored)
_NOT_FOLDING = ["ConstantSharing", "CommonSubexpressionElimination", "EliminateIdentity", "EliminateSlice",
                "UnsqueezeElimination", "EliminateDropout", "ExpandElimination", "CastElimination", "DivMulFusion",
                "FuseReluClip", "GemmTransposeFusion", "NotWhereFusion", "ConvAddFusion", "ConvBNFusion",
                "ConvMulFusion", "MatMulAddFusion", "ReshapeFusion", "NoopElimination", "DoubleQDQPairsRemover",
                "QDQPropagationTransformer", "EnsureUniqueDQForNodeUnit", "ConvActivationFusion", "PadFusion",
                "SliceElimination", "IdenticalChildrenConsolidation", "ShapeInputMerge", "PreShapeNodeElimination"]


def output_shapes(skeleton: Skeleton, pinned: Mapping[str, tuple[int, Sequence[int | None]]]
                  ) -> list[tuple[int | None, ...]] | None:
    """Each graph output's dims for the inputs in ``pinned`` ({name: (element type, shape)}, a dim None or negative
    left open) at those shapes (None for a dim only the data decides), as ONNX Runtime tells them from a session
    over the weightless graph that is never run; None where it cannot make that session. ONNX Runtime shows an
    output whose shape it does not know as rank 0, like a scalar: the caller holds the ranks against the model's
    own."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    # constant folding (the basic level) resolves Shape -> Reshape chains that type inference alone leaves open
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    try:
        session = ort.InferenceSession(skeleton.probe_model(pinned), so, providers=["CPUExecutionProvider"],
                                       disabled_optimizers=_NOT_FOLDING)
    except Exception:  # noqa: BLE001 - a graph the CPU provider cannot take (the EP's session will say why)
        return None
    return [tuple(d if isinstance(d, int) and d >= 0 else None for d in arg.shape or ()) for arg in
            session.get_outputs()]


def _value_name(buf: memoryview, start: int, end: int) -> str:
    for _, a, b in fields(buf, start, end, 2, frozenset((VALUE_NAME,))):
        return str(buf[a:b], "utf-8")
    return ""


def _tensor_name(buf: memoryview, start: int, end: int) -> str:
    for _, a, b in fields(buf, start, end, 2, frozenset((TENSOR_NAME,))):
        return str(buf[a:b], "utf-8")
    return ""


def _field(tag: int, payload: bytes) -> bytes:
    return _varint_bytes(tag) + _varint_bytes(len(payload)) + payload


def _value_info(name: str, elem_type: int, dims: Sequence[int | None]) -> bytes:
    """A ValueInfoProto of a tensor: name (1), type (2) = TypeProto.tensor_type (1) = elem_type (1), shape (2) of
    Dimension (1) dim_value (1); a dim that is None or negative is left open (a Dimension with no value)."""
    shape = b"".join(_field(field_tag(1, LEN), b"" if d is None or d < 0 else
                            _varint_bytes(field_tag(1, VARINT)) + _varint_bytes(int(d))) for d in dims)
    tensor = _varint_bytes(field_tag(1, VARINT)) + _varint_bytes(elem_type) + _field(field_tag(2, LEN), shape)
    return _field(field_tag(1, LEN), name.encode()) + _field(field_tag(2, LEN), _field(field_tag(1, LEN), tensor))
