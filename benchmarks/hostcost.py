"""What a job costs the host: process CPU time per job and jobs per second, npurt against the same pattern written
with the engine directly, side by side in one run.

Models: the embedded digits classifier (``npurt.models.DEFAULT_MODEL``, 10-20 us of compute: the path around the
engine is most of a job) and the PP-OCR classifier (1x3x48x192, ~0.5 ms), input shapes pinned on both sides
(npurt: option ``shapes``; OpenVINO: the model reshaped before compiling; ONNX Runtime: IOBinding with the concrete
shapes), on both backends (OpenVINO CPU, ONNX Runtime CPU as "VAIML"). The raw side is compiled with the runner's own
engine settings (``device_info.engine_settings``: OpenVINO's threads, hint, streams and precision; ONNX Runtime's
intra-op threads and spinning), so that neither side's thread settings decide a row.

Rows (npurt on runner-allocated CPU-view tensors / raw on tensors bound once):
- ``execute``: ``execute`` in a loop (``max_concurrent_runs=1``, hint as the backend's default) / OpenVINO
  ``InferRequest.infer(share_outputs=True)`` with every tensor set once; ONNX Runtime ``run_with_iobinding``;
- ``execute_async + wait``, N in flight: ``execute_async`` on N tensor sets, ``wait`` for the oldest / OpenVINO N
  infer requests, ``start_async`` and ``wait`` on the oldest; ONNX Runtime ``ThreadPoolExecutor(N)`` running
  ``run_with_iobinding`` on N bindings, ``result()`` of the oldest;
- ``wait_any``, N in flight: ``wait_any`` for whichever ends / OpenVINO ``AsyncInferQueue(N).start_async`` (which
  waits for whichever request is idle); ONNX Runtime ``wait(..., FIRST_COMPLETED)``;
- ``InferQueue``: ``npurt.InferQueue`` with a callback, ``start_async`` on numpy inputs / OpenVINO
  ``AsyncInferQueue(N)`` with a callback; ONNX Runtime the executor with a done-callback per job;
- ``callbacks``: N chains of ``execute_async`` whose callbacks submit the next job (``callback_order="completion"``) /
  the same raw queue with a callback (held to jobs/s only: npurt runs callbacks on its own threads by contract, the
  engine on its own).
Asynchronous rows use ``performance_hint="THROUGHPUT"`` and ``max_concurrent_runs=N`` (N = 2: the cores).

Each row alternates npurt and raw blocks of a fixed number of jobs (the order flips every block), at least 7 blocks;
CPU per job is ``time.process_time()`` over a block (every thread of the process) divided by its jobs; the figures
are the medians of the paired per-block differences (CPU) and ratios (jobs/s) between neighbouring blocks. The CPU
target is checked as the median of per-block ratios npurt / (raw + 5 us) <= 1.

Targets (issue 46, 2 cores): in every row npurt's CPU per job <= the engine's + 5 us; jobs/s >= 0.95x the engine's on
PP-OCR's classifier and >= 0.85x on the digits model (a 10-20 us job, where 0.95x would leave under a microsecond
for any Python call); callback rows (InferQueue, callbacks) are held to jobs/s only. Each is judged on the median of
three full runs; on a shared machine the figures are noisy.

``--own``: instead, npurt's own Python per job, the engine taken out: the digits model on OpenVINO with the engine's
``run`` returning at once and its job lane replaced by one in Python whose jobs have ended when they start
(``execute``; ``execute_async`` + ``wait`` and ``wait_any``, N in flight). What is left is the runner, the plan
lookup, the scheduler and the status, plus the stand-in lane's trivial calls; no engine work, no thread woken. A
diagnostic, with no target.

``--paths``: instead, OpenVINO's asynchronous rows (``execute_async + wait``, ``wait_any``) with npurt's two job
paths side by side: jobs on npurt's ``_ovjobs`` extension (its job lane: the jobs' table and completion in C++) and
on Python InferRequests (a runner whose engine has ``native_jobs`` turned off before its first job), against the raw
pattern, the three in turn in each block (the order rotates), in one process; besides the process's CPU, the main
thread's (``time.thread_time``: npurt's Python, the raw pattern's calls), whose difference is npurt's share of the
CPU added (the rest is OpenVINO's threads). A diagnostic, with no target.

    python -m benchmarks.hostcost [--quick] [--json] [--backends OPENVINO,VAIML] [--models digits,cls] [--n N]
                                  [--blocks K] [--own | --paths]
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Literal

import numpy as np

from benchmarks import check, finish, onnxruntime_session, parser
from benchmarks.apps import BACKENDS, callback_chains, model_path, npurt_runner
from npurt import InferQueue, JobHandle, StatusCode, TensorType
from npurt.bench import BenchError, Report, Table, Target, random_feeds
from npurt.bench.subjects import runner_tensors
from npurt.engine import ResultShapes
from npurt.models import DEFAULT_MODEL
from npurt.runner import Runner

MODELS: dict[str, tuple[str, dict[str, tuple[int, ...]]]] = {
    "digits": ("default", {"image": (1, 1, 8, 8)}),
    "cls": ("ocr_cls", {"x": (1, 3, 48, 192)}),
}
JOBS = {"digits": 2000, "cls": 300}  # per block (full run)
QUICK_JOBS = {"digits": 80, "cls": 15}  # (--quick checks the script runs and reports)
CPU_LIMIT_US = 5.0
RATE_LIMIT = {"cls": 0.95, "digits": 0.85}  # jobs/s npurt / raw, by model
SUCCESS = StatusCode.SUCCESS
CALLBACK_ROWS = ("InferQueue", "callbacks")

Jobs = Callable[[int], None]  # runs k jobs to their end


def path_of(model: str) -> str:
    return str(DEFAULT_MODEL) if model == "default" else model_path(model)


# ---------------------------------------------------------------- npurt's side
class NpurtSide:
    """A runner per kind of row and the patterns on it."""

    def __init__(self, backend: str, path: str, shapes: Mapping[str, tuple[int, ...]], n: int) -> None:
        pinned = {k: list(v) for k, v in shapes.items()}
        views = {"input_tensor_type": "CPU", "output_tensor_type": "CPU", "shapes": pinned}
        self.n = n
        self.sync = npurt_runner(backend, path, max_concurrent_runs=1, **views)
        self.asyn = npurt_runner(backend, path, performance_hint="THROUGHPUT", max_concurrent_runs=n, **views)
        self.chained = npurt_runner(backend, path, performance_hint="THROUGHPUT", max_concurrent_runs=n,
                                    callback_order="completion", **views)
        self.runners = [self.sync, self.asyn, self.chained]
        self.feeds = random_feeds({k: (v, "float32") for k, v in shapes.items()}, seed=0)
        self.one = runner_tensors(self.sync, self.feeds, TensorType.CPU)
        self.sets = [runner_tensors(self.asyn, self.feeds, TensorType.CPU) for _ in range(n)]
        self.chain_sets = [runner_tensors(self.chained, self.feeds, TensorType.CPU) for _ in range(n)]
        self.queue = InferQueue(self.chained)
        self.queue_failed: list[str] = []

        def slot_ended(slot: Any, _userdata: Any) -> None:
            if slot.status is not StatusCode.SUCCESS:
                self.queue_failed.append(f"{slot.status.name}: {slot.error}")

        self.queue.set_callback(slot_ended)

    def copies(self) -> int:
        return sum(r.stats["copies"] for r in self.runners)

    def execute(self, k: int) -> None:
        runner, (ins, outs) = self.sync, self.one
        execute = runner.execute  # (as the raw side binds its run: the loop times the calls, not their lookup)
        for _ in range(k):
            status = execute([ins], [outs])
            if status is not SUCCESS:  # inline, as an app checks: a helper's call per job is the harness's cost
                check(status, runner, "execute")

    def async_wait(self, k: int) -> None:
        runner, sets = self.asyn, self.sets
        running: deque[JobHandle] = deque()
        for i in range(k):
            if len(running) == len(sets):
                if (status := runner.wait(running.popleft())) is not SUCCESS:
                    check(status, runner, "wait")
            ins, outs = sets[i % len(sets)]  # the oldest job's set: it has just been collected
            job = runner.execute_async([ins], [outs])
            if job.status is not SUCCESS:
                check(job.status, runner, "execute_async")
            running.append(job)
        while running:
            if (status := runner.wait(running.popleft())) is not SUCCESS:
                check(status, runner, "wait")

    def wait_any(self, k: int) -> None:
        runner, sets = self.asyn, self.sets
        free = list(range(len(sets)))
        running: dict[int, int] = {}
        for _ in range(k):
            if not free:
                handle = runner.wait_any(list(running))
                if handle.status is not SUCCESS:
                    check(handle.status, runner, "wait_any")
                free.append(running.pop(handle.job_id))
            s = free.pop()
            ins, outs = sets[s]
            job = runner.execute_async([ins], [outs])
            if job.status is not SUCCESS:
                check(job.status, runner, "execute_async")
            running[job.job_id] = s
        while running:
            handle = runner.wait_any(list(running))
            if handle.status is not SUCCESS:
                check(handle.status, runner, "wait_any")
            running.pop(handle.job_id)

    def infer_queue(self, k: int) -> None:
        queue, feeds = self.queue, self.feeds
        for _ in range(k):
            queue.start_async(feeds)
        queue.wait_all()
        if self.queue_failed:
            raise BenchError(f"InferQueue job failed: {self.queue_failed[0]}")

    def callbacks(self, k: int) -> None:
        callback_chains(self.chained, self.chain_sets[:k], lambda started: started < k)

    def patterns(self) -> dict[str, Jobs]:
        return {"execute": self.execute, "execute_async + wait": self.async_wait, "wait_any": self.wait_any,
                "InferQueue": self.infer_queue, "callbacks": self.callbacks}

    def close(self) -> None:
        for r in self.runners:
            r.close()


# ---------------------------------------------------------------- the engine's side
class RawOpenVINO:
    """The same patterns on OpenVINO: the model reshaped to the pinned shapes, compiled with each runner's
    settings, every tensor set once."""

    def __init__(self, npurt: NpurtSide, path: str, shapes: Mapping[str, tuple[int, ...]]) -> None:
        import openvino as ov

        core = ov.Core()
        # The arrays the requests share: a request holds a shared ov.Tensor's memory only while the Python
        # ov.Tensor lives, so the arrays are kept here (else the runs read freed memory).
        self.shared: list[np.ndarray] = []

        def compiled(runner: Runner) -> Any:
            model = core.read_model(path)
            model.reshape({k: list(v) for k, v in shapes.items()})
            return core.compile_model(model, "CPU", dict(runner.device_info.engine_settings))

        def share_inputs(request: Any, c: Any) -> None:
            """Each input of ``c`` set on ``request`` once, over a copy of its feed kept in ``shared``."""
            for port in c.inputs:
                name = next(n for n in port.get_names() if n in npurt.feeds)
                self.shared.append(npurt.feeds[name].copy())
                request.set_tensor(port, ov.Tensor(self.shared[-1], shared_memory=True))

        def bound(c: Any) -> Any:
            request = c.create_infer_request()
            share_inputs(request, c)
            for port in c.outputs:
                request.set_tensor(port, ov.Tensor(port.get_element_type(), port.get_shape()))
            return request

        self.request = bound(compiled(npurt.sync))
        c_async = compiled(npurt.asyn)
        self.requests = [bound(c_async) for _ in range(npurt.n)]
        self.queue = ov.AsyncInferQueue(c_async, npurt.n)
        for request in self.queue:
            share_inputs(request, c_async)
        self.done = 0
        lock = threading.Lock()

        def on_done(_request: Any, _userdata: Any) -> None:
            nonlocal lock
            with lock:
                self.done += 1

        self.queue.set_callback(on_done)
        self.plain = ov.AsyncInferQueue(c_async, npurt.n)  # no callback: wait_any's pattern
        for request in self.plain:
            share_inputs(request, c_async)

    def execute(self, k: int) -> None:
        infer = self.request.infer
        for _ in range(k):
            infer(share_outputs=True)

    def async_wait(self, k: int) -> None:
        requests = self.requests
        running: deque[Any] = deque()
        for i in range(k):
            if len(running) == len(requests):
                running.popleft().wait()
            request = requests[i % len(requests)]
            request.start_async()
            running.append(request)
        while running:
            running.popleft().wait()

    def wait_any(self, k: int) -> None:
        queue = self.plain
        for _ in range(k):
            queue.start_async()  # waits for whichever request is idle
        queue.wait_all()

    def infer_queue(self, k: int) -> None:
        queue, before = self.queue, self.done
        for _ in range(k):
            queue.start_async()
        queue.wait_all()
        if self.done - before != k:
            raise BenchError(f"AsyncInferQueue: {self.done - before} callbacks for {k} jobs")

    def patterns(self) -> dict[str, Jobs]:
        return {"execute": self.execute, "execute_async + wait": self.async_wait, "wait_any": self.wait_any,
                "InferQueue": self.infer_queue, "callbacks": self.infer_queue}

    def close(self) -> None:
        for name in ("queue", "plain"):
            queue = self.__dict__.pop(name, None)
            if queue is not None:  # the callback refers back to this object: break the cycle before exit
                queue.wait_all()
                queue.set_callback(lambda *_: None)


class RawOnnxRuntime:
    """The same patterns on ONNX Runtime: one session with each runner's intra-op threads and spinning, IOBindings
    made once (N for N in flight), jobs on a ``ThreadPoolExecutor(N)``."""

    def __init__(self, npurt: NpurtSide, path: str) -> None:
        def session(runner: Runner) -> Any:
            return onnxruntime_session(path, runner.device_info.engine_settings)

        self.keep: list[np.ndarray] = []

        def binding(s: Any) -> Any:
            io = s.io_binding()
            for port in s.get_inputs():
                a = npurt.feeds[port.name].copy()
                self.keep.append(a)
                io.bind_input(port.name, "cpu", 0, a.dtype, list(a.shape), a.ctypes.data)
            for port, out in zip(s.get_outputs(), s.run(None, npurt.feeds)):
                a = np.empty_like(out)
                self.keep.append(a)
                io.bind_output(port.name, "cpu", 0, a.dtype, list(a.shape), a.ctypes.data)
            return io

        self.session = session(npurt.sync)
        self.binding = binding(self.session)
        self.async_session = session(npurt.asyn)
        self.bindings = [binding(self.async_session) for _ in range(npurt.n)]
        self.pool = ThreadPoolExecutor(max_workers=npurt.n, thread_name_prefix="raw-ort")
        self.done = 0
        self.lock = threading.Lock()

    def execute(self, k: int) -> None:
        run, binding = self.session.run_with_iobinding, self.binding
        for _ in range(k):
            run(binding)

    def async_wait(self, k: int) -> None:
        run, bindings, submit = self.async_session.run_with_iobinding, self.bindings, self.pool.submit
        running: deque[Future[Any]] = deque()
        for i in range(k):
            if len(running) == len(bindings):
                running.popleft().result()
            running.append(submit(run, bindings[i % len(bindings)]))
        while running:
            running.popleft().result()

    def wait_any(self, k: int, on_done: Callable[[Future[Any]], None] | None = None) -> None:
        run, bindings, submit = self.async_session.run_with_iobinding, self.bindings, self.pool.submit
        free = list(range(len(bindings)))
        pending: dict[Future[Any], int] = {}
        for _ in range(k):
            if not free:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for f in finished:
                    f.result()
                    free.append(pending.pop(f))
            s = free.pop()
            f = submit(run, bindings[s])
            if on_done is not None:
                f.add_done_callback(on_done)
            pending[f] = s
        for f in pending:
            f.result()

    def infer_queue(self, k: int) -> None:
        before = self.done

        def on_done(_f: Future[Any]) -> None:
            with self.lock:
                self.done += 1

        self.wait_any(k, on_done)
        while self.done - before < k:  # done-callbacks run after result() is available
            time.sleep(0)

    def patterns(self) -> dict[str, Jobs]:
        return {"execute": self.execute, "execute_async + wait": self.async_wait, "wait_any": self.wait_any,
                "InferQueue": self.infer_queue, "callbacks": self.infer_queue}

    def close(self) -> None:
        self.pool.shutdown()


# ---------------------------------------------------------------- measurement
def paired(npurt: Jobs, raw: Jobs, jobs: int, blocks: int) -> tuple[list[tuple[float, float]], ...]:
    """(CPU us per job, jobs/s) per block of each side, blocks alternating (the order flips every block)."""
    for _ in range(2):  # warm-up: threads started, plans made, each engine past its first slower runs
        npurt(jobs)
        raw(jobs)
    samples: tuple[list[tuple[float, float]], list[tuple[float, float]]] = ([], [])
    for b in range(blocks):
        order = ((0, npurt), (1, raw)) if b % 2 == 0 else ((1, raw), (0, npurt))
        for side, fn in order:
            c0, t0 = time.process_time(), time.perf_counter()
            fn(jobs)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            samples[side].append((cpu / jobs * 1e6, jobs / wall))
    return samples


def measure(backend: str, name: str, n: int, jobs: int, blocks: int, table: Table, report: Report) -> None:
    model, shapes = MODELS[name]
    path = path_of(model)
    npurt = NpurtSide(backend, path, shapes, n)
    raw: RawOpenVINO | RawOnnxRuntime | None = None
    try:
        raw = RawOpenVINO(npurt, path, shapes) if backend == "OPENVINO" else RawOnnxRuntime(npurt, path)
        before = npurt.copies()
        raw_patterns = raw.patterns()
        for row, fn in npurt.patterns().items():
            a, b = paired(fn, raw_patterns[row], jobs, blocks)
            cpu_added = statistics.median(x[0] - y[0] for x, y in zip(a, b))
            ratio = statistics.median(x[1] / y[1] for x, y in zip(a, b))
            rows_n = 1 if row == "execute" else n
            table.add(backend, name, row, rows_n, statistics.median(x[0] for x in a),
                      statistics.median(y[0] for y in b), cpu_added, statistics.median(x[1] for x in a),
                      statistics.median(y[1] for y in b), ratio)
            what = f"{backend} {name} {row} N={rows_n}"
            if row not in CALLBACK_ROWS:  # npurt <= raw + 5 us, as a ratio (a difference may be negative)
                over = statistics.median(x[0] / (y[0] + CPU_LIMIT_US) for x, y in zip(a, b))
                report.targets.append(Target(f"{what}: npurt CPU/job / (raw + {CPU_LIMIT_US:g} us)", over, 1.0))
            report.targets.append(Target(f"{what}: npurt/raw jobs/s", ratio, RATE_LIMIT[name], at_most=False))
        copies = npurt.copies() - before
        if copies:
            report.problems.append(f"{backend} {name}: {copies} host copies on the zero-copy paths")
        settings = ", ".join(f"{k}={v}" for k, v in npurt.asyn.device_info.engine_settings)
        table.add(f"  {backend} {name}: shapes {dict(shapes)} on both sides; asynchronous rows' engine settings, "
                  f"both sides: {settings}")
    finally:
        if raw is not None:
            raw.close()
        npurt.close()


class _EndedLane:
    """A job lane whose jobs have ended when they start (``--own``; engine.JobLane), in Python."""

    def __init__(self) -> None:
        self.ended: dict[int, str] = {}

    def reserve(self, job_id: int, others: int, limit: int, arg: Any) -> int:
        return 1

    def launch(self, job_id: int, arg: Any, keep: Any) -> None:
        self.ended[job_id] = ""

    def collect(self, job_id: int, timeout_ms: int, taken: bool) -> None | Literal[False] | str:
        return self.ended.pop(job_id, False)

    def collect_any(self, job_ids: Sequence[int], timeout_ms: int, taken: bool
                    ) -> None | tuple[int, Literal[False] | str]:
        return job_ids[0], self.ended.pop(job_ids[0], False)

    def take(self, job_id: int) -> bool | None:
        return None

    def forget(self, job_id: int) -> None:
        pass

    def jobs(self) -> list[int]:
        return []

    def running(self) -> int:
        return 0

    def uncollected(self) -> int:
        return len(self.ended)

    def counts(self) -> tuple[int, int, int]:
        return 0, 0, 0


def own_python(n: int, jobs: int, blocks: int, table: Table) -> None:
    """npurt's Python per job with the engine taken out (see the module's docstring): CPU us per job per pattern,
    median of ``blocks`` blocks of ``jobs`` jobs."""
    model, shapes = MODELS["digits"]
    npurt = NpurtSide("OPENVINO", path_of(model), shapes, n)
    try:
        def run(binding: Any, context: Any = None) -> ResultShapes:
            return None

        for runner in (npurt.sync, npurt.asyn):  # before any run: the plans made from here on hold these
            engine: Any = runner.engine_for()
            lane = _EndedLane()
            engine.run, engine.lane = run, lambda binding, lane=lane, engine=engine: (lane, None, engine.translate)
        patterns = npurt.patterns()
        for row in ("execute", "execute_async + wait", "wait_any"):
            fn = patterns[row]
            fn(jobs)  # warm-up: plans made
            cpu = []
            for _ in range(blocks):
                c0 = time.process_time()
                fn(jobs)
                cpu.append((time.process_time() - c0) / jobs * 1e6)
            table.add("OPENVINO", "digits", row, 1 if row == "execute" else n, statistics.median(cpu), min(cpu))
    finally:
        npurt.close()


def _added(a: list[tuple[float, ...]], b: list[tuple[float, ...]], k: int = 0) -> float:
    """Median of per-block CPU differences (us per job): the process's (k = 0) or the main thread's (k = 2)."""
    return statistics.median(x[k] - y[k] for x, y in zip(a, b))


def _ratio(a: list[tuple[float, ...]], b: list[tuple[float, ...]]) -> float:
    """Median of per-block jobs/s ratios."""
    return statistics.median(x[1] / y[1] for x, y in zip(a, b))


def job_paths(names: list[str], n: int, quick: bool, blocks: int, table: Table) -> None:
    """OpenVINO's asynchronous rows on npurt's two job paths and raw, in turn (see the module's docstring)."""
    for name in names:
        model, shapes = MODELS[name]
        path = path_of(model)
        jobs = (QUICK_JOBS if quick else JOBS)[name]
        native, python = NpurtSide("OPENVINO", path, shapes, n), NpurtSide("OPENVINO", path, shapes, n)
        raw: RawOpenVINO | None = None
        try:
            python_engine: Any = python.asyn.engine_for()
            python_engine.native_jobs = False  # before its first job: Python InferRequests
            raw = RawOpenVINO(native, path, shapes)
            for row in ("execute_async + wait", "wait_any"):
                subjects = {"extension": native.patterns()[row], "python": python.patterns()[row],
                            "raw": raw.patterns()[row]}
                for _ in range(2):  # warm-up, as paired()
                    for fn in subjects.values():
                        fn(jobs)
                # per block: process CPU us/job, jobs/s, and the main thread's CPU us/job (the thread that runs
                # npurt's Python and the raw pattern's calls; OpenVINO's own threads are the rest)
                samples: dict[str, list[tuple[float, float, float]]] = {k: [] for k in subjects}
                order = list(subjects)
                for b in range(blocks):
                    for side in order[b % 3:] + order[:b % 3]:
                        c0, m0, t0 = time.process_time(), time.thread_time(), time.perf_counter()
                        subjects[side](jobs)
                        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                        main = time.thread_time() - m0
                        samples[side].append((cpu / jobs * 1e6, jobs / wall, main / jobs * 1e6))
                ext, py, raws = samples["extension"], samples["python"], samples["raw"]
                table.add("OPENVINO", name, row, n, statistics.median(y[0] for y in raws), _added(ext, raws),
                          _added(py, raws), statistics.median(y[2] for y in raws), _added(ext, raws, 2),
                          _ratio(ext, raws), _ratio(py, raws), _ratio(ext, py))
            native_engine: Any = native.asyn.engine_for()
            if native_engine._native is None:
                raise BenchError("npurt._ovjobs is not built (or refused this OpenVINO): both sides ran the Python "
                                 "path")
        finally:
            if raw is not None:
                raw.close()
            native.close()
            python.close()


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated: OPENVINO, VAIML")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of digits,cls")
    p.add_argument("--n", type=int, default=2, help="jobs in flight in the asynchronous rows (default 2)")
    p.add_argument("--blocks", type=int, default=None, help="alternating blocks per row (default 9; at least 7)")
    p.add_argument("--own", action="store_true", help="npurt's own Python per job, the engine taken out (no target)")
    p.add_argument("--paths", action="store_true", help="OpenVINO's asynchronous rows on npurt's two job paths "
                                                        "(the _ovjobs extension, Python requests) and raw (no target)")
    args = p.parse_args()
    wanted = {b.strip().upper() for b in args.backends.split(",") if b.strip()}
    if wanted - set(BACKENDS):
        p.error(f"unknown backends {sorted(wanted - set(BACKENDS))}; known: {', '.join(BACKENDS)}")
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    if set(names) - set(MODELS) or args.n < 1:
        p.error(f"--models takes {', '.join(MODELS)}; --n >= 1")
    blocks = args.blocks or (7 if args.quick else 9)
    if blocks < 7:
        p.error("--blocks >= 7: the figures are medians of at least 7 paired blocks")
    if args.own:
        report = Report(f"npurt's own Python per job, the engine taken out ({'quick' if args.quick else 'full'} run, "
                        f"{blocks} blocks per row)")
        table = Table(["backend", "model", "pattern", "N", "CPU us/job", "best block"],
                      formats=["", "", "", "", "{:.2f}", "{:.2f}"],
                      title="process CPU time per job: the median and the best of the blocks (OpenVINO's engine "
                            "replaced by runs that end at once)")
        report.tables.append(table)
        own_python(args.n, 2000 if args.quick else 20000, blocks, table)
        return finish(report, args.json)
    if args.paths:
        report = Report(f"OpenVINO's job paths: npurt with its _ovjobs extension, npurt on Python requests, raw "
                        f"OpenVINO, in turn ({'quick' if args.quick else 'full'} run, {blocks} blocks per row)")
        table = Table(["backend", "model", "pattern", "N", "raw CPU us/job", "extension: CPU added us",
                       "Python path: CPU added us", "raw main thread us/job", "extension: main thread added us",
                       "extension/raw jobs/s", "Python path/raw jobs/s", "extension/Python path jobs/s"],
                      formats=["", "", "", "", "{:.1f}", "{:+.1f}", "{:+.1f}", "{:.1f}", "{:+.1f}", "{:.3f}", "{:.3f}",
                               "{:.3f}"],
                      title="medians of per-block differences and ratios against the neighbouring block")
        report.tables.append(table)
        job_paths(names, args.n, args.quick, blocks, table)
        return finish(report, args.json)
    report = Report(f"Host cost per job, npurt against the same pattern on the engine directly, CPU, shapes pinned "
                    f"({'quick' if args.quick else 'full'} run, {blocks} alternating blocks per row)")
    table = Table(["backend", "model", "pattern", "N", "npurt CPU us/job", "raw CPU us/job", "CPU added us",
                   "npurt jobs/s", "raw jobs/s", "npurt/raw jobs/s"],
                  formats=["", "", "", "", "{:.1f}", "{:.1f}", "{:+.1f}", "{:.0f}", "{:.0f}", "{:.3f}"],
                  title="process CPU time per job (every thread) and jobs/s: medians of blocks; 'added' and the "
                        "ratio: medians of paired per-block differences and ratios")
    report.tables.append(table)
    for backend in (b for b in BACKENDS if b in wanted):  # OpenVINO first: before anything imports onnxruntime
        for name in names:
            jobs = (QUICK_JOBS if args.quick else JOBS)[name]
            measure(backend, name, args.n, jobs, blocks, table, report)
    return finish(report, args.json)


if __name__ == "__main__":
    sys.exit(main())
