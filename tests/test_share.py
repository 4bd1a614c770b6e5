"""npurt.share: tensors handed between processes over AF_UNIX sockets, against real peers and hostile ones."""

from __future__ import annotations

import array
import fcntl
import json
import os
import resource
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npurt import (
    DataType,
    MemoryLayout,
    MemoryType,
    NpuTensor,
    NpuTensorInfo,
    TensorDirection,
    TensorType,
)
from npurt.share import HEADER, MAGIC, MAX_PAYLOAD, VERSION, recv_tensors, send_tensors
from npurt.tensor import PAGE_SIZE, allocate_tensor, sub_tensor
from tests.helpers.procstat import fd_set, fd_targets, leaked_fds, open_fds, rss_bytes

SEALED = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def info(name="x", shape=(1, 3, 8, 8), dtype=DataType.FLOAT32, **kw) -> NpuTensorInfo:
    kw.setdefault("tensor_type", TensorType.CPU)
    return NpuTensorInfo(name=name, data_type=dtype, shape=shape, **kw)


def memfd(size: int, seals: int = SEALED) -> int:
    fd = os.memfd_create("peer", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


@pytest.fixture(params=[socket.SOCK_STREAM, socket.SOCK_SEQPACKET], ids=["stream", "seqpacket"])
def pair(request):
    a, b = socket.socketpair(socket.AF_UNIX, request.param)
    yield a, b
    a.close()
    b.close()


# ---------------------------------------------------------------------------------------------- round trips
def test_round_trip_keeps_every_field_and_shares_the_memory(pair):
    a, b = pair
    plain = allocate_tensor(info("frame"), provider="memfd")
    odd = allocate_tensor(info("hw", shape=(2, 3, 5), dtype=DataType.BF16, tensor_type=TensorType.HW,
                               direction=TensorDirection.OUTPUT, memory_layout=MemoryLayout.GENERIC,
                               memory_layout_order=(0, 2, 1), strides=(48, 16, 3), size_in_bytes=200),
                          provider="memfd")
    plain.numpy()[...] = np.arange(192, dtype=np.float32).reshape(1, 3, 8, 8)
    before = open_fds()
    send_tensors(a, [plain, odd])
    got = recv_tensors(b, timeout=5)
    assert [t.info for t in got] == [plain.info, odd.info]
    assert all(t.memory_type is MemoryType.DMA_FD and t.provider == "memfd" for t in got)
    assert open_fds() == before + 2  # one duplicate per received tensor, nothing else
    assert np.array_equal(got[0].numpy(), plain.numpy())
    got[0].numpy()[0, 2, 7, 7] = -1
    assert plain.numpy()[0, 2, 7, 7] == -1
    got[1].numpy()[1, 2, 4] = 0x3F80
    assert odd.numpy()[1, 2, 4] == 0x3F80
    assert isinstance(got[0].get_buffer(), int) and os.fstat(got[0].get_buffer()).st_size >= plain.nbytes
    del got
    assert open_fds() == before


def test_sub_tensors_travel_as_their_parents_fd_and_offset():
    a, b = socket.socketpair()
    with a, b:
        parent = allocate_tensor(info("batch", shape=(4, 1024), dtype=DataType.UINT8), provider="memfd")
        rows = [sub_tensor(parent, info(f"row{i}", shape=(1024,), dtype=DataType.UINT8), 1024 * i) for i in range(4)]
        for i, row in enumerate(rows):
            row.numpy()[...] = i + 1
        send_tensors(a, rows)
        data, ancillary, flags, _ = b.recvmsg(HEADER.size + MAX_PAYLOAD, socket.CMSG_SPACE(64))
        fds = array.array("i")
        fds.frombytes(ancillary[0][2])
        try:
            assert len(fds) == 1  # one buffer, one fd
            entries = json.loads(data[HEADER.size:])["tensors"]
            assert [(e["fd"], e["offset"]) for e in entries] == [(0, 0), (0, 1024), (0, 2048), (0, 3072)]
        finally:
            for fd in fds:
                os.close(fd)
        send_tensors(a, rows[1:3])
        got = recv_tensors(b)
        assert [t.numpy()[0] for t in got] == [2, 3] and [t.offset for t in got] == [1024, 2048]


def test_datagram_sockets_work_too():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with a, b:
        t = allocate_tensor(info(), provider="memfd")
        send_tensors(a, [t])
        (got,) = recv_tensors(b)
        got.numpy()[...] = 4
        assert t.numpy().min() == 4


def test_unexportable_tensors_raise_on_send():
    a, b = socket.socketpair()
    with a, b:
        user = NpuTensor(info("user"), np.zeros((1, 3, 8, 8), np.float32))
        with pytest.raises(ValueError, match=r"'user'.*user memory.*no fd"):
            send_tensors(a, [user])
        host = allocate_tensor(info("host"), provider="host")
        with pytest.raises(ValueError, match=r"'host'.*host memory.*no fd"):
            send_tensors(a, [host])
        with pytest.raises(ValueError, match="sequence of NpuTensor"):
            send_tensors(a, host)
        with pytest.raises(ValueError, match="item 0 is a ndarray"):
            send_tensors(a, [np.zeros(3)])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as inet:
        with pytest.raises(ValueError, match="AF_UNIX"):
            send_tensors(inet, [allocate_tensor(info(), provider="memfd")])


def test_timeout_raises_and_restores_the_socket_setting():
    a, b = socket.socketpair()
    with a, b:
        with pytest.raises(TimeoutError):
            recv_tensors(b, timeout=0.05)
        assert b.gettimeout() is None


# ---------------------------------------------------------------------------------------------- other processes
CHILD = textwrap.dedent("""
    import socket, sys
    import numpy as np
    from npurt.share import recv_tensors, send_tensors
    from npurt.tensor import allocate_tensor

    sock = socket.socket(fileno=int(sys.argv[1]))
    (frame,) = recv_tensors(sock, timeout=60)
    x = frame.numpy()
    assert (x == 1.0).all(), "child does not see the parent's data"
    x[:, :, :4] = 2.0                       # the child writes the top half
    sock.sendall(b"wrote")
    assert sock.recv(5) == b"check"
    assert (x[:, :, 4:] == 3.0).all(), "child does not see the parent's later write"
    own = allocate_tensor(frame.info.replace(name="from_child"), provider="memfd")
    own.numpy()[...] = 7.0
    send_tensors(sock, [own])
    assert sock.recv(4) == b"done"
    assert (own.numpy() == 8.0).all(), "child does not see the parent's write into its tensor"
    sock.sendall(b"ok")
""")


def test_parent_and_child_write_the_same_tensor_and_see_each_others_writes():
    parent_end, child_end = socket.socketpair()
    frame = allocate_tensor(info("frame"), provider="memfd")
    frame.numpy()[...] = 1.0
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(child_end.fileno())], pass_fds=[child_end.fileno()],
                             stderr=subprocess.PIPE)
    child_end.close()
    with parent_end:
        try:
            send_tensors(parent_end, [frame])
            assert parent_end.recv(5) == b"wrote"
            x = frame.numpy()
            assert (x[:, :, :4] == 2.0).all() and (x[:, :, 4:] == 1.0).all()
            x[:, :, 4:] = 3.0
            parent_end.sendall(b"check")
            (theirs,) = recv_tensors(parent_end, timeout=60)
            assert theirs.info.name == "from_child" and (theirs.numpy() == 7.0).all()
            theirs.numpy()[...] = 8.0
            parent_end.sendall(b"done")
            assert parent_end.recv(2) == b"ok"
        except Exception as e:
            child.kill()
            _, err = child.communicate(timeout=60)
            raise AssertionError(f"{e!r}; the child said: {err.decode()}") from e
        _, err = child.communicate(timeout=60)
        assert child.returncode == 0, err.decode()
    # the child is gone; the memory it allocated lives on in this process's mapping
    assert (theirs.numpy() == 8.0).all()


