"""Handing a tensor to another process and getting an acknowledgement, four ways, in one run.

- npurt.share: ``send_tensors`` of a runner-style tensor (memfd / dma-buf) over an AF_UNIX socket; the
  receiver maps the same memory (``recv_tensors``), reads one element and acks. No data is copied.
- multiprocessing.Queue: ``put`` of the numpy array (pickled through a pipe); the receiver gets a copy,
  reads one element and acks.
- multiprocessing.shared_memory, zero copy: the frame lives in a shared block both sides attached once (the
  producer writes it there, as a decoder writing into shared memory would); the sender sends a small message over a
  multiprocessing Pipe; the receiver reads one element and acks. The same work as npurt.share, done by hand:
  the baseline it must be measured against.
- multiprocessing.shared_memory with a copy: the sender copies the frame into such a block per send.

Each is timed from the send to the ack (``npurt.bench.measure_latency``): npurt.share and the zero-copy block
take turns in blocks; so do the Queue and the copying block (a thousand times slower, with fewer iterations). At
1 MB, at a 1x3x1080x1920 float32 frame (24.9 MB) and at 100 MB.
Targets (issue 3): npurt.share >= 50x faster than the Queue at the frame size, and its time at 100 MB within
2x of its time at 1 MB (hand-off time must not depend on size); npurt.share within 2x of the zero-copy block (the
fd passed and mapped per message, against a block mapped once).

    python -m benchmarks.share [--quick] [--json]
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import sys
import tempfile
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from benchmarks import finish, parser
from npurt import DataType, NpuTensorInfo, TensorType
from npurt.bench import Budget, CallSubject, Report, Table, Target, measure_latency
from npurt.share import recv_tensors, send_tensors
from npurt.tensor import allocate_tensor

SIZES = [("1 MB", (1, 1, 512, 512)), ("1x3x1080x1920", (1, 3, 1080, 1920)), ("100 MB", (1, 25, 1000, 1000))]
STOP = -1  # tells a worker to end


def share_worker(path: str) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    while True:
        try:
            (t,) = recv_tensors(sock)
        except ConnectionError:  # the sender closed the socket: done
            break
        float(t.numpy().flat[0])  # the receiver really reads the memory
        sock.sendall(b"k")
        del t
    sock.close()


def queue_worker(q_in: mp.Queue, q_out: mp.Queue) -> None:
    while True:
        a = q_in.get()
        if isinstance(a, int) and a == STOP:
            break
        float(a.flat[0])
        q_out.put(1)


def shm_worker(name: str, shape: tuple[int, ...], conn: Any) -> None:
    block = shared_memory.SharedMemory(name=name)
    view = np.ndarray(shape, np.float32, buffer=block.buf)
    while conn.recv() != STOP:
        float(view.flat[0])
        conn.send(1)
    del view
    block.close()


class ShareHandOff:
    """npurt.share: a tensor's fd over an AF_UNIX socket to a worker that maps it, reads and acks."""

    def __init__(self, ctx: Any, shape: tuple[int, ...]) -> None:
        info = NpuTensorInfo(name="frame", data_type=DataType.FLOAT32, shape=shape, tensor_type=TensorType.CPU)
        self.frame = allocate_tensor(info)
        self.frame.numpy()[...] = 1.0
        self.tmp = tempfile.TemporaryDirectory()
        path = os.path.join(self.tmp.name, "s")
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(1)
        self.worker = ctx.Process(target=share_worker, args=(path,))
        self.worker.start()
        self.conn, _ = self.server.accept()

    def __call__(self) -> None:
        send_tensors(self.conn, [self.frame])
        if self.conn.recv(1) != b"k":
            raise RuntimeError("share worker died")

    def close(self) -> None:
        self.conn.close()
        self.worker.join()
        self.server.close()
        self.tmp.cleanup()


class QueueHandOff:
    """multiprocessing.Queue: the array pickled through a pipe; the worker reads and acks."""

    def __init__(self, ctx: Any, shape: tuple[int, ...]) -> None:
        self.frame = np.ones(shape, np.float32)
        self.q_in, self.q_out = ctx.Queue(), ctx.Queue()
        self.worker = ctx.Process(target=queue_worker, args=(self.q_in, self.q_out))
        self.worker.start()

    def __call__(self) -> None:
        self.q_in.put(self.frame)
        self.q_out.get()

    def close(self) -> None:
        self.q_in.put(STOP)
        self.worker.join()


