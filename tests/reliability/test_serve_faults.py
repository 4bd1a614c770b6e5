"""npurt serve under faults: clients and services that die, hostile clients, limits, fairness, who may connect.

Every case ends in a clear error on the side that has to hear it (a FAILURE status with ``last_error``, an
exception from a query, an error reply to a bad message), never a hang, a crash of the service or a leak of its
fds. Raw clients speak the wire protocol (``npurt.serve.protocol``) directly, to send what no npurt client would.
"""

from __future__ import annotations

import array
import fcntl
import json
import os
import re
import shutil
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
from tests.helpers.missing import require_module
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


# ------------------------------------------------------------------------------------ the Open Inference Protocol
# Raw HTTP (http.client and plain sockets) sends what Triton's clients never would; every answer must be a 4xx with
# the protocol's {"error": ...} body, and the server must answer the next request as before.
def oip_available() -> None:
    """The serve extra and Triton's clients (the test extra): CI installs them, so there a missing one fails."""
    for name in ("aiohttp", "grpc", "tritonclient.http", "tritonclient.grpc"):
        require_module(name, "needs the 'serve' and 'test' extras")


def slow_model(path: Path, layers: int = 40) -> Path:
    """A model that takes a while (~0.1-0.5 s on one core with 40 layers): MatMuls of 256x1024 by 1024x1024, one
    weight."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array((np.eye(1024, dtype=np.float32) * 0.999), "w")
    nodes = [helper.make_node("MatMul", ["x" if k == 0 else f"h{k}", "w"], [f"h{k + 1}" if k < layers - 1 else "y"])
             for k in range(layers)]
    graph = helper.make_graph(nodes, "slow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 1024])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [256, 1024])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=9), str(path))
    return path


@pytest.fixture(scope="module")
def oip_service(tmp_path_factory):
    oip_available()
    tmp = tmp_path_factory.mktemp("oip_faults")
    with ServiceProcess.start({"cls": model_or_skip("ocr_cls"), "slow": slow_model(tmp / "slow.onnx")},
                              tmp / "serve.sock",
                              ["--backend", "openvino", "--device", "CPU", "--threads", "1", "--shape",
                               "cls:x=" + ",".join(map(str, SHAPE)), "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0",
                               "--max-body-mb", "2", "--max-json-mb", "1", "--max-tensors", "4",
                               "--max-elements", "300000", "--max-header-kb", "4"]) as svc:
        yield svc


def http_request(address: str, method: str, path: str, body: bytes = b"", headers: dict | None = None
                 ) -> tuple[int, dict]:
    status, _, doc = http_exchange(address, method, path, body, headers)
    return status, doc


def http_exchange(address: str, method: str, path: str, body: bytes = b"", headers: dict | None = None
                  ) -> tuple[int, str, dict]:
    """Status, Content-Type and JSON body of one request."""
    import http.client

    host, _, port = address.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        data = response.read()
        try:
            doc = json.loads(data)
        except ValueError:
            doc = {"raw": data.decode(errors="replace")}
        return response.status, response.getheader("Content-Type", ""), doc
    finally:
        conn.close()


def cls_request(shape=SHAPE, datatype="FP32", name="x", extra_header: dict | None = None, data: bytes | None = None
                ) -> tuple[bytes, dict]:
    n = int(np.prod(shape)) * 4
    doc = {"inputs": [{"name": name, "datatype": datatype, "shape": list(shape),
                       "parameters": {"binary_data_size": n}}]}
    header = json.dumps(doc).encode()
    payload = data if data is not None else frame(SHAPE, 1).tobytes()[:n].ljust(n, b"\0")
    return header + payload, {"Inference-Header-Content-Length": str(len(header)), **(extra_header or {})}


def assert_alive(svc: ServiceProcess) -> None:
    assert svc.process.poll() is None, svc.output()[-3000:]
    body, headers = cls_request()
    status, doc = http_request(svc.http_address, "POST", "/v2/models/cls/infer", body, headers)
    assert status == 200, doc


def test_oip_bad_requests_get_4xx_with_an_error_body(oip_service):
    svc = oip_service
    good, headers = cls_request()
    cases = {
        "malformed JSON": (b"{not json", {}),
        "JSON not an object": (b"[1, 2]", {}),
        "no inputs": (b'{"inputs": []}', {}),
        "wrong datatype": cls_request(datatype="INT32"),
        "unknown datatype": cls_request(datatype="FLOAT"),
        "BYTES": cls_request(datatype="BYTES"),
        "wrong shape": cls_request(shape=(1, 3, 48, 190)),
        "wrong rank": cls_request(shape=(3, 48, 192)),
        "negative dim": (json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, -3],
                                                 "data": [1.0]}]}).encode(), {}),
        "unknown input": cls_request(name="y"),
        "truncated binary body": (good[:-100], headers),
        "header length past the body": (good, {"Inference-Header-Content-Length": str(len(good) + 5)}),
        "header length not a number": (good, {"Inference-Header-Content-Length": "many"}),
        "trailing bytes": (good + b"xx", headers),
        "JSON data of the wrong size": (json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": list(SHAPE),
                                                                "data": [1.0, 2.0]}]}).encode(), {}),
        "JSON data not numbers": (json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1],
                                                          "data": ["a"]}]}).encode(), {}),
        "JSON booleans for FP32": (json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": list(SHAPE),
                                                           "data": [True] * 27648}]}).encode(), {}),
        "unknown region": (json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": list(SHAPE),
                                                   "parameters": {"shared_memory_region": "nope",
                                                                  "shared_memory_byte_size": 110592}}]}).encode(), {}),
        "unknown output": (json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": list(SHAPE),
                                                   "parameters": {"binary_data_size": 110592}}],
                                       "outputs": [{"name": "nope"}]}).encode() + good[-110592:], {}),
    }
    for what, (body, hdrs) in cases.items():
        status, content_type, doc = http_exchange(svc.http_address, "POST", "/v2/models/cls/infer", body, hdrs)
        assert 400 <= status < 500 and isinstance(doc.get("error"), str) and doc["error"], (what, status, doc)
        assert content_type == "application/json", (what, content_type)  # exactly: KServe's client needs it
    status, doc = http_request(svc.http_address, "POST", "/v2/models/nope/infer", good, headers)
    assert status == 404 and "unknown model" in doc["error"]
    status, doc = http_request(svc.http_address, "GET", "/v2/nothing/here")
    assert status == 404 and "error" in doc
    status, doc = http_request(svc.http_address, "GET", "/v2/models/cls/infer")
    assert status == 405 and "error" in doc
    assert_alive(svc)


def test_oip_limits(oip_service):
    svc = oip_service
    status, doc = http_request(svc.http_address, "POST", "/v2/models/cls/infer", b"x" * (3 << 20))
    assert status == 413 and "limit" in doc["error"]
    five = json.dumps({"inputs": [{"name": f"x{k}", "datatype": "FP32", "shape": [1], "data": [1.0]}
                                  for k in range(5)]}).encode()
    status, doc = http_request(svc.http_address, "POST", "/v2/models/cls/infer", five)
    assert status == 413 and "--max-tensors" in doc["error"]
    big_json = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 250000],
                                       "data": [1.0] * 250000}]}).encode()
    assert (1 << 20) < len(big_json) < (2 << 20)
    status, doc = http_request(svc.http_address, "POST", "/v2/models/slow/infer", big_json)
    assert status == 413 and "--max-json-mb" in doc["error"], doc
    status, doc = http_request(svc.http_address, "POST", "/v2/models/slow/infer",
                               json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [512, 1024],
                                                       "parameters": {"binary_data_size": 2 << 20}}]}).encode())
    assert status == 413 and "--max-elements" in doc["error"]
    status, _ = http_request(svc.http_address, "GET", "/v2/health/live", headers={"X-Big": "y" * 8000})
    assert status == 400  # aiohttp's parser: a header field over --max-header-kb
    assert_alive(svc)


def test_oip_client_that_disconnects_mid_request(oip_service):
    svc = oip_service
    host, _, port = svc.http_address.rpartition(":")
    body, headers = cls_request()
    for cut in (10, len(body) // 2, len(body) - 1):
        with socket.create_connection((host, int(port)), timeout=10) as s:
            head = (f"POST /v2/models/cls/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
                    f"Inference-Header-Content-Length: {headers['Inference-Header-Content-Length']}\r\n\r\n")
            s.sendall(head.encode() + body[:cut])
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"GARBAGE\r\n\r\n")
        assert re.match(rb"HTTP/1\.[01] 4\d\d ", s.recv(100))
    assert_alive(svc)


def test_oip_bad_shared_memory_registrations(oip_service, tmp_path):
    svc = oip_service
    name = f"npurt_fault_{os.getpid()}"
    with open(f"/dev/shm/{name}", "wb") as f:
        f.truncate(4096)
    link = f"/dev/shm/{name}_link"
    os.symlink(f"/dev/shm/{name}", link)
    try:
        cases = {
            "not a POSIX shm name": {"key": "noslash", "byte_size": 16},
            "a path": {"key": "/../../etc/passwd", "byte_size": 16},
            "absent": {"key": f"/{name}_absent", "byte_size": 16},
            "a symlink": {"key": f"/{name}_link", "byte_size": 16},
            "past the end": {"key": f"/{name}", "byte_size": 4096, "offset": 1},
            "zero bytes": {"key": f"/{name}", "byte_size": 0},
            "negative offset": {"key": f"/{name}", "byte_size": 16, "offset": -1},
            "not JSON": None,
        }
        for what, doc in cases.items():
            body = b"{oops" if doc is None else json.dumps(doc).encode()
            status, answer = http_request(svc.http_address, "POST", "/v2/systemsharedmemory/region/r/register", body)
            assert status == 400 and answer.get("error"), (what, status, answer)
        ok = json.dumps({"key": f"/{name}", "byte_size": 4096}).encode()
        assert http_request(svc.http_address, "POST", "/v2/systemsharedmemory/region/r/register", ok)[0] == 200
        assert http_request(svc.http_address, "POST", "/v2/systemsharedmemory/region/r/register", ok)[0] == 400
        # a tensor past the region's end
        doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(SHAPE),
                           "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 110592}}]}
        status, answer = http_request(svc.http_address, "POST", "/v2/models/cls/infer", json.dumps(doc).encode())
        assert status == 400 and "run past" in answer["error"]
        # shrunk after registering: refused, not a SIGBUS
        os.truncate(f"/dev/shm/{name}", 16)
        doc["inputs"][0]["shape"] = [1, 3, 2, 2]
        status, answer = http_request(svc.http_address, "POST", "/v2/models/cls/infer", json.dumps(doc).encode())
        assert status == 400, answer
        assert http_request(svc.http_address, "POST", "/v2/systemsharedmemory/region/r/unregister")[0] == 200
        # again: nothing to do, as Triton answers (tests/reliability/test_serve_oip_data.py)
        assert http_request(svc.http_address, "POST", "/v2/systemsharedmemory/region/r/unregister")[0] == 200
    finally:
        os.unlink(link)
        os.unlink(f"/dev/shm/{name}")
    assert_alive(svc)


def test_oip_unregister_waits_for_the_job_that_uses_the_region(oip_service):
    """A region in use by a running job is not unmapped: unregistering waits for the job, whose answer is right."""
    svc = oip_service
    name = f"npurt_busy_{os.getpid()}"
    x = np.ones((256, 1024), np.float32)
    with open(f"/dev/shm/{name}", "wb") as f:
        f.write(x.tobytes())
    try:
        body = json.dumps({"key": f"/{name}", "byte_size": x.nbytes}).encode()
        assert http_request(svc.http_address, "POST", "/v2/systemsharedmemory/region/busy/register", body)[0] == 200
        doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [256, 1024],
                           "parameters": {"shared_memory_region": "busy", "shared_memory_byte_size": x.nbytes}}],
               "outputs": [{"name": "y", "parameters": {"binary_data": False}}]}
        result: dict = {}

        def infer() -> None:
            result["answer"] = http_request(svc.http_address, "POST", "/v2/models/slow/infer",
                                            json.dumps(doc).encode())

        t = threading.Thread(target=infer)
        t.start()
        time.sleep(0.05)
        status, answer = http_request(svc.http_address, "POST", "/v2/systemsharedmemory/region/busy/unregister")
        t.join(timeout=60)
        assert status == 200, answer
        status, answer = result["answer"]
        assert status == 200, answer
        expected = float(np.float32(0.999) ** 40)
        assert abs(answer["outputs"][0]["data"][0] - expected) < 1e-3
    finally:
        os.unlink(f"/dev/shm/{name}")
    assert_alive(svc)


def test_oip_grpc_bad_requests(oip_service):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(oip_service.grpc_address)
    cases = [("cls", "x", [1, 3, 48, 190], "FP32"), ("cls", "x", list(SHAPE), "INT32"), ("nope", "x", list(SHAPE),
             "FP32"), ("cls", "y", list(SHAPE), "FP32")]
    for model, name, shape, datatype in cases:
        i = grpcclient.InferInput(name, shape, datatype)
        i.set_data_from_numpy(np.zeros(shape, np.float32 if datatype == "FP32" else np.int32))
        with pytest.raises(InferenceServerException) as e:
            client.infer(model, [i])
        assert e.value.status() in ("StatusCode.INVALID_ARGUMENT", "StatusCode.NOT_FOUND"), e.value
    assert_alive(oip_service)


def test_oip_unimplemented_rpcs_log_one_line_per_method_without_a_traceback(oip_service):
    """Any client may call Triton's RPCs that npurt does not serve: UNIMPLEMENTED, and one log line per method and
    minute, not a traceback per call (a client could flood the log)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(oip_service.grpc_address)
    for _ in range(5):
        with pytest.raises(InferenceServerException, match="not implemented by npurt serve") as e:
            client.get_model_repository_index()
        assert e.value.status() == "StatusCode.UNIMPLEMENTED"
        with pytest.raises(InferenceServerException, match="not implemented"):
            client.get_trace_settings()
    time.sleep(0.2)
    log = oip_service.output()
    assert log.count("gRPC RepositoryIndex: not implemented") == 1, log[-3000:]
    assert log.count("gRPC TraceSetting: not implemented") == 1, log[-3000:]
    assert "Traceback" not in log and "NotImplementedError" not in log, log[-3000:]
    assert_alive(oip_service)


