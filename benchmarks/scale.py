"""Throughput that scales with every core: npurt's four ways of keeping N jobs in flight against the engine used
directly the way a throughput app uses it, for N = 1, 2, 4, ... up to the core count, on both backends, with the
PP-OCR classifier (1x3x48x192) and recogniser (1x3x48x320), input shapes pinned on both sides (npurt: option
``shapes``; OpenVINO: the model reshaped before compiling; ONNX Runtime runs concrete shapes on its one session).

npurt's side: one runner per (model, N) with ``performance_hint="THROUGHPUT"``, ``max_concurrent_runs=N`` and the
shape pinned (``RunnerFactory.create_runner`` options, device CPU), driven four ways:
- InferQueue: ``npurt.InferQueue(runner)`` (its default slots: N running, max(N, 4) more waiting) with a callback,
  ``start_async`` on numpy inputs (on a runner with ``callback_order="completion"``, as AsyncInferQueue's
  callbacks run as requests end);
- wait_any: N jobs kept in flight with ``execute_async`` on N runner-allocated tensor sets, ``wait_any`` for the
  next one to end;
- callbacks: N chains of ``execute_async`` whose callbacks submit the next job (a runner with
  ``callback_order="completion"``);
- threads: N threads calling ``execute`` on tensor sets of their own (a runner of its own: on OpenVINO, a compiled
  model that has started jobs on ``start_async`` runs ``execute`` through it too).
Each pattern is measured against the raw pattern of the same shape, written the way a Python user of that engine
writes it, with the runner's own engine settings (threads, spinning, precision; ``NPURT_NUM_THREADS`` is cleared):
- OpenVINO (``compile_model`` with the THROUGHPUT hint, ``PERFORMANCE_HINT_NUM_REQUESTS=N``, f32, inputs set once):
  ``AsyncInferQueue(N)`` for the InferQueue, ``wait_any`` and callbacks, and the same compiled with the THROUGHPUT
  hint alone (the engine's own stream count for the machine), the faster of the two taken; N threads calling
  ``infer()`` on N infer requests of their own for npurt's threads;
- ONNX Runtime (one ``InferenceSession`` with intra-op threads = cores / N, spinning as npurt sets it): one thread
  keeping N runs in flight for the InferQueue, ``wait_any`` and callbacks, the faster of
  ``ThreadPoolExecutor(N)`` + ``wait(..., FIRST_COMPLETED)`` over ``session.run`` and ``session.run_async`` with a
  callback (which ONNX Runtime refuses on a session with one intra-op thread); N threads calling ``run`` for
  npurt's threads.
A second column puts every pattern against N bare threads calling the engine (``infer()`` / ``run``), which hand
nothing between threads.

All subjects take turns in blocks of fixed time; a ratio is the median of per-block ratios to the raw block beside
it (``npurt.bench.paired_ratio``), over at least 5 blocks.

At one run (N = 1, ``execute`` in a loop, shapes pinned, CPU views) each hint (none, LATENCY, THROUGHPUT) is also
measured against the engine at its own default settings, pinned as npurt is (ONNX Runtime: a default
``InferenceSession`` run on the concrete shape; OpenVINO: the model reshaped to the shape, ``compile_model`` with f32
only), in the same alternating blocks.

Targets (issue "Throughput, continued"): on both backends, for every model and N, npurt/raw >= 0.98 against the
raw pattern of the same shape and >= 0.90 against N bare threads; at one run, every hint >= 0.98x the engine's
default settings.

    python -m benchmarks.scale [--quick] [--json] [--max-n N] [--blocks K] [--backends OPENVINO,VAIML]
                               [--models cls,rec]
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

import numpy as np

from benchmarks import check, finish, onnxruntime_session, parser
from benchmarks.apps import BACKENDS, callback_chains, model_path, npurt_runner
from npurt import InferQueue, StatusCode, TensorType
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
QUICK_BLOCK_S = 0.03  # (--quick checks the script runs and reports: the suite runs it)
LIMIT, BARE_LIMIT = 0.98, 0.90
HINTS = (None, "LATENCY", "THROUGHPUT")


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
        start = time.perf_counter()
        done = callback_chains(self.runner, self.sets,
                               lambda started: not budget.done(started, time.perf_counter() - start))
        return done, time.perf_counter() - start

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


class RawOpenVINOThreads(Subject):
    """N threads calling ``infer()`` on N infer requests of their own, inputs set once (outputs shared)."""

    def __init__(self, compiled: Any, feeds: Mapping[str, np.ndarray], n: int) -> None:
        import openvino as ov

        self.label, self.requests = "raw threads", n
        self.requests_ = []
        self.shared: list[np.ndarray] = []  # (a request holds a shared ov.Tensor's memory only while it lives)
        for _ in range(n):
            request = compiled.create_infer_request()
            for port in compiled.inputs:
                name = next(iter(port.get_names()))
                self.shared.append(np.ascontiguousarray(feeds[name]).copy())
                request.set_tensor(port, ov.Tensor(self.shared[-1], shared_memory=True))
            self.requests_.append(request)
        self.pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="raw-ov-threads")

    def run_jobs(self, budget: Budget) -> tuple[int, float]:
        return _threads(self.pool, [lambda r=r: r.infer(share_outputs=True) for r in self.requests_], budget)

    def step(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.pool.shutdown()


def _threads(pool: ThreadPoolExecutor, calls: list[Any], budget: Budget) -> tuple[int, float]:
    """Each call on a thread of its own, in a loop until the budget is spent: (calls done, seconds)."""
    lock = threading.Lock()
    counts = {"started": 0, "done": 0}
    start = time.perf_counter()

    def worker(call: Any) -> None:
        while True:
            with lock:
                if budget.done(counts["started"], time.perf_counter() - start):
                    return
                counts["started"] += 1
            call()
            with lock:
                counts["done"] += 1

    for f in [pool.submit(worker, c) for c in calls]:
        f.result()
    return counts["done"], time.perf_counter() - start


class RawOrtInFlight(Subject):
    """One thread keeping N ``session.run`` in flight on ``ThreadPoolExecutor(N)``, collecting with
    ``wait(..., FIRST_COMPLETED)``: the concurrent.futures way to keep N jobs going."""

    def __init__(self, session: Any, feeds: Mapping[str, np.ndarray], n: int) -> None:
        self.label, self.requests = "raw executor", n
        self.session = session
        self.own = [{k: np.ascontiguousarray(v).copy() for k, v in feeds.items()} for _ in range(n)]
        self.pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="raw-ort-inflight")

    def run_jobs(self, budget: Budget) -> tuple[int, float]:
        run = self.session.run
        pending: dict[Future[Any], int] = {}
        started = done = 0
        start = time.perf_counter()
        for k, feeds in enumerate(self.own):
            pending[self.pool.submit(run, None, feeds)] = k
            started += 1
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for f in finished:
                k = pending.pop(f)
                f.result()
                done += 1
                if not budget.done(started, time.perf_counter() - start):
                    pending[self.pool.submit(run, None, self.own[k])] = k
                    started += 1
        return done, time.perf_counter() - start

    def step(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.pool.shutdown()


class RawOrtRunAsync(Subject):
    """N ``session.run_async`` in flight, each callback (on an ONNX Runtime thread) starting the next until the budget
    is spent."""

    def __init__(self, session: Any, feeds: Mapping[str, np.ndarray], n: int) -> None:
        self.label, self.requests = "raw run_async", n
        self.session = session
        self.own = [{k: np.ascontiguousarray(v).copy() for k, v in feeds.items()} for _ in range(n)]

    def run_jobs(self, budget: Budget) -> tuple[int, float]:
        lock, finished = threading.Lock(), threading.Event()
        counts = {"started": 0, "done": 0, "active": len(self.own)}
        errors: list[str] = []
        start = time.perf_counter()

        def ended(_results: Any, k: int, error: str) -> None:
            if error:
                errors.append(error)
            with lock:
                counts["done"] += 1
                go = not errors and not budget.done(counts["started"], time.perf_counter() - start)
                if go:
                    counts["started"] += 1
                else:
                    counts["active"] -= 1
                    if counts["active"] == 0:
                        finished.set()
            if go:
                self.session.run_async(None, self.own[k], ended, k)

        counts["started"] = len(self.own)
        for k in range(len(self.own)):
            self.session.run_async(None, self.own[k], ended, k)
        finished.wait()
        if errors:
            raise BenchError(f"run_async: {errors[0]}")
        return counts["done"], time.perf_counter() - start

    def step(self) -> None:
        raise NotImplementedError


def pinned_model(path: str, feeds: Mapping[str, np.ndarray]) -> Any:
    """The model as OpenVINO reads it, reshaped to the inputs' shapes (pinned as npurt pins them)."""
    import openvino as ov

    model = ov.Core().read_model(path)
    model.reshape({name: list(a.shape) for name, a in feeds.items()})
    return model


