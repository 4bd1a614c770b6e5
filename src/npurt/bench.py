"""Measurement loops for `npurt bench` and benchmarks/: a runner and the raw engines, on the same model, in one run.

Each measurement returns plain dicts (milliseconds, inferences per second) so that the CLI and the benchmark
scripts only format them:

- ``bench_runner``: time to the first inference (load + compile, then the first ``execute``; with a cache dir
  also the load from the cache), latency of ``execute`` with runner-allocated tensors after a warm-up, and
  throughput of ``execute_async`` with N requests in flight; optionally the same figures for the engine
  called directly (``compile_model`` + ``InferRequest.infer`` / ``AsyncInferQueue``; ``InferenceSession.run``
  + a thread pool) with the settings the runner used (device, static shapes, OpenVINO CPU precision f32).
- The two are measured in alternating blocks (``measure_latency`` / ``measure_throughput`` over ``Subject`` s),
  so that load from other processes on a shared machine hits both alike.
- ``ratios``: npurt against the raw engine (latency > 1 and throughput < 1 mean npurt is slower).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from .factory import RunnerFactory
from .formats import convert
from .runner import Runner
from .tensor import NpuTensor
from .types import NpuError, NpuTensorInfo, StatusCode, TensorDirection, TensorType


class BenchError(NpuError):
    """A measurement could not run (the engine failed an inference, a request failed)."""


@dataclass(frozen=True)
class Budget:
    """How long each measured phase runs: until ``niter`` iterations or ``time_s`` seconds, whichever is first."""

    niter: int | None = None
    time_s: float | None = 3.0
    warmup: int = 5

    def __post_init__(self) -> None:
        if self.niter is None and self.time_s is None:
            raise ValueError("a benchmark budget needs niter or time_s")
        if self.niter is not None and self.niter < 1:
            raise ValueError(f"niter must be >= 1, got {self.niter}")
        if self.time_s is not None and not self.time_s > 0:
            raise ValueError(f"time must be > 0 seconds, got {self.time_s}")

    def fraction(self, count: int, elapsed: float) -> float:
        parts = []
        if self.niter is not None:
            parts.append(count / self.niter)
        if self.time_s is not None:
            parts.append(elapsed / self.time_s)
        return min(1.0, max(parts))

    def done(self, count: int, elapsed: float) -> bool:
        return self.fraction(count, elapsed) >= 1.0


class Progress:
    """A plain-text progress bar on a stream (stderr): redrawn in place on a terminal, one line per phase else."""

    def __init__(self, stream: TextIO | None = None, enabled: bool = True, width: int = 30) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled
        self.width = width
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self._label = ""
        self._last = 0.0

    def phase(self, label: str) -> None:
        if not self.enabled:
            return
        self._label = label
        self._last = 0.0
        if self.tty:
            self.update(0.0, force=True)
        else:
            print(f"npurt bench: {label} ...", file=self.stream, flush=True)

    def update(self, fraction: float, force: bool = False) -> None:
        if not self.tty:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.1:
            return
        self._last = now
        filled = int(round(self.width * min(max(fraction, 0.0), 1.0)))
        bar = "#" * filled + "-" * (self.width - filled)
        print(f"\r{self._label[:44]:<44} [{bar}] {fraction * 100:3.0f}%", end="", file=self.stream, flush=True)

    def done(self) -> None:
        if self.tty and self._label:
            self.update(1.0, force=True)
            print(file=self.stream, flush=True)
        self._label = ""


_NO_PROGRESS = Progress(enabled=False)


# -------------------------------------------------------------------------------------------------- statistics
def summarize_ms(samples_ns: Sequence[int]) -> dict[str, float | int]:
    """min / p50 / p90 / p99 / max / mean of latencies in nanoseconds, in milliseconds."""
    if not samples_ns:
        raise BenchError("no latency samples were taken")
    a = np.asarray(samples_ns, dtype=np.float64) / 1e6
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"count": int(a.size), "min": float(a.min()), "p50": float(p50), "p90": float(p90), "p99": float(p99),
            "max": float(a.max()), "mean": float(a.mean())}


def _throughput(count: int, elapsed: float, requests: int) -> dict[str, float | int]:
    return {"requests": requests, "count": count, "seconds": elapsed, "fps": count / elapsed if elapsed > 0 else 0.0}


def random_array(shape: Sequence[int], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
    """Random data for one input: floats in [0, 1), integers in [0, 10), booleans half true."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, 10, size=shape).astype(dtype)
    return rng.random(shape, dtype=np.float32).astype(dtype)


