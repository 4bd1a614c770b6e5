"""Streams and stateful models: S concurrent silero-vad streams (S = 1, 4, 16) through one npurt runner against the
same streams through the engine used directly, on CPU, per backend.

Each stream is a thread feeding 512-sample chunks of speech (examples/speech.py; a noise signal where espeak-ng or
sox is missing) as fast as it can, each chunk with the last 64 samples of the one before (examples/vad.py).
- npurt: one runner (``RunnerFactory.create_runner`` options ``{"device": "CPU", "state_pairs": {"state":
  "stateN"}}``, no ``shapes``), one ``runner.open_stream()`` per stream, ``stream.run({"input", "sr"})``: the state
  stays in the runner.
- raw: one engine request per stream, the state copied by hand from ``stateN`` to the next ``state``
  (``vad.SileroVad``): ONNX Runtime one ``InferenceSession`` for every stream with the runner's thread settings,
  ``run``; OpenVINO one compiled model (the runner's properties: f32) and one ``InferRequest`` per stream,
  ``infer(feeds, share_inputs=True, share_outputs=True)``. ``NPURT_NUM_THREADS`` is cleared: both sides take the
  settings stated.
OpenVINO cannot read silero_vad_16k_op15: both OpenVINO sides run the op18_ifless export.

The sides take turns in blocks (every stream advances a fixed number of chunks per block; the order alternates);
chunks per second per block, paired with the neighbouring block of the other side (median of the ratios), and
per-chunk latency p50 / p99 over all chunks of all blocks.

Targets (issue "Streams and stateful models"): throughput npurt/raw >= 1.0, p50 npurt/raw <= 1.10, for every S on
both backends; each stream finds the same speech probabilities through both (within 1e-5).

    python -m benchmarks.streams [--quick] [--json] [--streams 1,4,16] [--backends OPENVINO,VAIML]
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from benchmarks import finish, onnxruntime_session, parser
from benchmarks.apps import (
    BACKENDS,
    RAW_ENGINE,
    VAD_MODEL,
    StreamVad,
    audio_chunks,
    model_path,
    npurt_runner,
    vad,
    vad_audio,
)
from npurt.bench import LatencyStats, Report, Table, Target
from npurt.runner import Runner

STREAMS = (1, 4, 16)
THROUGHPUT_LIMIT, P50_LIMIT = 1.0, 1.10
PROBABILITY_TOLERANCE = 1e-5


def raw_stream_factory(backend: str, path: str, runner: Runner) -> Callable[[], vad.SileroVad]:
    """A new stream on the engine used directly: its own session (ONNX Runtime) or infer request (OpenVINO)."""
    if backend == "OPENVINO":
        import openvino as ov

        compiled = ov.Core().compile_model(path, "CPU", dict(runner.device_info.engine_settings))
        ports = [(o, o.get_any_name()) for o in compiled.outputs]

        def openvino_stream() -> vad.SileroVad:
            request = compiled.create_infer_request()

            def infer(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
                result = request.infer(feeds, share_inputs=True, share_outputs=True)  # no copies (as npurt's)
                return {name: result[port] for port, name in ports}

            return vad.SileroVad(infer)

        return openvino_stream
    # One session for every stream, as a user writes it (a session takes concurrent runs), with the runner's thread
    # settings: a default session per stream would start one spinning pool of every core per stream.
    session = onnxruntime_session(path, runner.device_info.engine_settings)
    names = [o.name for o in session.get_outputs()]

    def onnxruntime_stream() -> vad.SileroVad:
        return vad.SileroVad(lambda feeds: dict(zip(names, session.run(None, feeds))))

    return onnxruntime_stream


class StreamSet:
    """S streams, each a thread of its own feeding its chunks in order; the next block goes on where the last
    ended (each stream starts over at the end of the audio)."""

    def __init__(self, label: str, streams: Sequence[Any], chunks: Sequence[np.ndarray]) -> None:
        self.label, self.streams, self.chunks = label, list(streams), chunks
        self.positions = [(k * 37) % len(chunks) for k in range(len(streams))]  # streams out of step
        self.pool = ThreadPoolExecutor(max_workers=len(streams), thread_name_prefix=f"streams-{label}")
        self.samples_ns: list[int] = []
        self.block_rates: list[float] = []

    def block(self, chunks_per_stream: int, record: bool = True) -> None:
        barrier = threading.Barrier(len(self.streams) + 1)

        def feed(k: int) -> list[int]:
            step, times, clock = self.streams[k], [], time.perf_counter_ns
            barrier.wait()
            for _ in range(chunks_per_stream):
                if self.positions[k] == len(self.chunks):
                    self.positions[k] = 0
                    step.reset()
                chunk = self.chunks[self.positions[k]]
                t0 = clock()
                step(chunk)
                times.append(clock() - t0)
                self.positions[k] += 1
            return times

        futures = [self.pool.submit(feed, k) for k in range(len(self.streams))]
        barrier.wait()
        start = time.perf_counter()
        results = [f.result() for f in futures]
        elapsed = time.perf_counter() - start
        if record:
            self.block_rates.append(len(self.streams) * chunks_per_stream / elapsed)
            for times in results:
                self.samples_ns += times

    def close(self) -> None:
        self.pool.shutdown()


def same_probabilities(npurt_stream: StreamVad, raw_stream: vad.SileroVad, chunks: Sequence[np.ndarray]) -> float:
    """The largest difference of the speech probabilities of one pass over the audio (both start afresh)."""
    npurt_stream.reset()
    raw_stream.reset()
    a = np.array([npurt_stream(c) for c in chunks])
    b = np.array([raw_stream(c) for c in chunks])
    npurt_stream.reset()
    raw_stream.reset()
    return float(np.abs(a - b).max())


def measure(backend: str, count: int, chunks: Sequence[np.ndarray], per_block: int, blocks: int, table: Table,
            report: Report) -> None:
    path = model_path(VAD_MODEL[backend])
    runner = npurt_runner(backend, path, state_pairs={"state": "stateN"})
    sides: list[StreamSet] = []
    try:
        make_raw = raw_stream_factory(backend, path, runner)
        npurt_streams = [StreamVad(runner) for _ in range(count)]
        raw_streams = [make_raw() for _ in range(count)]
        diff = same_probabilities(npurt_streams[0], raw_streams[0], chunks)
        sides = [StreamSet("npurt", npurt_streams, chunks), StreamSet("raw", raw_streams, chunks)]
        for side in sides:
            side.block(max(5, per_block // 4), record=False)  # warm-up
        for k in range(blocks):
            for side in (sides if k % 2 == 0 else sides[::-1]):
                side.block(per_block)
        copies = runner.stats["copies"]
    finally:
        for side in sides:
            side.close()
        runner.close()
    a, b = (LatencyStats.from_samples(s.samples_ns) for s in sides)
    throughput = statistics.median(x / y for x, y in zip(sides[0].block_rates, sides[1].block_rates))
    rates = [statistics.median(s.block_rates) for s in sides]
    table.add(backend, count, rates[0], rates[1], throughput, a.p50_ms * 1e3, b.p50_ms * 1e3, a.p50_ms / b.p50_ms,
              a.p99_ms * 1e3, b.p99_ms * 1e3, a.p99_ms / b.p99_ms, diff)
    report.targets.append(Target(f"{backend} {count} streams chunks/s npurt/raw", throughput, THROUGHPUT_LIMIT,
                                 at_most=False))
    report.targets.append(Target(f"{backend} {count} streams p50 npurt/raw", a.p50_ms / b.p50_ms, P50_LIMIT))
    if not diff <= PROBABILITY_TOLERANCE:
        report.problems.append(f"{backend} {count} streams: speech probabilities differ by {diff:.2g} from raw "
                               f"{RAW_ENGINE[backend]}")
    if copies:
        report.problems.append(f"{backend} {count} streams: {copies} host copies of the carried state")


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--streams", default=",".join(map(str, STREAMS)), help="comma-separated stream counts")
    p.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated: OPENVINO, VAIML")
    args = p.parse_args()
    wanted = {b.strip().upper() for b in args.backends.split(",") if b.strip()}
    if wanted - set(BACKENDS):
        p.error(f"unknown backends {sorted(wanted - set(BACKENDS))}; known: {', '.join(BACKENDS)}")
    backends = [b for b in BACKENDS if b in wanted]  # OpenVINO first: before anything imports onnxruntime
    counts = [int(s) for s in args.streams.split(",") if s.strip()]
    audio, source = vad_audio()
    chunks = audio_chunks(audio)
    blocks = 5 if args.quick else 9
    chunk_budget = 150 if args.quick else 2400  # chunks per block, over all streams
    report = Report(f"Concurrent silero-vad streams through one npurt runner against one engine request per stream, "
                    f"CPU, {'quick' if args.quick else 'full'} run",
                    notes=[f"audio: {len(chunks)} chunks of {source}; {blocks} blocks per side"])
    table = Table(["backend", "streams", "npurt chunks/s", "raw chunks/s", "ratio", "npurt p50 us", "raw p50 us",
                   "p50 ratio", "npurt p99 us", "raw p99 us", "p99 ratio", "max |dp|"],
                  formats=["", "", "{:.0f}", "{:.0f}", "{:.3f}", "{:.1f}", "{:.1f}", "{:.3f}", "{:.1f}", "{:.1f}",
                           "{:.3f}", "{:.1e}"],
                  title="per-chunk latency and chunks per second (ratio: median of paired block ratios)")
    report.tables.append(table)
    for backend in backends:
        for count in counts:
            measure(backend, count, chunks, max(10, chunk_budget // count), blocks, table, report)
    return finish(report, args.json)


if __name__ == "__main__":
    sys.exit(main())
