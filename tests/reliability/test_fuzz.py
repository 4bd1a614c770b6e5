"""Fuzzing the native entry points and the share message parser with hypothesis: whatever they are fed,
they return or raise a Python exception; the interpreter never crashes (a crash fails the whole run) and
no fd is left open."""

from __future__ import annotations

import json
import os
import socket
import struct
import tempfile

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npurt import DataType, NpuError, _native
from npurt.share import HEADER, MAGIC, VERSION, recv_tensors
from tests.helpers.procstat import fd_set, fd_targets, leaked_fds

CONVERT_EXAMPLES = 400
IMPORT_EXAMPLES = 300
SHARE_EXAMPLES = 300
PAGE = os.sysconf("SC_PAGE_SIZE")
EXPECTED = (ValueError, TypeError, OverflowError, OSError, NpuError, ConnectionError, TimeoutError)

dims = st.integers(0, 6) | st.sampled_from([1 << 31, 1 << 62, -1])
strides = st.integers(-3, 64) | st.sampled_from([1 << 40, (1 << 62) + 1, -(1 << 40)])


# The enums' members, enums made from values they do not have (a ValueError) and plain ints (a TypeError).
element_types = st.sampled_from(list(_native.ElementType.__members__.values())) | \
    st.integers(-1, 14).map(_native.ElementType) | st.integers(-1, 14)
roundings = st.sampled_from(list(_native.Rounding.__members__.values())) | st.integers(-1, 4).map(_native.Rounding) | \
    st.integers(-1, 4)
paddings = st.none() | st.tuples(st.integers(-1, 7), st.integers(-1, 7), st.integers(-1, 7), st.integers(-1, 7),
                                 st.booleans())


@settings(max_examples=CONVERT_EXAMPLES, deadline=None)
@given(src_len=st.integers(0, 600), dst_len=st.integers(0, 600), src_type=element_types, dst_type=element_types,
       shape=st.lists(dims, max_size=6), data=st.data(), scale=st.floats(allow_nan=True, allow_infinity=True),
       zero_point=st.floats(-300, 300), rounding=roundings, pad_fields=paddings, read_only_dst=st.booleans())
def test_convert_kernels(src_len, dst_len, src_type, dst_type, shape, data, scale, zero_point, rounding,
                         pad_fields, read_only_dst):
    src = np.random.default_rng(src_len).integers(0, 256, src_len, dtype=np.uint8)
    dst = bytes(dst_len) if read_only_dst else np.zeros(dst_len, np.uint8)
    src_strides = data.draw(st.lists(strides, min_size=len(shape), max_size=len(shape)))
    dst_strides = data.draw(st.lists(strides, min_size=len(shape), max_size=len(shape)))
    try:
        pad = None if pad_fields is None else _native.ChannelPadding(
            group_axis=pad_fields[0], lane_axis=pad_fields[1], channels=pad_fields[2], group_size=pad_fields[3],
            dst_padded=pad_fields[4])
        _native.convert_strided(src, src_type, dst, dst_type, shape, src_strides, dst_strides, scale, zero_point,
                                rounding, pad)
    except EXPECTED:
        pass


def _memfd(size: int, seals: int) -> int:
    fd = os.memfd_create("fuzz", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


def _fd_of(kind: str, size: int, seals: int) -> int:
    if kind == "memfd":
        return _memfd(size, seals)
    if kind == "pipe":
        r, w = os.pipe()
        os.close(w)
        return r
    if kind == "devnull":
        return os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    if kind == "file":
        fd, path = tempfile.mkstemp()
        os.ftruncate(fd, size)
        os.unlink(path)
        return fd
    if kind == "socket":
        a, b = socket.socketpair()
        b.close()
        return a.detach()
    if kind == "closed":
        fd = os.open(os.devnull, os.O_RDONLY)
        os.close(fd)
        return fd
    return {"negative": -1, "huge": 1 << 30}[kind]


@settings(max_examples=IMPORT_EXAMPLES, deadline=None)
@given(kind=st.sampled_from(["memfd", "pipe", "devnull", "file", "socket", "closed", "negative", "huge"]),
       real=st.integers(0, 4 * PAGE), seals=st.sampled_from([0, 1, 2, 3, 4, 8, 15]),
       size=st.integers(0, 5 * PAGE) | st.sampled_from([1 << 63, (1 << 64) - 1, -1]),
       offset=st.integers(0, 5 * PAGE) | st.sampled_from([-PAGE, 1 << 62, 3]), allow_file=st.booleans())
def test_fd_import(kind, real, seals, size, offset, allow_file):
    before = fd_set()
    fd = _fd_of(kind, real, seals)
    targets = fd_targets([fd])
    try:
        buf = _native.Buffer.import_fd(fd, size, offset, allow_file)
    except EXPECTED:
        pass
    else:
        view = np.frombuffer(buf, np.uint8)
        assert view.size == size
        if size:  # read the first and last byte: they must be backed (no SIGBUS); a write-sealed memfd maps
            _ = int(view[0]), int(view[-1])  # read-only, so reading is the touch every kind allows
        del view, buf
    finally:
        if fd >= 0 and kind not in ("closed", "huge"):
            os.close(fd)
    assert not leaked_fds(before, targets)  # no duplicate of the fd is left open


def _entry(**over):
    entry = {"name": "x", "data_type": "FLOAT32", "shape": [4], "strides": [1], "layout": "UNKNOWN",
             "layout_order": [], "direction": "INPUT", "tensor_type": "CPU", "size_in_bytes": 16, "fd": 0,
             "offset": 0, "provider": "memfd"}
    entry.update(over)
    return entry


json_values = st.recursive(st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.floats() |
                           st.text(max_size=8), lambda c: st.lists(c, max_size=4) |
                           st.dictionaries(st.text(max_size=6), c, max_size=4), max_leaves=10)


@settings(max_examples=SHARE_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.sampled_from(["raw", "header", "entry"]), noise=st.binary(max_size=300),
       field=st.sampled_from(sorted(_entry())), value=json_values,
       fd_kinds=st.lists(st.sampled_from(["memfd", "sealed", "pipe", "file"]), max_size=3),
       declared=st.integers(0, 1 << 20) | st.just((1 << 32) - 1), magic=st.sampled_from([MAGIC, b"NPUX"]),
       version=st.sampled_from([VERSION, 0, 9]))
def test_share_message_parsing(shape, noise, field, value, fd_kinds, declared, magic, version):
    before = fd_set()
    if shape == "raw":
        message = noise or b"\0"
    elif shape == "header":
        message = HEADER.pack(magic, version, 0, declared) + noise
    else:
        payload = json.dumps({"tensors": [_entry(**{field: value})]}).encode()
        message = HEADER.pack(MAGIC, VERSION, 0, len(payload)) + payload
    fds = [_fd_of("memfd" if k != "pipe" else "pipe", 64, 1 if k == "sealed" else 0) if k != "file"
           else _fd_of("file", 64, 0) for k in fd_kinds]
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    targets = fd_targets(fds)
    try:
        socket.send_fds(a, [message], fds)
        a.close()
        try:
            tensors = recv_tensors(b, timeout=2)
        except EXPECTED:
            pass
        else:
            for t in tensors:
                t.numpy()  # whatever was accepted is mapped and readable
            del tensors
    finally:
        for fd in fds:
            os.close(fd)
        b.close()
        a.close()
    assert not leaked_fds(before, targets)  # no received fd is left open


def test_header_struct_is_what_the_fuzzer_speaks():
    assert HEADER.size == struct.calcsize("<4sHHI") and DataType.FLOAT32.name == "FLOAT32"