def random_feeds(infos: Sequence[NpuTensorInfo], seed: int) -> dict[str, np.ndarray]:
    """Random inputs for a runner's CPU-view input infos, reproducible from ``seed``."""
    rng = np.random.default_rng(seed)
    return {i.name: random_array(i.shape, i.numpy_dtype, rng) for i in infos}


# -------------------------------------------------------------------------------------------------- npurt
def runner_tensors(runner: Runner, feeds: Mapping[str, np.ndarray], tensor_type: TensorType = TensorType.HW
                   ) -> tuple[list[NpuTensor], list[NpuTensor]]:
    """Runner-allocated input and output tensors in ``tensor_type`` views, inputs filled from CPU-view ``feeds``."""
    ins = []
    for info in runner.get_tensors_info(TensorDirection.INPUT, tensor_type):
        t = runner.allocate_npu_tensor(info)
        cpu = runner.get_tensor_info_by_name(info.name, TensorType.CPU)
        src = NpuTensor(cpu, np.ascontiguousarray(feeds[info.name]))
        t.begin_cpu_access(write=True)
        try:
            if tensor_type is TensorType.CPU:
                t.numpy()[...] = src.numpy()
            else:
                convert(src, t, quant=runner.get_quant_parameters(info.name))
        finally:
            t.end_cpu_access(write=True)
        ins.append(t)
    outs = [runner.allocate_npu_tensor(i) for i in runner.get_tensors_info(TensorDirection.OUTPUT, tensor_type)]
    return ins, outs


def device_info_dict(runner: Runner) -> dict[str, Any]:
    d = dataclasses.asdict(runner.device_info)
    d["skipped"] = [list(s) for s in d["skipped"]]
    d["placement"] = [list(p) for p in d["placement"]]
    return d


def _execute_or_raise(runner: Runner, ins: list[NpuTensor], outs: list[NpuTensor]) -> None:
    status = runner.execute([ins], [outs])
    if status is not StatusCode.SUCCESS:
        raise BenchError(f"execute failed: {status.name}: {runner.last_error}")


def _timed_first_inference(backend: str, model: Path, options: Mapping[str, Any], seed: int,
                           tensor_type: TensorType) -> tuple[Runner, float, float, dict[str, np.ndarray]]:
    """Create a runner and run it once on random inputs: (runner, load + compile ms, first inference ms, feeds)."""
    t0 = time.perf_counter()
    runner = RunnerFactory.create_runner(backend, model, options)
    t1 = time.perf_counter()
    try:
        feeds = random_feeds(runner.get_tensors_info(TensorDirection.INPUT, TensorType.CPU), seed)
        ins, outs = runner_tensors(runner, feeds, tensor_type)
        t2 = time.perf_counter()
        _execute_or_raise(runner, ins, outs)
        t3 = time.perf_counter()
    except BaseException:
        runner.close()
        raise
    return runner, (t1 - t0) * 1e3, (t3 - t2) * 1e3, feeds


# -------------------------------------------------------------------------------------------------- subjects
class Subject:
    """Something to measure: one synchronous inference (``step``) and a block of concurrent ones."""

    label = ""
    requests = 1

    def step(self) -> None:
        raise NotImplementedError

    def throughput_block(self, budget: Budget) -> tuple[int, float]:
        """Keep ``requests`` inferences in flight until the budget is spent: (inferences done, seconds)."""
        raise NotImplementedError

    def warm_up(self, n: int) -> None:
        for _ in range(n):
            self.step()