def raw_subjects(backend: str, runner: Runner, path: str, feeds: Mapping[str, np.ndarray], n: int
                 ) -> tuple[list[Subject], Subject]:
    """The engine's same-shape patterns for npurt's asynchronous ones (the candidates: the faster is taken) and its
    N bare threads, with the runner's engine settings and shapes pinned (see the module docstring)."""
    settings = dict(runner.device_info.engine_settings)
    if backend == "OPENVINO":
        import openvino as ov

        core = ov.Core()
        compiled = core.compile_model(pinned_model(path, feeds), "CPU", settings)
        own = {k: v for k, v in settings.items() if k != "PERFORMANCE_HINT_NUM_REQUESTS"}  # its own stream count
        own_streams = core.compile_model(pinned_model(path, feeds), "CPU", own)
        return [RawOpenVINOSubject(compiled, feeds, n, label="raw AsyncInferQueue"),
                RawOpenVINOSubject(own_streams, feeds, n, label="raw AsyncInferQueue, engine's streams")], \
            RawOpenVINOThreads(compiled, feeds, n)
    session = onnxruntime_session(path, settings)
    same_shape: list[Subject] = [RawOrtInFlight(session, feeds, n)]
    if session.get_session_options().intra_op_num_threads != 1:  # (ONNX Runtime refuses run_async on one thread)
        same_shape.append(RawOrtRunAsync(session, feeds, n))
    return same_shape, RawOnnxRuntimeSubject(session, feeds, n, label="raw threads")


