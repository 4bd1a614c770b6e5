"""Throughput that scales with every core: npurt's four ways of keeping N jobs in flight against the engine used
directly the way a throughput app uses it, for N = 1, 2, 4, ... up to the core count, on both backends, with the
PP-OCR classifier (1x3x48x192) and recogniser (1x3x48x320), the models' own dynamic dims (no ``shapes``).

npurt's side: one runner per (model, N) with ``performance_hint="THROUGHPUT"`` and ``max_concurrent_runs=N``
(``RunnerFactory.create_runner`` options, device CPU), driven four ways:
- InferQueue: ``npurt.InferQueue(runner)`` (its default slots: N running, max(N, 4) more waiting) with a callback,
  ``start_async`` on numpy inputs (on a runner with ``callback_order="completion"``, as AsyncInferQueue's
  callbacks run as requests end);
- wait_any: N jobs kept in flight with ``execute_async`` on N runner-allocated tensor sets, ``wait_any`` for the
  next one to end;
- callbacks: N chains of ``execute_async`` whose callbacks submit the next job (a runner with
  ``callback_order="completion"``);
- threads: N threads calling ``execute`` on tensor sets of their own.
The raw side, with the runner's own engine settings: OpenVINO ``compile_model`` with the THROUGHPUT hint (and
``PERFORMANCE_HINT_NUM_REQUESTS=N``, f32) and an ``AsyncInferQueue`` of N requests, inputs set once; ONNX Runtime
one ``InferenceSession`` with intra-op threads = cores / N (spinning off, as npurt sets it) and N threads calling
``run``.

All five take turns in blocks of fixed time; the ratio of a pattern is the median of its per-block ratios to the
raw block beside it (``npurt.bench.paired_ratio``), over at least 5 blocks.

Target (issue "Throughput that scales with every core"): npurt/raw >= 0.98 at every N, on both backends, for every
pattern and model.

    python -m benchmarks.scale [--quick] [--json] [--max-n N] [--blocks K] [--backends OPENVINO,VAIML]
                               [--models cls,rec]
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from benchmarks import check, finish, parser
from benchmarks.apps import BACKENDS, model_path, npurt_runner
from npurt import InferQueue, JobHandle, StatusCode, TensorType
from npurt.bench import (
    BenchError,
    Budget,
    Report,
    Subject,
    Table,
    Target,
    measure_throughput,
    paired_ratio,
    random_feeds,
)
from npurt.bench.subjects import RawOnnxRuntimeSubject, RawOpenVINOSubject, output_shapes_of, runner_tensors
from npurt.runner import Runner

MODELS = {"cls": ("ocr_cls", (1, 3, 48, 192)), "rec": ("ocr_rec", (1, 3, 48, 320))}
BLOCK_S = {"cls": 0.5, "rec": 1.0}  # seconds per block and subject (full run)
QUICK_BLOCK_S = 0.12
LIMIT = 0.98


def n_values(max_n: int) -> list[int]:
    """1, 2, 4, ... up to max_n, and max_n itself."""
    out, n = [], 1
    while n < max_n:
        out.append(n)
        n *= 2
    return out + [max_n]


class QueuePattern(Subject):
    """``InferQueue`` with its default slots (N run, max(N, 4) wait) and a callback; ``start_async`` on the numpy
    inputs."""

    def __init__(self, runner: Runner, feeds: Mapping[str, np.ndarray], n: int,
                 output_shapes: Mapping[str, Sequence[int]]) -> None:
        self.label, self.requests = "InferQueue", n
        self.feeds = dict(feeds)
        self.queue = InferQueue(runner, tensor_type=TensorType.CPU, output_shapes=output_shapes)
        self.done = 0
        self.failed = ""
        lock = threading.Lock()

        def ended(slot: Any, _userdata: Any) -> None:
            with lock:
                self.done += 1
            if slot.status is not StatusCode.SUCCESS:
                self.failed = f"{slot.status.name}: {slot.error}"

        self.queue.set_callback(ended)

    def run_jobs(self, budget: Budget) -> tuple[int, float]:
        self.queue.wait_all()
        before, started = self.done, 0
        start = time.perf_counter()
        while not budget.done(started, time.perf_counter() - start):
            self.queue.start_async(self.feeds)
            started += 1
        self.queue.wait_all()
        if self.failed:
            raise BenchError(f"InferQueue job failed: {self.failed}")
        return self.done - before, time.perf_counter() - start

    def step(self) -> None:
        raise NotImplementedError


class WaitAnyPattern(Subject):
    """N jobs in flight with ``execute_async``; ``wait_any`` for whichever ends first, then its set goes again."""

    def __init__(self, runner: Runner, sets: list[tuple[list[Any], list[Any]]]) -> None:
        self.label, self.requests = "wait_any", len(sets)
        self.runner, self.sets = runner, sets

    def run_jobs(self, budget: Budget) -> tuple[int, float]:
        runner = self.runner
        free = list(range(len(self.sets)))
        running: dict[int, int] = {}  # job id -> its tensor set
        started = done = 0

        def collect() -> None:
            nonlocal done
            handle = runner.wait_any(list(running))
            check(handle.status, runner, "wait_any")
            free.append(running.pop(handle.job_id))
            done += 1

        start = time.perf_counter()
        while not budget.done(started, time.perf_counter() - start):
            if not free:
                collect()
                continue
            k = free.pop()
            ins, outs = self.sets[k]
            job = runner.execute_async([ins], [outs])
            if job.status is StatusCode.SUCCESS:
                running[job.job_id] = k
                started += 1
            else:
                free.append(k)
                if job.status is not StatusCode.RESOURCE_UNAVAILABLE or not running:
                    check(job.status, runner, "execute_async")
                collect()
        while running:
            collect()
        return done, time.perf_counter() - start

    def step(self) -> None:
        raise NotImplementedError


class CallbackPattern(Subject):
    """N chains of ``execute_async``: each job's callback submits the chain's next job until the budget is spent
    (the runner has ``callback_order="completion"``)."""

    def __init__(self, runner: Runner, sets: list[tuple[list[Any], list[Any]]]) -> None:
        self.label, self.requests = "callbacks", len(sets)
        self.runner, self.sets = runner, sets

    def run_jobs(self, budget: Budget) -> tuple[int, float]:
        runner, lock, finished = self.runner, threading.Lock(), threading.Event()
        counts = {"started": 0, "done": 0, "active": len(self.sets)}
        errors: list[str] = []
        start = time.perf_counter()

        def submit(k: int) -> None:
            ins, outs = self.sets[k]
            job = runner.execute_async([ins], [outs], callback=lambda handle: ended(k, handle))
            if job.status is not StatusCode.SUCCESS:
                errors.append(f"execute_async: {job.status.name}: {runner.last_error}")
                stop()

        def stop() -> None:
            with lock:
                counts["active"] -= 1
                if counts["active"] == 0:
                    finished.set()

        def ended(k: int, handle: JobHandle) -> None:
            with lock:
                counts["done"] += 1
                go = not errors and not budget.done(counts["started"], time.perf_counter() - start)
                if go:
                    counts["started"] += 1
            if handle.status is not StatusCode.SUCCESS:
                errors.append(f"job: {handle.status.name}: {runner.last_error}")
            if go:
                submit(k)
            else:
                stop()

        counts["started"] = len(self.sets)
        for k in range(len(self.sets)):
            submit(k)
        finished.wait()
        if errors:
            raise BenchError(errors[0])
        return counts["done"], time.perf_counter() - start

    def step(self) -> None:
        raise NotImplementedError


class ThreadsPattern(Subject):
    """N threads calling ``execute``, each on a tensor set of its own."""

    def __init__(self, runner: Runner, sets: list[tuple[list[Any], list[Any]]]) -> None:
        self.label, self.requests = "threads", len(sets)
        self.runner, self.sets = runner, sets
        self.pool = ThreadPoolExecutor(max_workers=len(sets), thread_name_prefix="scale-execute")

    def run_jobs(self, budget: Budget) -> tuple[int, float]:
        lock = threading.Lock()
        counts = {"started": 0, "done": 0}
        start = time.perf_counter()

        def worker(ins: list[Any], outs: list[Any]) -> None:
            while True:
                with lock:
                    if budget.done(counts["started"], time.perf_counter() - start):
                        return
                    counts["started"] += 1
                check(self.runner.execute([ins], [outs]), self.runner, "execute")
                with lock:
                    counts["done"] += 1

        for f in [self.pool.submit(worker, ins, outs) for ins, outs in self.sets]:
            f.result()
        return counts["done"], time.perf_counter() - start

    def step(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.pool.shutdown()


def raw_subject(backend: str, runner: Runner, path: str, feeds: Mapping[str, np.ndarray], n: int) -> Subject:
    """The engine as a throughput app drives it, with the runner's engine settings (see the module docstring)."""
    settings = dict(runner.device_info.engine_settings)
    if backend == "OPENVINO":
        import openvino as ov

        compiled = ov.Core().compile_model(path, "CPU", settings)
        return RawOpenVINOSubject(compiled, feeds, n, label="raw")
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = int(settings["intra_op_num_threads"].split()[0])
    options.add_session_config_entry("session.intra_op.allow_spinning", settings["allow_spinning"])
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return RawOnnxRuntimeSubject(session, feeds, n, label="raw")


