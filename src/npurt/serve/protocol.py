"""The wire protocol between ``npurt serve`` and its clients: small messages over one AF_UNIX SOCK_SEQPACKET socket.

Every message is one datagram: a fixed 20-byte head and an optional body: UTF-8 JSON for control messages and
for a run's error text or output shapes, or, with ``FLAG_TENSORS``, one ``npurt.share`` message (its header and
JSON, its fds as SCM_RIGHTS on the datagram) encoded and validated by ``npurt.share`` itself. Tensor memory never
travels in a message: it travels once, as fds, and is referred to by id afterwards. One datagram per message lets
several service threads read one connection at once (the kernel wakes one reader per datagram).

Head ``struct "<BBHIIQ"``: kind, status (a ``StatusCode`` in replies), flags, two numbers whose meaning the kind
gives (``a``, ``b``: a runner, binding or context id, a count), and the request id that the reply carries back.

The hot path is one RUN head (20 bytes) and one DONE head back (20 bytes, plus a small JSON body only when the run
failed or reported output shapes). Everything a peer sends is checked here before use (``ProtocolError``: a
ValueError naming what is wrong); a message that fails the checks gets an error reply, never a crash.
"""

from __future__ import annotations

import array
import json
import math
import os
import socket
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import share
from ..options import NUM_THREADS_ENV, RunnerOptions, parse_options
from ..ports import Port, PortSpec
from ..tensor import NpuTensor
from ..types import (
    DataType,
    DeviceInfo,
    MemoryLayout,
    NpuTensorInfo,
    QuantParameters,
    RoundingMode,
    StatusCode,
    TensorDirection,
    TensorType,
)

VERSION = 1
MAGIC = "npurt-serve"
HEAD = struct.Struct("<BBHIIQ")
MAX_MESSAGE = HEAD.size + share.HEADER.size + share.MAX_PAYLOAD  # the largest message: a head and share's largest
ANCILLARY_SIZE = socket.CMSG_SPACE(share.MAX_FDS * array.array("i").itemsize)  # the most fds one message carries
MAX_ID = 0xFFFFFFFF
SOCKET_ENV = "NPURT_SERVICE"  # the default socket's path, where set

# -- kinds: client -> service
HELLO = 1  # body {"magic", "version", "pid"}
MODELS = 2  # -> REPLY {"models": [...]}
DESCRIBE = 3  # body {"model", "options"} -> REPLY {"options"}: what a runner of these options would be served with
OPEN = 4  # body {"model", "options"} -> REPLY a=runner id, body: the served runner (ports, device, options)
COMPILE = 5  # a=runner, body {"signature": [[dims]] | null} -> REPLY {"inputs", "outputs", "state_names"}
BIND = 6  # a=runner, b=number of inputs, FLAG_TENSORS (inputs then outputs) -> REPLY a=binding id
UNBIND = 7  # a=binding; no reply
RUN = 8  # a=binding, b=context (0: none) -> DONE
RUN_ARRAYS = 9  # a=runner, b=context, FLAG_TENSORS (the inputs) -> REPLY with FLAG_TENSORS (the outputs)
CLOSE_RUNNER = 10  # a=runner -> REPLY
CONTEXT_OPEN = 11  # a=runner -> REPLY a=context id
CONTEXT_CLOSE = 12  # a=context -> REPLY
STATE_GET = 13  # a=context -> REPLY with FLAG_TENSORS (the variables)
STATE_SET = 14  # a=context, FLAG_TENSORS (the variables) -> REPLY
STATE_RESET = 15  # a=context -> REPLY
STATS = 16  # -> REPLY {"client": {...}, "service": {...}}
# -- kinds: service -> client
REPLY = 100  # status SUCCESS with the answer, or a status and body {"error"}
DONE = 101  # a run's end: status; body {"error", "shapes"} only where there is something to say
NOTICE = 102  # unsolicited (request id 0): body {"shutdown": why}