DYING_PEER = textwrap.dedent("""
    import array, os, signal, socket, struct, sys
    sock = socket.socket(fileno=int(sys.argv[1]))
    fd = os.memfd_create("dying", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, 4096)
    header = struct.pack("<4sHHI", b"NPUT", 1, 0, 1000)
    if sys.argv[2] == "mid-message":
        fds = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
        sock.sendmsg([header + b'{"tensors":[{"name":'], fds)
    os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.parametrize("when, match", [("mid-message", "after 20 of 1000 bytes of the metadata"),
                                         ("before-sending", "peer closed the connection")])
def test_a_peer_that_dies_gives_a_clean_error(when, match):
    mine, theirs = socket.socketpair()
    peer = subprocess.Popen([sys.executable, "-c", DYING_PEER, str(theirs.fileno()), when],
                            pass_fds=[theirs.fileno()])
    theirs.close()
    with mine:
        before = open_fds()
        with pytest.raises(ConnectionError, match=match):
            recv_tensors(mine, timeout=60)
        assert open_fds() == before  # the fd that came with the half message was closed
    assert peer.wait(timeout=60) == -9


# ---------------------------------------------------------------------------------------------- hostile senders
def entry(**changes) -> dict:
    e = {"name": "x", "data_type": "UINT8", "shape": [16], "strides": [1], "layout": "UNKNOWN", "layout_order": [],
         "direction": "INPUT", "tensor_type": "CPU", "size_in_bytes": 16, "fd": 0, "offset": 0, "provider": "memfd"}
    e.update(changes)
    return e


def raw_send(sock: socket.socket, payload: bytes | dict, fds: list[int], header: bytes | None = None) -> None:
    if isinstance(payload, dict):
        payload = json.dumps(payload).encode()
    if header is None:
        header = HEADER.pack(MAGIC, VERSION, 0, len(payload))
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sock.sendmsg([header + payload], ancillary)


def one(**changes) -> dict:
    return {"tensors": [entry(**changes)]}


def _pipe_read_end() -> int:
    r, w = os.pipe()
    os.close(w)
    return r


def _file_fd(tmp_path) -> int:
    path = tmp_path / "plain.bin"
    path.write_bytes(bytes(PAGE_SIZE))
    return os.open(path, os.O_RDWR)


# (id, make the fds to send, the payload, the error it must give)
HOSTILE: list[tuple[str, Callable, object, str]] = [
    ("unsealed memfd", lambda tmp: [memfd(PAGE_SIZE, seals=0)], one(), "memfd without F_SEAL_SHRINK"),
    ("memfd smaller than the info", lambda tmp: [memfd(PAGE_SIZE)], one(shape=[8192], strides=[1], size_in_bytes=8192),
     "holds 4096 bytes; asked for 8192"),
    ("offset past the end", lambda tmp: [memfd(PAGE_SIZE)], one(offset=2 * PAGE_SIZE), "holds 4096 bytes"),
    ("offset between elements", lambda tmp: [memfd(PAGE_SIZE)],
     one(data_type="FLOAT32", strides=[1], size_in_bytes=64, offset=2), "not aligned to its 4-byte"),
    ("a pipe", lambda tmp: [_pipe_read_end()], one(), "is a pipe"),
    ("a socket", lambda tmp: [socket.socket(socket.AF_UNIX).detach()], one(), "is a socket"),
    ("a regular file", lambda tmp: [_file_fd(tmp)], one(provider="file"), "regular file.*truncate"),
    ("output over write-sealed memory", lambda tmp: [memfd(PAGE_SIZE, SEALED | fcntl.F_SEAL_WRITE)],
     one(direction="OUTPUT"), "read-only"),
    ("provider lie", lambda tmp: [memfd(PAGE_SIZE)], one(provider="dma_heap:system"), "says provider"),
    ("host provider", lambda tmp: [memfd(PAGE_SIZE)], one(provider="host"), "says provider 'host'"),
    ("not UTF-8", lambda tmp: [memfd(PAGE_SIZE)], b"\xff\xfe\x00garbage", "not UTF-8 JSON"),
    ("not JSON", lambda tmp: [memfd(PAGE_SIZE)], b"{tensors: 1}", "not UTF-8 JSON"),
    ("deep nesting", lambda tmp: [memfd(PAGE_SIZE)], b"[" * 100_000, "not UTF-8 JSON"),
    ("not an object", lambda tmp: [memfd(PAGE_SIZE)], b"[1, 2]", "not {\"tensors\""),
    ("missing field", lambda tmp: [memfd(PAGE_SIZE)],
     {"tensors": [{k: v for k, v in entry().items() if k != "strides"}]}, "fields"),
    ("extra field", lambda tmp: [memfd(PAGE_SIZE)], one(evil=1), "fields"),
    ("entry not an object", lambda tmp: [memfd(PAGE_SIZE)], {"tensors": [7]}, "fields int"),
    ("unknown dtype", lambda tmp: [memfd(PAGE_SIZE)], one(data_type="FLOAT99"), "not a DataType"),
    ("dtype by number", lambda tmp: [memfd(PAGE_SIZE)], one(data_type=10), "not a DataType"),
    ("UNKNOWN dtype", lambda tmp: [memfd(PAGE_SIZE)], one(data_type="UNKNOWN"), "UNKNOWN"),
    ("negative dim", lambda tmp: [memfd(PAGE_SIZE)], one(shape=[-16]), "shape"),
    ("bool dim", lambda tmp: [memfd(PAGE_SIZE)], one(shape=[True]), "shape"),
    ("float dim", lambda tmp: [memfd(PAGE_SIZE)], one(shape=[16.0]), "shape"),
    ("huge shape", lambda tmp: [memfd(PAGE_SIZE)], one(shape=[1 << 45]), "shape"),
    ("too many dims", lambda tmp: [memfd(PAGE_SIZE)], one(shape=[1] * 64, strides=[1] * 64), "shape"),
    ("strides do not match", lambda tmp: [memfd(PAGE_SIZE)], one(strides=[1, 1]), "2 strides for a 1-d shape"),
    ("size below the span", lambda tmp: [memfd(PAGE_SIZE)], one(size_in_bytes=3), "smaller than the 16 bytes"),
    ("order not a permutation", lambda tmp: [memfd(PAGE_SIZE)], one(layout="GENERIC", layout_order=[3]),
     "not a permutation"),
    ("empty name", lambda tmp: [memfd(PAGE_SIZE)], one(name=""), "name"),
    ("huge name", lambda tmp: [memfd(PAGE_SIZE)], one(name="n" * 5000), "name"),
    ("name not a string", lambda tmp: [memfd(PAGE_SIZE)], one(name=["x"]), "name"),
    ("negative offset", lambda tmp: [memfd(PAGE_SIZE)], one(offset=-4096), "offset"),
    ("fd index out of range", lambda tmp: [memfd(PAGE_SIZE)], one(fd=7), "refers to fds \\[7\\].*carried 1"),
    ("fd index not an int", lambda tmp: [memfd(PAGE_SIZE)], one(fd="0"), "fd '0'"),
    ("no fds at all", lambda tmp: [], one(), "carried 0 fds"),
    ("more fds than used", lambda tmp: [memfd(PAGE_SIZE), memfd(PAGE_SIZE)], one(), "refers to fds \\[0\\].*carried 2"),
]


@pytest.mark.parametrize("make_fds, payload, match", [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_hostile_sender_gets_a_clean_error_and_the_receiver_lives_on(pair, tmp_path, make_fds, payload, match):
    a, b = pair
    before = fd_set()
    fds = make_fds(tmp_path)
    targets = fd_targets(fds)
    raw_send(a, payload, fds)
    for fd in fds:
        os.close(fd)
    with pytest.raises(ValueError, match=match):
        recv_tensors(b, timeout=5)
    # every received fd was closed (fds that other threads open or close meanwhile do not count: a count would)
    assert leaked_fds(before, targets) == []
    # the same connection still carries the next, honest message
    good = allocate_tensor(info(), provider="memfd")
    send_tensors(a, [good])
    (got,) = recv_tensors(b, timeout=5)
    got.numpy()[0, 0, 0, 0] = 9
    assert good.numpy()[0, 0, 0, 0] == 9


@pytest.mark.parametrize("header, payload, match", [
    (HEADER.pack(b"EVIL", VERSION, 0, 2), b"{}", "not an npurt tensor message"),
    (HEADER.pack(MAGIC, 99, 0, 2), b"{}", "version 99"),
    (HEADER.pack(MAGIC, VERSION, 0, 1 << 30), b"{}", "exceeds the 262144-byte limit"),
    (HEADER.pack(MAGIC, VERSION, 0, 100), b"{}", "truncated message: 2 bytes of metadata, the header says 100"),
    (b"NPU", b"", "truncated message: 3 bytes"),
], ids=["magic", "version", "oversized", "short payload", "short header"])
def test_bad_headers_give_clean_errors(header, payload, match):
    # SOCK_SEQPACKET keeps message boundaries, so the receiver can carry on after a broken message.
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with a, b:
        before = open_fds()
        fd = memfd(PAGE_SIZE)
        raw_send(a, payload, [fd], header=header)
        os.close(fd)
        with pytest.raises(ValueError, match=match):
            recv_tensors(b, timeout=5)
        assert open_fds() == before
        good = allocate_tensor(info(), provider="memfd")
        send_tensors(a, [good])
        assert recv_tensors(b, timeout=5)[0].info == good.info


def test_truncated_stream_message_is_detected():
    a, b = socket.socketpair()
    with b:
        fd = memfd(PAGE_SIZE)
        raw_send(a, b'{"tensors"', [fd], header=HEADER.pack(MAGIC, VERSION, 0, 500))
        os.close(fd)
        a.close()
        before = open_fds()
        with pytest.raises(ConnectionError, match="after 10 of 500 bytes.*truncated"):
            recv_tensors(b, timeout=5)
        assert open_fds() == before  # the fd that arrived with the message is closed as well


def test_truncated_control_data_is_detected():
    # A receiver near its fd limit cannot take every fd: the kernel sets MSG_CTRUNC and drops the rest.
    a, b = socket.socketpair()
    with a, b:
        fd = memfd(PAGE_SIZE)
        raw_send(a, one(), [fd] * 200)
        os.close(fd)
        before = open_fds()
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        in_use = {int(n) for n in os.listdir("/proc/self/fd")}
        limit, free = 0, 0
        while free < 3:  # leave three free fd numbers below the limit
            free += limit not in in_use
            limit += 1
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
        try:
            with pytest.raises(ValueError, match="control data truncated"):
                recv_tensors(b, timeout=5)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert open_fds() == before


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 64), 1 << 64) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(sorted(entry())), value=json_values, noise=st.binary(max_size=64))
def test_fuzzed_metadata_never_crashes_or_leaks(field, value, noise):
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with a, b:
        before = open_fds()
        fd = memfd(PAGE_SIZE)
        raw_send(a, one(**{field: value}), [fd])
        raw_send(a, noise, [fd])
        os.close(fd)
        for _ in range(2):
            try:
                got = recv_tensors(b, timeout=5)
            except ValueError:
                continue
            # a mutation that still describes a valid tensor over this memfd is fine: it must map it
            assert all(t.info.size_in_bytes <= PAGE_SIZE for t in got)
            del got
        assert open_fds() == before


def test_ten_thousand_share_cycles_leave_fds_and_rss_alone():
    # Margin: 8 MiB of RSS for allocator and interpreter noise; a leaked 64 KiB touched mapping per cycle
    # would add 625 MiB, a leaked fd shows at once.
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with a, b:
        src = allocate_tensor(info(shape=(16384,)), provider="memfd")

        def cycle(n: int) -> None:
            for i in range(n):
                send_tensors(a, [src])
                (t,) = recv_tensors(b)
                t.numpy()[i % 16384] += 1.0

        cycle(200)
        fds, rss = open_fds(), rss_bytes()
        cycle(10_000)
        assert open_fds() == fds
        assert rss_bytes() - rss < 8 << 20
        assert float(src.numpy().sum()) == 10_200.0
