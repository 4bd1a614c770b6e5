"""Handing tensors to another process by file descriptor, over an AF_UNIX socket.

``send_tensors(sock, tensors)`` sends one message: a fixed header, a compact JSON description of every
tensor (name, shape, dtype, layout and order, strides, direction, tensor type, offset, size, provider)
and the tensors' fds as SCM_RIGHTS ancillary data (one fd per distinct buffer: sub-tensors of one parent
travel as the parent's fd plus their offsets). ``recv_tensors(sock)`` maps the same memory in the
receiving process; writes on either side are visible to the other. No tensor data is copied.

Wire format (version 1)::

    header   struct "<4sHHI": magic b"NPUT", version, reserved (0), payload length (<= MAX_PAYLOAD)
    payload  UTF-8 JSON {"tensors": [{"name", "data_type", "shape", "strides", "layout", "layout_order",
             "direction", "tensor_type", "size_in_bytes", "fd", "offset", "provider"}, ...]}
             where "fd" indexes the message's fds and enums travel by name.

The receiver trusts nothing it is sent. It receives with MSG_CMSG_CLOEXEC, detects truncated control data
(MSG_CTRUNC) and truncated or oversized messages, validates every field, accepts only dma-bufs and memfds
sealed against shrinking (a regular file or an unsealed memfd could be truncated under the mapping and
kill the receiver with SIGBUS), closes every fd it receives (each tensor keeps its own duplicate), and
raises ValueError (bad message), NpuError (memory that passes the checks but cannot be mapped),
ConnectionError (peer gone) or TimeoutError. After an error in the header or a short read on a stream
socket the stream is out of step: close the connection.
"""

from __future__ import annotations

import array
import json
import os
import socket
import struct
from collections.abc import Sequence
from typing import Any

from .tensor import NpuTensor, import_dma_fd
from .types import (
    DataType,
    MemoryLayout,
    NpuError,
    NpuTensorInfo,
    TensorDirection,
    TensorType,
)

MAGIC = b"NPUT"
VERSION = 1
HEADER = struct.Struct("<4sHHI")
MAX_PAYLOAD = 256 * 1024  # bytes of JSON; a tensor entry is ~300 bytes
MAX_FDS = 253  # SCM_MAX_FD: the kernel's limit of fds in one message
MAX_TENSORS = 1024
MAX_NAME = 1024
MAX_DIMS = 32
MAX_DIM = 1 << 40

_ANCILLARY_SIZE = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
_FIELDS = frozenset({"name", "data_type", "shape", "strides", "layout", "layout_order", "direction", "tensor_type",
                     "size_in_bytes", "fd", "offset", "provider"})


# ---------------------------------------------------------------------------------------------- send
def send_tensors(sock: socket.socket, tensors: Sequence[NpuTensor]) -> None:
    """Send ``tensors`` (their metadata and fds) in one message over the AF_UNIX socket ``sock``.

    Every tensor must be fd-backed (runner-allocated memfd / dma-buf memory, or DMA_FD); user and host
    memory cannot cross a process boundary without a copy and raise ValueError.
    """
    _check_socket(sock)
    if isinstance(tensors, NpuTensor) or not isinstance(tensors, Sequence):
        raise ValueError(f"send_tensors needs a sequence of NpuTensor, got {type(tensors).__name__}")
    if len(tensors) > MAX_TENSORS:
        raise ValueError(f"send_tensors: {len(tensors)} tensors in one message, the limit is {MAX_TENSORS}")
    fds: list[int] = []
    fd_index: dict[int, int] = {}  # id(native buffer) -> index in fds
    entries = []
    for i, t in enumerate(tensors):
        if not isinstance(t, NpuTensor):
            raise ValueError(f"send_tensors: item {i} is a {type(t).__name__}, not an NpuTensor")
        info = t.info
        native = t.native
        if native is None or native.fd < 0:
            raise ValueError(
                f"tensor {info.name!r}: {t.provider} memory ({t.memory_type.name}) has no fd and cannot be shared "
                "without a copy; allocate it with runner.allocate_npu_tensor() or npurt.tensor.allocate_tensor()"
            )
        key = id(native)
        if key not in fd_index:
            fd_index[key] = len(fds)
            fds.append(native.fd)  # borrowed: SCM_RIGHTS takes its own reference while in flight
        entries.append({
            "name": info.name, "data_type": info.data_type.name, "shape": list(info.shape),
            "strides": list(info.strides), "layout": info.memory_layout.name,
            "layout_order": list(info.memory_layout_order), "direction": info.direction.name,
            "tensor_type": info.tensor_type.name, "size_in_bytes": info.size_in_bytes, "fd": fd_index[key],
            "offset": t.offset, "provider": t.provider,
        })
    if len(fds) > MAX_FDS:
        raise ValueError(f"send_tensors: {len(fds)} distinct buffers in one message, the kernel allows {MAX_FDS}")
    payload = json.dumps({"tensors": entries}, separators=(",", ":")).encode()
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"send_tensors: metadata of {len(payload)} bytes exceeds the {MAX_PAYLOAD}-byte limit")
    message = HEADER.pack(MAGIC, VERSION, 0, len(payload)) + payload
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sent = sock.sendmsg([message], ancillary)
    if sent < len(message):
        if sock.type != socket.SOCK_STREAM:
            raise ConnectionError(f"send_tensors: sent {sent} of {len(message)} bytes of a datagram")
        sock.sendall(message[sent:])  # the fds went with the first byte


