"""Runner: the VART-ML execution contract, once, for every backend.

A runner loads one model on one device through a backend (``engine.Backend``: an adapter of OpenVINO or ONNX
Runtime) and runs it. This module is the contract as a facade; its parts live in their own modules:

- ``core``: the parts every path shares, assembled once (``core.assemble``: ``options``, ``ports``, ``variants``:
  the engines compiled per input shapes, ``plans``, ``staging``, ``jobs``, ``stream_state``, ``stats``);
- ``arrays``: ``run`` on numpy arrays; ``streams``: runs in streams. Both hold the core, never the facade.

Queries and construction raise (ValueError for bad arguments, NpuError for the rest). Execution never raises:
``execute``, ``execute_async``, ``wait`` and ``wait_any`` return StatusCodes, and ``last_error`` (per thread) holds
the message. ``run`` is the exception: a numpy convenience that raises like ordinary Python. Every method is
thread-safe: one runner is meant to be shared by threads.
"""

from __future__ import annotations

import functools
import os
import shutil
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from . import bound
from .arrays import ArrayRuns
from .bound import BoundRun
from .core import RunnerCore, assemble
from .engine import Backend, Engine
from .logs import RunnerLog
from .options import RunnerOptions, parse_options
from .ports import Port, PortSpec
from .shutdown import open_runners
from .staging import run_plan
from .status import SUCCESS, StatusError
from .streams import Stream, StreamRuns
from .tensor import NpuTensor, allocate_tensor, sub_tensor
from .types import (
    DecoderFacts,
    DeviceInfo,
    JobHandle,
    MemoryType,
    NodePlacement,
    NpuError,
    NpuTensorInfo,
    QuantParameters,
    StatusCode,
    TensorDirection,
    TensorType,
    job_handle,
)
from .variants import Variant

if TYPE_CHECKING:
    from .huge_pages import Collapse