REQUEST_KINDS = frozenset(range(HELLO, STATS + 1))
FLAG_TENSORS = 1  # an npurt.share message follows this one

# Options the client's own runner keeps (its job table, batching, memory, streams' carried pairs); the others
# decide what the service compiles and are sent to it.
CLIENT_OPTIONS = frozenset({"batch_size", "max_concurrent_runs", "async_threadpool_depth", "callback_order",
                            "log_level", "memory_provider", "memory_strict", "state_pairs", "service"})
# Served options that decide the ports a client sees: a client's runner must agree with the service on them.
VIEW_FIELDS = ("input_tensor_type", "output_tensor_type", "tensor_types", "hw_view", "hw_format", "shape_sets",
               "static_shapes", "max_compiled_shapes")
_DEFAULTS = RunnerOptions()


class ProtocolError(ValueError):
    """A message that breaks the protocol (bad head, body, field or size)."""


class ServiceError(Exception):
    """A request the service answers with a status and a message (never a crash)."""

    def __init__(self, status: StatusCode, message: str) -> None:
        super().__init__(message)
        self.status = status


# ---------------------------------------------------------------------------------------------- framing
def pack(kind: int, req: int, a: int = 0, b: int = 0, status: int = 0, flags: int = 0, body: bytes = b"") -> bytes:
    return HEAD.pack(kind, status, flags, a, b, req) + body


def pack_json(kind: int, req: int, doc: Mapping[str, Any], a: int = 0, b: int = 0, status: int = 0,
              flags: int = 0) -> bytes:
    body = json.dumps(doc, separators=(",", ":")).encode()
    if HEAD.size + len(body) > MAX_MESSAGE:
        raise ProtocolError(f"message of {HEAD.size + len(body)} bytes exceeds the {MAX_MESSAGE}-byte limit")
    return pack(kind, req, a, b, status, flags, body)


def unpack(data: bytes | memoryview) -> tuple[int, int, int, int, int, int]:
    """(kind, status, flags, a, b, req) of a message (ProtocolError when it is too short)."""
    if len(data) < HEAD.size:
        raise ProtocolError(f"a message of {len(data)} bytes; the head alone is {HEAD.size}")
    return HEAD.unpack_from(data)


def body_json(data: bytes | memoryview) -> dict[str, Any]:
    """A message's JSON body as a dict (ProtocolError otherwise)."""
    body = bytes(data[HEAD.size:])
    try:
        doc = json.loads(body.decode("utf-8")) if body else {}
    except (ValueError, RecursionError) as e:
        raise ProtocolError(f"the body is not UTF-8 JSON: {str(e)[:120]}") from None
    if not isinstance(doc, dict):
        raise ProtocolError(f"the body is a JSON {type(doc).__name__}, not an object")
    return doc


class _Capture(socket.socket):
    """A socket whose ``sendmsg`` keeps the message instead of sending it: ``npurt.share`` encodes into it."""

    captured: tuple[bytes, list[Any]] = (b"", [])

    def sendmsg(self, buffers: Any, ancdata: Any = (), flags: int = 0, address: Any = None) -> int:
        data = b"".join(bytes(b) for b in buffers)
        self.captured = (data, list(ancdata))
        return len(data)


class _Replay(socket.socket):
    """A socket whose ``recvmsg`` gives a datagram already read: ``npurt.share`` decodes (and validates) it."""

    message: tuple[bytes, list[Any], int, Any] = (b"", [], 0, None)

    def recvmsg(self, bufsize: int, ancbufsize: int = 0, flags: int = 0) -> tuple[bytes, list[Any], int, Any]:
        data, ancdata, msg_flags, address = self.message
        if len(data) > bufsize:
            msg_flags |= socket.MSG_TRUNC
        return data[:bufsize], ancdata, msg_flags, address


