"""A runner of `npurt serve` against an in-process runner: the latency a service adds, and throughput with clients.

- Latency: ``execute`` on runner-allocated tensors, remote (``npurt.connect(...).open_runner``, another process
  runs the model) and in-process (``RunnerFactory.create_runner``, the same backend and options), taking turns in
  rotating blocks (``npurt.bench.measure_latency``); the added latency is remote minus in-process at p50 and p99,
  and the median of the paired differences. Two inputs: the PP-OCR classifier (1x3x48x192) and a 1x3x1080x1920
  float32 frame through a per-channel normalisation (``(x - mean) / std``, an ONNX model made here: the point is the
  tensor's size, which never travels through the socket).
- The floor: two plain Python processes exchanging a 20-byte message over an AF_UNIX socket around a busy wait as
  long as the in-process run (one wake-up each way, nothing else): the part of the added latency that no service
  can avoid on the machine it runs on.
- The engine behind a bare socket (a diagnostic, no target): the same model on the engine itself in another process
  (OpenVINO or ONNX Runtime, the runner's engine settings, tensors set once) that receives a 20-byte message, runs,
  and answers: what a hand-written service with nothing of npurt adds on this machine, beyond the same engine's run
  in a loop in that process (timed there first; its "in-process" columns). A run in a process woken per request is
  slower than in a loop (OpenVINO also pins the calling thread to its stream's core and back on every run), which
  the busy wait of the floor does not pay.
- Throughput: N client processes, each running ``execute`` in a loop on its own tensors, against N threads doing
  the same on one in-process runner, for N = 1, 4 and 8, in alternating blocks (the ratio is the median of the
  blocks' ratios).

Targets (issue 46): added p50 <= 60 us above the floor, independent of the tensor's size (the 1080p frame adds at most
60 us more above its floor than the classifier above its own); throughput with 4 clients >= 0.95x of 4 threads in
one process.

The Open Inference Protocol (``--part oip``; issues 31 and 38), against what a user would pick instead: KServe's own
Python model server (``kserve`` from PyPI, a ``kserve.Model`` whose ``predict`` calls ONNX Runtime), the same model
(the PP-OCR classifier) on the same engine (ONNX Runtime's CPU provider: npurt's VAIML backend on CPU, no Vitis AI
EP) with the same engine settings (one intra-op thread per run, as many runs at once as cores: npurt's two slots,
KServe's two uvicorn workers), the same clients (tritonclient.http with binary data, tritonclient.grpc), over both
protocols, every row labelled by its protocol (KServe's REST decoder turns binary tensors into Python lists; its
gRPC path does not), 1 and 8 concurrent client processes. KServe pins many packages: it runs from a venv of its own,
never the project's (``--kserve-python``, or ``$NPURT_KSERVE_PYTHON``; e.g. ``python3 -m venv ~/kserve-venv &&
~/kserve-venv/bin/pip install kserve onnxruntime``). And the 1x3x1080x1920 float32 frame of the latency part above
(its normalisation) sent as an HTTP request whose input and output lie in system shared memory, against the socket
protocol's round trip (``execute`` on registered tensors) of the same frame through the same server.

Targets (issues 31, 38), each of npurt's protocols against KServe's faster one: throughput >= 1.2x at 8 clients; p50
<= 0.8x at 1 client; the 1080p shared memory request <= 1.1x the socket protocol's round trip; 0 server deaths.

Language models (``--part generate``, issue 45): ``npurt serve --generate`` against onnxruntime-genai behind a
one-at-a-time OpenAI front, 1, 4 and 8 streaming clients (benchmarks/serve_generate.py, which runs alone too).

    python -m benchmarks.serve [--quick] [--json] [--backend openvino|vaiml] [--part socket|oip|generate|all]
                               [--kserve-python PATH]
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import finish, onnxruntime_session, parser
from benchmarks.serve_generate import generation_section
from npurt import RunnerFactory
from npurt.bench import (
    BenchError,
    Budget,
    LatencyStats,
    Report,
    RunnerSubject,
    Table,
    Target,
    measure_latency,
    paired_difference_ms,
)
from npurt.bench.measure import CallSubject
from npurt.bench.subjects import runner_feeds
from npurt.models import zoo
from npurt.serve import connect
from npurt.serve.process import ServiceProcess

CLS_SHAPE = (1, 3, 48, 192)
FRAME_SHAPE = (1, 3, 1080, 1920)
CLIENTS = (1, 4, 8)


def normalize_model(path: Path) -> Path:
    """(x - mean) / std per channel on a 1x3x1080x1920 float32 frame: a camera pipeline's first step."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    mean = numpy_helper.from_array(np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1), "mean")
    std = numpy_helper.from_array(np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 3, 1, 1), "std")
    graph = helper.make_graph(
        [helper.make_node("Sub", ["x", "mean"], ["centred"]), helper.make_node("Div", ["centred", "std"], ["y"])],
        "normalize", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(FRAME_SHAPE))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(FRAME_SHAPE))], [mean, std])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=9)
    onnx.save(model, str(path))
    return path


