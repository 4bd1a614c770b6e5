"""The Open Inference Protocol's messages, without any server: datatypes, model metadata, and inference requests and
responses over HTTP (JSON, with Triton's binary tensor extension) and gRPC (``inference.ModelInferRequest``).

Everything a client sends is checked here before it is used: an ``OipError`` (an HTTP status and a message) names
what is wrong. Tensors the request carries become numpy arrays over the request's own bytes where their alignment
allows (no copy); a tensor that lies in system shared memory is a ``ShmRef``, resolved by ``npurt.serve.oip.shm``.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...types import DataType, NpuTensorInfo

# The protocol's datatype names (KServe v2 / Triton) against npurt's. BYTES (strings) has no npurt type: refused.
DATATYPE_OF: dict[DataType, str] = {
    DataType.BOOLEAN: "BOOL", DataType.UINT8: "UINT8", DataType.UINT16: "UINT16", DataType.UINT32: "UINT32",
    DataType.UINT64: "UINT64", DataType.INT8: "INT8", DataType.INT16: "INT16", DataType.INT32: "INT32",
    DataType.INT64: "INT64", DataType.FP16: "FP16", DataType.FLOAT32: "FP32", DataType.FLOAT64: "FP64",
    DataType.BF16: "BF16",
}
DATA_TYPE_OF: dict[str, DataType] = {v: k for k, v in DATATYPE_OF.items()}
MAX_RANK = 32
SHM_PARAMETERS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")


class OipError(Exception):
    """A request answered with an HTTP status (gRPC: the matching code) and ``{"error": message}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

    @property
    def message(self) -> str:
        return str(self)


def bad(message: str) -> OipError:
    return OipError(400, message)


@dataclass(frozen=True)
class OipLimits:
    """What one request may carry, and how many may be in flight."""

    max_header_bytes: int = 16 << 10  # HTTP request line and headers (each line), gRPC metadata
    max_body_bytes: int = 64 << 20  # an HTTP body, a gRPC message (a 1080p float32 frame is 24.9 MB)
    max_json_bytes: int = 16 << 20  # the JSON of an HTTP request (binary tensors after it count in the body only)
    max_tensors: int = 64  # inputs plus requested outputs
    max_elements: int = 1 << 26  # elements of all inputs together
    max_in_flight: int = 64  # requests admitted at once, both protocols (64 bodies of 64 MiB: 4 GiB at most)
    body_idle_s: float = 30.0  # an HTTP body that sends nothing this long is refused (408): it holds a slot meanwhile


@dataclass(frozen=True)
class ShmRef:
    """A tensor in a registered system shared memory region: ``byte_size`` bytes at ``offset`` in it."""

    region: str
    byte_size: int
    offset: int


@dataclass
class InputTensor:
    name: str
    data_type: DataType
    shape: tuple[int, ...]
    array: np.ndarray | None = None  # the data the request carried (None: in shared memory)
    shm: ShmRef | None = None

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.data_type.itemsize


@dataclass
class RequestedOutput:
    name: str
    binary: bool | None = None  # None: the request's default (binary_data_output)
    shm: ShmRef | None = None


@dataclass
class InferRequest:
    id: str = ""
    inputs: list[InputTensor] = field(default_factory=list)
    outputs: list[RequestedOutput] | None = None  # None: every output
    binary_output: bool = False  # the request's parameter binary_data_output


@dataclass
class OutputTensor:
    """One output of a response: its array, or where it was written (shared memory)."""

    name: str
    data_type: DataType
    shape: tuple[int, ...]
    array: np.ndarray | None = None
    shm: ShmRef | None = None
    binary: bool = False


# ---------------------------------------------------------------------------------------------- metadata
def tensor_metadata(info: NpuTensorInfo) -> dict[str, Any]:
    """A port as the protocol describes it: name, datatype, shape with -1 for a dim the model leaves open."""
    return {"name": info.name, "datatype": datatype_name(info.data_type), "shape": [int(d) for d in info.shape]}