class RunnerSubject(Subject):
    """``execute`` on runner-allocated tensors; ``execute_async`` with ``requests`` jobs, each with its tensors."""

    def __init__(self, runner: Runner, feeds: Mapping[str, np.ndarray], requests: int,
                 tensor_type: TensorType, label: str = "npurt") -> None:
        self.runner, self.requests, self.label = runner, requests, label
        self.ins, self.outs = runner_tensors(runner, feeds, tensor_type)
        self.sets = [runner_tensors(runner, feeds, tensor_type) for _ in range(requests)]

    def step(self) -> None:
        _execute_or_raise(self.runner, self.ins, self.outs)

    def throughput_block(self, budget: Budget) -> tuple[int, float]:
        runner, requests = self.runner, self.requests
        jobs: list[Any] = [None] * requests

        def submit(i: int) -> None:
            ins, outs = self.sets[i]
            while True:
                job = runner.execute_async([ins], [outs])
                if job.status is StatusCode.SUCCESS:
                    jobs[i] = job
                    return
                if job.status is not StatusCode.RESOURCE_UNAVAILABLE:
                    raise BenchError(f"execute_async failed: {job.status.name}: {runner.last_error}")
                time.sleep(0)  # all runs busy: a job of ours is still finishing; try again

        done = started = 0
        start = time.perf_counter()
        for i in range(requests):
            if budget.niter is not None and started >= budget.niter:
                break
            submit(i)
            started += 1
        i = 0
        while any(j is not None for j in jobs):
            if jobs[i] is not None:
                status = runner.wait(jobs[i], None)
                jobs[i] = None
                if status is not StatusCode.SUCCESS:
                    raise BenchError(f"async job failed: {status.name}: {runner.last_error}")
                done += 1
                if not budget.done(started, time.perf_counter() - start):
                    submit(i)
                    started += 1
            i = (i + 1) % requests
        return done, time.perf_counter() - start


class RawOpenVINOSubject(Subject):
    """OpenVINO called directly: ``InferRequest.infer()`` with input tensors set once; an ``AsyncInferQueue``."""

    call = "InferRequest.infer() with input tensors set once; AsyncInferQueue.start_async() for throughput"

    def __init__(self, compiled: Any, arrays: Mapping[str, np.ndarray], requests: int,
                 label: str = "raw OpenVINO") -> None:
        import openvino as ov

        self.label, self.requests = label, requests
        self.request = compiled.create_infer_request()
        self._arrays = [dict(arrays)] + [{n: a.copy() for n, a in arrays.items()} for _ in range(requests)]
        for n, a in self._arrays[0].items():
            self.request.set_tensor(n, ov.Tensor(a, shared_memory=True))
        self.queue = ov.AsyncInferQueue(compiled, requests)
        for req, req_arrays in zip(self.queue, self._arrays[1:]):  # each request its own inputs
            for n, a in req_arrays.items():
                req.set_tensor(n, ov.Tensor(a, shared_memory=True))
        self._done = 0
        lock = threading.Lock()

        def on_done(_request: Any, _userdata: Any) -> None:
            with lock:  # callbacks run on several OpenVINO threads; += is not atomic even under the GIL
                self._done += 1

        self.queue.set_callback(on_done)

    def step(self) -> None:
        self.request.infer()

    def throughput_block(self, budget: Budget) -> tuple[int, float]:
        self.queue.wait_all()
        before = self._done
        started = 0
        start = time.perf_counter()
        while not budget.done(started, time.perf_counter() - start):
            self.queue.start_async()  # blocks while every request is busy
            started += 1
        self.queue.wait_all()
        return self._done - before, time.perf_counter() - start


class RawOnnxRuntimeSubject(Subject):
    """ONNX Runtime called directly: ``InferenceSession.run``; ``requests`` threads calling it for throughput."""

    call = "InferenceSession.run(None, feeds); as many threads calling it for throughput"

    def __init__(self, session: Any, arrays: Mapping[str, np.ndarray], requests: int,
                 label: str = "raw ONNX Runtime") -> None:
        self.session, self.requests, self.label = session, requests, label
        self.arrays = dict(arrays)
        self.own = [{n: a.copy() for n, a in arrays.items()} for _ in range(requests)]
        self.pool = ThreadPoolExecutor(max_workers=requests, thread_name_prefix="raw-ort")

    def step(self) -> None:
        self.session.run(None, self.arrays)

    def throughput_block(self, budget: Budget) -> tuple[int, float]:
        lock = threading.Lock()
        state = {"started": 0, "done": 0}
        start = time.perf_counter()

        def worker(feeds: dict[str, np.ndarray]) -> None:
            while True:
                with lock:
                    if budget.done(state["started"], time.perf_counter() - start):
                        return
                    state["started"] += 1
                self.session.run(None, feeds)
                with lock:
                    state["done"] += 1

        for f in [self.pool.submit(worker, a) for a in self.own]:
            f.result()
        return state["done"], time.perf_counter() - start

    def close(self) -> None:
        self.pool.shutdown()