class SharedFrameHandOff:
    """multiprocessing.shared_memory, zero copy: the frame lives in a block both sides attached once; a message, an
    ack."""

    def __init__(self, ctx: Any, shape: tuple[int, ...]) -> None:
        self.block = shared_memory.SharedMemory(create=True, size=int(np.prod(shape)) * 4)
        self.frame = np.ndarray(shape, np.float32, buffer=self.block.buf)
        self.frame[...] = 1.0  # the producer's frame, written in place
        self.mine, theirs = ctx.Pipe()
        self.worker = ctx.Process(target=shm_worker, args=(self.block.name, shape, theirs))
        self.worker.start()

    def __call__(self) -> None:
        self.mine.send(0)
        self.mine.recv()

    def close(self) -> None:
        self.mine.send(STOP)
        self.worker.join()
        del self.frame
        self.block.close()
        self.block.unlink()


class SharedMemoryHandOff:
    """multiprocessing.shared_memory: copy into a block both sides attached once, a message, an ack."""

    def __init__(self, ctx: Any, shape: tuple[int, ...]) -> None:
        self.frame = np.ones(shape, np.float32)
        self.block = shared_memory.SharedMemory(create=True, size=self.frame.nbytes)
        self.view = np.ndarray(shape, np.float32, buffer=self.block.buf)
        self.view[...] = 0  # first touch outside the timing, as a long-lived block would be
        self.mine, theirs = ctx.Pipe()
        self.worker = ctx.Process(target=shm_worker, args=(self.block.name, shape, theirs))
        self.worker.start()

    def __call__(self) -> None:
        np.copyto(self.view, self.frame)
        self.mine.send(0)
        self.mine.recv()

    def close(self) -> None:
        self.mine.send(STOP)
        self.worker.join()
        del self.view
        self.block.close()
        self.block.unlink()


def main() -> int:
    args = parser(__doc__).parse_args()
    ctx = mp.get_context("spawn")
    scale = 0.25 if args.quick else 1.0
    report = Report(f"hand-off to another process and ack, p50 of each ({os.cpu_count()} CPUs, python "
                    f"{sys.version.split()[0]})")
    table = Table(["size", "bytes", "npurt.share us", "(p90 us)", "shm zero-copy us", "npurt/shm zero-copy",
                   "mp.Queue ms", "shm copy ms", "Queue/npurt", "shm copy/npurt"],
                  formats=["", "", "{:.0f}", "{:.0f}", "{:.0f}", "{:.2f}", "{:.2f}", "{:.2f}", "{:.0f}x", "{:.0f}x"])
    report.tables.append(table)
    share_p50 = {}
    for label, shape in SIZES:
        nbytes = int(np.prod(shape)) * 4
        n_share = max(20, int(300 * scale))
        n_copy = max(4, int((8 if nbytes > 50e6 else 30 if nbytes > 2e6 else 100) * scale))
        share, frame = ShareHandOff(ctx, shape), SharedFrameHandOff(ctx, shape)
        try:
            s, z = measure_latency([CallSubject("npurt.share", share), CallSubject("shm zero-copy", frame)],
                                   Budget(niter=n_share, time_s=None, warmup=3, blocks=10))
        finally:
            share.close()
            frame.close()
        queue, shm = QueueHandOff(ctx, shape), SharedMemoryHandOff(ctx, shape)
        try:
            q, m = measure_latency([CallSubject("mp.Queue", queue), CallSubject("shared_memory", shm)],
                                   Budget(niter=n_copy, time_s=None, warmup=1, blocks=min(n_copy, 10), settle=0))
        finally:
            queue.close()
            shm.close()
        share_p50[label] = s.p50_ms
        table.add(label, nbytes, s.p50_ms * 1e3, s.p90_ms * 1e3, z.p50_ms * 1e3, s.p50_ms / z.p50_ms, q.p50_ms,
                  m.p50_ms, q.p50_ms / s.p50_ms, m.p50_ms / s.p50_ms)
        report.targets.append(Target(f"npurt.share against the zero-copy shared block at {label}",
                                     s.p50_ms / z.p50_ms, 2, unit="x"))
        if label == "1x3x1080x1920":
            report.targets.append(Target("npurt.share against mp.Queue at the frame size", q.p50_ms / s.p50_ms, 50,
                                         at_most=False, unit="x"))
    report.targets.append(Target("npurt.share at 100 MB / at 1 MB", share_p50["100 MB"] / share_p50["1 MB"], 2))
    return finish(report, args.json)


if __name__ == "__main__":
    sys.exit(main())
