"""Runner: the VART-ML execution contract, once, for every backend.

A runner loads one model on one device through a backend (``engine.Backend``: an adapter of OpenVINO or ONNX
Runtime) and runs it. This module is the contract as a facade; its parts live in their own modules:

- ``options``: the option names and values; ``ports``: the model's ports and both views of each;
- ``variants``: the engines compiled for input shapes (one dynamic engine, or one per static signature);
- ``plans``: ``[batch][tensor]`` lists validated once, cached by tensor identity and by value, with their binding;
- ``staging``: conversions between views through reused staging tensors, and DMA-BUF CPU-access brackets;
- ``jobs``: the job table, workers, engine-started jobs, ``wait`` / ``wait_any`` and callbacks;
- ``stats``: the counters behind ``Runner.stats``.

Queries and construction raise (ValueError for bad arguments, NpuError for the rest). Execution never raises:
``execute``, ``execute_async``, ``wait`` and ``wait_any`` return StatusCodes, and ``last_error`` (per thread) holds
the message. ``run`` is the exception: a numpy convenience that raises like ordinary Python. Every method is
thread-safe: one runner is meant to be shared by threads.
"""

from __future__ import annotations

import atexit
import dataclasses
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .arrays import ArrayRuns
from .engine import Backend, Engine
from .jobs import JobScheduler
from .logs import RunnerLog
from .options import RunnerOptions, parse_options
from .plans import Plan, Planner
from .ports import Port, PortFactory, PortSpec, check_port_options
from .staging import Staging, engine_start, run_plan
from .stats import RunnerStats
from .status import StatusError
from .streams import Stream, StreamRuns, StreamState, StreamTable
from .tensor import NpuTensor, allocate_tensor, sub_tensor
from .types import (
    DeviceInfo,
    JobHandle,
    MemoryType,
    NpuError,
    NpuTensorInfo,
    QuantParameters,
    StatusCode,
    TensorDirection,
    TensorType,
)
from .variants import ShapeVariants, Variant


