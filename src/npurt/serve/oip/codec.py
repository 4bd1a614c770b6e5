"""The Open Inference Protocol's messages, without any server: datatypes, model metadata, and inference requests and
responses over HTTP (JSON, with Triton's binary tensor extension) and gRPC (``inference.ModelInferRequest``).

Everything a client sends is checked here before it is used: an ``OipError`` (an HTTP status and a message) names
what is wrong. Tensors the request carries become numpy arrays over the request's own bytes where their alignment
allows (no copy); a tensor that lies in system shared memory is a ``ShmRef``, resolved by ``npurt.serve.oip.shm``.
"""

from __future__ import annotations

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
    """What one request may carry."""

    max_header_bytes: int = 16 << 10  # HTTP request line and headers (each line), gRPC metadata
    max_body_bytes: int = 64 << 20  # an HTTP body, a gRPC message (a 1080p float32 frame is 24.9 MB)
    max_tensors: int = 64  # inputs plus requested outputs
    max_elements: int = 1 << 26  # elements of all inputs together


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


def _count_elements(total: int, shape: tuple[int, ...], limits: OipLimits) -> int:
    """The request's elements so far, with one more input's (OipError 413 past the limit: before any data is
    decoded)."""
    total += math.prod(shape)
    if total > limits.max_elements:
        raise OipError(413, f"the request's inputs hold {total} elements or more; this server takes at most "
                            f"{limits.max_elements} per request (--max-elements)")
    return total


def check_counts(request: InferRequest, limits: OipLimits) -> None:
    """The request's tensor count and elements within the limits (OipError 400 / 413)."""
    n = len(request.inputs) + len(request.outputs or ())
    if n > limits.max_tensors:
        raise OipError(413, f"the request names {n} tensors; this server takes at most {limits.max_tensors} "
                            "(--max-tensors)")
    elements = sum(math.prod(t.shape) for t in request.inputs)
    if elements > limits.max_elements:
        raise OipError(413, f"the request's inputs hold {elements} elements; this server takes at most "
                            f"{limits.max_elements} per request (--max-elements)")


def _array_from_json(data: Any, data_type: DataType, shape: tuple[int, ...], what: str) -> np.ndarray:
    if data_type is DataType.BF16:
        raise bad(f"{what}: BF16 data cannot be written in JSON; send it as binary data")
    try:
        array = np.asarray(data, dtype=data_type.numpy)
    except (TypeError, ValueError, OverflowError) as e:
        raise bad(f"{what}: data is not a list of {datatype_name(data_type)} values: {str(e)[:120]}") from None
    if array.dtype == object or array.size != math.prod(shape):
        raise bad(f"{what}: data holds {array.size} values, shape {list(shape)} needs {math.prod(shape)}")
    return array.reshape(shape)


def array_over(buffer: memoryview | bytes, offset: int, data_type: DataType, shape: tuple[int, ...]) -> np.ndarray:
    """An array over ``buffer`` at ``offset`` (no copy), or a copy where the bytes are not aligned for the type."""
    count = math.prod(shape)
    array = np.frombuffer(buffer, dtype=data_type.numpy, count=count, offset=offset).reshape(shape)
    if not array.flags.aligned:
        array = array.copy()  # engines read elements in place: a misaligned one is copied, once
    return array


