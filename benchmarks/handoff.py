"""What a job pays beyond the engine's own work, per way of running it, and what a thread hand-off costs here.

The model is a Relu over 64 floats (built here): the engine's own work is a few microseconds, so what is measured is
the path around it. One job at a time (N = 1), on both backends (OpenVINO CPU, ONNX Runtime CPU):
- raw: the engine called directly (OpenVINO ``InferRequest.infer`` with its tensor set once; ONNX Runtime
  ``InferenceSession.run`` on a numpy feed);
- npurt ``execute`` on runner-allocated tensors and ``run`` on a numpy feed: the caller's thread calls the engine;
- ``execute`` on a runner that has also run ``execute_async`` jobs (on OpenVINO such a runner's synchronous calls go
  through ``start_async`` + ``wait`` too: one kind of execution per compiled model keeps its memory flat);
- ``execute_async`` + ``wait``, ``execute_async`` + ``wait_any``, a chain of ``execute_async`` callbacks (each submits
  the next; ``callback_order="completion"``) and the ``InferQueue`` (``start_async`` per job, ``wait_all`` at the
  end): the job runs on a runner worker, so it moves between threads.
And, with no npurt and no engine, what the machine charges for a hand-off: two Python threads handing a lock back
and forth (a round trip is two hand-offs: each thread wakes the other once), as the kernel places them and with
both held on one core (a woken thread that must start on another core costs far more on a VM).

Each figure is microseconds per job (per round trip for the ping-pong), wall and CPU (the process's, all
threads), the median of alternating rounds; ``added`` is the pattern's wall time over ``execute``'s. It explains
``benchmarks/scale.py``: a pattern that moves each job between threads pays a wake-up or two per job, a share of a
short job that no Python-level trimming removes. No targets: it measures what the machine charges.

    python -m benchmarks.handoff [--quick] [--json] [--backends OPENVINO,VAIML]
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from queue import SimpleQueue
from typing import Any

import numpy as np

from benchmarks import check, finish, parser
from benchmarks.apps import BACKENDS
from npurt import InferQueue, JobHandle, RunnerFactory, StatusCode, TensorType
from npurt.bench import BenchError, Report, Table
from npurt.bench.subjects import runner_tensors
from npurt.runner import Runner

Pattern = Callable[[int], None]  # runs k jobs


def relu_model(directory: Path) -> str:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = directory / "relu64.onnx"
    onnx.save(model, str(path))
    return str(path)


def ping_pong(k: int, cores: tuple[int, int] | None = None) -> None:
    """k round trips between two threads: each wakes the other once. ``cores``: the two threads held on these
    cores (the same one twice: one core), the caller's affinity restored after; None: where the kernel puts them."""
    handed: SimpleQueue[threading.Lock | None] = SimpleQueue()

    def other() -> None:
        if cores is not None:
            os.sched_setaffinity(0, {cores[1]})
        while (lock := handed.get()) is not None:
            lock.release()

    allowed = os.sched_getaffinity(0)  # this thread's
    if cores is not None:
        os.sched_setaffinity(0, {cores[0]})
    try:
        thread = threading.Thread(target=other)
        thread.start()
        for _ in range(k):
            lock = threading.Lock()
            lock.acquire()
            handed.put(lock)
            lock.acquire()
        handed.put(None)
        thread.join()
    finally:
        os.sched_setaffinity(0, allowed)


def npurt_patterns(backend: str, path: str, feeds: dict[str, np.ndarray]) -> tuple[dict[str, Pattern], list[Runner]]:
    options = {"device": "CPU", "max_concurrent_runs": 1, "num_threads": 1}
    # execute and run on a runner of their own: an OpenVINO runner that has started jobs on start_async runs its
    # synchronous calls that way too (one kind of execution per compiled model: see backends/openvino/engine.py),
    # which the row "execute after execute_async" shows
    synchronous = RunnerFactory.create_runner(backend, path, options)
    runner = RunnerFactory.create_runner(backend, path, options)
    chained = RunnerFactory.create_runner(backend, path, {**options, "callback_order": "completion"})
    s_ins, s_outs = runner_tensors(synchronous, feeds, TensorType.CPU)
    ins, outs = runner_tensors(runner, feeds, TensorType.CPU)
    c_ins, c_outs = runner_tensors(chained, feeds, TensorType.CPU)
    queue = InferQueue(chained)
    queue_failed: list[str] = []

    def slot_ended(slot: Any, _userdata: Any) -> None:
        if slot.status is not StatusCode.SUCCESS:
            queue_failed.append(f"InferQueue job failed: {slot.status.name}: {slot.error}")

    queue.set_callback(slot_ended)

    def execute(k: int) -> None:
        for _ in range(k):
            check(synchronous.execute([s_ins], [s_outs]), synchronous, "execute")

    def run(k: int) -> None:
        for _ in range(k):
            synchronous.run(feeds)

    def execute_after_async(k: int) -> None:
        for _ in range(k):
            check(runner.execute([ins], [outs]), runner, "execute")

    def async_wait(k: int) -> None:
        for _ in range(k):
            check(runner.wait(runner.execute_async([ins], [outs])), runner, "wait")

    def async_wait_any(k: int) -> None:
        for _ in range(k):
            check(runner.wait_any([runner.execute_async([ins], [outs])]).status, runner, "wait_any")

    def callbacks(k: int) -> None:
        left, done, failed = [k], threading.Event(), []

        def ended(handle: JobHandle) -> None:
            left[0] -= 1
            if handle.status is not StatusCode.SUCCESS:
                failed.append(f"{handle.status.name}: {chained.last_error}")
            if left[0] and not failed:
                submit()
            else:
                done.set()

        def submit() -> None:
            job = chained.execute_async([c_ins], [c_outs], callback=ended)
            if job.status is not StatusCode.SUCCESS:
                failed.append(f"{job.status.name}: {chained.last_error}")
                done.set()

        submit()
        done.wait()
        if failed:
            raise BenchError(failed[0])

    def infer_queue(k: int) -> None:
        for _ in range(k):
            queue.start_async(feeds)
        queue.wait_all()
        if queue_failed:
            raise BenchError(queue_failed[0])

    patterns: dict[str, Pattern] = {"npurt execute": execute, "npurt run": run, "execute_async + wait": async_wait,
                "execute_async + wait_any": async_wait_any, "execute after execute_async": execute_after_async,
                "callbacks (chain)": callbacks, "InferQueue": infer_queue}
    return patterns, [synchronous, runner, chained]