def test_oip_sigterm_drains_in_flight_requests_and_refuses_new_ones(tmp_path):
    oip_available()
    svc = ServiceProcess.start({"slow": slow_model(tmp_path / "slow.onnx")}, tmp_path / "serve.sock",
                               ["--device", "CPU", "--threads", "1", "--http", "127.0.0.1:0"])
    try:
        x = np.ones((256, 1024), np.float32)
        header = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [256, 1024],
                                         "parameters": {"binary_data_size": x.nbytes}}],
                             "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}).encode()
        answers: list[tuple[int, dict]] = []

        def infer() -> None:
            answers.append(http_request(svc.http_address, "POST", "/v2/models/slow/infer", header + x.tobytes(),
                                        {"Inference-Header-Content-Length": str(len(header))}))

        first = threading.Thread(target=infer)
        first.start()
        time.sleep(0.05)
        svc.process.send_signal(signal.SIGTERM)
        time.sleep(0.1)
        status, doc = http_request(svc.http_address, "POST", "/v2/models/slow/infer", header + x.tobytes(),
                                   {"Inference-Header-Content-Length": str(len(header))})
        assert status == 503 and "shutting down" in doc["error"]
        status, doc = http_request(svc.http_address, "GET", "/v2/health/ready")
        assert status == 503
        first.join(timeout=60)
        assert answers and answers[0][0] == 200, answers
        assert svc.process.wait(timeout=60) == 0
    finally:
        if svc.process.poll() is None:
            svc.kill()