# ---------------------------------------------------------------------------------------------- the floor
def echo_process(sock: socket.socket, busy_s: float) -> None:
    """Receive, stay busy as long as a run takes, answer: a service that adds nothing."""
    while message := sock.recv(64):
        end = time.perf_counter() + busy_s
        while time.perf_counter() < end:
            pass
        sock.send(message)


def raw_engine_process(sock: socket.socket, backend: str, path: str, shapes: dict[str, list[int]] | None,
                       settings: list[tuple[str, str]], feeds: dict[str, np.ndarray], n: int) -> None:
    """The engine itself behind a bare socket: receive, run on tensors set once, answer. A hand-written service with
    nothing of npurt: OpenVINO (the model reshaped to the pinned shapes, compiled with the runner's settings) or ONNX
    Runtime (the runner's intra-op threads and spinning, an IOBinding made once). It first times its own run in a
    loop (``n`` runs) and sends the p50 and p99 (seconds)."""
    if backend == "OPENVINO":
        import openvino as ov

        core = ov.Core()
        model = core.read_model(path)
        if shapes:
            model.reshape(shapes)
        compiled = core.compile_model(model, "CPU", dict(settings))
        request = compiled.create_infer_request()
        for port in compiled.inputs:  # (feeds keeps the arrays: a request holds none of a shared tensor's memory)
            name = next(n for n in port.get_names() if n in feeds)
            request.set_tensor(port, ov.Tensor(feeds[name], shared_memory=True))
        for port in compiled.outputs:
            request.set_tensor(port, ov.Tensor(port.get_element_type(), port.get_shape()))
        # (sharing the outputs: without it, each run copies them into new arrays)
        run: Callable[[], Any] = functools.partial(request.infer, share_inputs=True, share_outputs=True)
    else:
        session = onnxruntime_session(path, settings)
        binding = session.io_binding()
        for name, array in feeds.items():
            binding.bind_cpu_input(name, array)
        outputs = [np.empty_like(out) for out in session.run(None, feeds)]
        for port, array in zip(session.get_outputs(), outputs):
            binding.bind_output(port.name, "cpu", 0, array.dtype, list(array.shape), array.ctypes.data)
        run = functools.partial(session.run_with_iobinding, binding)

    own = []  # first its own run in a loop, as the in-process side runs: what the round trip is measured beyond
    for k in range(n + 20):
        t0 = time.perf_counter_ns()
        run()
        if k >= 20:
            own.append(time.perf_counter_ns() - t0)
    stats = LatencyStats.from_samples(own)
    sock.send(f"{stats.p50_ms!r} {stats.p99_ms!r}".encode())
    while message := sock.recv(64):
        run()
        sock.send(message)


def raw_engine_us(backend: str, path: str, shapes: dict[str, list[int]] | None, settings: list[tuple[str, str]],
                  feeds: dict[str, np.ndarray], n: int) -> tuple[float, float, float, float]:
    """The engine's own run in its process (p50, p99 ms), and the p50 and p99 (us) of a round trip to it there
    beyond that run's p50."""
    mine, proc = spawned_peer(raw_engine_process, backend, path, shapes, settings, feeds, n)
    try:
        own50, own99 = (float(x) for x in mine.recv(64).decode().split())
        trips = round_trips(mine, n, own50 / 1e3)
    except (OSError, ValueError) as e:
        raise BenchError(f"the raw engine's process: {type(e).__name__}: {e}") from None
    finally:
        mine.close()
        proc.join(timeout=10)
    return own50, own99, trips.p50_ms * 1e3, trips.p99_ms * 1e3