BLOCKS = 10  # each measurement is split into blocks, alternating between the subjects


def _block_budget(budget: Budget) -> Budget:
    return Budget(niter=None if budget.niter is None else max(1, math.ceil(budget.niter / BLOCKS)),
                  time_s=None if budget.time_s is None else budget.time_s / BLOCKS, warmup=0)


def _orders(subjects: Sequence[Subject]) -> list[list[Subject]]:
    """Block k runs the subjects in turn, reversed every other block, so slow drifts of the machine hit all alike."""
    return [list(subjects) if k % 2 == 0 else list(reversed(subjects)) for k in range(BLOCKS)]


def measure_latency(subjects: Sequence[Subject], budget: Budget, progress: Progress = _NO_PROGRESS,
                    label: str = "latency") -> list[dict[str, float | int]]:
    """Latency of each subject's ``step``: a warm-up, then the budget per subject in interleaved blocks."""
    progress.phase(f"{label}: warm-up")
    for subject in subjects:
        subject.warm_up(budget.warmup)
    progress.phase(label)
    block = _block_budget(budget)
    samples: list[list[int]] = [[] for _ in subjects]
    index = {id(s): i for i, s in enumerate(subjects)}
    for k, order in enumerate(_orders(subjects)):
        for subject in order:
            mine = samples[index[id(subject)]]
            count, start = 0, time.perf_counter()
            while not block.done(count, time.perf_counter() - start):
                t0 = time.perf_counter_ns()
                subject.step()
                mine.append(time.perf_counter_ns() - t0)
                count += 1
        progress.update((k + 1) / BLOCKS)
    progress.done()
    if budget.niter is not None:  # blocks round up: keep exactly niter samples each
        samples = [s[: budget.niter] for s in samples]
    return [summarize_ms(s) for s in samples]


def measure_throughput(subjects: Sequence[Subject], budget: Budget, progress: Progress = _NO_PROGRESS,
                       label: str = "throughput") -> list[dict[str, float | int]]:
    """Inferences per second of each subject with its requests in flight, in interleaved blocks."""
    progress.phase(label)
    warm = Budget(niter=max(1, budget.warmup) * max(s.requests for s in subjects), time_s=None, warmup=0)
    for subject in subjects:
        subject.throughput_block(warm)
    block = _block_budget(budget)
    totals = [[0, 0.0] for _ in subjects]
    index = {id(s): i for i, s in enumerate(subjects)}
    for k, order in enumerate(_orders(subjects)):
        for subject in order:
            count, elapsed = subject.throughput_block(block)
            totals[index[id(subject)]][0] += count
            totals[index[id(subject)]][1] += elapsed
        progress.update((k + 1) / BLOCKS)
    progress.done()
    return [_throughput(int(c), e, s.requests) for (c, e), s in zip(totals, subjects)]