def raw_description(backend: str, runner: Runner, n: int) -> str:
    settings = dict(runner.device_info.engine_settings)
    if backend == "OPENVINO":
        return f"AsyncInferQueue({n}), " + ", ".join(f"{k}={v}" for k, v in sorted(settings.items()))
    return (f"{n} threads x run, intra_op_num_threads={settings['intra_op_num_threads'].split()[0]}, "
            f"allow_spinning={settings['allow_spinning']}")


def measure(backend: str, name: str, n: int, block_s: float, blocks: int, table: Table, report: Report) -> None:
    model, shape = MODELS[name]
    path = model_path(model)
    feeds = random_feeds({"x": (shape, "float32")}, seed=0)
    options: dict[str, Any] = {"performance_hint": "THROUGHPUT", "max_concurrent_runs": n}
    runner = npurt_runner(backend, path, **options)
    chained = npurt_runner(backend, path, callback_order="completion", **options)
    subjects: list[Subject] = []
    try:
        shapes = output_shapes_of(runner, feeds)

        def sets(r: Runner) -> list[tuple[list[Any], list[Any]]]:
            return [runner_tensors(r, feeds, TensorType.CPU, shapes) for _ in range(n)]

        subjects = [QueuePattern(chained, feeds, n, shapes), WaitAnyPattern(runner, sets(runner)),
                    CallbackPattern(chained, sets(chained)), ThreadsPattern(runner, sets(runner)),
                    raw_subject(backend, runner, path, feeds, n)]
        budget = Budget(niter=None, time_s=block_s * blocks, warmup=3, blocks=blocks)
        before = runner.stats["copies"] + chained.stats["copies"]
        results = measure_throughput(subjects, budget)
        copies = runner.stats["copies"] + chained.stats["copies"] - before
        description = raw_description(backend, runner, n)
    finally:
        for s in subjects:
            s.close()
        runner.close()
        chained.close()
    raw = results[-1]
    for subject, stats in zip(subjects[:-1], results[:-1]):
        ratio = paired_ratio(stats, raw)
        table.add(backend, name, n, subject.label, stats.fps, raw.fps, ratio)
        report.targets.append(Target(f"{backend} {name} N={n} {subject.label} npurt/raw",
                                     ratio if ratio is not None else float("nan"), LIMIT, at_most=False))
    table.add(f"  {backend} {name} N={n}: raw = {description}; {blocks} blocks of {block_s:g} s each")
    if copies:
        report.problems.append(f"{backend} {name} N={n}: {copies} host copies on the zero-copy paths")


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--max-n", type=int, default=os.cpu_count() or 1, help="largest N (default: the core count)")
    p.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated: OPENVINO, VAIML")
    p.add_argument("--models", default=None, help="comma-separated subset of cls,rec (default both; --quick: cls)")
    p.add_argument("--blocks", type=int, default=None,
                   help="alternating blocks per N (default 9, --quick 5; at least 5)")
    args = p.parse_args()
    wanted = {b.strip().upper() for b in args.backends.split(",") if b.strip()}
    if wanted - set(BACKENDS):
        p.error(f"unknown backends {sorted(wanted - set(BACKENDS))}; known: {', '.join(BACKENDS)}")
    backends = [b for b in BACKENDS if b in wanted]  # OpenVINO first: before anything imports onnxruntime
    names = (args.models or ("cls" if args.quick else ",".join(MODELS))).split(",")
    if set(names) - set(MODELS) or args.max_n < 1:
        p.error(f"--models takes {', '.join(MODELS)}; --max-n >= 1")
    blocks = args.blocks or (5 if args.quick else 9)
    if blocks < 5:
        p.error("--blocks >= 5: a ratio is the median of at least 5 paired blocks")
    report = Report(f"Throughput with N jobs in flight, npurt against the engines used directly, CPU "
                    f"({os.cpu_count()} cores), {'quick' if args.quick else 'full'} run")
    table = Table(["backend", "model", "N", "pattern", "npurt jobs/s", "raw jobs/s", "npurt/raw"],
                  formats=["", "", "", "", "{:.1f}", "{:.1f}", "{:.3f}"],
                  title="jobs per second (npurt/raw: median of paired per-block ratios)")
    report.tables.append(table)
    for backend in backends:
        for name in names:
            for n in n_values(args.max_n):
                measure(backend, name, n, QUICK_BLOCK_S if args.quick else BLOCK_S[name], blocks, table, report)
    return finish(report, args.json)


if __name__ == "__main__":
    sys.exit(main())