def floor_us(busy_s: float, n: int) -> tuple[float, float]:
    """p50 and p99 (us) of a bare round trip to another process, beyond its busy wait of ``busy_s``."""
    mine, proc = spawned_peer(echo_process, busy_s)
    try:
        trips = round_trips(mine, n, busy_s)
    finally:
        mine.close()
        proc.join(timeout=10)
    return trips.p50_ms * 1e3, trips.p99_ms * 1e3


def spawned_peer(target: Callable[..., None], *args: Any) -> tuple[socket.socket, Any]:
    """A process running ``target(its end of a socket pair, *args)``, and this end (a timeout on it: a peer that
    hangs, in its compile say, fails the benchmark instead of stalling it)."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    proc = mp.get_context("spawn").Process(target=target, args=(theirs, *args), daemon=True)
    proc.start()
    theirs.close()
    mine.settimeout(300)
    return mine, proc


def round_trips(sock: socket.socket, n: int, beyond_s: float) -> LatencyStats:
    """``n`` round trips of a 20-byte message to the peer (after 20 unmeasured), each beyond ``beyond_s``."""
    samples = []
    beyond_ns = round(beyond_s * 1e9)
    for k in range(n + 20):
        t0 = time.perf_counter_ns()
        sock.send(b"x" * 20)
        if not sock.recv(64):
            raise BenchError("the peer process ended")
        if k >= 20:
            samples.append(time.perf_counter_ns() - t0 - beyond_ns)
    return LatencyStats.from_samples(samples)


# ---------------------------------------------------------------------------------------------- throughput
def client_process(socket_path: str, model: str, seed: int, conn: Any) -> None:
    """A client: ``execute`` in a loop for as long as it is told; its count back."""
    with connect(socket_path) as client, client.open_runner(model) as runner:
        subject = RunnerSubject(runner, runner_feeds(runner, seed=seed))
        for _ in range(5):
            subject.step()
        conn.send("ready")
        while (seconds := conn.recv()) is not None:
            conn.send(_loop(subject, seconds))


def _loop(subject: RunnerSubject, seconds: float) -> tuple[int, float]:
    count, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        subject.step()
        count += 1
    return count, elapsed


class Clients:
    """N client processes of the service, started once and run block by block."""

    def __init__(self, socket_path: Path, model: str, n: int) -> None:
        ctx = mp.get_context("spawn")
        self.conns, self.procs = [], []
        for k in range(n):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=client_process, args=(str(socket_path), model, k, theirs), daemon=True)
            proc.start()
            self.conns.append(mine)
            self.procs.append(proc)
        for conn in self.conns:
            if conn.recv() != "ready":
                raise RuntimeError("a client did not start")

    def rate(self, seconds: float) -> float:
        for conn in self.conns:
            conn.send(seconds)
        return sum(count / elapsed for count, elapsed in (conn.recv() for conn in self.conns))

    def close(self) -> None:
        for conn in self.conns:
            conn.send(None)
        for proc in self.procs:
            proc.join(timeout=30)


def threads_rate(subjects: list[RunnerSubject], seconds: float) -> float:
    """N threads of this process, each looping ``execute`` on its own tensors over one runner."""
    results: list[tuple[int, float]] = [(0, 1.0)] * len(subjects)

    def work(k: int) -> None:
        results[k] = _loop(subjects[k], seconds)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(subjects))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(count / elapsed for count, elapsed in results)


# ---------------------------------------------------------------------------------------------- main
def main() -> int:
    p = parser(__doc__)
    p.add_argument("--backend", default="openvino", choices=("openvino", "vaiml"))
    p.add_argument("--part", default="all", choices=("socket", "oip", "generate", "all"))
    p.add_argument("--kserve-python", default=os.environ.get("NPURT_KSERVE_PYTHON"),
                   help="the python of a venv with kserve and onnxruntime (default: $NPURT_KSERVE_PYTHON)")
    args = p.parse_args()
    if args.part == "generate":
        report = Report(f"npurt serve --generate ({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at "
                        "the start)")
        generation_section(report, args.quick, list(CLIENTS))
        return finish(report, args.json)
    if args.part == "oip":
        report = Report(f"npurt serve over the Open Inference Protocol ({os.cpu_count()} CPUs, load average "
                        f"{os.getloadavg()[0]:.1f} at the start)")
        oip_section(report, args.quick, args.kserve_python)
        return finish(report, args.json)
    report = socket_section(args)
    if args.part == "all":
        oip_section(report, args.quick, args.kserve_python)
        generation_section(report, args.quick, list(CLIENTS))
    return finish(report, args.json)


def socket_section(args: Any) -> Report:
    backend = args.backend.upper()
    quick = args.quick
    tmp = tempfile.TemporaryDirectory()
    frame_model = normalize_model(Path(tmp.name) / "normalize_1080p.onnx")
    cls_model = zoo.path("ocr_cls")
    options: dict[str, Any] = {"device": "CPU", "shapes": {"x": list(CLS_SHAPE)}, "num_threads": 1}
    serve_args = ["--backend", backend.lower(), "--device", "CPU", "--threads", "1", "--shape",
                  "cls:x=" + ",".join(map(str, CLS_SHAPE))]
    report = Report(f"npurt serve against an in-process runner, {backend} on CPU ({os.cpu_count()} CPUs, load "
                    f"average {os.getloadavg()[0]:.1f} at the start)")
    report.notes.append("both sides run each model with the same options (device CPU, one engine thread per run: "
                        "several runs share the cores); clients are separate processes, as a service's are")
    latency = Table(["input", "in-process p50 ms", "remote p50 ms", "added p50 us", "paired added us",
                     "in-process p99 ms", "remote p99 ms", "added p99 us"],
                    formats=["", "{:.3f}", "{:.3f}", "{:.0f}", "{:.0f}", "{:.3f}", "{:.3f}", "{:.0f}"])
    throughput = Table(["clients", "threads in one process /s", "service clients /s", "service / threads"],
                       formats=["", "{:.0f}", "{:.0f}", "{:.2f}x"])
    report.tables += [latency, throughput]
    added: dict[str, float] = {}
    above_floor: dict[str, float] = {}  # added p50 minus the floor around the same in-process time
    with ServiceProcess.start({"cls": cls_model, "frame": frame_model}, Path(tmp.name) / "serve.sock",
                              serve_args) as service:
        with connect(service.socket_path) as client:
            for label, model, path, n in (("PP-OCR cls 1x3x48x192", "cls", cls_model, 300 if quick else 2000),
                                          ("frame 1x3x1080x1920 f32", "frame", frame_model, 40 if quick else 300)):
                opts = options if model == "cls" else {"device": "CPU", "num_threads": 1}
                with RunnerFactory.create_runner(backend, path, opts) as local, client.open_runner(model) as remote:
                    feeds = runner_feeds(local)
                    subjects = [RunnerSubject(local, feeds, label="in-process"),
                                RunnerSubject(remote, feeds, label="remote")]
                    a, b = measure_latency(subjects, Budget(niter=n, time_s=None, warmup=20, blocks=10))
                    diff = paired_difference_ms(b, a) * 1e3
                    added[model] = (b.p50_ms - a.p50_ms) * 1e3
                    latency.add(label, a.p50_ms, b.p50_ms, added[model], diff, a.p99_ms, b.p99_ms,
                                (b.p99_ms - a.p99_ms) * 1e3)
                    f50, f99 = floor_us(a.p50_ms / 1e3, n)
                    above_floor[model] = added[model] - f50
                    latency.add(f"  floor: bare round trip around {a.p50_ms:.3f} ms", a.p50_ms, a.p50_ms + f50 / 1e3,
                                f50, f50, a.p99_ms, a.p99_ms + f99 / 1e3, f99)
                    own50, own99, r50, r99 = raw_engine_us(backend, str(path), opts.get("shapes"),
                                                           list(local.device_info.engine_settings), feeds, n)
                    latency.add("  the engine behind a bare socket (in-process: its own run there)", own50,
                                own50 + r50 / 1e3, r50, r50, own99, own50 + r99 / 1e3, r99 - (own99 - own50) * 1e3)
                    if remote.stats["copies"] or local.stats["copies"]:
                        raise BenchError(f"{label}: a copy was made ({remote.stats}, {local.stats})")
        seconds = 0.5 if quick else 2.0
        blocks = 2 if quick else 4
        with RunnerFactory.create_runner(backend, cls_model, options) as local:
            ratios4 = []
            for n in CLIENTS:
                clients = Clients(service.socket_path, "cls", n)
                subjects = [RunnerSubject(local, runner_feeds(local, seed=k)) for k in range(n)]
                try:
                    threads_rate(subjects, 0.2)
                    rates_t, rates_s = [], []
                    for k in range(blocks):  # alternating, the order turned each block
                        order = (threads_rate, clients.rate) if k % 2 == 0 else (clients.rate, threads_rate)
                        for fn in order:
                            rate = fn(subjects, seconds) if fn is threads_rate else fn(seconds)
                            (rates_t if fn is threads_rate else rates_s).append(rate)
                finally:
                    clients.close()
                ratio = float(np.median([s / t for s, t in zip(rates_s, rates_t)]))
                throughput.add(str(n), float(np.median(rates_t)), float(np.median(rates_s)), ratio)
                if n == 4:
                    ratios4.append(ratio)
    tmp.cleanup()
    report.targets += [
        Target("added p50 above the floor, PP-OCR classifier", above_floor["cls"], 60, unit=" us"),
        Target("added p50 above the floor, 1x3x1080x1920 frame", above_floor["frame"], 60, unit=" us"),
        # one-sided: a size cost shows as the frame adding more; adding less is the frame's in-process run swinging
        Target("added p50 above the floor, frame minus classifier (size independence)",
               above_floor["frame"] - above_floor["cls"], 60, unit=" us"),
        Target("throughput, 4 clients / 4 threads in one process", ratios4[0], 0.95, at_most=False, unit="x"),
    ]
    return report


# ---------------------------------------------------------------------------------------------- Open Inference Protocol
KSERVE_MODEL = """
import argparse, onnxruntime as ort
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer

class OnnxModel(Model):
    # what a KServe user writes: ONNX Runtime's session, its outputs as binary tensors. With several workers KServe
    # pickles the model into each worker process: the session is made there, on first use.
    def __init__(self, name, path, threads):
        super().__init__(name)
        self.path, self.threads, self.session = path, threads, None
        self.ready = True

    def predict(self, payload: InferRequest, headers=None) -> InferResponse:
        if self.session is None:
            options = ort.SessionOptions()
            options.intra_op_num_threads = self.threads
            self.session = ort.InferenceSession(self.path, options, providers=["CPUExecutionProvider"])
            self.outputs = [o.name for o in self.session.get_outputs()]
        results = self.session.run(self.outputs, {i.name: i.as_numpy() for i in payload.inputs})
        outputs = []
        for name, array in zip(self.outputs, results):
            out = InferOutput(name=name, shape=list(array.shape), datatype="FP32")
            out.set_data_from_numpy(array, binary_data=True)
            outputs.append(out)
        return InferResponse(model_name=self.name, infer_outputs=outputs, response_id=payload.id or "0")

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--path"); p.add_argument("--name"); p.add_argument("--port", type=int)
    p.add_argument("--grpc-port", type=int); p.add_argument("--threads", type=int)
    p.add_argument("--workers", type=int)
    a = p.parse_args()
    ModelServer(http_port=a.port, grpc_port=a.grpc_port, enable_grpc=True, workers=a.workers,
                enable_latency_logging=False).start([OnnxModel(a.name, a.path, a.threads)])
