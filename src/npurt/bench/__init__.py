"""npurt's one measurement engine: `npurt bench` and every script in benchmarks/ measure through it.

- ``measure``: the timing loops (``measure_latency`` in rotating blocks, ``measure_throughput`` in alternating
  blocks with ``paired_ratio``, ``keep_in_flight`` for execute_async, ``stopwatch``), over ``Subject`` s with a
  ``Budget`` (iterations or seconds, warm-up, blocks);
- ``subjects``: npurt's runner and the raw engines as subjects (``RunnerSubject``, ``RawOpenVINOSubject``,
  ``RawOnnxRuntimeSubject``; the runner's own engine without npurt, ``engine_floor``; any callable as
  ``CallSubject``), and their inputs (``random_feeds``,
  ``runner_tensors``);
- ``fresh`` and ``loads``: loads timed in a fresh process, with the memory each adds (``fresh_loads``);
- ``compare``: npurt against its raw engine on one model (``bench_backend``: what `npurt bench` runs);
- ``results``: the typed results (``LatencyStats``, ``ThroughputStats``, ``FreshLoad``, ``BenchReport``, and for
  scripts ``Report`` with ``Table`` s and ``Target`` s) and ``render``, the one formatter (text or JSON).

A benchmark script compares subjects, states its targets and exits non-zero when one is missed:

    import sys
    from npurt import RunnerFactory
    from npurt.bench import (Budget, CallSubject, Report, RunnerSubject, Table, Target, measure_latency,
                             random_feeds, render)
    from npurt.models import zoo

    path = zoo.path("ocr_cls")
    runner = RunnerFactory.create_runner("OPENVINO", path, {"device": "CPU"})
    feeds = random_feeds({"x": ((1, 3, 48, 192), "float32")})
    npurt_run = RunnerSubject(runner, feeds)                       # execute on runner-allocated tensors
    numpy_run = CallSubject("Runner.run", lambda: runner.run(feeds))  # the numpy convenience
    a, b = measure_latency([npurt_run, numpy_run], Budget(niter=500, time_s=None))
    report = Report("execute against run, PP-OCR classifier", tables=[Table(["call", "p50 ms"])],
                    targets=[Target("execute / run, p50", a.p50_ms / b.p50_ms, 1.0)])
    report.tables[0].add("execute", a.p50_ms)
    report.tables[0].add("run", b.p50_ms)
    print(render(report))
    sys.exit(report.exit_code)
"""

from .compare import bench_backend, onnxruntime_providers, raw_engine_of
from .fresh import fresh_loads, in_fresh_process
from .measure import (
    NO_PROGRESS,
    BenchError,
    Budget,
    CallSubject,
    Progress,
    Subject,
    keep_in_flight,
    measure_latency,
    measure_throughput,
    paired_difference_ms,
    paired_ratio,
    stopwatch,
)
from .results import (
    BackendBench,
    BenchReport,
    BenchSettings,
    FreshLoad,
    FreshRun,
    LatencyStats,
    LoadTimes,
    Report,
    Side,
    Table,
    Target,
    ThroughputStats,
    jsonable,
    render,
)
from .subjects import (
    RawOnnxRuntimeSubject,
    RawOpenVINOSubject,
    RunnerSubject,
    engine_floor,
    random_array,
    random_feeds,
    runner_feeds,
    runner_tensors,
)

__all__ = [
    "NO_PROGRESS", "BackendBench", "BenchError", "BenchReport", "BenchSettings", "Budget", "CallSubject",
    "FreshLoad", "FreshRun", "LatencyStats", "LoadTimes", "Progress", "RawOnnxRuntimeSubject",
    "RawOpenVINOSubject", "Report", "RunnerSubject", "Side", "Subject", "Table", "Target", "ThroughputStats",
    "bench_backend", "engine_floor", "fresh_loads", "in_fresh_process", "jsonable", "keep_in_flight", "measure_latency",
    "measure_throughput", "onnxruntime_providers", "paired_difference_ms", "paired_ratio", "random_array",
    "random_feeds", "raw_engine_of", "render", "runner_feeds", "runner_tensors", "stopwatch",
]