def pack_tensors(kind: int, req: int, tensors: Sequence[NpuTensor], a: int = 0, b: int = 0, status: int = 0
                 ) -> tuple[bytes, list[Any]]:
    """A message that carries tensors: the head and ``npurt.share``'s message for them, and its ancillary data
    (the fds), to send in one ``sendmsg``. ValueError for tensors that cannot be shared (no fd)."""
    with _Capture(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC) as capture:
        share.send_tensors(capture, tensors)
        data, ancdata = capture.captured
    return pack(kind, req, a, b, status, FLAG_TENSORS, data), ancdata


def unpack_tensors(data: bytes | memoryview, ancdata: list[Any], msg_flags: int) -> list[NpuTensor]:
    """The tensors of a message with FLAG_TENSORS, mapped here, validated by ``npurt.share`` (which closes every fd
    that came with the message, whatever happens). ValueError / NpuError for a bad message."""
    with _Replay(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC) as replay:
        replay.message = (bytes(data[HEAD.size:]), ancdata, msg_flags, None)
        return share.recv_tensors(replay)


def close_fds(ancdata: list[Any]) -> None:
    """Close the fds of a message that carries none by protocol (a hostile peer's, or a stray one)."""
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds = array.array("i")
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass


_STATUSES = {int(s): s for s in StatusCode}


def status_name(status: int) -> StatusCode:
    """The status a message's number stands for (FAILURE for a number that is none)."""
    return _STATUSES.get(status, StatusCode.FAILURE)