"""
CLS_OUT = "save_infer_model/scale_0.tmp_1"
OIP_CLIENTS = (1, 8)
PROTOCOLS = ("HTTP", "gRPC")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class KServeProcess:
    """KServe's model server for one ONNX model, from a venv of its own."""

    def __init__(self, python: str, model: Path, name: str, tmp: Path, threads: int, workers: int) -> None:
        script = tmp / "kserve_model.py"
        script.write_text(KSERVE_MODEL)
        self.port, grpc_port = free_port(), free_port()
        self.log = open(tmp / "kserve.log", "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen([python, str(script), "--path", str(model), "--name", name, "--port",
                                         str(self.port), "--grpc-port", str(grpc_port), "--threads", str(threads),
                                         "--workers", str(workers)], stdout=self.log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL)
        self.address = f"127.0.0.1:{self.port}"
        self.addresses = {"HTTP": self.address, "gRPC": f"127.0.0.1:{grpc_port}"}
        import tritonclient.grpc as grpcclient
        import tritonclient.http as httpclient

        deadline = time.monotonic() + 120
        while True:
            try:
                if httpclient.InferenceServerClient(self.address).is_model_ready(name) and \
                        grpcclient.InferenceServerClient(self.addresses["gRPC"]).is_model_ready(name):
                    break
            except Exception:  # noqa: BLE001 - not up yet
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise BenchError(f"KServe's model server did not start: {(tmp / 'kserve.log').read_text()[-2000:]}")
            time.sleep(0.3)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def infer_fn(protocol: str, address: str, model: str, x: np.ndarray) -> Any:
    """One client's infer request, as a callable: tritonclient.http with binary data, or tritonclient.grpc (a
    connection of its own)."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    if protocol == "HTTP":
        client = httpclient.InferenceServerClient(address)
        outputs = [httpclient.InferRequestedOutput(CLS_OUT, binary_data=True)]

        def infer() -> np.ndarray:
            i = httpclient.InferInput("x", list(x.shape), "FP32")
            i.set_data_from_numpy(x, binary_data=True)
            return client.infer(model, [i], outputs=outputs).as_numpy(CLS_OUT)

        return infer
    channel = grpcclient.InferenceServerClient(address)
    grpc_outputs = [grpcclient.InferRequestedOutput(CLS_OUT)]

    def infer_grpc() -> np.ndarray:
        i = grpcclient.InferInput("x", list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        return channel.infer(model, [i], outputs=grpc_outputs).as_numpy(CLS_OUT)

    return infer_grpc


def oip_client_process(protocol: str, address: str, seed: int, conn: Any) -> None:
    """A tritonclient client process: infer in a loop for as long as it is told; its count back."""
    x = np.random.default_rng(seed).random(CLS_SHAPE, dtype=np.float32)
    infer = infer_fn(protocol, address, "cls", x)
    for _ in range(5):
        infer()
    conn.send("ready")
    while (seconds := conn.recv()) is not None:
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            infer()
            count += 1
        conn.send((count, time.perf_counter() - start))


class OipClients:
    def __init__(self, protocol: str, address: str, n: int) -> None:
        ctx = mp.get_context("spawn")
        self.conns, self.procs = [], []
        for k in range(n):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=oip_client_process, args=(protocol, address, k, theirs), daemon=True)
            proc.start()
            self.conns.append(mine)
            self.procs.append(proc)
        for conn in self.conns:
            if conn.recv() != "ready":
                raise BenchError("a client did not start")

    def rate(self, seconds: float) -> float:
        for conn in self.conns:
            conn.send(seconds)
        return sum(count / elapsed for count, elapsed in (conn.recv() for conn in self.conns))

    def close(self) -> None:
        for conn in self.conns:
            conn.send(None)
        for proc in self.procs:
            proc.join(timeout=30)


def statistics_fn(address: str) -> Any:
    """npurt serve's statistics of the classifier (Triton's schema), as a callable."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(address)

    def read() -> dict[str, Any]:
        return dict(client.get_inference_statistics("cls")["model_stats"][0]["inference_stats"])

    return read