# ---------------------------------------------------------------------------------------------- HTTP
def parse_http(body: bytes, header_length: str | None, limits: OipLimits) -> InferRequest:
    """An HTTP infer request: its JSON (the whole body, or the first ``header_length`` bytes of it, Triton's binary
    tensor extension) and the binary tensors after it, in input order."""
    if header_length is not None:
        try:
            json_size = int(header_length)
        except ValueError:
            raise bad(f"Inference-Header-Content-Length {header_length[:40]!r} is not a number") from None
        if not 0 < json_size <= len(body):
            raise bad(f"Inference-Header-Content-Length {json_size} for a body of {len(body)} bytes")
    else:
        json_size = len(body)
    try:
        doc = json.loads(body[:json_size])
    except (ValueError, RecursionError) as e:
        raise bad(f"the request is not JSON: {str(e)[:160]}") from None
    if not isinstance(doc, dict):
        raise bad(f"the request is a JSON {type(doc).__name__}, not an object")
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
    if len(inputs) + len(outputs or ()) > limits.max_tensors:
        raise OipError(413, f"the request names {len(inputs) + len(outputs or ())} tensors; this server takes at "
                            f"most {limits.max_tensors} (--max-tensors)")
    view = memoryview(body)
    offset = json_size
    elements = 0
    for k, item in enumerate(inputs):
        what = f"input {k}"
        if not isinstance(item, dict):
            raise bad(f"{what} is not an object")
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise bad(f"{what}: 'name' is missing or not a string")
        what = f"input {name!r}"
        data_type = _data_type(item.get("datatype"), what)
        shape = _shape(item.get("shape"), what)
        elements = _count_elements(elements, shape, limits)
        tensor = InputTensor(name, data_type, shape)
        p = _parameters(item.get("parameters"), what)
        tensor.shm = _shm_ref(p, what)
        size = p.get("binary_data_size")
        if tensor.shm is not None:
            if size is not None or "data" in item:
                raise bad(f"{what}: data given both in shared memory and in the request")
        elif size is not None:
            size = _int(size, f"{what}: binary_data_size")
            if size != tensor.nbytes:
                raise bad(f"{what}: binary_data_size {size}, shape {list(shape)} of {datatype_name(data_type)} "
                          f"needs {tensor.nbytes} bytes")
            if offset + size > len(body):
                raise bad(f"{what}: the binary data is truncated: {size} bytes declared, {len(body) - offset} left "
                          "in the body")
            tensor.array = array_over(view, offset, data_type, shape)
            offset += size
        elif "data" in item:
            tensor.array = _array_from_json(item["data"], data_type, shape, what)
        else:
            raise bad(f"{what}: no data (neither 'data', binary_data_size nor shared memory)")
        request.inputs.append(tensor)
    if offset != len(body):
        raise bad(f"the body has {len(body) - offset} bytes after the tensors its header declares")
    if outputs is not None:
        request.outputs = []
        for k, item in enumerate(outputs):
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                raise bad(f"output {k}: not an object with a 'name'")
            what = f"output {item['name']!r}"
            p = _parameters(item.get("parameters"), what)
            binary = p.get("binary_data")
            if binary is not None and not isinstance(binary, bool):
                raise bad(f"{what}: binary_data is not a boolean")
            request.outputs.append(RequestedOutput(item["name"], binary, _shm_ref(p, what)))
    check_counts(request, limits)
    return request


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


def parse_grpc(message: Any, limits: OipLimits) -> InferRequest:
    """An ``inference.ModelInferRequest``: typed ``contents`` or ``raw_input_contents`` (one per input that carries
    data, in order) or shared memory."""
    request = InferRequest(id=message.id)
    params = grpc_parameters(message.parameters)
    request.binary_output = True  # gRPC has only raw outputs
    if len(message.inputs) + len(message.outputs) > limits.max_tensors:
        raise OipError(413, f"the request names {len(message.inputs) + len(message.outputs)} tensors; this server "
                            f"takes at most {limits.max_tensors} (--max-tensors)")
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
        elements = _count_elements(elements, shape, limits)
        tensor = InputTensor(item.name, data_type, shape)
        p = grpc_parameters(item.parameters)
        tensor.shm = _shm_ref(p, what)
        contents_field = _CONTENTS_FIELD.get(data_type)
        has_contents = item.HasField("contents") and contents_field is not None and len(
            getattr(item.contents, contents_field)) > 0
        if tensor.shm is not None:
            if has_contents:
                raise bad(f"{what}: data given both in shared memory and in the request")
        elif has_contents:
            assert contents_field is not None
            tensor.array = _array_from_json(list(getattr(item.contents, contents_field)), data_type, shape, what)
        elif next_raw < len(raw):
            blob = raw[next_raw]
            next_raw += 1
            if len(blob) != tensor.nbytes:
                raise bad(f"{what}: {len(blob)} bytes of raw contents, shape {list(shape)} of "
                          f"{datatype_name(data_type)} needs {tensor.nbytes}")
            tensor.array = array_over(blob, 0, data_type, shape)
        else:
            raise bad(f"{what}: no data (neither contents, raw_input_contents nor shared memory)")
        request.inputs.append(tensor)
    if next_raw != len(raw):
        raise bad(f"{len(raw) - next_raw} raw_input_contents beyond the inputs that take them")
    if message.outputs:
        request.outputs = []
        for item in message.outputs:
            p = grpc_parameters(item.parameters)
            request.outputs.append(RequestedOutput(item.name, True, _shm_ref(p, f"output {item.name!r}")))
    del params
    check_counts(request, limits)
    return request


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
           "RequestedOutput", "ShmRef", "array_over", "check_counts", "datatype_name", "fill_grpc_response",
           "grpc_parameters", "http_response", "parse_grpc", "parse_http", "tensor_metadata"]