def datatype_name(data_type: DataType) -> str:
    name = DATATYPE_OF.get(data_type)
    if name is None:
        raise OipError(500, f"data type {data_type.name} has no Open Inference Protocol name")
    return name


# ---------------------------------------------------------------------------------------------- checks
def _int(value: Any, what: str, low: int = 0) -> int:
    if type(value) is not int or not low <= value < (1 << 62):
        raise bad(f"{what}: {str(value)[:60]!r} is not an integer >= {low}")
    return value


def _shape(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or len(value) > MAX_RANK:
        raise bad(f"{what}: shape {str(value)[:80]} is not a list of at most {MAX_RANK} dims")
    return tuple(_int(d, f"{what}: shape", 0) for d in value)


def _data_type(value: Any, what: str) -> DataType:
    if not isinstance(value, str) or value not in DATA_TYPE_OF:
        if value == "BYTES":
            raise bad(f"{what}: datatype BYTES (strings) is not served by npurt")
        raise bad(f"{what}: datatype {str(value)[:40]!r} is not one of {sorted(DATA_TYPE_OF)}")
    return DATA_TYPE_OF[value]


def _shm_ref(parameters: Mapping[str, Any], what: str) -> ShmRef | None:
    region = parameters.get("shared_memory_region")
    if region is None:
        if any(k in parameters for k in SHM_PARAMETERS[1:]):
            raise bad(f"{what}: shared memory parameters without 'shared_memory_region'")
        return None
    if not isinstance(region, str) or not region:
        raise bad(f"{what}: shared_memory_region {str(region)[:60]!r} is not a region name")
    if "shared_memory_byte_size" not in parameters:
        raise bad(f"{what}: shared_memory_region without shared_memory_byte_size")
    size = _int(parameters["shared_memory_byte_size"], f"{what}: shared_memory_byte_size")
    offset = _int(parameters.get("shared_memory_offset", 0), f"{what}: shared_memory_offset")
    return ShmRef(region, size, offset)


def _parameters(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad(f"{what}: parameters is not an object")
    return value


def _count_elements(total: int, shape: tuple[int, ...], limits: OipLimits, what: str) -> int:
    """The request's elements so far, with one more input's (OipError 413 past the limit: before any data is
    decoded). A zero-sized shape's other dims count too: [0, 2**61] holds nothing, but no array of it can be made."""
    if math.prod(max(d, 1) for d in shape) > limits.max_elements:
        raise OipError(413, f"{what}: shape {list(shape)[:MAX_RANK]} has dims past this server's limit of "
                            f"{limits.max_elements} elements per request (--max-elements)")
    total += math.prod(shape)
    if total > limits.max_elements:
        raise OipError(413, f"the request's inputs hold {total} elements or more; this server takes at most "
                            f"{limits.max_elements} per request (--max-elements)")
    return total


def _flat(data: Any, what: str) -> list[Any]:
    """JSON data, nested lists flattened (row-major)."""
    if not isinstance(data, list):
        raise bad(f"{what}: data is not a list")
    flat: list[Any] = data
    for _ in range(MAX_RANK):
        if not any(isinstance(v, list) for v in flat):
            return flat
        if not all(isinstance(v, list) for v in flat):
            raise bad(f"{what}: data mixes lists and values at one level")
        flat = list(itertools.chain.from_iterable(flat))
    raise bad(f"{what}: data nested deeper than {MAX_RANK} levels")


def _check_values(values: Sequence[Any], data_type: DataType, what: str) -> np.ndarray:
    """Values of the declared datatype as an array of it: booleans for BOOL, integers within the type's range for
    INT* / UINT*, numbers for FP* (OipError 400 otherwise: nothing is truncated, wrapped or coerced)."""
    kinds = set(map(type, values))
    name = datatype_name(data_type)
    dtype = data_type.numpy
    if data_type is DataType.BOOLEAN:
        allowed: set[type] = {bool}
        takes = "true / false"
    elif np.issubdtype(dtype, np.integer):
        allowed, takes = {int}, "integers"
    else:
        allowed, takes = {int, float}, "numbers"
    if not kinds <= allowed:
        wrong = sorted(k.__name__ for k in kinds - allowed)
        raise bad(f"{what}: {name} data holds {', '.join(wrong)} values; it takes {takes}")
    if allowed == {int} and values:
        info = np.iinfo(dtype)
        low, high = min(values), max(values)
        if low < info.min or high > info.max:
            raise bad(f"{what}: {name} data holds {low if low < info.min else high}, outside {info.min}..{info.max}")
    try:
        with np.errstate(over="ignore"):
            array = np.asarray(values, dtype=dtype)
    except (TypeError, ValueError, OverflowError) as e:
        raise bad(f"{what}: data is not a list of {name} values: {str(e)[:120]}") from None
    if allowed == {int, float} and array.size and not np.isfinite(array).all():
        wide = np.asarray(values, dtype=np.float64)
        past = np.isinf(array) & np.isfinite(wide)  # a finite number no value of the type holds (not rounded: inf)
        if past.any():
            raise bad(f"{what}: {name} data holds {float(wide[past][0])!r}, outside {name}'s range "
                      f"(+-{float(np.finfo(dtype).max)!r})")
    return array


def _array_from_json(data: Any, data_type: DataType, shape: tuple[int, ...], what: str) -> np.ndarray:
    if data_type is DataType.BF16:
        raise bad(f"{what}: BF16 data cannot be written in JSON; send it as binary data")
    values = _flat(data, what)
    if len(values) != math.prod(shape):
        raise bad(f"{what}: data holds {len(values)} values, shape {list(shape)} needs {math.prod(shape)}")
    return _check_values(values, data_type, what).reshape(shape)


def array_over(buffer: memoryview | bytes, offset: int, data_type: DataType, shape: tuple[int, ...],
               what: str = "tensor") -> np.ndarray:
    """An array over ``buffer`` at ``offset`` (no copy), or a copy where the bytes are not aligned for the type;
    BOOL bytes checked (``check_bool``)."""
    count = math.prod(shape)
    array = np.frombuffer(buffer, dtype=data_type.numpy, count=count, offset=offset).reshape(shape)
    if not array.flags.aligned:
        array = array.copy()  # engines read elements in place: a misaligned one is copied, once
    return check_bool(array, what)


def check_bool(array: np.ndarray, what: str) -> np.ndarray:
    """BOOL data in bytes (binary, raw or shared memory) is one byte per element, 0 or 1 (OipError 400 otherwise):
    numpy and the engines take any other byte for a bool that is neither (ONNX Runtime's Not of a 2 is true)."""
    if array.dtype == np.bool_ and array.size and int(array.view(np.uint8).max()) > 1:
        raise bad(f"{what}: BOOL data holds a byte other than 0 and 1 (byte {int(array.view(np.uint8).max())})")
    return array


# ---------------------------------------------------------------------------------------------- HTTP
def parse_http(body: bytes, header_length: str | None, limits: OipLimits) -> InferRequest:
    """An HTTP infer request: its JSON (the whole body, or the first ``header_length`` bytes of it, Triton's binary
    tensor extension) and the binary tensors after it, in input order. Runs off the event loop: parsing JSON of
    megabytes takes milliseconds."""
    doc, json_size = _http_json(body, header_length, limits)
    request, inputs, outputs = _http_head(doc, limits)
    view = memoryview(body)
    offset = json_size
    elements = 0
    for k, item in enumerate(inputs):
        tensor, parameters = _http_input(k, item)
        elements = _count_elements(elements, tensor.shape, limits, f"input {tensor.name!r}")  # before its data
        offset = _http_data(tensor, item, parameters, view, offset)
        request.inputs.append(tensor)
    if offset != len(body):
        raise bad(f"the body has {len(body) - offset} bytes after the tensors its header declares")
    if outputs:  # none asked for (an empty list too): every output, as Triton answers (and the gRPC side)
        request.outputs = [_http_output(k, item) for k, item in enumerate(outputs)]
    return request


def _http_json(body: bytes, header_length: str | None, limits: OipLimits) -> tuple[dict[str, Any], int]:
    """The request's JSON document and its length in the body (within ``max_json_bytes``)."""
    if header_length is not None:
        try:
            json_size = int(header_length)
        except ValueError:
            raise bad(f"Inference-Header-Content-Length {header_length[:40]!r} is not a number") from None
        if not 0 < json_size <= len(body):
            raise bad(f"Inference-Header-Content-Length {json_size} for a body of {len(body)} bytes")
    else:
        json_size = len(body)
    if json_size > limits.max_json_bytes:
        raise OipError(413, f"the request's JSON is {json_size} bytes; this server parses at most "
                            f"{limits.max_json_bytes} (--max-json-mb); send large tensors as binary data")
    try:
        doc = json.loads(body[:json_size])
    except (ValueError, RecursionError) as e:
        raise bad(f"the request is not JSON: {str(e)[:160]}") from None
    if not isinstance(doc, dict):
        raise bad(f"the request is a JSON {type(doc).__name__}, not an object")
    return doc, json_size


def _http_head(doc: dict[str, Any], limits: OipLimits) -> tuple[InferRequest, list[Any], list[Any] | None]:
    """The request's id and parameters, and its lists of inputs and outputs (their count within the limit)."""
    request = InferRequest()
    rid = doc.get("id", "")
    if not isinstance(rid, str):
        raise bad("'id' is not a string")
    request.id = rid
    params = _parameters(doc.get("parameters"), "request")
    binary_output = params.get("binary_data_output", False)
    if not isinstance(binary_output, bool):
        raise bad("parameter binary_data_output is not a boolean")
    request.binary_output = binary_output
    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise bad("'inputs' is missing or not a non-empty list")
    outputs = doc.get("outputs")
    if outputs is not None and not isinstance(outputs, list):
        raise bad("'outputs' is not a list")
    _count_tensors(len(inputs) + len(outputs or ()), limits)
    return request, inputs, outputs


def _count_tensors(n: int, limits: OipLimits) -> None:
    if n > limits.max_tensors:
        raise OipError(413, f"the request names {n} tensors; this server takes at most {limits.max_tensors} "
                            "(--max-tensors)")


def _http_input(k: int, item: Any) -> tuple[InputTensor, dict[str, Any]]:
    """Input ``k`` of the JSON: its name, datatype, shape and shared memory reference; its parameters."""
    what = f"input {k}"
    if not isinstance(item, dict):
        raise bad(f"{what} is not an object")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise bad(f"{what}: 'name' is missing or not a string")
    what = f"input {name!r}"
    tensor = InputTensor(name, _data_type(item.get("datatype"), what), _shape(item.get("shape"), what))
    parameters = _parameters(item.get("parameters"), what)
    tensor.shm = _shm_ref(parameters, what)
    return tensor, parameters


def _http_data(tensor: InputTensor, item: dict[str, Any], parameters: dict[str, Any], body: memoryview,
               offset: int) -> int:
    """The input's data: from the JSON, the binary part at ``offset`` or shared memory (then none here); the offset
    of the next binary part."""
    what = f"input {tensor.name!r}"
    size = parameters.get("binary_data_size")
    if tensor.shm is not None:
        if size is not None or "data" in item:
            raise bad(f"{what}: data given both in shared memory and in the request")
    elif size is not None:
        if "data" in item:
            raise bad(f"{what}: data given both in 'data' and as binary data (binary_data_size)")
        size = _int(size, f"{what}: binary_data_size")
        if size != tensor.nbytes:
            raise bad(f"{what}: binary_data_size {size}, shape {list(tensor.shape)} of "
                      f"{datatype_name(tensor.data_type)} needs {tensor.nbytes} bytes")
        if offset + size > len(body):
            raise bad(f"{what}: the binary data is truncated: {size} bytes declared, {len(body) - offset} left "
                      "in the body")
        tensor.array = array_over(body, offset, tensor.data_type, tensor.shape, what)
        offset += size
    elif "data" in item:
        tensor.array = _array_from_json(item["data"], tensor.data_type, tensor.shape, what)
    else:
        raise bad(f"{what}: no data (neither 'data', binary_data_size nor shared memory)")
    return offset


def _http_output(k: int, item: Any) -> RequestedOutput:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise bad(f"output {k}: not an object with a 'name'")
    what = f"output {item['name']!r}"
    p = _parameters(item.get("parameters"), what)
    binary = p.get("binary_data")
    if binary is not None and not isinstance(binary, bool):
        raise bad(f"{what}: binary_data is not a boolean")
    return RequestedOutput(item["name"], binary, _output_shm(p, what))


def _output_shm(parameters: Mapping[str, Any], what: str) -> ShmRef | None:
    """A requested output's shared memory reference; Triton's classification extension (the top k classes as BYTES
    labels) is not served: asked for, it is refused (OipError 400), never answered with the whole tensor."""
    if "classification" in parameters:
        raise bad(f"{what}: classification (Triton's top-k labels) is not served by npurt; ask for the output itself")
    return _shm_ref(parameters, what)


def http_response(model: str, version: str, request_id: str, outputs: Sequence[OutputTensor]
                  ) -> tuple[list[bytes | memoryview], int | None]:
    """The response body's parts (JSON first, then each binary output) and the JSON's length where binary outputs
    follow it (the ``Inference-Header-Content-Length`` header), else None."""
    described = []
    blobs: list[bytes | memoryview] = []
    for out in outputs:
        entry: dict[str, Any] = {"name": out.name, "datatype": datatype_name(out.data_type), "shape": list(out.shape)}
        if out.shm is not None:
            entry["parameters"] = {"shared_memory_region": out.shm.region,
                                   "shared_memory_byte_size": out.shm.byte_size}
            if out.shm.offset:
                entry["parameters"]["shared_memory_offset"] = out.shm.offset
        elif out.binary:
            assert out.array is not None
            data = np.ascontiguousarray(out.array)
            entry["parameters"] = {"binary_data_size": data.nbytes}
            blobs.append(data.data.cast("B") if data.nbytes else b"")
        else:
            assert out.array is not None
            if out.data_type is DataType.BF16:
                raise OipError(400, f"output {out.name!r} is BF16: ask for it as binary data (binary_data)")
            entry["data"] = out.array.ravel().tolist()
        described.append(entry)
    doc: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": described}
    if request_id:
        doc["id"] = request_id
    header = json.dumps(doc, separators=(",", ":")).encode()
    return [header, *blobs], (len(header) if blobs else None)


# ---------------------------------------------------------------------------------------------- gRPC
_CONTENTS_FIELD = {
    DataType.BOOLEAN: "bool_contents", DataType.INT8: "int_contents", DataType.INT16: "int_contents",
    DataType.INT32: "int_contents", DataType.INT64: "int64_contents", DataType.UINT8: "uint_contents",
    DataType.UINT16: "uint_contents", DataType.UINT32: "uint_contents", DataType.UINT64: "uint64_contents",
    DataType.FLOAT32: "fp32_contents", DataType.FLOAT64: "fp64_contents",
}


def grpc_parameters(parameters: Any) -> dict[str, Any]:
    """A protobuf map<string, InferParameter> as a dict of plain values."""
    out: dict[str, Any] = {}
    for key, value in parameters.items():
        which = value.WhichOneof("parameter_choice")
        out[key] = getattr(value, which) if which else None
    return out


def parse_grpc(message: Any, limits: OipLimits, model: str = "") -> InferRequest:
    """An ``inference.ModelInferRequest``: typed ``contents`` or ``raw_input_contents`` (one per input, in order,
    where the request uses them: then no input has ``contents``, as Triton rules) or shared memory."""
    request = InferRequest(id=message.id)
    request.binary_output = True  # gRPC has only raw outputs
    _count_tensors(len(message.inputs) + len(message.outputs), limits)
    if not message.inputs:
        raise bad("the request has no inputs")
    raw = message.raw_input_contents
    next_raw = 0
    elements = 0
    for item in message.inputs:
        what = f"input {item.name!r}"
        if not item.name:
            raise bad("an input without a name")
        data_type = _data_type(item.datatype, what)
        shape = _shape(list(item.shape), what)
        elements = _count_elements(elements, shape, limits, what)
        tensor = InputTensor(item.name, data_type, shape)
        tensor.shm = _shm_ref(grpc_parameters(item.parameters), what)
        contents = _grpc_contents(item, data_type)
        if contents is not None and len(raw):
            raise bad(f"contents field must not be specified when using raw_input_contents for {item.name!r} for "
                      f"model {model!r}")
        if tensor.shm is not None:
            if contents is not None:
                raise bad(f"{what}: data given both in shared memory and in the request")
        elif contents is not None:
            if len(contents) != math.prod(shape):
                raise bad(f"{what}: contents hold {len(contents)} values, shape {list(shape)} needs "
                          f"{math.prod(shape)}")
            tensor.array = _check_values(contents, data_type, what).reshape(shape)
        elif next_raw < len(raw):
            blob = raw[next_raw]
            next_raw += 1
            if len(blob) != tensor.nbytes:
                raise bad(f"{what}: {len(blob)} bytes of raw contents, shape {list(shape)} of "
                          f"{datatype_name(data_type)} needs {tensor.nbytes}")
            tensor.array = array_over(blob, 0, data_type, shape, what)
        else:
            raise bad(f"{what}: no data (neither contents, raw_input_contents nor shared memory)")
        request.inputs.append(tensor)
    if next_raw != len(raw):
        raise bad(f"{len(raw) - next_raw} raw_input_contents beyond the inputs that take them")
    if message.outputs:
        request.outputs = [RequestedOutput(item.name, True, _output_shm(grpc_parameters(item.parameters),
                                                                        f"output {item.name!r}"))
                           for item in message.outputs]
    return request


def _grpc_contents(item: Any, data_type: DataType) -> list[Any] | None:
    """The input's typed contents for its datatype (None: none given)."""
    field_name = _CONTENTS_FIELD.get(data_type)
    if field_name is None or not item.HasField("contents"):
        return None
    values = getattr(item.contents, field_name)
    return list(values) if len(values) else None


def fill_grpc_response(response: Any, model: str, version: str, request_id: str,
                       outputs: Sequence[OutputTensor]) -> None:
    """An ``inference.ModelInferResponse``: one raw_output_contents per output, in order (empty for an output in
    shared memory: the client finds an output's bytes by its position)."""
    response.model_name = model
    response.model_version = version
    response.id = request_id
    for out in outputs:
        entry = response.outputs.add()
        entry.name = out.name
        entry.datatype = datatype_name(out.data_type)
        entry.shape.extend(out.shape)
        if out.shm is not None:
            entry.parameters["shared_memory_region"].string_param = out.shm.region
            entry.parameters["shared_memory_byte_size"].int64_param = out.shm.byte_size
            if out.shm.offset:
                entry.parameters["shared_memory_offset"].int64_param = out.shm.offset
            response.raw_output_contents.append(b"")
        else:
            assert out.array is not None
            response.raw_output_contents.append(np.ascontiguousarray(out.array).tobytes())


__all__ = ["DATATYPE_OF", "DATA_TYPE_OF", "InferRequest", "InputTensor", "OipError", "OipLimits", "OutputTensor",
           "RequestedOutput", "ShmRef", "array_over", "check_bool", "datatype_name", "fill_grpc_response",
           "grpc_parameters", "http_response", "parse_grpc", "parse_http", "tensor_metadata"]
