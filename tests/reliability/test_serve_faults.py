"""npurt serve under faults: clients and services that die, hostile clients, limits, fairness, who may connect.

Every case ends in a clear error on the side that has to hear it (a FAILURE status with ``last_error``, an
exception from a query, an error reply to a bad message), never a hang, a crash of the service or a leak of its
fds. Raw clients speak the wire protocol (``npurt.serve.protocol``) directly, to send what no npurt client would.
"""

from __future__ import annotations

import array
import fcntl
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import npurt
from npurt import NpuError, StatusCode, TensorDirection
from npurt.serve import protocol as p
from npurt.serve.process import ServiceProcess
from npurt.tensor import allocate_tensor
from tests.helpers.models import model_or_skip
from tests.helpers.ocr import SHAPES, frame

SHAPE = SHAPES["ocr_cls"]
BASE_ARGS = ["--backend", "openvino", "--device", "CPU", "--shape", "x=" + ",".join(map(str, SHAPE)), "--threads", "1"]
LIMITS = ["--max-connections-per-uid", "8", "--max-jobs-per-client", "4", "--max-mapped-mb-per-client", "1",
          "--handshake-timeout", "1", "--send-timeout", "1"]
ROOT = Path(__file__).resolve().parents[2]


def start(tmp: Path, *args: str, name: str = "serve.sock") -> ServiceProcess:
    return ServiceProcess.start({"cls": model_or_skip("ocr_cls")}, tmp / name, [*BASE_ARGS, *args])


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    with start(tmp_path_factory.mktemp("faults"), *LIMITS) as svc:
        yield svc


def fds_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def settle(pid: int, baseline: int, seconds: float = 10.0) -> int:
    """The service's fd count once it is back at ``baseline`` or below (or the time is up). Below is no leak: the
    engine's requests keep their last run's buffers, and after another client's run two of them may share one."""
    deadline = time.monotonic() + seconds
    while (n := fds_of(pid)) > baseline and time.monotonic() < deadline:
        time.sleep(0.05)
    return n


def pair(runner: npurt.Runner):
    x = runner.allocate_npu_tensor(runner.get_tensors_info(TensorDirection.INPUT)[0])
    y = runner.allocate_npu_tensor(runner.get_tensors_info(TensorDirection.OUTPUT)[0])
    x.numpy()[...] = frame(SHAPE, 0)
    return x, y


def warm(service: ServiceProcess) -> int:
    """Run a few jobs on both of the engine's requests, so that what they keep of their last run is already there;
    the service's fd count then."""
    with npurt.connect(service.socket_path) as c, c.open_runner("cls", {"max_concurrent_runs": 2}) as r:
        pairs = [pair(r) for _ in range(2)]
        for _ in range(5):
            jobs = [r.execute_async([[x]], [[y]]) for x, y in pairs]
            assert all(r.wait(j, 30_000) is StatusCode.SUCCESS for j in jobs)
    time.sleep(0.5)
    return fds_of(service.pid)