def test_oip_token_and_tls(tmp_path):
    """--token: 401 without it, probes open; with TLS the token may cross beyond loopback (checked by the config
    rules); tritonclient over HTTPS and gRPC with TLS and the bearer token."""
    oip_available()
    if not shutil.which("openssl"):
        pytest.skip("openssl makes the test's certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"],
                   check=True, capture_output=True)
    token = "s3cret-token"
    with ServiceProcess.start({"cls": model_or_skip("ocr_cls")}, tmp_path / "serve.sock",
                              [*BASE_ARGS, "--http", "localhost:0", "--grpc", "localhost:0", "--token", token,
                               "--tls-cert", str(cert), "--tls-key", str(key)]) as svc:
        import ssl

        import tritonclient.grpc as grpcclient
        import tritonclient.http as httpclient
        from tritonclient.utils import InferenceServerException

        port = svc.http_address.rpartition(":")[2]
        context = ssl.create_default_context(cafile=str(cert))
        anonymous = httpclient.InferenceServerClient(f"localhost:{port}", ssl=True,
                                                     ssl_context_factory=lambda: context)
        assert anonymous.is_server_live() and anonymous.is_server_ready()  # probes need no token
        with pytest.raises(InferenceServerException, match="bearer token"):
            anonymous.get_model_metadata("cls")
        auth = {"Authorization": f"Bearer {token}"}
        f = frame(SHAPE, 3)
        i = httpclient.InferInput("x", list(SHAPE), "FP32")
        i.set_data_from_numpy(f)
        assert anonymous.infer("cls", [i], headers=auth).as_numpy("save_infer_model/scale_0.tmp_1").shape == (1, 2)
        gport = svc.grpc_address.rpartition(":")[2]
        g = grpcclient.InferenceServerClient(f"localhost:{gport}", ssl=True, root_certificates=str(cert))
        with pytest.raises(InferenceServerException, match="bearer token"):
            g.get_model_metadata("cls")
        assert g.get_model_metadata("cls", headers={"authorization": f"Bearer {token}"}).name == "cls"