# -------------------------------------------------------------------------------------------------- loads
def load_runner(backend: str, model: str | Path, options: Mapping[str, Any], requests: int, seed: int = 0,
                cache_dir: str | Path | None = None, tensor_type: TensorType | None = None,
                progress: Progress = _NO_PROGRESS) -> tuple[Runner, dict[str, Any], dict[str, np.ndarray]]:
    """Load a runner, timing the load and the first inference (and, with ``cache_dir``, the cached load).

    Returns the runner (the caller closes it), the figures so far and the CPU-view inputs it ran on.
    ``tensor_type``: the view of the ports and of the runner-allocated tensors. None picks HW when the runner
    attached an NPU and CPU otherwise: on another device the HW view (FP16 / BF16, another layout) only adds a
    conversion that the raw engine running the plain model does not do, so the comparison would not be like for
    like. ``options`` must not hold cache_dir: give ``cache_dir``, measured separately from the cold compile.
    """
    model = Path(model)
    name = backend.upper()
    options = {**options, "max_concurrent_runs": requests}
    # Once untimed, so that the engine's libraries and plugins are loaded before the timed load, as they are
    # for the raw engine measured later in the same process.
    progress.phase(f"{name}: loading the engine")
    runner, _, _, _ = _timed_first_inference(name, model, options, seed, tensor_type or TensorType.HW)
    attached = runner.device_info.attached
    runner.close()
    if tensor_type is None:
        tensor_type = TensorType.HW if attached == "NPU" else TensorType.CPU
    options = {**options, "input_tensor_type": tensor_type.name, "output_tensor_type": tensor_type.name}
    if cache_dir is not None:
        cache = _cached_load(name, model, options, seed, tensor_type, Path(cache_dir), progress)
    progress.phase(f"{name}: load + compile + first inference")
    runner, load_ms, first_ms, feeds = _timed_first_inference(name, model, options, seed, tensor_type)
    progress.done()
    result: dict[str, Any] = {"backend": name, "tensor_type": tensor_type.name, "load_ms": load_ms,
                              "first_inference_ms": first_ms, "time_to_first_inference_ms": load_ms + first_ms,
                              "device_info": device_info_dict(runner),
                              "inputs": {i.name: list(i.shape) for i in
                                         runner.get_tensors_info(TensorDirection.INPUT, TensorType.CPU)}}
    if cache_dir is not None:
        result["cache"] = cache
    return runner, result, feeds


def _cached_load(name: str, model: Path, options: Mapping[str, Any], seed: int, tensor_type: TensorType,
                 cache_dir: Path, progress: Progress) -> dict[str, Any]:
    """Load with a compiled-model cache twice: the first fills it (if it was empty), the second reads it."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    was_empty = not any(cache_dir.iterdir())
    opts = {**options, "cache_dir": str(cache_dir)}
    progress.phase(f"{name}: load with cache_dir (fill)")
    runner, fill_ms, fill_first_ms, _ = _timed_first_inference(name, model, opts, seed, tensor_type)
    runner.close()
    progress.phase(f"{name}: load from cache")
    runner, load_ms, first_ms, _ = _timed_first_inference(name, model, opts, seed, tensor_type)
    runner.close()
    progress.done()
    return {"dir": str(cache_dir), "was_empty": was_empty, "fill_load_ms": fill_ms,
            "fill_first_inference_ms": fill_first_ms, "cached_load_ms": load_ms,
            "cached_first_inference_ms": first_ms, "cached_time_to_first_inference_ms": load_ms + first_ms}


def openvino_config(device: str, performance_hint: str | None = None, cache_dir: str | Path | None = None
                    ) -> dict[str, str]:
    """The OpenVINO properties npurt's backend sets for a device (CPU: f32 precision, not the bf16 default)."""
    config = {}
    if device == "CPU":
        config["INFERENCE_PRECISION_HINT"] = "f32"
    if performance_hint:
        config["PERFORMANCE_HINT"] = performance_hint.upper()
    if cache_dir is not None:
        config["CACHE_DIR"] = str(cache_dir)
    return config


def _ov_compile(core: Any, model: Path, device: str, shapes: Mapping[str, Sequence[int]] | None,
                config: Mapping[str, str]) -> Any:
    if shapes:
        ov_model = core.read_model(str(model))
        ov_model.reshape({name: list(shape) for name, shape in shapes.items()})
        return core.compile_model(ov_model, device, dict(config))
    return core.compile_model(str(model), device, dict(config))


def _ov_first_inference(compiled: Any, arrays: Mapping[str, np.ndarray]) -> float:
    import openvino as ov

    request = compiled.create_infer_request()
    for n, a in arrays.items():
        request.set_tensor(n, ov.Tensor(a, shared_memory=True))
    t0 = time.perf_counter()
    request.infer()
    return (time.perf_counter() - t0) * 1e3


