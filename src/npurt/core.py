"""The runner's core: the parts every path of one runner shares, assembled once.

``Runner`` (the facade), ``ArrayRuns`` (``run`` on numpy arrays) and ``StreamRuns`` (runs in streams) each hold this
object, never each other: the model's ports, the compiled shape variants, the planner, staging, the job scheduler,
the streams' table, the stats, and the per-thread ``last_error``. A change to the facade cannot break its parts,
and none of them knows the facade.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .engine import Backend
from .jobs import JobScheduler
from .logs import RunnerLog
from .options import RunnerOptions
from .plans import Plan, Planner
from .ports import Port, PortFactory, PortSpec, check_port_options
from .staging import Staging, engine_start, run_plan
from .stats import RunnerStats
from .status import SUCCESS, StatusError
from .stream_state import StreamState, StreamTable
from .tensor import NpuTensor
from .types import DeviceInfo, JobHandle, NpuTensorInfo, StatusCode, TensorDirection
from .variants import ShapeVariants

if TYPE_CHECKING:
    from .huge_pages import Collapse


class RunnerCore:
    """One runner's shared parts (see the module's docstring). ``closed`` is the runner's: set once, by close()."""

    def __init__(self, in_specs: list[PortSpec], out_specs: list[PortSpec], variants: ShapeVariants,
                 planner: Planner, staging: Staging, jobs: JobScheduler, streams: StreamTable, stats: RunnerStats,
                 log: RunnerLog, model_name: str) -> None:
        self.in_specs, self.out_specs = in_specs, out_specs
        self.variants = variants
        self.planner = planner
        self.staging = staging
        self.jobs = jobs
        self.streams = streams
        self.stats = stats
        self.log = log
        self.model_name = model_name
        self.closed = False
        self.huge_pages: Collapse | None = None  # the collapse of the load's memory (option huge_pages)
        self._tls = threading.local()
        # set this thread's last_error: a C call (setattr on the thread-local), no Python frame (every job's path)
        self.set_last_error: Callable[[str], None] = functools.partial(setattr, self._tls, "error")
        carried_in, carried_out = set(streams.pairs), set(streams.pairs.values())
        self.input_names = [s.name for s in in_specs if s.name not in carried_in]  # the inputs an app passes
        self.output_names = [s.name for s in out_specs if s.name not in carried_out]

    # -- last_error, per thread ---------------------------------------------------------------------------
    @property
    def last_error(self) -> str:
        return getattr(self._tls, "error", "")

    def fail(self, status: StatusCode, message: str) -> StatusCode:
        """Return ``status`` to the caller with ``message`` as its ``last_error`` (logged where it is a failure)."""
        self._tls.error = message
        if status is not SUCCESS:
            self.log.debug("%s: %s", status.name, message)
        return status

    def executed(self, status: StatusCode, message: str) -> StatusCode:
        """An execute's end: counted, and ``status`` returned with ``message`` as its ``last_error``."""
        self.stats.execute_ended()
        if self.huge_pages is not None:  # (its collapse waits for the first run: runs beside it wait on its pages)
            self.huge_pages.start()
        if status is not SUCCESS:
            self.stats.execute_failed()
            self.log.debug("%s: %s", status.name, message)
        self._tls.error = message
        return status

    def check_open(self) -> None:
        """StatusError FAILURE once the runner is closed (the execution path's form of a closed runner)."""
        if self.closed:
            raise StatusError(StatusCode.FAILURE, "the runner is closed")

    # -- ports ----------------------------------------------------------------------------------------------
    def app_ports(self, direction: TensorDirection) -> list[Port]:
        """The ports an app passes tensors for: the model's, but those a stream carries (option state_pairs)."""
        direction = TensorDirection(direction)
        pairs = self.streams.pairs
        carried = set(pairs) if direction is TensorDirection.INPUT else set(pairs.values())
        ports = self.variants.ports(direction)
        return [p for p in ports if p.name not in carried] if carried else ports

    def port(self, name: str) -> Port:
        """Both views of a port by name (ValueError for a name the model does not have)."""
        for port in self.variants.ports(TensorDirection.INPUT) + self.variants.ports(TensorDirection.OUTPUT):
            if port.name == name:
                return port
        raise ValueError(f"no tensor named {name!r}; the model has inputs {self.input_names} and outputs "
                         f"{self.output_names}")

    # -- running ---------------------------------------------------------------------------------------------
    def submit(self, plan: Plan, inputs: Sequence[Sequence[NpuTensor]], outputs: Sequence[Sequence[NpuTensor]],
               callback: Callable[[JobHandle], Any] | None) -> int:
        """Submit a validated plan as a job (``execute_async`` without a stream): its id. On the engine's job lane
        where it has one (no callback, one slot; see ``Engine.lane``), else on the engine's own requests or the
        workers. StatusError where the scheduler refuses it."""
        if callback is None and len(plan) == 1:
            slot = plan[0]
            lane = slot.lane
            if lane is None:
                lane = slot.lane = slot.find_lane()
            if lane:
                job_id = self.jobs.submit_lane(*lane, (inputs, outputs))
                if job_id:
                    return job_id
        start = engine_start(plan, outputs, callback is not None)
        return self.jobs.submit(self.execute_plan, (plan, inputs, outputs), start, callback).job_id

    def execute_plan(self, plan: Plan, inputs: Sequence[Sequence[NpuTensor]],
                     outputs: Sequence[Sequence[NpuTensor]], stream: StreamState | None = None
                     ) -> tuple[StatusCode, str]:
        """Run a validated plan (in a stream's contexts where given); never raises."""
        context_of: Callable[[Any], Any] | None = None if stream is None else stream.context
        return run_plan(plan, inputs, outputs, self.staging, context_of)