def test_oip_safety_rules():
    oip_available()
    from npurt.serve.oip.server import OipConfig, check_config

    assert check_config(OipConfig(http=("127.0.0.1", 0))) == []
    with pytest.raises(ValueError, match="without a token.*--no-auth"):
        check_config(OipConfig(http=("0.0.0.0", 8080)))
    warnings = check_config(OipConfig(http=("0.0.0.0", 8080), no_auth=True))
    assert warnings and "WITHOUT AUTHENTICATION" in warnings[0]
    with pytest.raises(ValueError, match="contradict"):
        check_config(OipConfig(http=("127.0.0.1", 0), no_auth=True, token="t"))
    with pytest.raises(ValueError, match="in\\s+the clear"):
        check_config(OipConfig(grpc=("10.0.0.1", 8081), token="t"))
    assert check_config(OipConfig(grpc=("10.0.0.1", 8081), token="t", insecure=True)) == []
    assert check_config(OipConfig(http=("::1", 0), token="t")) == []
    with pytest.raises(ValueError, match="go together"):
        check_config(OipConfig(http=("127.0.0.1", 0), tls_cert=Path("/nope")))
    # system shared memory: auto is on only where every listener binds loopback
    assert OipConfig(http=("127.0.0.1", 0), grpc=("::1", 0)).shm_enabled
    assert not OipConfig(http=("127.0.0.1", 0), grpc=("0.0.0.0", 0), token="t").shm_enabled
    assert OipConfig(http=("0.0.0.0", 0), token="t", shm="on").shm_enabled
    assert not OipConfig(http=("127.0.0.1", 0), shm="off").shm_enabled