# ---------------------------------------------------------------------------------------------- fields
def field(doc: Mapping[str, Any], key: str, kind: type | tuple[type, ...], what: str = "") -> Any:
    """``doc[key]`` if it is of ``kind`` (bool is not an int here), else ProtocolError."""
    if key not in doc:
        raise ProtocolError(f"{what or 'message'}: field {key!r} is missing")
    value = doc[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        raise ProtocolError(f"{what or 'message'}: field {key!r} is {type(value).__name__}, expected "
                            f"{' or '.join(k.__name__ for k in kinds)}")
    return value


def _enum(cls: Any, value: Any, what: str) -> Any:
    if not isinstance(value, str) or value not in cls.__members__:
        raise ProtocolError(f"{what}: {str(value)[:60]!r} is not a {cls.__name__} name")
    return cls[value]


def ints(value: Any, what: str, low: int = 0, allow_none: bool = False) -> list[Any]:
    if not isinstance(value, list) or len(value) > 32:
        raise ProtocolError(f"{what}: {str(value)[:80]} is not a list of at most 32 ints")
    for v in value:
        if v is None and allow_none:
            continue
        if type(v) is not int or not low <= v < (1 << 62):
            raise ProtocolError(f"{what}: {str(value)[:80]} holds {v!r}")
    return value


def info_to_dict(info: NpuTensorInfo) -> dict[str, Any]:
    return {"name": info.name, "data_type": info.data_type.name, "shape": list(info.shape),
            "direction": info.direction.name, "tensor_type": info.tensor_type.name,
            "layout": info.memory_layout.name, "layout_order": list(info.memory_layout_order),
            "strides": list(info.strides), "size_in_bytes": info.size_in_bytes}


def info_from_dict(doc: Any, what: str = "tensor") -> NpuTensorInfo:
    if not isinstance(doc, dict):
        raise ProtocolError(f"{what}: not an object")
    try:
        return NpuTensorInfo(
            name=field(doc, "name", str, what),
            data_type=_enum(DataType, doc.get("data_type"), what),
            shape=tuple(ints(field(doc, "shape", list, what), what, low=-1)),
            direction=_enum(TensorDirection, doc.get("direction"), what),
            tensor_type=_enum(TensorType, doc.get("tensor_type"), what),
            memory_layout=_enum(MemoryLayout, doc.get("layout"), what),
            memory_layout_order=tuple(ints(field(doc, "layout_order", list, what), what)),
            strides=tuple(ints(field(doc, "strides", list, what), what)),
            size_in_bytes=field(doc, "size_in_bytes", int, what),
        )
    except ProtocolError:
        raise
    except ValueError as e:
        raise ProtocolError(f"{what}: {e}") from None


def _quant_to_dict(q: QuantParameters | None) -> dict[str, Any] | None:
    return None if q is None else {"scale": q.scale, "zero_point": q.zero_point, "rounding": q.rounding_mode.name}


def _quant_from_dict(doc: Any, what: str) -> QuantParameters | None:
    if doc is None:
        return None
    if not isinstance(doc, dict):
        raise ProtocolError(f"{what}: quant is not an object")
    scale = field(doc, "scale", (int, float), what)
    if not math.isfinite(scale) or scale <= 0:
        raise ProtocolError(f"{what}: quant scale {scale!r}")
    return QuantParameters(float(scale), field(doc, "zero_point", int, what),
                           _enum(RoundingMode, doc.get("rounding"), what))


def port_to_dict(port: Port) -> dict[str, Any]:
    return {"cpu": info_to_dict(port.cpu), "hw": info_to_dict(port.hw), "view": port.view.name,
            "quant": _quant_to_dict(port.quant)}


def port_from_dict(doc: Any) -> Port:
    if not isinstance(doc, dict):
        raise ProtocolError("port: not an object")
    return Port(cpu=info_from_dict(doc.get("cpu"), "port cpu view"), hw=info_from_dict(doc.get("hw"), "port hw view"),
                view=_enum(TensorType, doc.get("view"), "port view"), quant=_quant_from_dict(doc.get("quant"), "port"))


def spec_to_dict(spec: PortSpec) -> dict[str, Any]:
    return {"name": spec.name, "data_type": spec.data_type.name, "shape": list(spec.shape),
            "quant": _quant_to_dict(spec.quant),
            "quant_data_type": spec.quant_data_type.name if spec.quant_data_type is not None else None,
            "dim_names": list(spec.dim_names), "layout": spec.layout.name if spec.layout is not None else None}


def spec_from_dict(doc: Any) -> PortSpec:
    if not isinstance(doc, dict):
        raise ProtocolError("port spec: not an object")
    name = field(doc, "name", str, "port spec")
    qdt = doc.get("quant_data_type")
    dim_names = field(doc, "dim_names", list, "port spec")
    if not all(n is None or isinstance(n, str) for n in dim_names):
        raise ProtocolError(f"port spec {name!r}: dim_names {dim_names!r}")
    return PortSpec(name, _enum(DataType, doc.get("data_type"), "port spec"),
                    tuple(ints(field(doc, "shape", list, "port spec"), "port spec shape", allow_none=True)),
                    quant=_quant_from_dict(doc.get("quant"), "port spec"),
                    quant_data_type=None if qdt is None else _enum(DataType, qdt, "port spec"),
                    dim_names=tuple(dim_names),
                    layout=None if doc.get("layout") is None else _enum(MemoryLayout, doc["layout"], "port spec"))


def device_info_to_dict(info: DeviceInfo) -> dict[str, Any]:
    return {"requested": info.requested, "attached": info.attached, "engine": info.engine,
            "engine_version": info.engine_version, "fell_back": info.fell_back, "reason": info.reason,
            "skipped": [list(s) for s in info.skipped], "full_name": info.full_name,
            "placement": [list(p) for p in info.placement], "load_steps": [list(s) for s in info.load_steps]}


def device_info_from_dict(doc: Any) -> DeviceInfo:
    if not isinstance(doc, dict):
        raise ProtocolError("device info: not an object")
    try:
        return DeviceInfo(
            requested=field(doc, "requested", str), attached=field(doc, "attached", str),
            engine=field(doc, "engine", str), engine_version=field(doc, "engine_version", str),
            fell_back=field(doc, "fell_back", bool), reason=field(doc, "reason", str),
            skipped=tuple((str(d), str(w)) for d, w in field(doc, "skipped", list)),
            full_name=field(doc, "full_name", str),
            placement=tuple((str(p), int(n)) for p, n in field(doc, "placement", list)),
            load_steps=tuple((str(s), float(ms)) for s, ms in field(doc, "load_steps", list)))
    except (TypeError, ValueError) as e:
        raise ProtocolError(f"device info: {e}") from None


# ---------------------------------------------------------------------------------------------- options
def served_options(options: RunnerOptions, raw: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The options that decide what the service compiles, as JSON-safe option values: those that differ from the
    defaults (a default means "as the service serves it"). ``num_threads`` that only the environment set
    (``NPURT_NUM_THREADS``, a process's own cap) is left out: a client's cap is not a request to the service."""
    out: dict[str, Any] = {}
    o, d = options, _DEFAULTS
    for key in ("device", "fallback", "hw_view", "performance_hint", "inference_precision", "static_shapes",
                "max_compiled_shapes"):
        if getattr(o, key) != getattr(d, key):
            out[key] = getattr(o, key)
    if o.num_threads is not None:
        asked = "num_threads" in raw if raw is not None else os.environ.get(NUM_THREADS_ENV) != str(o.num_threads)
        if asked:
            out["num_threads"] = o.num_threads
    for key in ("input_tensor_type", "output_tensor_type"):
        if getattr(o, key) != getattr(d, key):
            out[key] = getattr(o, key).name
    for (direction, name), tensor_type in sorted(o.tensor_types.items(), key=lambda kv: (kv[0][0].name, kv[0][1])):
        out[f"{direction.name.lower()}_tensor_type.{name}"] = tensor_type.name
    if o.shape_sets:
        out["shapes"] = [{n: list(s) for n, s in sig.items()} for sig in o.shape_sets]
    if o.cache_dir is not None:
        out["cache_dir"] = str(o.cache_dir)
    if o.hw_format:
        out["hw_format"] = {n: {k: v.name for k, v in (("memory_layout", f.memory_layout),
                                                        ("data_type", f.data_type)) if v is not None}
                            for n, f in o.hw_format.items()}
    if o.engine_options:
        try:
            json.dumps(dict(o.engine_options))
        except (TypeError, ValueError):
            raise ValueError(f"option 'engine_options' {dict(o.engine_options)!r}: a service takes values that "
                             "JSON carries (strings, numbers, booleans)") from None
        out["engine_options"] = dict(o.engine_options)
    return out


def client_options(raw: Mapping[str, Any] | None) -> dict[str, Any]:
    """The options of a raw option dict that a client's runner keeps for itself."""
    return {k: v for k, v in (raw or {}).items() if k in CLIENT_OPTIONS}


def merge_served(defaults: Mapping[str, Any], requested: Mapping[str, Any]) -> tuple[RunnerOptions, str]:
    """A served runner's options: the service's defaults for the model, overridden by what a client asked for;
    and the key of that served runner (equal options share one). ValueError for bad options."""
    if not isinstance(requested, Mapping):
        raise ValueError(f"options must be an object, got {type(requested).__name__}")
    local = sorted(set(requested) & CLIENT_OPTIONS)
    if local:
        raise ValueError(f"options {local} are the client's own, not the service's")
    options = parse_options({**defaults, **requested})
    return options, json.dumps(served_options(options, {**defaults, **requested}), sort_keys=True)


def view_mismatch(client: RunnerOptions, served: RunnerOptions) -> list[str]:
    """The view-deciding options on which a client's runner and the served runner differ."""
    return [f for f in VIEW_FIELDS if getattr(client, f) != getattr(served, f)]


# ---------------------------------------------------------------------------------------------- the socket
def default_socket_path() -> Path:
    """``$NPURT_SERVICE``, else ``$XDG_RUNTIME_DIR/npurt/serve.sock``, else ``/tmp/npurt-<uid>/serve.sock``."""
    env = os.environ.get(SOCKET_ENV)
    if env:
        return Path(env)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) / "npurt" if runtime else Path(f"/tmp/npurt-{os.getuid()}")
    return base / "serve.sock"