def raw_description(backend: str, runner: Runner, n: int) -> str:
    settings = dict(runner.device_info.engine_settings)
    if backend == "OPENVINO":
        return f"AsyncInferQueue({n}) / {n} threads x infer(), shapes pinned, " + ", ".join(
            f"{k}={v}" for k, v in sorted(settings.items()))
    return (f"one thread keeping {n} runs in flight / {n} threads x run, intra_op_num_threads="
            f"{settings['intra_op_num_threads'].split()[0]}, allow_spinning={settings['allow_spinning']}")


def measure(backend: str, name: str, n: int, block_s: float, blocks: int, table: Table, report: Report) -> None:
    model, shape = MODELS[name]
    path = model_path(model)
    feeds = random_feeds({"x": (shape, "float32")}, seed=0)
    options: dict[str, Any] = {"performance_hint": "THROUGHPUT", "max_concurrent_runs": n, "shapes": {"x": list(shape)}}
    runner = npurt_runner(backend, path, **options)
    chained = npurt_runner(backend, path, callback_order="completion", **options)
    # execute from threads on a runner of its own: on OpenVINO a compiled model whose jobs started on start_async
    # runs execute through start_async + wait too (one kind of execution per compiled model)
    threaded = npurt_runner(backend, path, **options)
    subjects: list[Subject] = []
    try:
        shapes = output_shapes_of(runner, feeds)

        def sets(r: Runner) -> list[tuple[list[Any], list[Any]]]:
            return [runner_tensors(r, feeds, TensorType.CPU, shapes) for _ in range(n)]

        patterns: list[Subject] = [QueuePattern(chained, feeds, n, shapes), WaitAnyPattern(runner, sets(runner)),
                                   CallbackPattern(chained, sets(chained)), ThreadsPattern(threaded, sets(threaded))]
        same_shape, bare = raw_subjects(backend, runner, path, feeds, n)
        subjects = [*patterns, *same_shape, bare]
        budget = Budget(niter=None, time_s=block_s * blocks, warmup=3, blocks=blocks)
        before = sum(r.stats["copies"] for r in (runner, chained, threaded))
        results = measure_throughput(subjects, budget)
        copies = sum(r.stats["copies"] for r in (runner, chained, threaded)) - before
        description = raw_description(backend, runner, n)
    finally:
        for s in subjects:
            s.close()
        runner.close()
        chained.close()
        threaded.close()
    by_subject = dict(zip(subjects, results))
    raw_async = max(same_shape, key=lambda s: by_subject[s].fps)  # the faster of the candidates
    bare_stats = by_subject[bare]
    for subject in patterns:
        stats = by_subject[subject]
        raw = bare if subject.label == "threads" else raw_async
        ratio = paired_ratio(stats, by_subject[raw])
        bare_ratio = paired_ratio(stats, bare_stats)
        table.add(backend, name, n, subject.label, stats.fps, raw.label, by_subject[raw].fps, ratio,
                  bare_stats.fps, bare_ratio)
        report.targets.append(Target(f"{backend} {name} N={n} {subject.label} npurt/{raw.label}",
                                     ratio if ratio is not None else float("nan"), LIMIT, at_most=False))
        if subject.label != "threads":
            report.targets.append(Target(f"{backend} {name} N={n} {subject.label} npurt/raw threads",
                                         bare_ratio if bare_ratio is not None else float("nan"), BARE_LIMIT,
                                         at_most=False))
    if len(same_shape) > 1:
        table.add(f"  {backend} {name} N={n}: same-shape raw candidates: " + ", ".join(
            f"{s.label} {by_subject[s].fps:.1f}/s" for s in same_shape) + f" (taken: {raw_async.label})")
    table.add(f"  {backend} {name} N={n}: raw = {description}; {blocks} blocks of {block_s:g} s each")
    if copies:
        report.problems.append(f"{backend} {name} N={n}: {copies} host copies on the zero-copy paths")