def oip_latency(report: Report, table: Table, servers: dict[str, dict[str, str]], x: np.ndarray,
                quick: bool) -> None:
    """p50 / p99 of one client, every server and protocol taking turns; npurt's against KServe's faster protocol."""
    labels = [(server, protocol) for server, addresses in servers.items() for protocol in addresses]
    subjects = [CallSubject(f"PP-OCR cls, {server}, {protocol}", infer_fn(protocol, servers[server][protocol], "cls",
                                                                           x)) for server, protocol in labels]
    statistics = statistics_fn(servers["npurt serve"]["HTTP"])
    before = statistics()
    stats = measure_latency(subjects, Budget(niter=150 if quick else 1000, time_s=None, warmup=20, blocks=6))
    after = statistics()
    requests = after["success"]["count"] - before["success"]["count"]
    phases = ("success", "compute_input", "queue", "compute_infer", "compute_output")
    phase_table = Table(["phase (Triton's statistics)", "us per request"], formats=["", "{:.0f}"],
                        title=f"npurt serve's own figures over the latency run ({requests} requests, both protocols)")
    for phase in phases:
        phase_table.add(phase, (after[phase]["ns"] - before[phase]["ns"]) / max(requests, 1) / 1e3)
    report.tables.append(phase_table)
    theirs = {protocol: st.p50_ms for (server, protocol), st in zip(labels, stats) if server == "KServe"}
    faster = min(theirs, key=lambda k: theirs[k]) if theirs else None
    for subject, st in zip(subjects, stats):
        table.add(subject.label, st.p50_ms, st.p99_ms, st.p50_ms / theirs[faster] if faster else None)
    if faster is not None:
        for (server, protocol), st in zip(labels, stats):
            if server == "npurt serve":
                report.targets.append(Target(f"p50 at 1 client, npurt serve {protocol} / KServe {faster}",
                                             st.p50_ms / theirs[faster], 0.8, unit="x"))