# ---------------------------------------------------------------------------------------------- receive
def recv_tensors(sock: socket.socket, timeout: float | None = None) -> list[NpuTensor]:
    """Receive one ``send_tensors`` message and map its tensors (MemoryType.DMA_FD) in this process.

    ``timeout`` (seconds) bounds the wait for the message; None keeps the socket's own setting.
    """
    _check_socket(sock)
    saved = sock.gettimeout()
    if timeout is not None:
        sock.settimeout(timeout)
    fds: list[int] = []
    try:
        payload = _receive(sock, fds)
        return _tensors_from(payload, fds)
    finally:
        # Every tensor holds its own duplicate of its fd; the received numbers are ours to close.
        for fd in fds:
            os.close(fd)
        if timeout is not None:
            sock.settimeout(saved)


def _check_socket(sock: Any) -> None:
    if not isinstance(sock, socket.socket):
        raise ValueError(f"expected a socket.socket, got {type(sock).__name__}")
    if sock.family != socket.AF_UNIX:
        raise ValueError(f"fds can only travel over AF_UNIX sockets, this one is {sock.family!r}")


def _received_fds(ancillary: list[tuple[int, int, bytes]], fds: list[int]) -> None:
    """Append every fd in the control messages to ``fds`` (so the caller closes them whatever happens)."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            got = array.array("i")
            got.frombytes(data[: len(data) - len(data) % got.itemsize])
            fds.extend(got)


def _recv_exact(sock: socket.socket, n: int, what: str) -> bytes:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(min(n - len(chunks), 1 << 20))
        if not chunk:
            raise ConnectionError(f"recv_tensors: peer closed the connection after {len(chunks)} of {n} bytes "
                                  f"of the {what} (truncated message)")
        chunks += chunk
    return bytes(chunks)


def _receive(sock: socket.socket, fds: list[int]) -> bytes:
    """One message's payload; the fds that came with it are appended to ``fds``."""
    stream = sock.type == socket.SOCK_STREAM
    # On a stream read exactly the header first, so as never to eat into the next message.
    want = HEADER.size if stream else HEADER.size + MAX_PAYLOAD + 1
    data, ancillary, flags, _ = sock.recvmsg(want, _ANCILLARY_SIZE, socket.MSG_CMSG_CLOEXEC)
    _received_fds(ancillary, fds)
    if flags & socket.MSG_CTRUNC:
        raise ValueError(f"recv_tensors: control data truncated (more than {MAX_FDS} fds, or fds refused by the "
                         "kernel): the message's fds were lost")
    if not data:
        if sock.type == socket.SOCK_DGRAM:
            raise ValueError("recv_tensors: empty datagram")
        raise ConnectionError("recv_tensors: peer closed the connection")
    if stream and len(data) < HEADER.size:
        data += _recv_exact(sock, HEADER.size - len(data), "header")
    if len(data) < HEADER.size:
        raise ValueError(f"recv_tensors: truncated message: {len(data)} bytes, the header alone is {HEADER.size}")
    magic, version, _reserved, length = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ValueError(f"recv_tensors: not an npurt tensor message (magic {magic!r}, expected {MAGIC!r})")
    if version != VERSION:
        raise ValueError(f"recv_tensors: message version {version}, this npurt reads version {VERSION}")
    if length > MAX_PAYLOAD:
        raise ValueError(f"recv_tensors: metadata of {length} bytes exceeds the {MAX_PAYLOAD}-byte limit")
    if stream:
        return _recv_exact(sock, length, "metadata")
    if flags & socket.MSG_TRUNC or len(data) != HEADER.size + length:
        raise ValueError(f"recv_tensors: truncated message: {len(data) - HEADER.size} bytes of metadata, "
                         f"the header says {length}")
    return data[HEADER.size:]