class Raw:
    """A client that speaks the protocol by hand."""

    def __init__(self, path: Path, hello: bool = True) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.settimeout(10)
        self.sock.connect(str(path))
        if hello:
            kind, status, *_ , doc = self.call(p.HELLO, {"magic": p.MAGIC, "version": p.VERSION, "pid": os.getpid()})
            assert kind == p.REPLY and status == 0, doc

    def send(self, data: bytes, fds: tuple[int, ...] = (), ancdata: list | None = None) -> None:
        anc = ancdata if ancdata is not None else \
            ([(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else [])
        self.sock.sendmsg([data], anc)

    def recv(self) -> tuple[int, int, int, int, dict]:
        data = self.sock.recv(p.MAX_MESSAGE + 1)
        if not data:
            raise ConnectionError("closed")
        kind, status, _, a, b, req = p.unpack(data)
        return kind, status, a, req, p.body_json(data)

    def call(self, kind: int, doc: dict | None = None, a: int = 0, b: int = 0, req: int = 1):
        self.send(p.pack_json(kind, req, doc, a, b) if doc is not None else p.pack(kind, req, a, b))
        return self.recv()

    def close(self) -> None:
        self.sock.close()


_keep: list = []  # the tensors whose fds a hand-made message borrows


def sealed_pair_message(runner_id: int) -> tuple[bytes, list]:
    x = allocate_tensor(npurt.NpuTensorInfo(name="x", data_type=npurt.DataType.FLOAT32, shape=SHAPE),
                        provider="memfd")
    y = allocate_tensor(npurt.NpuTensorInfo(name="save_infer_model/scale_0.tmp_1", data_type=npurt.DataType.FLOAT32,
                                            shape=(1, 2), direction=TensorDirection.OUTPUT), provider="memfd")
    _keep[:] = [x, y]
    return p.pack_tensors(p.BIND, 7, [x, y], a=runner_id, b=1)


def with_fd(ancdata: list, index: int, fd: int) -> list:
    level, kind, data = ancdata[0]
    fds = array.array("i")
    fds.frombytes(bytes(data))
    fds[index] = fd
    return [(level, kind, fds)]


# ---------------------------------------------------------------------------------------------- dying peers
def test_client_killed_mid_job_frees_everything(service):
    baseline = warm(service)
    code = f"""
import sys, numpy as np, npurt
from npurt import TensorDirection, StatusCode
c = npurt.connect({str(service.socket_path)!r})
r = c.open_runner("cls", {{"max_concurrent_runs": 4}})
pairs = [(r.allocate_npu_tensor(r.get_tensors_info(TensorDirection.INPUT)[0]),
          r.allocate_npu_tensor(r.get_tensors_info(TensorDirection.OUTPUT)[0])) for _ in range(4)]
print("ready", flush=True)
while True:
    jobs = [r.execute_async([[x]], [[y]]) for x, y in pairs]
    [r.wait(j, 60_000) for j in jobs if j.status is StatusCode.SUCCESS]
"""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.3)  # jobs in flight, tensors registered
        assert fds_of(service.pid) > baseline
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert settle(service.pid, baseline) <= baseline, "the killed client's memory or connection is still held"
    with npurt.connect(service.socket_path) as c, c.open_runner("cls") as r:
        x, y = pair(r)
        assert r.execute([[x]], [[y]]) is StatusCode.SUCCESS
    assert "disconnected" in service.output()


def test_service_killed_then_restarted_under_a_client(tmp_path):
    svc = start(tmp_path)
    c = npurt.connect(svc.socket_path)
    r = c.open_runner("cls", {"max_concurrent_runs": 8})
    x, y = pair(r)
    assert r.execute([[x]], [[y]]) is StatusCode.SUCCESS
    pairs = [pair(r) for _ in range(8)]
    jobs = [r.execute_async([[a]], [[b]]) for a, b in pairs]
    svc.kill()  # SIGKILL: no goodbye; some of those jobs are in flight
    for job in jobs:
        assert r.wait(job, 30_000) in (StatusCode.SUCCESS, StatusCode.FAILURE)  # never a hang
    assert r.execute([[x]], [[y]]) is StatusCode.FAILURE
    assert "closed the connection" in r.last_error and str(svc.socket_path) in r.last_error
    ended = threading.Event()
    job = r.execute_async([[x]], [[y]], lambda h: ended.set())
    assert r.wait(job, 10_000) is StatusCode.FAILURE and ended.wait(10)
    with pytest.raises(NpuError, match="closed the connection"):
        c.stats()
    with pytest.raises(NpuError, match="closed the connection"):
        c.open_runner("cls")
    r.close()
    c.close()
    assert svc.socket_path.exists()  # left behind by SIGKILL: the next service takes it over
    with start(tmp_path) as again, npurt.connect(again.socket_path) as c2, c2.open_runner("cls") as r2:
        x2, y2 = pair(r2)
        assert r2.execute([[x2]], [[y2]]) is StatusCode.SUCCESS


def test_a_second_service_on_a_live_socket_is_refused(service, tmp_path):
    r = subprocess.run([sys.executable, "-m", "npurt", "serve", "--socket", str(service.socket_path), "--model",
                        f"cls={model_or_skip('ocr_cls')}", *BASE_ARGS], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "another service already listens on" in r.stderr


# ---------------------------------------------------------------------------------------------- hostile clients
def test_hostile_messages_get_errors_and_leak_nothing(service, tmp_path):
    baseline = warm(service)
    raw = Raw(service.socket_path)
    try:
        _, status, runner_id, _, doc = raw.call(p.OPEN, {"model": "cls", "options": {}})
        assert status == 0 and runner_id
        # garbage of every size, unknown kinds, bodies that are not JSON objects, fields of the wrong type
        for data in (b"\x00", os.urandom(19), b"\xff" * 20 + b"garbage", p.pack(99, 5), p.pack(p.OPEN, 6) + b"[1]",
                     p.pack_json(p.OPEN, 7, {"model": 3, "options": {}}),
                     p.pack_json(p.COMPILE, 8, {"signature": [[-5]]}, a=runner_id),
                     p.pack_json(p.OPEN, 9, {"model": "cls", "options": {"num_threads": "many"}})):
            raw.send(data)
        replies = []
        while len(replies) < 6:
            replies.append(raw.recv())
        assert all(kind == p.REPLY and status == StatusCode.INVALID_INPUT for kind, status, *_ in replies)
        assert any("unknown message kind 99" in d["error"] for *_, d in replies)
        # an oversized count, a BIND without tensors, tensors that lie
        assert raw.call(p.BIND, a=runner_id, b=10**9)[1] == StatusCode.INVALID_INPUT
        message, ancdata = sealed_pair_message(runner_id)
        raw.send(message.replace(b'"size_in_bytes":8', b'"size_in_bytes":9999999999'), ancdata=ancdata)
        assert raw.recv()[1] == StatusCode.INVALID_INPUT
        # fds of the wrong kind in place of the tensor's memory: unsealed memfd, pipe, regular file, socket
        unsealed = os.memfd_create("unsealed", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(unsealed, 1 << 20)
        rd, wr = os.pipe()
        regular = os.open(tmp_path, os.O_TMPFILE | os.O_RDWR)
        os.ftruncate(regular, 1 << 20)
        left, right = socket.socketpair()
        for fd, why in ((unsealed, "F_SEAL_SHRINK"), (rd, "not memory"), (regular, "F_SEAL_SHRINK|file"),
                        (left.fileno(), "not memory")):
            raw.send(message, ancdata=with_fd(ancdata, 0, fd))
            kind, status, _, _, doc = raw.recv()
            assert status == StatusCode.INVALID_INPUT and re.search(why, doc["error"]), doc
        # fds riding on messages that take none are closed, not kept
        for _ in range(20):
            raw.send(p.pack(p.STATS, 11), fds=(unsealed, rd, wr))
            assert raw.recv()[1] == 0
        for fd in (unsealed, rd, wr, regular):
            os.close(fd)
        left.close()
        right.close()
        # another client's ids name nothing here
        with npurt.connect(service.socket_path) as other, other.open_runner("cls") as r:
            x, y = pair(r)
            assert r.execute([[x]], [[y]]) is StatusCode.SUCCESS
            for some_id in range(1, 8):
                raw.send(p.pack(p.RUN, 20 + some_id, some_id, 0))
                kind, status, _, _, doc = raw.recv()
                assert kind == p.DONE and status == StatusCode.INVALID_INPUT and "not registered" in doc["error"]
                assert raw.call(p.STATE_GET, a=some_id)[1] == StatusCode.INVALID_INPUT
                assert raw.call(p.COMPILE, {"signature": None}, a=some_id + runner_id)[1] == StatusCode.INVALID_INPUT
            assert r.execute([[x]], [[y]]) is StatusCode.SUCCESS
    finally:
        raw.close()
    assert settle(service.pid, baseline) <= baseline


def test_handshake_refusals_and_a_flood_of_connections(service):
    baseline = warm(service)
    silent = Raw(service.socket_path, hello=False)  # says nothing: closed after --handshake-timeout
    assert silent.sock.recv(100) == b""
    silent.close()
    wrong = Raw(service.socket_path, hello=False)
    wrong.send(p.pack_json(p.HELLO, 1, {"magic": p.MAGIC, "version": 99}))
    kind, _, _, _, doc = wrong.recv()
    assert kind == p.NOTICE and "protocol version 99" in doc["refused"]
    wrong.close()
    flood = []
    refused = []
    for _ in range(20):  # --max-connections-per-uid 8
        try:
            flood.append(npurt.connect(service.socket_path))
        except NpuError as e:
            refused.append(str(e))
    assert len(flood) == 8 and len(refused) == 12
    assert "refused this client" in refused[0] and "--max-connections-per-uid 8" in refused[0]
    for c in flood:
        c.close()
    assert settle(service.pid, baseline) <= baseline
    with npurt.connect(service.socket_path) as c, c.open_runner("cls") as r:
        x, y = pair(r)
        assert r.execute([[x]], [[y]]) is StatusCode.SUCCESS


def test_a_client_that_never_reads_its_answers_is_disconnected(service):
    """The kernel queues few datagrams for a reader (net.unix.max_dgram_qlen): a client that sends and never reads
    would block whoever answers it. After --send-timeout it is disconnected; the others are served meanwhile."""
    baseline = warm(service)
    deaf = Raw(service.socket_path)
    runner_id = deaf.call(p.OPEN, {"model": "cls", "options": {}})[2]
    message, ancdata = sealed_pair_message(runner_id)
    deaf.send(message, ancdata=ancdata)
    binding_id = deaf.recv()[2]
    stop = threading.Event()

    def flood() -> None:
        k = 0
        while not stop.is_set():
            try:
                deaf.send(p.pack(p.RUN, 1000 + k, binding_id, 0) if k % 2 else p.pack(99, k))
            except OSError:
                return  # disconnected (or the queue full and the socket shut)
            k += 1

    sender = threading.Thread(target=flood, daemon=True)
    sender.start()
    with npurt.connect(service.socket_path) as c, c.open_runner("cls") as r:
        x, y = pair(r)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 3:
            assert r.execute([[x]], [[y]]) is StatusCode.SUCCESS, r.last_error
    stop.set()
    deaf.sock.settimeout(10)
    while True:  # what was queued for it, then the end
        try:
            if not deaf.sock.recv(p.MAX_MESSAGE + 1):
                break
        except OSError:
            break
    sender.join(timeout=10)
    deaf.close()
    assert "leaves its answers unread for 1.0 s; disconnecting it" in service.output()
    assert settle(service.pid, baseline) <= baseline


# ---------------------------------------------------------------------------------------------- limits
def test_per_client_limits_are_clear_statuses(service):
    raw = Raw(service.socket_path)
    try:
        runner_id = raw.call(p.OPEN, {"model": "cls", "options": {}})[2]
        message, ancdata = sealed_pair_message(runner_id)
        raw.send(message, ancdata=ancdata)
        kind, status, binding_id, _, doc = raw.recv()
        assert status == 0, doc
        for k in range(40):  # --max-jobs-per-client 4: more in flight at once are refused, not queued
            raw.send(p.pack(p.RUN, 100 + k, binding_id, 0))
        answers = [raw.recv() for _ in range(40)]
        statuses = [StatusCode(status) for _, status, *_ in answers]
        assert StatusCode.RESOURCE_UNAVAILABLE in statuses and StatusCode.SUCCESS in statuses
        busy = next(d for _, s, _, _, d in answers if s == StatusCode.RESOURCE_UNAVAILABLE)
        assert "--max-jobs-per-client 4" in busy["error"]
    finally:
        raw.close()
    with npurt.connect(service.socket_path) as c, c.open_runner("cls") as r:  # --max-mapped-mb-per-client 1
        pairs = [pair(r) for _ in range(12)]  # 12 x 110 KB
        statuses = [r.execute([[x]], [[y]]) for x, y in pairs]
        assert statuses[0] is StatusCode.SUCCESS and statuses[-1] is StatusCode.OUT_OF_MEMORY
        assert "over its limit" in r.last_error
        del pairs  # their registrations go with them, and room comes back
        x, y = pair(r)
        deadline = time.monotonic() + 10
        while r.execute([[x]], [[y]]) is not StatusCode.SUCCESS and time.monotonic() < deadline:
            time.sleep(0.05)
            x, y = pair(r)
        assert r.execute([[x]], [[y]]) is StatusCode.SUCCESS


def test_jobs_of_several_clients_are_served_round_robin(tmp_path):
    """One run at a time (--workers 1); a client keeps 30 jobs queued, another runs one at a time: the second waits
    for about one job of the first each time (round robin), not for the 30 queued before it (first come)."""
    with start(tmp_path, "--workers", "1") as svc, npurt.connect(svc.socket_path) as flood_c, \
            npurt.connect(svc.socket_path) as calm_c:
        flooder = flood_c.open_runner("cls")
        fx, fy = pair(flooder)
        binding = flooder.engine_for().bind([fx], [fy])
        calm = calm_c.open_runner("cls")
        x, y = pair(calm)
        alone = []
        for _ in range(30):
            t0 = time.perf_counter()
            assert calm.execute([[x]], [[y]]) is StatusCode.SUCCESS
            alone.append(time.perf_counter() - t0)
        stop = threading.Event()
        flooded = [0]

        def again(reply) -> None:
            flooded[0] += 1
            if not stop.is_set():
                flood_c.run(binding.binding_id, 0, again)

        for _ in range(30):
            flood_c.run(binding.binding_id, 0, again)
        time.sleep(0.2)
        shared = []
        for _ in range(30):
            t0 = time.perf_counter()
            assert calm.execute([[x]], [[y]]) is StatusCode.SUCCESS
            shared.append(time.perf_counter() - t0)
        stop.set()
        time.sleep(0.3)
        job = np.median(alone)
        assert flooded[0] > 60
        # first come, first served would make each run wait behind ~30 queued jobs of the flooder
        assert np.median(shared) < 8 * job, (np.median(shared), job)
        calm.close()
        flooder.close()


def test_only_allowed_uids_and_the_group_get_in(tmp_path):
    other = os.getuid() + 12345
    with start(tmp_path, "--allow-uid", str(other), "--group", str(os.getgid())) as svc:
        assert oct(os.stat(svc.socket_path).st_mode & 0o777) == oct(0o660)
        with pytest.raises(NpuError, match=rf"uid {os.getuid()} may not use this service \(allowed: \[{other}\]\)"):
            npurt.connect(svc.socket_path)
        assert f"refused pid {os.getpid()}" in svc.output()


def test_sigterm_lets_jobs_in_flight_end(tmp_path):
    svc = start(tmp_path)
    with npurt.connect(svc.socket_path) as c:
        r = c.open_runner("cls", {"max_concurrent_runs": 16})
        pairs = [pair(r) for _ in range(16)]
        jobs = [r.execute_async([[x]], [[y]]) for x, y in pairs]
        svc.process.send_signal(signal.SIGTERM)
        assert all(r.wait(j, 30_000) is StatusCode.SUCCESS for j in jobs)  # accepted before the signal: they end
        assert svc.stop() == 0
        x, y = pairs[0]
        assert r.execute([[x]], [[y]]) is StatusCode.FAILURE and "shut down" in r.last_error
        r.close()


def test_fcntl_seals_of_runner_memory():
    """The memory a client registers is sealed against shrinking: the service can never take SIGBUS."""
    t = allocate_tensor(npurt.NpuTensorInfo(name="x", data_type=npurt.DataType.FLOAT32, shape=SHAPE), provider="memfd")
    seals = fcntl.fcntl(t.get_buffer().fd, fcntl.F_GET_SEALS)
    assert seals & fcntl.F_SEAL_SHRINK