def assemble(backend: Backend, options: RunnerOptions, log: RunnerLog, model_name: str,
             allocate_state: Callable[[NpuTensorInfo], NpuTensor], in_place: bool,
             before_load: Callable[[RunnerCore], object] = lambda core: None
             ) -> tuple[RunnerCore, Callable[[], DeviceInfo]]:
    """Open the model through ``backend`` and build one runner's core around it (the engines compiled per shape,
    the planner, staging, the job scheduler, the streams' table: ``in_place`` binds each carried past and its
    present to one buffer), with where it runs: a call, made when first asked (what the engine says of where the
    nodes went is read then, not during the load). The backend is closed where any of it fails.

    The engines load last, after ``before_load(core)`` (the facade's own parts): code that runs right after an
    engine's load finds the CPU's caches cold (~2x slower), so as little as possible runs then. Where the backend's
    default ``max_concurrent_runs`` is the engine's (OpenVINO's optimal number of requests) and no option gives
    it, the job scheduler waits for the engine."""
    stats = RunnerStats()
    backend.count_copy = stats.copy
    variants: ShapeVariants | None = None
    try:
        t0 = time.perf_counter()
        opened = backend.open()
        open_ms = (time.perf_counter() - t0) * 1e3
        pairs = check_port_options(options, opened.inputs, opened.outputs)
        ports = PortFactory(options, backend.target, opened.device_info.attached)
        streams = StreamTable(pairs, allocate_state, in_place=in_place)
        staging = Staging(options.memory_provider, stats)
        variants = ShapeVariants(backend, opened, ports, options, stats)
        max_concurrent = options.max_concurrent_runs
        engine_first = not max_concurrent and _concurrency_of_engine(backend)
        if engine_first:
            variants.load()
            default = variants.default
            max_concurrent = backend.default_max_concurrent_runs(default.engine if default is not None else None)
        elif not max_concurrent:
            max_concurrent = backend.default_max_concurrent_runs(None)
        jobs = JobScheduler(max_concurrent, options.async_threadpool_depth or max_concurrent,
                            options.callback_order, stats)
        core = RunnerCore(list(opened.inputs), list(opened.outputs), variants,
                          Planner(variants, options.batch_size), staging, jobs, streams, stats, log, model_name)
        jobs.callbacks.before_callback = core.set_last_error
        before_load(core)
        if not engine_first:
            variants.load()
        maybe = options.huge_pages if options.huge_pages is not None else options.decoder is not None
        if backend.model_is_a_file and maybe:
            from . import huge_pages  # (only where it may be asked for: not on every import of npurt)

            if huge_pages.wanted(options.huge_pages, options.decoder is not None, backend.model_path,
                                 opened.device_info.attached == "CPU"):
                core.huge_pages = huge_pages.collapse_all()
    except BaseException:
        if variants is not None:
            variants.close()
        backend.close()
        raise
    load_steps = (("open the model", open_ms), *variants.load_steps)

    def device_info() -> DeviceInfo:
        return dataclasses.replace(
            backend.refine_device_info(opened.device_info),
            hw_view="npu" if ports.npu_views else "device", shape_mode=variants.mode,
            engine_settings=tuple(sorted(backend.engine_settings().items())), load_steps=load_steps)
    return core, device_info


def _concurrency_of_engine(backend: Backend) -> bool:
    """Whether the backend's default max_concurrent_runs depends on its engine (it overrides the base class's
    constant: OpenVINO asks the compiled model)."""
    return type(backend).default_max_concurrent_runs is not Backend.default_max_concurrent_runs