def _bad(index: int, what: str) -> ValueError:
    return ValueError(f"recv_tensors: tensor {index}: {what}")


def _int(entry: dict[str, Any], key: str, index: int, low: int, high: int) -> int:
    value = entry[key]
    if type(value) is not int or not low <= value <= high:
        raise _bad(index, f"{key} {value!r} is not an int in [{low}, {high}]")
    return value


def _ints(entry: dict[str, Any], key: str, index: int, high: int) -> list[int]:
    value = entry[key]
    if not isinstance(value, list) or len(value) > MAX_DIMS:
        raise _bad(index, f"{key} {value!r} is not a list of at most {MAX_DIMS} ints")
    for v in value:
        if type(v) is not int or not 0 <= v <= high:
            raise _bad(index, f"{key} {value!r} holds {v!r}, not an int in [0, {high}]")
    return value


def _name(enum_cls: Any, entry: dict[str, Any], key: str, index: int) -> Any:
    value = entry[key]
    if not isinstance(value, str) or value not in enum_cls.__members__:
        raise _bad(index, f"{key} {value!r} is not a {enum_cls.__name__} name")
    return enum_cls[value]


def _tensors_from(payload: bytes, fds: list[int]) -> list[NpuTensor]:
    try:
        doc = json.loads(payload.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"recv_tensors: metadata is not UTF-8 JSON: {str(e)[:200]}") from None
    if not isinstance(doc, dict) or set(doc) != {"tensors"} or not isinstance(doc["tensors"], list):
        raise ValueError("recv_tensors: metadata is not {\"tensors\": [...]}")
    entries = doc["tensors"]
    if len(entries) > MAX_TENSORS:
        raise ValueError(f"recv_tensors: {len(entries)} tensors, the limit is {MAX_TENSORS}")
    specs = []
    used: set[int] = set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or set(entry) != _FIELDS:
            keys = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
            raise _bad(i, f"fields {keys} are not {sorted(_FIELDS)}")
        name = entry["name"]
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
            raise _bad(i, f"name {str(name)[:80]!r} is not a string of 1..{MAX_NAME} characters")
        provider = entry["provider"]
        if not isinstance(provider, str) or len(provider) > 64:
            raise _bad(i, f"provider {str(provider)[:80]!r} is not a provider name")
        fd_index = _int(entry, "fd", i, 0, MAX_FDS - 1)
        offset = _int(entry, "offset", i, 0, 1 << 62)
        try:
            info = NpuTensorInfo(
                name=name,
                data_type=_name(DataType, entry, "data_type", i),
                shape=tuple(_ints(entry, "shape", i, MAX_DIM)),
                strides=tuple(_ints(entry, "strides", i, MAX_DIM)),
                direction=_name(TensorDirection, entry, "direction", i),
                tensor_type=_name(TensorType, entry, "tensor_type", i),
                memory_layout=_name(MemoryLayout, entry, "layout", i),
                memory_layout_order=tuple(_ints(entry, "layout_order", i, MAX_DIMS)),
                size_in_bytes=_int(entry, "size_in_bytes", i, 0, 1 << 62),
            )
        except ValueError as e:
            raise _bad(i, str(e)) from None
        if info.data_type is DataType.UNKNOWN:
            raise _bad(i, "data_type UNKNOWN")
        specs.append((info, fd_index, offset, provider))
        used.add(fd_index)
    if used != set(range(len(fds))):
        raise ValueError(f"recv_tensors: the metadata refers to fds {sorted(used)}, the message carried "
                         f"{len(fds)} fds")
    tensors = []
    for info, fd_index, offset, provider in specs:
        try:
            t = import_dma_fd(info, fds[fd_index], offset, allow_file=False)
        except OSError as e:  # passed the checks but the kernel would not map it (an exporter without mmap, ...)
            raise NpuError(f"recv_tensors: tensor {info.name!r}: {e.strerror or e}") from e
        _check_provider(info.name, provider, t.provider)
        tensors.append(t)
    return tensors


def _check_provider(name: str, claimed: str, found: str) -> None:
    """The sender's provider must agree with what the fd turned out to be."""
    dmabuf_kinds = ("dma_heap:", "dma_buf:", "udmabuf")
    if found == "memfd":
        ok = claimed == "memfd"
    else:
        ok = claimed.startswith(dmabuf_kinds) and found.startswith(dmabuf_kinds)
    if not ok:
        raise ValueError(f"recv_tensors: tensor {name!r}: the sender says provider {claimed!r}, "
                         f"the fd is {found!r} memory")
