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
- Throughput: N client processes, each running ``execute`` in a loop on its own tensors, against N threads doing
  the same on one in-process runner, for N = 1, 4 and 8, in alternating blocks (the ratio is the median of the
  blocks' ratios).

Targets (the issue): added p50 <= 60 us, independent of the tensor's size (the 1080p frame's added p50 within 60 us
of the classifier's); throughput with 4 clients >= 0.95x of 4 threads in one process.

    python -m benchmarks.serve [--quick] [--json] [--backend openvino|vaiml]
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import finish, parser
from npurt import RunnerFactory
from npurt.bench import BenchError, Budget, Report, RunnerSubject, Table, Target, measure_latency, paired_difference_ms
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


def floor_us(busy_s: float, n: int) -> tuple[float, float]:
    """p50 and p99 (us) of a bare round trip to another process, beyond its busy wait of ``busy_s``."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    proc = mp.get_context("spawn").Process(target=echo_process, args=(theirs, busy_s), daemon=True)
    proc.start()
    theirs.close()
    samples = []
    try:
        for k in range(n + 20):
            t0 = time.perf_counter()
            mine.send(b"x" * 20)
            mine.recv(64)
            if k >= 20:
                samples.append(time.perf_counter() - t0 - busy_s)
    finally:
        mine.close()
        proc.join(timeout=10)
    samples.sort()
    return samples[len(samples) // 2] * 1e6, samples[int(len(samples) * 0.99)] * 1e6


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
    args = p.parse_args()
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
                    latency.add(f"  floor: bare round trip around {a.p50_ms:.3f} ms", a.p50_ms, a.p50_ms + f50 / 1e3,
                                f50, f50, a.p99_ms, a.p99_ms + f99 / 1e3, f99)
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
        Target("added p50, PP-OCR classifier", added["cls"], 60, unit=" us"),
        Target("added p50, 1x3x1080x1920 frame", added["frame"], 60, unit=" us"),
        Target("added p50, frame minus classifier (size independence)", abs(added["frame"] - added["cls"]), 60,
               unit=" us"),
        Target("throughput, 4 clients / 4 threads in one process", ratios4[0], 0.95, at_most=False, unit="x"),
    ]
    return finish(report, args.json)


if __name__ == "__main__":
    sys.exit(main())