def load_raw_openvino(model: str | Path, device: str, feeds: Mapping[str, np.ndarray], requests: int,
                      shapes: Mapping[str, Sequence[int]] | None = None, performance_hint: str | None = None,
                      cache_dir: str | Path | None = None, progress: Progress = _NO_PROGRESS
                      ) -> tuple[RawOpenVINOSubject, dict[str, Any]]:
    """Compile with OpenVINO directly, timing compile and first inference (and the load from CACHE_DIR)."""
    import openvino as ov

    model = Path(model)
    core = ov.Core()
    config = openvino_config(device, performance_hint)
    arrays = {n: np.ascontiguousarray(a) for n, a in feeds.items()}
    result: dict[str, Any] = {"engine": "openvino", "engine_version": ov.__version__, "device": device,
                              "config": config, "call": RawOpenVINOSubject.call}
    if cache_dir is not None:
        raw_cache = Path(cache_dir) / "raw-openvino"
        raw_cache.mkdir(parents=True, exist_ok=True)
        cached_config = openvino_config(device, performance_hint, raw_cache)
        progress.phase("raw OpenVINO: compile with CACHE_DIR (fill)")
        t0 = time.perf_counter()
        _ov_first_inference(_ov_compile(core, model, device, shapes, cached_config), arrays)
        fill_ms = (time.perf_counter() - t0) * 1e3
        progress.phase("raw OpenVINO: load from cache")
        t0 = time.perf_counter()
        cached = _ov_compile(core, model, device, shapes, cached_config)
        load_ms = (time.perf_counter() - t0) * 1e3
        first_ms = _ov_first_inference(cached, arrays)
        del cached
        result["cache"] = {"dir": str(raw_cache), "fill_load_ms": fill_ms, "cached_load_ms": load_ms,
                           "cached_first_inference_ms": first_ms,
                           "cached_time_to_first_inference_ms": load_ms + first_ms}
    progress.phase("raw OpenVINO: compile + first inference")
    t0 = time.perf_counter()
    compiled = _ov_compile(core, model, device, shapes, config)
    load_ms = (time.perf_counter() - t0) * 1e3
    first_ms = _ov_first_inference(compiled, arrays)
    progress.done()
    result.update(load_ms=load_ms, first_inference_ms=first_ms, time_to_first_inference_ms=load_ms + first_ms)
    return RawOpenVINOSubject(compiled, arrays, requests), result


def onnxruntime_providers(device: str) -> list[str]:
    """The providers a raw ONNX Runtime session uses for the device the npurt runner attached."""
    if device == "NPU":
        return ["VitisAIExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def load_raw_onnxruntime(model: str | Path, device: str, feeds: Mapping[str, np.ndarray], requests: int,
                         progress: Progress = _NO_PROGRESS) -> tuple[RawOnnxRuntimeSubject, dict[str, Any]]:
    """An ONNX Runtime session with default options (as a user makes one), timing creation and first run."""
    import onnxruntime as ort

    arrays = {n: np.ascontiguousarray(a) for n, a in feeds.items()}
    progress.phase("raw ONNX Runtime: session + first inference")
    t0 = time.perf_counter()
    session = ort.InferenceSession(str(model), providers=onnxruntime_providers(device))
    t1 = time.perf_counter()
    session.run(None, arrays)
    t2 = time.perf_counter()
    progress.done()
    result = {"engine": "onnxruntime", "engine_version": ort.__version__, "device": device,
              "providers": session.get_providers(), "call": RawOnnxRuntimeSubject.call,
              "load_ms": (t1 - t0) * 1e3, "first_inference_ms": (t2 - t1) * 1e3,
              "time_to_first_inference_ms": (t2 - t0) * 1e3}
    return RawOnnxRuntimeSubject(session, arrays, requests), result