class Runner:
    """Loads a model on a device through a backend and runs it. Thread-safe: one runner is meant to be shared.

    Made by ``RunnerFactory.create_runner`` (``Runner(backend_class, model_path, options)`` is the same without the
    registry). Construction and queries raise (ValueError for bad arguments, NpuError for the engine, the device
    and a closed runner); execution returns StatusCodes with the message in ``last_error``. A tensor in its port's
    view reaches the engine without a host copy; every copy the runner makes is counted in ``stats``. Close it
    (``close()``, or ``with``) to release the engines and threads.
    """

    def __init__(self, backend: type[Backend], model_path: str | Path,
                 options: Mapping[str, Any] | None = None) -> None:
        self._closed = True  # until fully constructed, so that a failed __init__ leaves nothing to close
        self.options: RunnerOptions = parse_options(options)
        self.model_path = Path(model_path)
        if backend.model_is_a_file and not self.model_path.exists():
            raise ValueError(f"model file not found: {self.model_path}")
        self.log = RunnerLog(self.options.log_level)
        self._tls = threading.local()
        self._stats = RunnerStats()
        self._backend = backend(self.model_path, self.options)
        self._backend.count_copy = self._stats.copy
        self._variants: ShapeVariants | None = None
        try:
            t0 = time.perf_counter()
            opened = self._backend.open()
            open_ms = (time.perf_counter() - t0) * 1e3
            self._in_specs, self._out_specs = list(opened.inputs), list(opened.outputs)
            pairs = check_port_options(self.options, self._in_specs, self._out_specs)
            self._ports = PortFactory(self.options, self._backend.target, opened.device_info.attached)
            self._variants = ShapeVariants(self._backend, opened, self._ports, self.options, self._stats)
            self._planner = Planner(self._variants, self.options.batch_size)
            self._variants.on_evict = self._forget_variant
            default = self._variants.default
            max_concurrent = self.options.max_concurrent_runs or self._backend.default_max_concurrent_runs(
                default.engine if default is not None else None)
            self._jobs = JobScheduler(max_concurrent, self.options.async_threadpool_depth or max_concurrent,
                                      self.options.callback_order, self._stats)
            self._jobs.before_callback = self._set_last_error
        except BaseException:
            if self._variants is not None:
                self._variants.close()
            self._backend.close()
            raise
        self._staging = Staging(self.options.memory_provider, self._stats)
        self._device_info = dataclasses.replace(
            self._backend.refine_device_info(opened.device_info),
            hw_view="npu" if self._ports.npu_views else "device", shape_mode=self._variants.mode,
            engine_settings=tuple(sorted(self._backend.engine_settings().items())),
            load_steps=(("open the model", open_ms), *self._variants.load_steps))
        self._streams = StreamTable(pairs, self._allocate_state)
        carried_in, carried_out = set(self._streams.pairs), set(self._streams.pairs.values())
        self._input_names = [s.name for s in self._in_specs if s.name not in carried_in]
        self._arrays = ArrayRuns(self, self._input_names,
                                 [s.data_type.numpy for s in self._in_specs if s.name not in carried_in])
        self._output_names = [s.name for s in self._out_specs if s.name not in carried_out]
        self._stream_runs = StreamRuns(self, self._streams)
        self._closed = False
        _open_runners.add(self)

    def _forget_variant(self, variant: Variant) -> None:
        """The LRU dropped an engine: the plans and run() shortcuts that use it go with it."""
        self._planner.forget_variant(variant)
        self._arrays.forget(variant)

    def _allocate_state(self, info: NpuTensorInfo) -> NpuTensor:
        return allocate_tensor(info, MemoryType.XRT_BO, self.options.memory_provider)

    # ---------------------------------------------------------------- queries (raise)
    def _require_open(self) -> None:
        if self._closed:
            raise NpuError(f"runner for {self.model_path.name} is closed")

    def _query_ports(self, direction: TensorDirection) -> list[Port]:
        """The ports an app passes tensors for: the model's, but those a stream carries (option state_pairs)."""
        assert self._variants is not None
        direction = TensorDirection(direction)
        carried = set(self._streams.pairs) if direction is TensorDirection.INPUT else set(self._streams.pairs.values())
        ports = self._variants.ports(direction)
        return [p for p in ports if p.name not in carried] if carried else ports

    def get_tensors_info(self, direction: TensorDirection, tensor_type: TensorType = TensorType.HW
                         ) -> list[NpuTensorInfo]:
        """Every input (or output) port's info in one view, in the model's order.

        Dims the model leaves open (and that option ``shapes`` does not pin) are DYNAMIC_DIM (-1): the engine takes
        any size there on devices that run dynamic shapes. Allocate such a port's tensor for a concrete shape
        (``info.replace(shape=...)``). A stream's carried state (option state_pairs) is left out. ValueError for a
        bad direction or tensor type, NpuError once closed."""
        self._require_open()
        return [p.info(TensorType(tensor_type)) for p in self._query_ports(direction)]

    def get_tensor_info_by_name(self, name: str, tensor_type: TensorType = TensorType.HW) -> NpuTensorInfo:
        """One port's info in one view (ValueError for a name the model does not have)."""
        return self.get_port(name).info(TensorType(tensor_type))

    def get_port(self, name: str) -> Port:
        """Both views of a port and which one the engine consumes (ValueError for a name the model does not have,
        NpuError once closed)."""
        self._require_open()
        return self._port(name)

    def _port(self, name: str) -> Port:
        """get_port for the runner's own parts, which finish the runs in flight while it closes."""
        assert self._variants is not None
        for port in self._variants.ports(TensorDirection.INPUT) + self._variants.ports(TensorDirection.OUTPUT):
            if port.name == name:
                return port
        raise ValueError(f"no tensor named {name!r}; the model has inputs {self._input_names} and outputs "
                         f"{self._output_names}")

    def get_quant_parameters(self, name: str) -> QuantParameters | None:
        """The scale and zero point of a port whose HW view is the quantized tensor; None for float views.
        ValueError for a name the model does not have."""
        return self.get_port(name).quant

    def get_num_input_tensors(self) -> int:
        """The inputs an app passes tensors for (a stream's carried state is not counted)."""
        return len(self._input_names)

    def get_num_output_tensors(self) -> int:
        """The outputs an app passes tensors for (a stream's carried state is not counted)."""
        return len(self._output_names)

    def get_batch_size(self) -> int:
        """The number of batch slots one execute takes (option batch_size)."""
        return self.options.batch_size

    @property
    def input_specs(self) -> list[PortSpec]:
        """The model's inputs as read, dynamic dims (None) included, state ports too (a new list)."""
        return list(self._in_specs)

    @property
    def output_specs(self) -> list[PortSpec]:
        """The model's outputs as read, dynamic dims (None) included, state ports too (a new list)."""
        return list(self._out_specs)

    @property
    def device_info(self) -> DeviceInfo:
        """Requested and attached device, engine and version, fallback and why, views and shapes in force."""
        return self._device_info

    @property
    def backend(self) -> Backend:
        """The backend adapter (its name is the runner type)."""
        return self._backend

    @property
    def runner_type(self) -> str:
        """The backend's name ("OPENVINO", "VAIML", or a registered backend's)."""
        return self._backend.name

    def engine_for(self, shapes: Sequence[Sequence[int]] | None = None) -> Engine:
        """The compiled engine that runs these input CPU shapes (default: the default shapes), for diagnostics
        (``.compiled_model``, ``.session``...). ValueError where none is compiled."""
        self._require_open()
        assert self._variants is not None
        signature = None if shapes is None else tuple(tuple(int(d) for d in s) for s in shapes)
        return self._variants.find(signature).engine

    @property
    def stats(self) -> dict[str, int]:
        """Totals since the runner was made: ``copies`` / ``bytes_copied`` (every host-side copy of tensor data
        the runner did), ``executes`` / ``execute_failures``, ``jobs_submitted`` / ``jobs_completed`` /
        ``jobs_failed``, ``compiles``. A snapshot (a new dict)."""
        return self._stats.snapshot()

    @property
    def last_error(self) -> str:
        """The message behind the last non-SUCCESS status returned to this thread."""
        return getattr(self._tls, "error", "")

    @property
    def max_concurrent_runs(self) -> int:
        """Jobs that may be in flight at once (option max_concurrent_runs, else the backend's choice)."""
        return self._jobs.max_concurrent

    # ---------------------------------------------------------------- memory
    def allocate_npu_tensor(self, info: NpuTensorInfo, memory_type: MemoryType = MemoryType.XRT_BO) -> NpuTensor:
        """A runner-owned, page-aligned, exportable tensor for ``info`` (from the runner's memory provider). The
        memory lives as long as the tensor and its sub-tensors.

        ValueError for an info with dynamic dims (allocate for a concrete shape: ``info.replace(shape=...)``),
        MemoryType.UNKNOWN, a HW info with USER_POINTER_NON_CMA, or DMA_FD from the "host" provider; NpuError when
        the provider cannot allocate (or, with option memory_strict, only a weaker one could) or once closed."""
        self._require_open()
        if not isinstance(info, NpuTensorInfo):
            raise ValueError(f"allocate_npu_tensor needs an NpuTensorInfo, got {type(info).__name__}")
        return allocate_tensor(info, MemoryType(memory_type), self.options.memory_provider,
                               self.options.memory_strict)

    def allocate_sub_tensor(self, parent: NpuTensor, info: NpuTensorInfo, offset: int) -> NpuTensor:
        """A view of ``info`` at byte ``offset`` into a runner-allocated parent (no copy); one level of nesting.

        The memory lives until the parent and every sub-tensor are gone; ``export_buffer()`` of the sub-tensor gives
        the parent's buffer, and its ``offset`` says where it lies. ValueError for a parent that is not
        runner-allocated or is a sub-tensor, or an offset that does not fit or is misaligned."""
        self._require_open()
        return sub_tensor(parent, info, offset)

    # ---------------------------------------------------------------- execution (never raises)
    def _set_last_error(self, message: str) -> None:
        self._tls.error = message

    def _fail(self, status: StatusCode, message: str) -> StatusCode:
        self._tls.error = message
        if status is not StatusCode.SUCCESS:
            self.log.debug("%s: %s", status.name, message)
        return status

    def _execute_plan(self, plan: Plan, inputs: Sequence[Sequence[NpuTensor]],
                      outputs: Sequence[Sequence[NpuTensor]], stream: StreamState | None = None
                      ) -> tuple[StatusCode, str]:
        context_of = None if stream is None else (lambda engine: self._stream_runs.context(stream, engine))
        return run_plan(plan, inputs, outputs, self._staging, context_of)

    def execute(self, inputs: Sequence[Sequence[NpuTensor]], outputs: Sequence[Sequence[NpuTensor]],
                stream: Stream | int | None = None) -> StatusCode:
        """Run one batch synchronously: ``inputs[b][i]``, ``outputs[b][j]`` (batch slot b, tensors matched to
        ports by ``info.name``).

        A tensor in its port's view reaches the engine without a copy; one in the other view is converted through
        a staging tensor (one counted copy each way). An output whose shape only the run tells gets the data at
        the start of its memory, and its ``result_info`` says the shape; INVALID_OUTPUT (with the shape needed in
        ``last_error``) where the memory is too small. INVALID_INPUT / INVALID_OUTPUT for wrong tensors, the
        engine's failures as RUNTIME_ERROR, UNSUPPORTED or OUT_OF_MEMORY, FAILURE once closed.

        ``stream`` (see ``open_stream``): the run takes its place in the stream's line, reads its state and leaves
        the next state there; on a model with state and no stream given, the default stream."""
        try:
            if self._closed:
                raise StatusError(StatusCode.FAILURE, "the runner is closed")
            if stream is not None or self._stream_runs.stateful:
                status, message = self._stream_runs.execute(stream, inputs, outputs)
            else:
                plan = self._planner.plan(inputs, outputs)
                status, message = self._execute_plan(plan, inputs, outputs)
        except StatusError as e:
            status, message = e.status, str(e)
        except BaseException as e:  # noqa: BLE001 - execution never raises (VART-ML contract)
            if isinstance(e, KeyboardInterrupt):
                raise
            status, message = StatusCode.FAILURE, f"unexpected error: {e!r}"
        self._stats.executed(status is StatusCode.SUCCESS)
        return self._fail(status, message)

    def execute_async(self, inputs: Sequence[Sequence[NpuTensor]], outputs: Sequence[Sequence[NpuTensor]],
                      callback: Callable[[JobHandle], Any] | None = None,
                      stream: Stream | int | None = None) -> JobHandle:
        """Submit one batch and return at once: ``JobHandle(SUCCESS, job_id)``, or a failure status with job id 0.

        RESOURCE_UNAVAILABLE when ``max_concurrent_runs`` jobs are in flight (transient: wait for one and retry).
        The tensors must stay alive and unchanged until the job ends. ``callback(JobHandle)`` runs on one of the
        runner's threads when the job ends (option ``callback_order``), with the job's message in ``last_error``;
        a job with a callback is released after its callback returns. ``stream``: the job runs in the stream's
        line, after the stream's earlier runs."""
        return self._submit(inputs, outputs, callback, stream)

    def _submit(self, inputs: Sequence[Sequence[NpuTensor]], outputs: Sequence[Sequence[NpuTensor]],
                callback: Callable[[JobHandle], Any] | None, stream: Stream | int | None = None,
                continuation: bool = False) -> JobHandle:
        """execute_async; ``continuation``: called by a callback that returns right after (the InferQueue starting
        a waiting slot), the job runs next on the worker running that callback (``JobScheduler.submit``)."""
        try:
            if self._closed:
                raise StatusError(StatusCode.FAILURE, "the runner is closed")
            if callback is not None and not callable(callback):
                raise StatusError(StatusCode.INVALID_INPUT, f"callback {callback!r} is not callable")
            if stream is not None or self._stream_runs.stateful:
                job = self._stream_runs.submit(stream, inputs, outputs, callback)
            else:
                plan = self._planner.plan(inputs, outputs)
                start = engine_start(plan, outputs)
                job = self._jobs.submit(lambda: self._execute_plan(plan, inputs, outputs), start, callback,
                                        continuation=continuation)
        except StatusError as e:
            self._fail(e.status, str(e))
            return JobHandle(e.status, 0)
        except BaseException as e:  # noqa: BLE001 - submission never raises either (VART-ML contract)
            if isinstance(e, KeyboardInterrupt):
                raise
            self._fail(StatusCode.FAILURE, f"unexpected error: {e!r}")
            return JobHandle(StatusCode.FAILURE, 0)
        self._tls.error = ""
        return JobHandle(StatusCode.SUCCESS, job.job_id)

    def _timeout_s(self, timeout_ms: Any) -> float | None:
        if timeout_ms is None:
            return None
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)) or not timeout_ms >= 0:
            raise StatusError(StatusCode.INVALID_INPUT,
                              f"timeout_ms must be None (no limit) or a number >= 0, got {timeout_ms!r}")
        return timeout_ms / 1000.0

    def wait(self, job: JobHandle | int, timeout_ms: int | None = None) -> StatusCode:
        """Wait for a job (a JobHandle or its id): ``timeout_ms`` 0 polls, None waits for as long as it takes.

        JOB_PENDING on timeout; INVALID_JOB_ID for a job that is unknown or already collected; INVALID_INPUT for a
        negative or non-numeric timeout; otherwise the job's own status (and its message in ``last_error``). A
        collected job is forgotten. Never raises."""
        job_id = _job_id_of(job)
        if job_id is None:
            return self._fail(StatusCode.INVALID_JOB_ID, f"{job!r} is not a JobHandle or a job id")
        try:
            timeout_s = self._timeout_s(timeout_ms)
        except StatusError as e:
            return self._fail(e.status, str(e))
        return self._fail(*self._jobs.wait(job_id, timeout_s))

    def wait_any(self, jobs: Sequence[JobHandle | int], timeout_ms: int | None = None) -> JobHandle:
        """Wait for whichever of ``jobs`` (JobHandles or ids) ends first and collect it, as ``wait`` does.

        Returns ``JobHandle(status, job_id)`` of that job (its own status); ``JobHandle(JOB_PENDING, 0)`` when none
        ends within ``timeout_ms``; ``JobHandle(INVALID_JOB_ID, id)`` for a job that is unknown or already
        collected; ``JobHandle(INVALID_INPUT, 0)`` for a bad ``timeout_ms``. Where several have ended, the one that
        ended first. Never raises."""
        try:
            if isinstance(jobs, (str, bytes)) or not isinstance(jobs, Sequence):
                raise StatusError(StatusCode.INVALID_JOB_ID, f"wait_any takes a list of jobs, got {jobs!r}")
            ids = []
            for job in jobs:
                job_id = _job_id_of(job)
                if job_id is None:
                    raise StatusError(StatusCode.INVALID_JOB_ID, f"{job!r} is not a JobHandle or a job id")
                ids.append(job_id)
            timeout_s = self._timeout_s(timeout_ms)
        except StatusError as e:
            self._fail(e.status, str(e))
            return JobHandle(e.status, 0)
        status, job_id, message = self._jobs.wait_any(ids, timeout_s)
        self._fail(status, message)
        return JobHandle(status, job_id)

    # ---------------------------------------------------------------- convenience (raises)
    def run(self, feeds: Mapping[str, np.ndarray], stream: Stream | int | None = None) -> dict[str, np.ndarray]:
        """Run on numpy arrays in the CPU views (the model's own); new arrays out, of the shapes the run produced.

        Raises ValueError for wrong inputs (not a dict, unknown or missing names, another dtype than the port's:
        nothing is cast) or shapes the model cannot take, and NpuError ("STATUS: message") for failures. The arrays
        reach the engine without a copy where they are C-contiguous and of the port's dtype, and the ports take
        them as they are (the model's own view); a non-contiguous array is made contiguous first (by numpy), and a
        port with another HW view (hw_view="npu") costs one counted conversion each way. The results are new
        arrays, the engine's own where it makes them. ``stream``: as for execute (the state a stream carries is
        neither passed nor returned)."""
        self._require_open()
        if stream is not None or self._stream_runs.stateful:
            return self._stream_runs.run(stream, feeds)
        arrays = self._arrays.feeds(feeds)
        return dict(zip(self._output_names, self._arrays.run(arrays)))

    # ---------------------------------------------------------------- streams
    def open_stream(self) -> Stream:
        """A new stream: an independent sequence of runs with state of its own (carried pairs of option
        state_pairs, and the variables of a stateful model), starting from the initial state. NpuError once
        closed. See docs/streams.md."""
        self._require_open()
        return Stream(self, self._streams.open())

    def reset_stream(self, stream: Stream | int | None = None) -> StatusCode:
        """Back to the initial state (after the stream's runs already submitted). INVALID_INPUT for an unknown or
        closed stream."""
        return self._stream_op(stream, self._stream_runs.reset)

    def set_stream_state(self, stream: Stream | int | None, state: Mapping[str, np.ndarray]) -> StatusCode:
        """Restore a state (as ``get_stream_state`` gave it; copied in). INVALID_INPUT for an unknown stream, names
        the stream does not carry, or arrays of the wrong shape or dtype."""
        return self._stream_op(stream, lambda st: self._stream_runs.set_state(st, state))

    def close_stream(self, stream: Stream | int) -> StatusCode:
        """Close a stream once its submitted runs have ended, and free its state; the default stream stays."""
        if stream is None or stream == 0:
            return self._fail(StatusCode.INVALID_INPUT, "the default stream (0) cannot be closed")
        return self._stream_op(stream, self._stream_runs.close)

    def get_stream_state(self, stream: Stream | int | None = None) -> dict[str, np.ndarray]:
        """A copy of a stream's state, by name: its carried inputs and the model's variables (as of the stream's
        runs already submitted). ValueError for an unknown or closed stream."""
        self._require_open()
        return self._stream_runs.get_state(self._streams.get(stream))

    def _stream_op(self, stream: Stream | int | None, op: Callable[[StreamState], None]) -> StatusCode:
        try:
            if self._closed:
                raise StatusError(StatusCode.FAILURE, "the runner is closed")
            op(self._stream_state(stream))
        except StatusError as e:
            return self._fail(e.status, str(e))
        except (ValueError, NpuError) as e:
            return self._fail(StatusCode.INVALID_INPUT, str(e))
        return self._fail(StatusCode.SUCCESS, "")

    def _stream_state(self, stream: Stream | int | None) -> StreamState:
        try:
            return self._streams.get(stream)
        except ValueError as e:
            raise StatusError(StatusCode.INVALID_INPUT, str(e)) from None

    # ---------------------------------------------------------------- lifecycle
    def close(self) -> None:
        """Stop accepting work, end queued jobs (and runs waiting for their stream's turn) with FAILURE, let running
        jobs end, deliver pending callbacks, join the runner's threads, release the engines. Idempotent."""
        if self._closed:
            return
        self._closed = True  # from here on nothing new starts
        _open_runners.discard(self)
        try:
            self._stream_runs.close()  # runs waiting for their stream's turn end now, with FAILURE
            self._jobs.close()
        finally:
            self._planner.clear()
            self._arrays.clear()
            try:
                if self._variants is not None:
                    self._variants.close()
            finally:
                self._backend.close()

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._closed

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Runner {self._backend.name} {self.model_path.name}: {self._device_info.summary()}>"


def _job_id_of(job: JobHandle | int) -> int | None:
    if isinstance(job, JobHandle):
        return job.job_id
    if isinstance(job, int) and not isinstance(job, bool):
        return job
    return None


# Runners still open at interpreter exit are closed then, so that no worker thread is inside an engine call while
# the interpreter tears down (the workers are daemon threads: an unclosed runner must not keep the process alive).
_open_runners: weakref.WeakSet[Runner] = weakref.WeakSet()


@atexit.register
def _close_open_runners() -> None:
    for runner in list(_open_runners):
        try:
            runner.close()
        except Exception:  # noqa: BLE001 - exiting anyway
            runner.log.exception("closing %r at exit", runner)