def oip_throughput(report: Report, table: Table, servers: dict[str, dict[str, str]], quick: bool) -> None:
    """Requests/s of 1 and 8 client processes per server and protocol, in alternating blocks (the order turned each
    block); npurt's against KServe's faster protocol (the median of the blocks' ratios)."""
    seconds, blocks = (1.0, 2) if quick else (3.0, 4)
    for clients in OIP_CLIENTS:
        groups = {(server, protocol): OipClients(protocol, address, clients)
                  for server, addresses in servers.items() for protocol, address in addresses.items()}
        rates: dict[tuple[str, str], list[float]] = {key: [] for key in groups}
        try:
            for k in range(blocks):
                order = list(groups.items())
                for key, group in order if k % 2 == 0 else order[::-1]:
                    rates[key].append(group.rate(seconds))
        finally:
            for group in groups.values():
                group.close()
        kserve = [key for key in rates if key[0] == "KServe"]
        faster = max(kserve, key=lambda key: float(np.median(rates[key])))
        for key, values in rates.items():
            ratio = float(np.median([a / b for a, b in zip(values, rates[faster])]))
            table.add(str(clients), f"{key[0]}, {key[1]}", float(np.median(values)), ratio)
            if clients == 8 and key[0] == "npurt serve":
                report.targets.append(Target(f"throughput at 8 clients, npurt serve {key[1]} / KServe {faster[1]}",
                                             ratio, 1.2, at_most=False, unit="x"))


def oip_shared_memory(report: Report, latency: Table, service: ServiceProcess, quick: bool) -> None:
    """The 1080p frame: an HTTP request whose input and output lie in system shared memory against the socket
    protocol's round trip of the same frame through the same server."""
    import tritonclient.http as httpclient
    import tritonclient.utils.shared_memory as shm

    frame = np.random.default_rng(1).random(FRAME_SHAPE, dtype=np.float32)
    key_in, key_out = f"/npurt_bench_in_{os.getpid()}", f"/npurt_bench_out_{os.getpid()}"
    region_in = shm.create_shared_memory_region("bench_in", key_in, frame.nbytes)
    region_out = shm.create_shared_memory_region("bench_out", key_out, frame.nbytes)
    try:
        shm.set_shared_memory_region(region_in, [frame])
        client = httpclient.InferenceServerClient(service.http_address)
        client.register_system_shared_memory("bench_in", key_in, frame.nbytes)
        client.register_system_shared_memory("bench_out", key_out, frame.nbytes)
        request_input = httpclient.InferInput("x", list(FRAME_SHAPE), "FP32")
        request_input.set_shared_memory("bench_in", frame.nbytes)
        request_output = httpclient.InferRequestedOutput("y")
        request_output.set_shared_memory("bench_out", frame.nbytes)

        def shm_infer() -> None:
            client.infer("frame", [request_input], outputs=[request_output])

        with connect(service.socket_path) as socket_client, socket_client.open_runner("frame") as remote:
            feeds = {"x": frame}
            socket_subject = RunnerSubject(remote, feeds, label="socket protocol")
            shm_subject = CallSubject("HTTP, input and output in system shared memory", shm_infer)
            n_frame = 40 if quick else 300
            a, b = measure_latency([socket_subject, shm_subject],
                                   Budget(niter=n_frame, time_s=None, warmup=10, blocks=6))
            got = shm.get_contents_as_numpy(region_out, np.float32, list(FRAME_SHAPE))
            if not np.array_equal(got, remote.run(feeds)["y"]):
                report.problems.append("the shared memory request's output differs from the socket's")
            latency.add("1x3x1080x1920 f32, socket protocol (registered tensors)", a.p50_ms, a.p99_ms, 1.0)
            latency.add("1x3x1080x1920 f32, HTTP with system shared memory", b.p50_ms, b.p99_ms,
                        b.p50_ms / a.p50_ms)
            report.targets.append(Target("1080p frame: HTTP over shared memory / socket protocol round trip",
                                         b.p50_ms / a.p50_ms, 1.1, unit="x"))
        client.unregister_system_shared_memory()
    finally:
        shm.destroy_shared_memory_region(region_in)
        shm.destroy_shared_memory_region(region_out)