def hints_at_one_run(backend: str, name: str, iterations: int, blocks: int, table: Table, report: Report) -> None:
    """One run at a time (``execute`` in a loop, shapes pinned, CPU views): each hint against the engine at its own
    default settings."""
    from npurt.bench import measure_latency
    from npurt.bench.subjects import RawOnnxRuntimeSubject as RawOrt
    from npurt.bench.subjects import RawOpenVINOSubject as RawOv

    model, shape = MODELS[name]
    path = model_path(model)
    feeds = random_feeds({"x": (shape, "float32")}, seed=0)
    runners = [npurt_runner(backend, path, performance_hint=hint, max_concurrent_runs=1,
                            shapes={"x": list(shape)}, input_tensor_type="CPU", output_tensor_type="CPU")
               for hint in HINTS]
    if backend == "OPENVINO":
        import openvino as ov

        compiled = ov.Core().compile_model(pinned_model(path, feeds), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        raw: Subject = RawOv(compiled, feeds, label="raw, default settings")
    else:
        import onnxruntime as ort

        raw = RawOrt(ort.InferenceSession(path, providers=["CPUExecutionProvider"]), feeds,
                     label="raw, default settings")
    subjects: list[Subject] = []
    try:
        for hint, r in zip(HINTS, runners):
            ins, outs = runner_tensors(r, feeds, TensorType.CPU)
            subjects.append(_ExecuteLoop(f"npurt hint {hint or 'none'}", r, ins, outs))
        results = measure_latency([*subjects, raw], Budget(niter=iterations, time_s=None, warmup=5, blocks=blocks))
    finally:
        raw.close()
        for r in runners:
            r.close()
    raw_p50 = results[-1].p50_ms
    for hint, r, stats in zip(HINTS, runners, results):
        settings = ", ".join(f"{k}={v}" for k, v in r.device_info.engine_settings)
        table.add(backend, name, hint or "none", stats.p50_ms * 1e3, raw_p50 * 1e3, raw_p50 / stats.p50_ms, settings)
        report.targets.append(Target(f"{backend} {name} one run, hint {hint or 'none'}: npurt/raw default (jobs/s)",
                                     raw_p50 / stats.p50_ms, LIMIT, at_most=False))


class _ExecuteLoop(Subject):
    def __init__(self, label: str, runner: Runner, ins: list[Any], outs: list[Any]) -> None:
        self.label, self.runner, self.ins, self.outs = label, runner, ins, outs

    def step(self) -> None:
        check(self.runner.execute([self.ins], [self.outs]), self.runner, "execute")


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
    table = Table(["backend", "model", "N", "pattern", "npurt jobs/s", "same-shape raw", "raw jobs/s", "npurt/raw",
                   "raw threads jobs/s", "npurt/raw threads"],
                  formats=["", "", "", "", "{:.1f}", "", "{:.1f}", "{:.3f}", "{:.1f}", "{:.3f}"],
                  title="jobs per second (ratios: medians of paired per-block ratios)")
    hints = Table(["backend", "model", "hint", "npurt us", "raw default us", "npurt/raw (jobs/s)",
                   "npurt's engine settings"], formats=["", "", "", "{:.1f}", "{:.1f}", "{:.3f}", ""],
                  title="one run at a time (execute in a loop, p50), against the engine's default settings")
    report.tables += [table, hints]
    for backend in backends:
        for name in names:
            for n in n_values(args.max_n):
                measure(backend, name, n, QUICK_BLOCK_S if args.quick else BLOCK_S[name], blocks, table, report)
            hints_at_one_run(backend, name, 50 if args.quick else (1200 if name == "cls" else 300), blocks, hints,
                             report)
    return finish(report, args.json)


if __name__ == "__main__":
    sys.exit(main())