# -------------------------------------------------------------------------------------------------- whole runs
def bench_runner(backend: str, model: str | Path, options: Mapping[str, Any], budget: Budget, requests: int,
                 seed: int = 0, cache_dir: str | Path | None = None, tensor_type: TensorType | None = None,
                 raw: str | None = None, raw_shapes: Mapping[str, Sequence[int]] | None = None,
                 performance_hint: str | None = None, progress: Progress = _NO_PROGRESS) -> dict[str, Any]:
    """All figures for one npurt backend and, with ``raw`` ("openvino" / "onnxruntime"), for that engine called
    directly on the same model, inputs and device, measured in alternating blocks in the same run.

    ``raw="auto"`` takes the engine the runner reports. Returns {"npurt": ..., "raw": ... or None, "ratio": ...}.
    ``raw_shapes``: static input shapes for the raw OpenVINO compile (needed where the model has dynamic dims;
    npurt's come from ``options["shapes"]``).
    """
    name = backend.upper()
    runner, result, feeds = load_runner(name, model, options, requests, seed, cache_dir, tensor_type, progress)
    raw_subject: Subject | None = None
    raw_result: dict[str, Any] | None = None
    try:
        tensor_type = TensorType[result["tensor_type"]]
        subjects: list[Subject] = [RunnerSubject(runner, feeds, requests, tensor_type, label=name)]
        device = result["device_info"]["attached"]
        if raw == "auto":
            raw = raw_engine_of(result["device_info"]) or None
            result["raw_missing"] = None if raw else f"no raw engine known for {result['device_info']['engine']!r}"
        if raw == "openvino":
            raw_subject, raw_result = load_raw_openvino(model, device, feeds, requests, raw_shapes, performance_hint,
                                                        cache_dir, progress)
        elif raw == "onnxruntime":
            raw_subject, raw_result = load_raw_onnxruntime(model, device, feeds, requests, progress)
        elif raw is not None:
            raise ValueError(f"raw engine {raw!r} is not 'openvino' or 'onnxruntime'")
        if raw_subject is not None:
            subjects.append(raw_subject)
        who = " and ".join(s.label for s in subjects)
        before = runner.stats
        latencies = measure_latency(subjects, budget, progress, f"{who}: latency")
        after = runner.stats
        throughputs = measure_throughput(subjects, budget, progress, f"{who}: {requests}-request throughput")
        n = after["executes"] - before["executes"]
        result["latency_ms"], result["throughput"] = latencies[0], throughputs[0]
        result["copies_per_inference"] = (after["copies"] - before["copies"]) / n if n else 0.0
        result["stats"] = runner.stats
        if raw_result is not None:
            raw_result["latency_ms"], raw_result["throughput"] = latencies[1], throughputs[1]
    finally:
        if isinstance(raw_subject, RawOnnxRuntimeSubject):
            raw_subject.close()
        runner.close()
    return {"npurt": result, "raw": raw_result, "ratio": ratios(result, raw_result) if raw_result else None}


# -------------------------------------------------------------------------------------------------- comparison
def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b or not math.isfinite(a) or not math.isfinite(b):
        return None
    return a / b


def ratios(npurt_result: Mapping[str, Any], raw: Mapping[str, Any]) -> dict[str, float | None]:
    """npurt / raw: latency and load ratios above 1 and a throughput ratio below 1 mean npurt is slower."""
    out = {f"latency_{k}": _ratio(npurt_result["latency_ms"][k], raw["latency_ms"][k]) for k in ("p50", "p90", "p99")}
    out["throughput"] = _ratio(npurt_result["throughput"]["fps"], raw["throughput"]["fps"])
    out["time_to_first_inference"] = _ratio(npurt_result["time_to_first_inference_ms"],
                                            raw["time_to_first_inference_ms"])
    if "cache" in npurt_result and "cache" in raw:
        out["cached_load"] = _ratio(npurt_result["cache"]["cached_load_ms"], raw["cache"]["cached_load_ms"])
    return out


def raw_engine_of(device_info: Mapping[str, Any]) -> str:
    """Which raw engine matches a runner: by the engine its device_info names."""
    engine = str(device_info.get("engine", "")).lower()
    if "openvino" in engine:
        return "openvino"
    if "onnx" in engine:
        return "onnxruntime"
    return ""


__all__ = [
    "BenchError", "Budget", "Progress", "RawOnnxRuntimeSubject", "RawOpenVINOSubject", "RunnerSubject", "Subject",
    "bench_runner", "device_info_dict", "load_raw_onnxruntime", "load_raw_openvino", "load_runner",
    "measure_latency", "measure_throughput", "onnxruntime_providers", "openvino_config", "random_array",
    "random_feeds", "ratios", "raw_engine_of", "runner_tensors", "summarize_ms",
]