def oip_section(report: Report, quick: bool, kserve_python: str | None) -> None:
    """npurt serve over HTTP and gRPC against KServe's model server over both; the 1080p frame in shared memory
    against the socket."""
    tmp_dir = tempfile.TemporaryDirectory()
    tmp = Path(tmp_dir.name)
    cls_model = zoo.path("ocr_cls")
    frame_model = normalize_model(tmp / "normalize_1080p.onnx")
    args = ["--backend", "vaiml", "--device", "CPU", "--threads", "1", "--shape",
            "cls:x=" + ",".join(map(str, CLS_SHAPE)), "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"]
    report.notes.append("Open Inference Protocol: both servers run the PP-OCR classifier on ONNX Runtime's CPU "
                        "provider (npurt's VAIML backend on CPU, no Vitis AI EP), one intra-op thread per run, two "
                        "runs at once (npurt: two slots; KServe: two uvicorn workers); clients are tritonclient.http "
                        "processes sending binary data and tritonclient.grpc processes; each ratio is against "
                        "KServe's faster protocol")
    latency = Table(["request", "p50 ms", "p99 ms", "p50 / KServe's faster"],
                    formats=["", "{:.3f}", "{:.3f}", "{:.2f}x"], title="latency, one client")
    throughput = Table(["clients", "server, protocol", "requests/s", "/ KServe's faster"],
                       formats=["", "", "{:.0f}", "{:.2f}x"], title="throughput")
    report.tables += [latency, throughput]
    deaths = 0
    kserve: KServeProcess | None = None
    with ServiceProcess.start({"cls": cls_model, "frame": frame_model}, tmp / "serve.sock", args) as service:
        try:
            servers = {"npurt serve": {"HTTP": service.http_address, "gRPC": service.grpc_address}}
            x = np.random.default_rng(0).random(CLS_SHAPE, dtype=np.float32)
            with RunnerFactory.create_runner("VAIML", cls_model, {"device": "CPU", "num_threads": 1,
                                                                  "shapes": {"x": list(CLS_SHAPE)}}) as local:
                expected = local.run({"x": x})[CLS_OUT]
            for protocol, address in servers["npurt serve"].items():
                if not np.array_equal(infer_fn(protocol, address, "cls", x)(), expected):
                    report.problems.append(f"npurt serve's answer over {protocol} differs from the in-process "
                                           "runner's")
            if kserve_python:
                kserve = KServeProcess(kserve_python, cls_model, "cls", tmp, threads=1, workers=2)
                servers["KServe"] = kserve.addresses
                for protocol, address in kserve.addresses.items():
                    if not np.allclose(infer_fn(protocol, address, "cls", x)(), expected, atol=1e-5):
                        report.problems.append(f"KServe's answer over {protocol} differs from npurt serve's")
            else:
                report.notes.append("KServe: no --kserve-python (or $NPURT_KSERVE_PYTHON): its rows and targets are "
                                    "left out")
            oip_latency(report, latency, servers, x, quick)
            if kserve is not None:
                oip_throughput(report, throughput, servers, quick)
            oip_shared_memory(report, latency, service, quick)
            deaths += service.process.poll() is not None
            if kserve is not None:
                deaths += kserve.process.poll() is not None
        finally:
            if kserve is not None:
                kserve.stop()
    report.targets.append(Target("server deaths", float(deaths), 0, unit=""))
    tmp_dir.cleanup()


if __name__ == "__main__":
    sys.exit(main())