def raw_pattern(backend: str, path: str, feeds: dict[str, np.ndarray]) -> Pattern:
    if backend == "OPENVINO":
        import openvino as ov

        # the runner's settings: one thread, f32 (npurt asks for it on CPU); input set once, outputs shared
        request = ov.Core().compile_model(path, "CPU", {"INFERENCE_NUM_THREADS": 1,
                                                        "INFERENCE_PRECISION_HINT": "f32"}).create_infer_request()
        request.set_input_tensor(ov.Tensor(feeds["x"], shared_memory=True))

        def infer(k: int) -> None:
            for _ in range(k):
                request.infer(share_outputs=True)

        return infer
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    def run(k: int) -> None:
        for _ in range(k):
            session.run(None, feeds)

    return run


def measure(patterns: dict[str, Pattern], jobs: int, rounds: int) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) microseconds per job of each pattern, rounds alternating between them."""
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in patterns}
    for pattern in patterns.values():
        pattern(max(10, jobs // 10))  # warm-up: threads started, plans made
    for _ in range(rounds):
        for name, pattern in patterns.items():
            c0, t0 = time.process_time(), time.perf_counter()
            pattern(jobs)
            samples[name].append(((time.perf_counter() - t0) / jobs * 1e6, (time.process_time() - c0) / jobs * 1e6))
    return {name: (statistics.median(s[0] for s in v), statistics.median(s[1] for s in v))
            for name, v in samples.items()}


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated: OPENVINO, VAIML")
    args = p.parse_args()
    wanted = {b.strip().upper() for b in args.backends.split(",") if b.strip()}
    if wanted - set(BACKENDS):
        p.error(f"unknown backends {sorted(wanted - set(BACKENDS))}; known: {', '.join(BACKENDS)}")
    jobs, rounds = (300, 5) if args.quick else (2000, 7)
    report = Report(f"Per-job cost around the engine, one job at a time, a 64-float Relu, CPU "
                    f"({'quick' if args.quick else 'full'} run: {rounds} rounds of {jobs} jobs)")
    table = Table(["backend", "way", "us/job wall", "us/job CPU", "added"],
                  formats=["", "", "{:.1f}", "{:.1f}", "{:+.1f}"],
                  title="microseconds per job (median of alternating rounds); added: wall over npurt execute")
    report.tables.append(table)
    cpus = sorted(os.sched_getaffinity(0))
    placements: dict[str, Pattern] = {"as the kernel puts them": ping_pong,
                                      "on one core": functools.partial(ping_pong, cores=(cpus[0], cpus[0]))}
    if len(cpus) > 1:
        placements["on two cores"] = functools.partial(ping_pong, cores=(cpus[0], cpus[1]))
    for placement, (wall, cpu) in measure(placements, jobs, rounds).items():
        table.add("-", f"ping-pong round trip, threads {placement}", wall, cpu, None)
    with tempfile.TemporaryDirectory(prefix="npurt-handoff-") as tmp:
        path = relu_model(Path(tmp))
        feeds = {"x": np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64)}
        for backend in (b for b in BACKENDS if b in wanted):  # OpenVINO first: before anything imports onnxruntime
            patterns, runners = npurt_patterns(backend, path, feeds)
            try:
                results = measure({"raw": raw_pattern(backend, path, feeds), **patterns}, jobs, rounds)
            finally:
                for runner in runners:
                    runner.close()
            base = results["npurt execute"][0]
            for name, (wall, cpu) in results.items():
                table.add(backend, name, wall, cpu, None if name == "npurt execute" else wall - base)
    return finish(report, args.json)


if __name__ == "__main__":
    sys.exit(main())