def test_oip_cli_refuses_and_warns(tmp_path):
    """The command line, before anything is loaded: a token over plain text beyond loopback is refused (exit 2), so
    is a bind beyond loopback without a token (the container's command, without the Secret's token)."""
    oip_available()
    base = [sys.executable, "-m", "npurt", "serve", "--model", f"cls={model_or_skip('ocr_cls')}", "--socket",
            str(tmp_path / "s.sock")]
    env = {k: v for k, v in os.environ.items() if k != "NPURT_SERVE_TOKEN"}
    proc = subprocess.run([*base, "--http", "0.0.0.0:0", "--token", "t"], capture_output=True, text=True, timeout=60,
                          env=env)
    assert proc.returncode == 2 and "in the clear" in proc.stderr.replace("\n", " ")
    proc = subprocess.run([*base, "--grpc", "0.0.0.0:0"], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2 and "without a token" in proc.stderr and "--no-auth" in proc.stderr, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "npurt", "serve", "--help"], capture_output=True, text=True,
                          timeout=60)
    text = " ".join(proc.stdout.split())
    assert "--backend NAME openvino, vaiml, qnn, onnxruntime or auto" in text, text  # every backend
    assert "--max-in-flight N requests admitted at once" in text and "(default: 64)" in text


def test_oip_token_on_every_route_but_health_and_metrics(tmp_path):
    """With a token: every route and RPC but the health probes and /metrics answers 401 / UNAUTHENTICATED without
    it, one by one; with it (the scheme in any case, RFC 7235) each answers as without a token."""
    oip_available()
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    token = "tok-" + "x" * 20
    name = f"npurt_tok_{os.getpid()}"
    with open(f"/dev/shm/{name}", "wb") as f:
        f.truncate(4096)
    try:
        with ServiceProcess.start({"cls": model_or_skip("ocr_cls")}, tmp_path / "serve.sock",
                                  [*BASE_ARGS, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--token", token]
                                  ) as svc:
            body, headers = cls_request()
            register = json.dumps({"key": f"/{name}", "byte_size": 4096}).encode()
            routes = [("POST", "/v2/models/cls/infer", body, headers),
                      ("POST", "/v2/systemsharedmemory/region/r/register", register, {}),
                      ("GET", "/v2/systemsharedmemory/status", b"", {}),
                      ("GET", "/v2/systemsharedmemory/region/r/status", b"", {}),
                      ("POST", "/v2/systemsharedmemory/region/r/unregister", b"", {}),
                      ("POST", "/v2/systemsharedmemory/unregister", b"", {}),
                      ("GET", "/v2/cudasharedmemory/status", b"", {}),
                      ("POST", "/v2/cudasharedmemory/unregister", b"", {}),
                      ("GET", "/v2/models/cls/stats", b"", {}), ("GET", "/v2/models/stats", b"", {}),
                      ("GET", "/v2/models/cls/config", b"", {}), ("GET", "/v2/models/cls", b"", {}),
                      ("GET", "/v2/models/cls/ready", b"", {}), ("GET", "/v2", b"", {})]
            for scheme in ("Bearer", "bearer", "BEARER"):
                for method, path, data, extra in routes:
                    status, doc = http_request(svc.http_address, method, path, data, extra)
                    assert status == 401 and "bearer token" in doc["error"], (method, path, status, doc)
                    status, doc = http_request(svc.http_address, method, path, data,
                                               {**extra, "Authorization": f"{scheme} {token}"})
                    assert status == 200, (scheme, method, path, status, doc)
                status, _ = http_request(svc.http_address, "GET", "/v2/models/cls", b"",
                                         {"Authorization": f"{scheme} {token}x"})
                assert status == 401
            for path in ("/v2/health/live", "/v2/health/ready", "/metrics"):
                assert http_request(svc.http_address, "GET", path)[0] == 200, path

            client = grpcclient.InferenceServerClient(svc.grpc_address)
            f = frame(SHAPE, 2)
            x = grpcclient.InferInput("x", list(SHAPE), "FP32")
            x.set_data_from_numpy(f)
            calls = {
                "infer": lambda h: client.infer("cls", [x], headers=h),
                "register": lambda h: client.register_system_shared_memory("g", f"/{name}", 4096, headers=h),
                "status": lambda h: client.get_system_shared_memory_status(headers=h),
                "unregister": lambda h: client.unregister_system_shared_memory("g", headers=h),
                "cuda status": lambda h: client.get_cuda_shared_memory_status(headers=h),
                "cuda unregister": lambda h: client.unregister_cuda_shared_memory(headers=h),
                "stats": lambda h: client.get_inference_statistics("cls", headers=h),
                "config": lambda h: client.get_model_config("cls", headers=h),
                "metadata": lambda h: client.get_model_metadata("cls", headers=h),
            }
            for what, call in calls.items():
                with pytest.raises(InferenceServerException) as e:
                    call(None)
                assert e.value.status() == "StatusCode.UNAUTHENTICATED", (what, e.value)
                call({"authorization": f"bearer {token}"})
            assert client.is_server_live() and client.is_server_ready()
            with pytest.raises(InferenceServerException, match="bearer token"):
                client.is_model_ready("cls")  # not a probe: it needs the token
            assert client.is_model_ready("cls", headers={"authorization": f"Bearer {token}"})
    finally:
        os.unlink(f"/dev/shm/{name}")


def test_oip_shm_off_in_flight_limit_and_a_free_event_loop(tmp_path):
    """--shm off: every shared memory call refused (403 / PERMISSION_DENIED) saying how to turn it on.
    --max-in-flight 1: a second request while one runs gets 503 / UNAVAILABLE. And while a model runs (about a
    second), the event loop is free: health probes answer within 50 ms."""
    oip_available()
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    with ServiceProcess.start({"slow": slow_model(tmp_path / "slow.onnx", layers=300)}, tmp_path / "serve.sock",
                              ["--device", "CPU", "--threads", "1", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0",
                               "--shm", "off", "--max-in-flight", "1"]) as svc:
        name = f"npurt_off_{os.getpid()}"
        with open(f"/dev/shm/{name}", "wb") as f:
            f.truncate(4096)
        try:
            for method, path, data in (
                    ("POST", "/v2/systemsharedmemory/region/r/register",
                     json.dumps({"key": f"/{name}", "byte_size": 4096}).encode()),
                    ("GET", "/v2/systemsharedmemory/status", b""), ("POST", "/v2/systemsharedmemory/unregister", b""),
                    ("POST", "/v2/models/slow/infer", json.dumps({"inputs": [{
                        "name": "x", "datatype": "FP32", "shape": [256, 1024], "parameters": {
                            "shared_memory_region": "r", "shared_memory_byte_size": 1 << 20}}]}).encode())):
                status, doc = http_request(svc.http_address, method, path, data)
                assert status == 403 and "--shm on" in doc["error"], (path, status, doc)
        finally:
            os.unlink(f"/dev/shm/{name}")
        client = grpcclient.InferenceServerClient(svc.grpc_address)
        for call in (client.get_system_shared_memory_status, client.unregister_system_shared_memory,
                     lambda: client.register_system_shared_memory("r", "/x", 16)):
            with pytest.raises(InferenceServerException, match="--shm on") as e:
                call()
            assert e.value.status() == "StatusCode.PERMISSION_DENIED"

        x = np.ones((256, 1024), np.float32)
        header = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [256, 1024],
                                         "parameters": {"binary_data_size": x.nbytes}}],
                             "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}).encode()
        request = (header + x.tobytes(), {"Inference-Header-Content-Length": str(len(header))})
        answers: list[tuple[int, dict]] = []
        started = time.monotonic()
        slow = threading.Thread(target=lambda: answers.append(
            http_request(svc.http_address, "POST", "/v2/models/slow/infer", *request)))
        slow.start()
        time.sleep(0.15)
        probes = []
        for _ in range(10):
            t0 = time.perf_counter()
            assert http_request(svc.http_address, "GET", "/v2/health/live")[0] == 200
            probes.append(time.perf_counter() - t0)
        status, doc = http_request(svc.http_address, "POST", "/v2/models/slow/infer", *request)
        assert status == 503 and "--max-in-flight" in doc["error"], (status, doc)
        g = grpcclient.InferInput("x", [256, 1024], "FP32")
        g.set_data_from_numpy(x)
        with pytest.raises(InferenceServerException, match="--max-in-flight") as e:
            client.infer("slow", [g])
        assert e.value.status() == "StatusCode.UNAVAILABLE"
        assert slow.is_alive(), "the model ended before the probes did: the test measured nothing"
        slow.join(timeout=120)
        took = time.monotonic() - started
        assert answers and answers[0][0] == 200, answers
        print(f"\nhealth while a {took:.2f} s request ran: max {max(probes) * 1e3:.1f} ms, "
              f"median {sorted(probes)[5] * 1e3:.1f} ms")
        assert max(probes) < 0.05, probes