class Runner:
    """Loads a model on a device through a backend and runs it (the module's docstring has the contract).

    Made by ``RunnerFactory.create_runner`` (``Runner(backend_class, model_path, options)`` without the registry).
    Close it (``close()``, or ``with``) to release the engines and threads.
    """

    def __init__(self, backend: type[Backend], model_path: str | Path,
                 options: Mapping[str, Any] | RunnerOptions | None = None, *, engine_model: Path | None = None,
                 decoder: DecoderFacts | None = None, owned_folder: Path | None = None) -> None:
        """``engine_model``: the file the engine opens where it is not ``model_path`` (a decoder's derived form),
        with its ``decoder`` facts; ``owned_folder``: a folder removed with the runner (at close, or when it is
        collected). Option ``decoder`` comes prepared by ``RunnerFactory.create_runner``, which derives them."""
        self.options = options if isinstance(options, RunnerOptions) else parse_options(options)
        self.model_path = Path(model_path)
        if self.options.decoder is not None and decoder is None:
            raise ValueError("option 'decoder' is prepared by RunnerFactory.create_runner (it derives the model the "
                             "engine opens and checks it against the export): make the runner there")
        if backend.model_is_a_file and not os.path.exists(self.model_path):
            raise ValueError(f"model file not found: {self.model_path}")
        self.decoder = decoder  # option decoder: the derived form's facts (npurt.Generator)
        # a derived model's temporary folder goes with the runner: at close, or when it is collected unclosed
        self._remove_owned = weakref.finalize(self, shutil.rmtree, owned_folder, True) if owned_folder else None
        engine_model = engine_model or self.model_path
        self.log = RunnerLog(self.options.log_level)
        self._backend = backend(engine_model, self.options)
        provider = self.options.memory_provider

        def allocate_state(info: NpuTensorInfo) -> NpuTensor:  # (not a method: the parts never refer back here)
            return allocate_tensor(info, MemoryType.XRT_BO, provider)

        _, self._device_info_of = assemble(self._backend, self.options, self.log, self.model_path.name,
                                              allocate_state, in_place=decoder is not None,
                                              before_load=self._set_core)
        open_runners.add(self)  # (closed at exit if still open: shutdown.py)

    def _set_core(self, core: RunnerCore) -> None:
        """The facade's parts over the core, made before the engines load (``core.assemble``)."""
        self._arrays = ArrayRuns(core)
        self._streams = StreamRuns(core, self._arrays)
        self._core = core
        # the LRU dropped an engine: the plans and run() shortcuts that use it go with it (the parts hold no
        # reference back to the facade or to arrays, so that a runner dropped unclosed is freed at once)
        planner, arrays = weakref.ref(core.planner), weakref.ref(self._arrays)

        def forget_variant(variant: Variant) -> None:
            if (plans := planner()) is not None:
                plans.forget_variant(variant)
            if (runs := arrays()) is not None:
                runs.forget(variant)

        core.variants.on_evict = forget_variant

    # ---------------------------------------------------------------- queries (raise)
    def _require_open(self) -> None:
        if self._core.closed:
            raise NpuError(f"runner for {self.model_path.name} is closed")

    def get_tensors_info(self, direction: TensorDirection, tensor_type: TensorType = TensorType.HW
                         ) -> list[NpuTensorInfo]:
        """Every input (or output) port's info in one view, in the model's order.

        Dims the model leaves open (and that option ``shapes`` does not pin) are DYNAMIC_DIM (-1): the engine takes
        any size there on devices that run dynamic shapes. Allocate such a port's tensor for a concrete shape
        (``info.replace(shape=...)``). A stream's carried state (option state_pairs) is left out. ValueError for a
        bad direction or tensor type, NpuError once closed."""
        self._require_open()
        return [p.info(TensorType(tensor_type)) for p in self._core.app_ports(direction)]

    def get_tensor_info_by_name(self, name: str, tensor_type: TensorType = TensorType.HW) -> NpuTensorInfo:
        """One port's info in one view (ValueError for a name the model does not have)."""
        return self.get_port(name).info(TensorType(tensor_type))

    def get_port(self, name: str) -> Port:
        """Both views of a port and which the engine consumes (ValueError: no such name; NpuError once closed)."""
        self._require_open()
        return self._core.port(name)

    def get_quant_parameters(self, name: str) -> QuantParameters | None:
        """The scale and zero point of a port whose HW view is the quantized tensor; None for float views.
        ValueError for a name the model does not have."""
        return self.get_port(name).quant

    def get_num_input_tensors(self) -> int:
        """The inputs an app passes tensors for (a stream's carried state is not counted)."""
        return len(self._core.input_names)

    def get_num_output_tensors(self) -> int:
        """The outputs an app passes tensors for (likewise)."""
        return len(self._core.output_names)

    def get_batch_size(self) -> int:
        """The batch slots one execute takes (option batch_size)."""
        return self.options.batch_size

    @property
    def input_specs(self) -> list[PortSpec]:
        """The model's inputs as read (frame ports in a frame input's place), open dims None, state ports too."""
        return list(self._core.in_specs)

    @property
    def output_specs(self) -> list[PortSpec]:
        """The model's outputs as read, open dims None, state ports too (a new list)."""
        return list(self._core.out_specs)

    @functools.cached_property
    def device_info(self) -> DeviceInfo:
        """Requested and attached device, engine and version, fallback and why, views and shapes in force."""
        return self._device_info_of()

    @property
    def placement(self) -> tuple[NodePlacement, ...]:
        """Each node of the model as the engine partitioned it: where it runs and, for a node not on the device asked
        for, why, where the engine says (``device_info.placement`` holds the counts)."""
        self._require_open()
        return self._backend.node_placement()

    @property
    def backend(self) -> Backend:
        """The backend adapter (its name is the runner type)."""
        return self._backend

    @property
    def runner_type(self) -> str:
        """The backend's name ("OPENVINO", "VAIML", "QNN", "ONNXRUNTIME", or a registered backend's)."""
        return self._backend.name

    def engine_for(self, shapes: Sequence[Sequence[int]] | None = None, compile: bool = False) -> Engine:
        """The compiled engine that runs these input CPU shapes (default: the default shapes), for diagnostics and
        for a service. ``compile``: compile it where none is yet (``shapes`` None: the model's own dims, on a
        dynamic-shape device). ValueError where none is compiled (and ``compile`` is False) or the model cannot
        take the shapes; NpuError where the engine cannot compile them."""
        self._require_open()
        variants = self._core.variants
        signature = None if shapes is None else tuple(tuple(int(d) for d in s) for s in shapes)
        if not compile:
            return variants.find(signature).engine
        return (variants.dynamic_variant() if signature is None else variants.get(signature)).engine

    @property
    def stats(self) -> dict[str, int]:
        """Totals since the runner was made (a new dict): ``copies`` / ``bytes_copied`` (every host copy of tensor
        data it did), ``executes`` / ``execute_failures``, ``jobs_*`` (submitted, completed, failed), ``compiles``."""
        return self._core.stats.snapshot()

    @property
    def huge_pages(self) -> Collapse | None:
        """The collapse of the process's memory into huge pages once this model loaded, on a thread of its own
        (option ``huge_pages``; by default for a decoder of 32 to 256 MB on the CPU: ``npurt.huge_pages.wanted``):
        its ``done`` event, then the bytes ``collapsed`` of those ``advised``, or why none were (``refused``). None
        where not asked for (a remote runner's: the service's process holds its memory)."""
        return self._core.huge_pages

    @property
    def last_error(self) -> str:
        """The message behind the last non-SUCCESS status returned to this thread."""
        return self._core.last_error

    @property
    def max_concurrent_runs(self) -> int:
        """Jobs that may be in flight at once (option max_concurrent_runs, else the backend's choice)."""
        return self._core.jobs.max_concurrent

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
    def execute(self, inputs: Sequence[Sequence[NpuTensor]], outputs: Sequence[Sequence[NpuTensor]],
                stream: Stream | int | None = None) -> StatusCode:
        """Run one batch synchronously: ``inputs[b][i]``, ``outputs[b][j]`` (batch slot b, tensors matched to
        ports by ``info.name``).

        A tensor in its port's view reaches the engine without a copy; one in the other view goes through a staging
        tensor (one counted copy each way). An output whose shape only the run tells gets the data at the start of
        its memory, its ``result_info`` the shape (INVALID_OUTPUT, the shape needed in ``last_error``, where too
        small). INVALID_INPUT / INVALID_OUTPUT for wrong tensors, the engine's failures as RUNTIME_ERROR,
        UNSUPPORTED or OUT_OF_MEMORY, FAILURE once closed.

        ``stream`` (see ``open_stream``): the run takes its place in the stream's line, reads its state and leaves
        the next state there; on a model with state and no stream given, the default stream."""
        core = self._core
        try:
            if core.closed:
                core.check_open()  # (raises)
            if stream is not None or self._streams.stateful:
                status, message = self._streams.execute(stream, inputs, outputs)
            else:
                status, message = run_plan(core.planner.plan(inputs, outputs), inputs, outputs, core.staging)
        except StatusError as e:
            status, message = e.status, str(e)
        except BaseException as e:  # noqa: BLE001 - execution never raises (VART-ML contract)
            if isinstance(e, KeyboardInterrupt):
                raise
            status, message = StatusCode.FAILURE, f"unexpected error: {e!r}"
        return core.executed(status, message)

    def execute_async(self, inputs: Sequence[Sequence[NpuTensor]], outputs: Sequence[Sequence[NpuTensor]],
                      callback: Callable[[JobHandle], Any] | None = None,
                      stream: Stream | int | None = None) -> JobHandle:
        """Submit one batch and return at once: ``JobHandle(SUCCESS, job_id)``, or a failure status with job id 0.

        RESOURCE_UNAVAILABLE when ``max_concurrent_runs`` jobs are in flight (transient: wait for one and retry).
        The tensors must stay alive and unchanged until the job ends. ``callback(JobHandle)`` runs on one of the
        runner's threads when the job ends (option ``callback_order``), with the job's message in ``last_error``;
        it may submit jobs and wait for them through npurt's own waits only (docs/throughput.md). ``stream``: the
        job runs in the stream's line, after the stream's earlier runs."""
        core = self._core
        try:
            if core.closed:
                core.check_open()  # (raises: the execution path's form of a closed runner)
            if callback is not None and not callable(callback):
                raise StatusError(StatusCode.INVALID_INPUT, f"callback {callback!r} is not callable")
            if stream is not None or self._streams.stateful:
                job_id = self._streams.submit(stream, inputs, outputs, callback).job_id
            else:
                job_id = core.submit(core.planner.plan(inputs, outputs), inputs, outputs, callback)
        except StatusError as e:
            core.fail(e.status, str(e))
            return JobHandle(e.status, 0)
        except BaseException as e:  # noqa: BLE001 - submission never raises either (VART-ML contract)
            if isinstance(e, KeyboardInterrupt):
                raise
            core.fail(StatusCode.FAILURE, f"unexpected error: {e!r}")
            return JobHandle(StatusCode.FAILURE, 0)
        core.set_last_error("")
        return job_handle(SUCCESS, job_id)

    def wait(self, job: JobHandle | int, timeout_ms: int | None = None) -> StatusCode:
        """Wait for a job (a JobHandle or its id): ``timeout_ms`` 0 polls, None waits for as long as it takes.

        JOB_PENDING on timeout; INVALID_JOB_ID for a job unknown or already collected; INVALID_INPUT for a bad
        timeout; otherwise the job's own status (its message in ``last_error``), and the job is forgotten."""
        core = self._core
        job_id = job.job_id if type(job) is JobHandle else _job_id_of(job)  # (the plain case without a call)
        if job_id is None:
            return core.fail(StatusCode.INVALID_JOB_ID, f"{job!r} is not a JobHandle or a job id")
        timeout_s = None
        if timeout_ms is not None:
            try:
                timeout_s = _timeout_s(timeout_ms)
            except StatusError as e:
                return core.fail(e.status, str(e))
        return core.fail(*core.jobs.wait(job_id, timeout_s))

    def wait_any(self, jobs: Sequence[JobHandle | int], timeout_ms: int | None = None) -> JobHandle:
        """Wait for whichever of ``jobs`` (JobHandles or ids) ends first and collect it, as ``wait`` does.

        Returns ``JobHandle(status, job_id)`` of the first to end (its own status); ``JobHandle(JOB_PENDING, 0)``
        on timeout; ``JobHandle(INVALID_JOB_ID, id)`` for a job unknown or already collected;
        ``JobHandle(INVALID_INPUT, 0)`` for a bad ``timeout_ms``. Never raises."""
        core = self._core
        try:
            if type(jobs) is not list and (isinstance(jobs, (str, bytes)) or not isinstance(jobs, Sequence)):
                raise StatusError(StatusCode.INVALID_JOB_ID, f"wait_any takes a list of jobs, got {jobs!r}")
            # (the plain cases without a call: JobHandles, or ids as ints)
            found = [job.job_id if type(job) is JobHandle else job if type(job) is int else _job_id_of(job)
                     for job in jobs]
            if None in found:
                job = jobs[found.index(None)]
                raise StatusError(StatusCode.INVALID_JOB_ID, f"{job!r} is not a JobHandle or a job id")
            ids: list[int] = found  # type: ignore[assignment]  # (no None in it)
            timeout_s = None if timeout_ms is None else _timeout_s(timeout_ms)
        except StatusError as e:
            core.fail(e.status, str(e))
            return JobHandle(e.status, 0)
        status, job_id, message = core.jobs.wait_any(ids, timeout_s)
        core.fail(status, message)
        return job_handle(status, job_id)

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
        if stream is not None or self._streams.stateful:
            return self._streams.run(stream, feeds)
        arrays = self._arrays.feeds(feeds)
        return dict(zip(self._core.output_names, self._arrays.run(arrays)))

    def bind(self, inputs: Sequence[Sequence[NpuTensor]], outputs: Sequence[Sequence[NpuTensor]],
             stream: Stream | int | None = None) -> BoundRun:
        """These tensors validated, planned and bound once: ``bound.execute()`` runs them again (a StatusCode, as
        ``execute``), without execute's per-run checks. ValueError for tensors execute would refuse; a stream whose
        state changes buffers every run (ping-pong pairs) cannot be bound. NpuError once closed."""
        self._require_open()
        return bound.bind(self._core, self._streams, inputs, outputs, stream)

    # ---------------------------------------------------------------- streams
    def open_stream(self) -> Stream:
        """A new stream: an independent sequence of runs with state of its own (carried pairs of option
        state_pairs, and the variables of a stateful model), starting from the initial state. NpuError once
        closed. See docs/streams.md."""
        self._require_open()
        return self._streams.open()

    def reset_stream(self, stream: Stream | int | None = None) -> StatusCode:
        """Back to the initial state (after the stream's runs already submitted). INVALID_INPUT for an unknown or
        closed stream."""
        return self._streams.reset(stream)

    def set_stream_state(self, stream: Stream | int | None, state: Mapping[str, np.ndarray]) -> StatusCode:
        """Restore a state (as ``get_stream_state`` gave it; copied in). INVALID_INPUT for an unknown stream, names
        the stream does not carry, or arrays of the wrong shape or dtype."""
        return self._streams.set_state(stream, state)

    def close_stream(self, stream: Stream | int) -> StatusCode:
        """Close a stream once its submitted runs have ended, and free its state; the default stream stays."""
        return self._streams.close_stream(stream)

    def get_stream_state(self, stream: Stream | int | None = None) -> dict[str, np.ndarray]:
        """A copy of a stream's state, by name: its carried inputs and the model's variables (as of the stream's
        runs already submitted). ValueError for an unknown or closed stream."""
        self._require_open()
        return self._streams.get_state(stream)

    # ---------------------------------------------------------------- lifecycle
    def close(self) -> None:
        """Stop accepting work, end queued jobs (and runs waiting for their stream's turn) with FAILURE, let running
        jobs end, deliver pending callbacks, join the runner's threads, release the engines. Idempotent."""
        core = self._core
        if core.closed:
            return
        core.closed = True  # from here on nothing new starts
        open_runners.discard(self)
        if core.huge_pages is not None:
            core.huge_pages.stop()  # (its memory goes now: a range mapped again there would be filled)
        try:
            self._streams.close()  # runs waiting for their stream's turn end now, with FAILURE
            core.jobs.close()
        finally:
            core.planner.clear()
            self._arrays.clear()
            try:
                core.variants.close()
            finally:
                self._backend.close()
                if self._remove_owned is not None:
                    self._remove_owned()

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._core.closed

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Runner {self._backend.name} {self.model_path.name}: {self.device_info.summary()}>"


def _timeout_s(timeout_ms: Any) -> float | None:
    if timeout_ms is None:
        return None
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)) or not timeout_ms >= 0:
        raise StatusError(StatusCode.INVALID_INPUT,
                          f"timeout_ms must be None (no limit) or a number >= 0, got {timeout_ms!r}")
    return timeout_ms / 1000.0


def _job_id_of(job: JobHandle | int) -> int | None:
    if isinstance(job, JobHandle):
        return job.job_id
    if isinstance(job, int) and not isinstance(job, bool):
        return job
    return None