def test_oip_shm_region_of_another_uid_is_refused(oip_service):
    """A region's shm object must belong to the server's uid: a client names only memory it made for the server."""
    if os.geteuid() != 0:
        pytest.skip("making a file of another uid needs root")
    name = f"npurt_uid_{os.getpid()}"
    path = f"/dev/shm/{name}"
    with open(path, "wb") as f:
        f.truncate(4096)
    os.chown(path, 65534, 65534)
    try:
        status, doc = http_request(oip_service.http_address, "POST", "/v2/systemsharedmemory/region/u/register",
                                   json.dumps({"key": f"/{name}", "byte_size": 4096}).encode())
        assert status == 403 and "belongs to uid 65534" in doc["error"], (status, doc)
    finally:
        os.unlink(path)


def test_a_socket_directory_others_can_write_is_refused(tmp_path):
    """Whoever may write the socket's directory may swap the socket for their own and read every client's tensors:
    the directory must be the server's (or root's) and not writable by others unless sticky (as /tmp). The default
    /tmp/npurt-<uid> is made 0700 where it is missing; one made before by another user is refused, not used."""
    if os.geteuid() != 0:
        pytest.skip("making a directory of another uid needs root")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    for directory, why in ((theirs, "belongs to uid 65534"), (shared, "writable by others")):
        with pytest.raises(NpuError, match=why):
            start(tmp_path, name=f"{directory.name}/serve.sock").stop()  # stopped, should it start
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    with start(tmp_path, name="sticky/serve.sock") as svc:
        with npurt.connect(svc.socket_path) as client:
            assert "cls" in [m["name"] for m in client.models()]
