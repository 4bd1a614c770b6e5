"""Runner: the execution contract, once, for every backend.

A backend subclasses ``Runner`` and implements four hooks:

- ``_load()``: read the model; return its input and output ``PortSpec`` s (dynamic dims as ``None``) and
  set ``self._device_info``.
- ``_compile(inputs)``: build the engine for static input ``Port`` s (their views chosen), baking the
  CPU<->HW conversion into the model at HW ports; return a ``Compiled`` whose output ports it made with
  ``self.make_port``.
- ``_run(compiled, inputs, outputs)``: one inference, tensors in the engine's views and in port order.
  Raise on failure. It may be called from many threads at once.
- ``_close()``: release the engine.

Two optional hooks let ``execute_async`` use the engine's own asynchronous requests instead of the
runner's worker threads (for jobs without a callback whose tensors need no conversion):

- ``_start(compiled, inputs, outputs)``: start one inference without blocking and return a handle, or
  None when the engine cannot start one right now (the job then goes to the workers). It is called under
  the runner's lock (so that job ids, starts and close() stay in order): it must not call back into the
  runner.
- ``_await(handle, timeout_s)``: wait up to ``timeout_s`` (None: no limit) for a started inference; True
  once it has ended (raise the engine's error if it failed), False while it runs.

Everything else (option parsing, validation of ``[batch][tensor]`` lists, view conversion into staging
buffers, the job table, callbacks, status codes, per-thread errors and stats) lives here.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from queue import SimpleQueue
from typing import Any, ClassVar

import numpy as np

from . import formats
from .options import RunnerOptions, parse_options
from .tensor import NpuTensor, allocate_tensor, sub_tensor
from .types import (
    DataType,
    DeviceInfo,
    JobHandle,
    MemoryLayout,
    MemoryType,
    NpuError,
    NpuTensorInfo,
    NpuUnsupportedError,
    QuantParameters,
    StatusCode,
    TensorDirection,
    TensorType,
)

log = logging.getLogger("npurt")

MAX_COMPILED_SHAPES = 8  # compiled variants kept per runner (one per input-shape signature)
PLAN_CACHE_SIZE = 64  # validated plans kept per runner, keyed by the identity of the tensors


@dataclass(frozen=True)
class PortSpec:
    """A model input or output as the engine reads it: dynamic dims are None."""

    name: str
    data_type: DataType
    shape: tuple[int | None, ...]
    quant: QuantParameters | None = None  # set where the HW view is the quantized tensor (QDQ boundary)
    quant_data_type: DataType | None = None  # INT8 / UINT8: the quantized tensor's type, with quant
    dim_names: tuple[str | None, ...] = ()

    @property
    def is_static(self) -> bool:
        return all(d is not None for d in self.shape)

    def dynamic_dims(self) -> list[str]:
        names = self.dim_names or (None,) * len(self.shape)
        return [f"dim {i}" + (f" ({n})" if n else "") for i, (d, n) in enumerate(zip(self.shape, names)) if d is None]


@dataclass(frozen=True)
class Port:
    """One port of a compiled model: both views of its tensor, and the one the engine consumes."""

    cpu: NpuTensorInfo
    hw: NpuTensorInfo
    view: TensorType
    quant: QuantParameters | None = None

    @property
    def name(self) -> str:
        return self.cpu.name

    def info(self, tensor_type: TensorType) -> NpuTensorInfo:
        return self.hw if tensor_type is TensorType.HW else self.cpu

    @property
    def engine(self) -> NpuTensorInfo:
        return self.info(self.view)


@dataclass
class Compiled:
    """An engine built for one input-shape signature."""

    inputs: list[Port]
    outputs: list[Port]
    engine: Any
    staging: dict[tuple[TensorDirection, int], list[NpuTensor]] = field(default_factory=dict)

    @property
    def signature(self) -> tuple[tuple[int, ...], ...]:
        return tuple(p.cpu.shape for p in self.inputs)


def _zero_copy(t: NpuTensor, port: Port) -> bool:
    """Whether a tensor is in the view its port's engine consumes, laid out as the engine expects."""
    return t.info.tensor_type is port.view and t.info.strides == port.engine.strides


_NO_SYNC_PROVIDERS = frozenset({"user", "host", "memfd"})  # memory the CPU sees coherently


class _Slot:
    """One validated batch slot: the compiled variant, tensors in port order, and what the run must do.

    The plan cache keeps tensor-free templates (``template()``) and binds each call's own tensors to them
    (``bind()``), so a cached plan never keeps a user's frame alive.
    """

    __slots__ = ("compiled", "ins", "outs", "in_order", "out_order", "convert_in", "convert_out", "direct")

    def __init__(self, compiled: Compiled, slot_in: Sequence[NpuTensor], slot_out: Sequence[NpuTensor],
                 in_order: tuple[int, ...], out_order: tuple[int, ...]) -> None:
        self.compiled, self.in_order, self.out_order = compiled, in_order, out_order
        ins = self.ins = [slot_in[k] for k in in_order]
        outs = self.outs = [slot_out[k] for k in out_order]
        self.convert_in = tuple(i for i, (t, p) in enumerate(zip(ins, compiled.inputs)) if not _zero_copy(t, p))
        self.convert_out = tuple(j for j, (t, p) in enumerate(zip(outs, compiled.outputs)) if not _zero_copy(t, p))
        # DMA-BUF memory needs CPU-access bracketing around the (CPU) engine's access; other memory does not.
        self.direct = not (self.convert_in or self.convert_out or
                           any(t.provider not in _NO_SYNC_PROVIDERS for t in (*ins, *outs)))

    def _copy(self, ins: list[NpuTensor], outs: list[NpuTensor]) -> _Slot:
        s = _Slot.__new__(_Slot)
        s.compiled, s.in_order, s.out_order = self.compiled, self.in_order, self.out_order
        s.convert_in, s.convert_out, s.direct = self.convert_in, self.convert_out, self.direct
        s.ins, s.outs = ins, outs
        return s

    def template(self) -> _Slot:
        return self._copy([], [])

    def bind(self, slot_in: Sequence[NpuTensor], slot_out: Sequence[NpuTensor]) -> _Slot:
        return self._copy([slot_in[k] for k in self.in_order], [slot_out[k] for k in self.out_order])


class _StatusError(Exception):
    def __init__(self, status: StatusCode, message: str) -> None:
        super().__init__(message)
        self.status = status


def _status_of(e: BaseException, b: int) -> tuple[StatusCode, str]:
    """The status and message of an error raised while running batch slot ``b``."""
    if isinstance(e, _StatusError):
        return e.status, f"batch slot {b}: {e}"
    if isinstance(e, NpuUnsupportedError):
        return StatusCode.UNSUPPORTED, f"batch slot {b}: {e}"
    if isinstance(e, MemoryError):
        return StatusCode.OUT_OF_MEMORY, f"batch slot {b}: out of memory: {e}"
    if isinstance(e, Exception):
        return StatusCode.RUNTIME_ERROR, f"batch slot {b}: {type(e).__name__}: {e}"
    return StatusCode.FAILURE, f"batch slot {b}: unexpected error: {e!r}"


class _Job:
    """One execute_async job.

    A job on the runner's workers holds ``pending`` from submission until it has its final status: a plain
    lock is the cheapest thing a waiter can block on without the GIL (an Event is a Condition and two
    locks in Python code, several microseconds per job). A job started on the engine's own request
    (``handle`` set) has nobody to signal its end: a waiter asks the engine, holding ``pending`` meanwhile,
    so that one thread at a time does."""

    __slots__ = ("job_id", "callback", "callback_seq", "pending", "status", "error", "handle")

    def __init__(self, job_id: int, callback: Callable[[JobHandle], Any] | None, callback_seq: int) -> None:
        self.job_id = job_id
        self.callback = callback
        self.callback_seq = callback_seq
        self.pending = threading.Lock()
        self.pending.acquire()
        self.status = StatusCode.JOB_PENDING
        self.error = ""
        self.handle: Any = None  # what Runner._start returned, for a job started on the engine

    @property
    def finished(self) -> bool:
        return self.status is not StatusCode.JOB_PENDING

    def wait(self, timeout_s: float) -> bool:
        """Block (GIL released) until a worker has finished the job, at most ``timeout_s``; whether it has."""
        if self.pending.acquire(True, timeout_s):
            self.pending.release()  # leave it free: any later wait returns at once
        return self.finished


def _job_id_of(job: JobHandle | int) -> int | None:
    if isinstance(job, JobHandle):
        return job.job_id
    if isinstance(job, int) and not isinstance(job, bool):
        return job
    return None


class Runner:
    """Loads a model on a device and runs it. Thread-safe: one runner is meant to be shared."""

    runner_type: ClassVar[str] = ""
    target: ClassVar[str] = ""  # which HW view family this backend exposes (see formats.hw_view)

    def __init__(self, model_path: str | Path, options: Mapping[str, Any] | None = None) -> None:
        self._closed = True  # until fully constructed, so a failed __init__ leaves nothing to close
        self.options: RunnerOptions = parse_options(options)
        self.model_path = Path(model_path)
        if not self.model_path.exists():
            raise ValueError(f"model file not found: {self.model_path}")
        log.setLevel(self.options.log_level)
        self._tls = threading.local()
        self._lock = threading.Lock()
        self._stats = {"copies": 0, "bytes_copied": 0, "executes": 0, "execute_failures": 0,
                       "jobs_submitted": 0, "jobs_completed": 0, "jobs_failed": 0, "compiles": 0}
        self._device_info: DeviceInfo | None = None
        self._in_specs, self._out_specs = self._load()
        self._check_option_names()
        self._compiled: dict[tuple[tuple[int, ...], ...], Compiled] = {}
        self._compile_lock = threading.Lock()
        self._default = self._get_compiled(self._default_signature())
        self._plans: dict[Any, tuple[tuple[weakref.ref[NpuTensor], ...], list[_Slot]]] = {}
        # async machinery: jobs go through one queue to a few worker threads; _running counts the jobs
        # submitted and not yet finished (at most max_concurrent_runs), under _lock.
        self._max_concurrent = self.options.max_concurrent_runs or self._default_max_concurrent_runs()
        self._running = 0
        self._queue: SimpleQueue[tuple[_Job, list[_Slot]] | None] = SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._jobs: dict[int, _Job] = {}
        self._in_engine: dict[int, _Job] = {}  # jobs started with _start and not seen to end yet
        self._next_job_id = 1
        self._next_callback_seq = 0
        self._callback_due = 0
        self._callback_ready: dict[int, _Job] = {}
        self._callback_queue: SimpleQueue[_Job | None] = SimpleQueue()
        self._callback_thread: threading.Thread | None = None
        self._closed = False
        _open_runners.add(self)

    # ---------------------------------------------------------------- backend hooks
    def _load(self) -> tuple[list[PortSpec], list[PortSpec]]:
        raise NotImplementedError

    def _compile(self, inputs: list[Port]) -> Compiled:
        raise NotImplementedError

    def _run(self, compiled: Compiled, inputs: list[NpuTensor], outputs: list[NpuTensor]) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        pass

    def _start(self, compiled: Compiled, inputs: list[NpuTensor], outputs: list[NpuTensor]) -> Any:
        return None  # no engine-side async: every job runs on the runner's workers

    def _await(self, handle: Any, timeout_s: float | None) -> bool:
        raise NotImplementedError

    def _default_max_concurrent_runs(self) -> int:
        return 2  # VART-ML's default

    @classmethod
    def npu_present(cls) -> bool:
        """Whether this backend's NPU is usable on this machine (RunnerType.AUTO prefers such a backend)."""
        return False

    # ---------------------------------------------------------------- ports and shapes
    def make_port(self, spec: PortSpec, direction: TensorDirection) -> Port:
        """Both views of a static port, in the view the options chose for it (for backends' _compile)."""
        if not spec.is_static:
            raise NpuError(f"{direction.name.lower()} {spec.name!r} still has dynamic {spec.dynamic_dims()}")
        shape = tuple(int(d) for d in spec.shape)  # type: ignore[arg-type]
        cpu = NpuTensorInfo(name=spec.name, data_type=spec.data_type, shape=shape, direction=direction,
                            tensor_type=TensorType.CPU, memory_layout=formats.default_layout(len(shape)))
        hw = formats.hw_view(cpu, self.target, quant_data_type=spec.quant_data_type,
                             override=self.options.hw_format.get(spec.name))
        return Port(cpu=cpu, hw=hw, view=self.options.tensor_type(direction, spec.name), quant=spec.quant)

    def _check_option_names(self) -> None:
        names = {TensorDirection.INPUT: {s.name for s in self._in_specs},
                 TensorDirection.OUTPUT: {s.name for s in self._out_specs}}
        for direction, name in self.options.tensor_types:
            if name not in names[direction]:
                raise ValueError(f"option '{direction.name.lower()}_tensor_type.{name}': the model has no "
                                 f"{direction.name.lower()} {name!r} (it has {sorted(names[direction])})")
        all_names = names[TensorDirection.INPUT] | names[TensorDirection.OUTPUT]
        for name in self.options.hw_format:
            if name not in all_names:
                raise ValueError(f"option 'hw_format': the model has no tensor {name!r} (it has {sorted(all_names)})")
        for name in self.options.shapes:
            if name not in names[TensorDirection.INPUT]:
                raise ValueError(f"option 'shapes': the model has no input {name!r} "
                                 f"(it has {sorted(names[TensorDirection.INPUT])})")

    def _default_signature(self) -> tuple[tuple[int, ...], ...]:
        """Static input shapes from the model, `shapes`, and the batch-slot rule (a dynamic dim 0 is 1)."""
        sig = []
        for spec in self._in_specs:
            given = self.options.shapes.get(spec.name)
            if given is not None:
                self._check_compatible(spec, given, "option 'shapes'")
                sig.append(tuple(given))
                continue
            # Each batch slot of execute() holds one frame, so a dynamic leading (batch) dim is 1.
            shape = [1 if (i == 0 and d is None) else d for i, d in enumerate(spec.shape)]
            if any(d is None for d in shape):
                dims = [d for d in spec.dynamic_dims() if not d.startswith("dim 0")]
                raise ValueError(
                    f"input {spec.name!r} has dynamic {', '.join(dims)} (shape {list(spec.shape)}); give a static "
                    f"shape with the option shapes={{'{spec.name}': [...]}} (on the command line: "
                    f"--shape {spec.name}=D1,D2,...)"
                )
            sig.append(tuple(int(d) for d in shape))  # type: ignore[arg-type]
        return tuple(sig)

    @staticmethod
    def _check_compatible(spec: PortSpec, shape: Sequence[int], where: str) -> None:
        if len(shape) != len(spec.shape) or any(d is not None and d != g for d, g in zip(spec.shape, shape)):
            raise ValueError(f"{where}: shape {list(shape)} does not fit input {spec.name!r} of shape "
                             f"{['?' if d is None else d for d in spec.shape]}")

    def _get_compiled(self, signature: tuple[tuple[int, ...], ...]) -> Compiled:
        compiled = self._compiled.get(signature)
        if compiled is not None:
            return compiled
        with self._compile_lock:
            compiled = self._compiled.get(signature)
            if compiled is None:
                ports = [self.make_port(dataclasses.replace(s, shape=shape), TensorDirection.INPUT)
                         for s, shape in zip(self._in_specs, signature)]
                compiled = self._compile(ports)
                with self._lock:
                    self._stats["compiles"] += 1
                if len(self._compiled) >= MAX_COMPILED_SHAPES:
                    # drop the oldest variant, but never the default one
                    oldest = next(k for k in self._compiled if self._compiled[k] is not getattr(self, "_default", None))
                    del self._compiled[oldest]
                self._compiled = {**self._compiled, signature: compiled}  # readers never see a dict mid-update
            return compiled

    # ---------------------------------------------------------------- queries (raise)
    def _require_open(self) -> None:
        if self._closed:
            raise NpuError(f"{type(self).__name__} for {self.model_path.name} is closed")

    def _ports(self, direction: TensorDirection) -> list[Port]:
        direction = TensorDirection(direction)
        return self._default.inputs if direction is TensorDirection.INPUT else self._default.outputs

    def get_tensors_info(self, direction: TensorDirection, tensor_type: TensorType = TensorType.HW
                         ) -> list[NpuTensorInfo]:
        self._require_open()
        return [p.info(TensorType(tensor_type)) for p in self._ports(direction)]

    def get_tensor_info_by_name(self, name: str, tensor_type: TensorType = TensorType.HW) -> NpuTensorInfo:
        self._require_open()
        for port in self._default.inputs + self._default.outputs:
            if port.name == name:
                return port.info(TensorType(tensor_type))
        raise ValueError(f"no tensor named {name!r}; the model has {self._port_names()}")

    def get_port(self, name: str) -> Port:
        """Both views of a port and which one the engine consumes."""
        self._require_open()
        for port in self._default.inputs + self._default.outputs:
            if port.name == name:
                return port
        raise ValueError(f"no tensor named {name!r}; the model has {self._port_names()}")

    def _port_names(self) -> str:
        return (f"inputs {[p.name for p in self._default.inputs]} and "
                f"outputs {[p.name for p in self._default.outputs]}")

    def get_quant_parameters(self, name: str) -> QuantParameters | None:
        return self.get_port(name).quant

    def get_num_input_tensors(self) -> int:
        return len(self._default.inputs)

    def get_num_output_tensors(self) -> int:
        return len(self._default.outputs)

    def get_batch_size(self) -> int:
        return self.options.batch_size

    @property
    def input_specs(self) -> list[PortSpec]:
        """The model's inputs as read, dynamic dims included."""
        return list(self._in_specs)

    @property
    def output_specs(self) -> list[PortSpec]:
        return list(self._out_specs)

    @property
    def device_info(self) -> DeviceInfo:
        assert self._device_info is not None, "a backend's _load() must set _device_info"
        return self._device_info

    @property
    def stats(self) -> dict[str, int]:
        """Totals since the runner was made: host-side copies of tensor data, executes and jobs."""
        self._reap()
        with self._lock:
            return dict(self._stats)

    @property
    def last_error(self) -> str:
        """The message behind the last non-SUCCESS status returned to this thread."""
        return getattr(self._tls, "error", "")

    @property
    def max_concurrent_runs(self) -> int:
        return self._max_concurrent

    # ---------------------------------------------------------------- memory
    def allocate_npu_tensor(self, info: NpuTensorInfo, memory_type: MemoryType = MemoryType.XRT_BO) -> NpuTensor:
        """A runner-owned, page-aligned tensor for ``info``."""
        self._require_open()
        if not isinstance(info, NpuTensorInfo):
            raise ValueError(f"allocate_npu_tensor needs an NpuTensorInfo, got {type(info).__name__}")
        return allocate_tensor(info, MemoryType(memory_type), self.options.memory_provider,
                               self.options.memory_strict)

    def allocate_sub_tensor(self, parent: NpuTensor, info: NpuTensorInfo, offset: int) -> NpuTensor:
        """A view of ``info`` at byte ``offset`` into a runner-allocated parent; one level of nesting."""
        self._require_open()
        return sub_tensor(parent, info, offset)

    def _count_copy(self, nbytes: int) -> None:
        """Backends call this for every host-side copy of tensor data they cannot avoid."""
        with self._lock:
            self._stats["copies"] += 1
            self._stats["bytes_copied"] += int(nbytes)

    # ---------------------------------------------------------------- execution (never raises)
    def _fail(self, status: StatusCode, message: str) -> StatusCode:
        self._tls.error = message
        if status is not StatusCode.SUCCESS:
            log.debug("%s: %s", status.name, message)
        return status

    def execute(self, inputs: Sequence[Sequence[NpuTensor]], outputs: Sequence[Sequence[NpuTensor]]
                ) -> StatusCode:
        """Run one batch synchronously: ``inputs[b][i]``, ``outputs[b][j]``."""
        try:
            if self._closed:
                raise _StatusError(StatusCode.FAILURE, f"{type(self).__name__} is closed")
            plan = self._plan(inputs, outputs)
            status, message = self._execute_plan(plan)
        except _StatusError as e:
            status, message = e.status, str(e)
        except BaseException as e:  # noqa: BLE001 - execution never raises (VART-ML contract)
            if isinstance(e, KeyboardInterrupt):
                raise
            status, message = StatusCode.FAILURE, f"unexpected error: {e!r}"
        with self._lock:
            self._stats["executes"] += 1
            if status is not StatusCode.SUCCESS:
                self._stats["execute_failures"] += 1
        return self._fail(status, message)

    def execute_async(self, inputs: Sequence[Sequence[NpuTensor]], outputs: Sequence[Sequence[NpuTensor]],
                      callback: Callable[[JobHandle], Any] | None = None) -> JobHandle:
        """Submit one batch; returns at once. RESOURCE_UNAVAILABLE (job 0) when all runs are busy: retry."""
        try:
            if self._closed:
                raise _StatusError(StatusCode.FAILURE, f"{type(self).__name__} is closed")
            if callback is not None and not callable(callback):
                raise _StatusError(StatusCode.INVALID_INPUT, f"callback {callback!r} is not callable")
            plan = self._plan(inputs, outputs)
            engine_side = callback is None and len(plan) == 1 and plan[0].direct
            if self._in_engine and self._running >= self._max_concurrent:
                self._reap()  # engine-started jobs end unseen: look before saying all runs are busy
            with self._lock:  # id, callback sequence and start or queueing together, so callbacks keep order
                if self._closed:
                    raise _StatusError(StatusCode.FAILURE, f"{type(self).__name__} is closed")
                if self._running >= self._max_concurrent:
                    raise _StatusError(StatusCode.RESOURCE_UNAVAILABLE, f"all {self._max_concurrent} concurrent "
                                                                        "runs are busy; wait for one and retry")
                job = _Job(self._next_job_id, callback, self._next_callback_seq)
                self._jobs[job.job_id] = job
                self._next_job_id += 1
                if callback is not None:
                    self._next_callback_seq += 1
                self._running += 1
                self._stats["jobs_submitted"] += 1
                if engine_side:
                    slot = plan[0]
                    try:
                        job.handle = self._start(slot.compiled, slot.ins, slot.outs)
                    except BaseException as e:  # noqa: BLE001 - the engine's error is the job's status
                        self._finish_locked(job, *_status_of(e, 0))
                        if not isinstance(e, Exception):
                            raise  # KeyboardInterrupt and the like: the job has ended, the caller is told
                        engine_side = False
                    else:
                        engine_side = job.handle is not None
                if engine_side:
                    job.pending.release()  # free for whichever thread asks the engine first
                    self._in_engine[job.job_id] = job
                elif not job.finished:
                    if not self._workers:
                        self._start_workers()
                    self._queue.put((job, plan))
        except _StatusError as e:
            self._fail(e.status, str(e))
            return JobHandle(e.status, 0)
        self._tls.error = ""
        return JobHandle(StatusCode.SUCCESS, job.job_id)

    def wait(self, job: JobHandle | int, timeout_ms: int | None = None) -> StatusCode:
        """Wait for a job: ``timeout_ms`` 0 polls, None waits for as long as it takes.

        JOB_PENDING on timeout; INVALID_JOB_ID for a job that is unknown or already collected; otherwise the
        job's own status (and its message in ``last_error``). A collected job is forgotten.
        """
        job_id = _job_id_of(job)
        if job_id is None:
            return self._fail(StatusCode.INVALID_JOB_ID, f"{job!r} is not a JobHandle or a job id")
        if timeout_ms is not None and (isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float))
                                       or timeout_ms < 0):
            return self._fail(StatusCode.INVALID_INPUT,
                              f"timeout_ms must be None (no limit) or a number >= 0, got {timeout_ms!r}")
        entry = self._jobs.get(job_id)  # a single dict operation: atomic, no lock needed
        if entry is None:
            return self._fail(StatusCode.INVALID_JOB_ID,
                              f"job {job_id} is unknown to this runner or was already collected")
        if not entry.finished:
            deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000.0
            # Wait in slices so that KeyboardInterrupt reaches the main thread promptly.
            while not self._await_job(entry, 0.1 if deadline is None
                                      else max(0.0, min(0.1, deadline - time.monotonic()))):
                if deadline is not None and time.monotonic() >= deadline:
                    return self._fail(StatusCode.JOB_PENDING, f"job {job_id} is still running")
        if entry.callback is None:
            with self._lock:  # close() walks the job table under the lock
                self._jobs.pop(job_id, None)
        return self._fail(entry.status, entry.error)

    # ---------------------------------------------------------------- convenience (raises)
    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run on numpy arrays in the CPU views (the model's own); raises NpuError on failure."""
        self._require_open()
        if not isinstance(feeds, Mapping):
            raise ValueError(f"run() takes a dict of input name -> array, got {type(feeds).__name__}")
        names = [p.name for p in self._default.inputs]
        unknown = sorted(set(feeds) - set(names))
        missing = [n for n in names if n not in feeds]
        if unknown or missing:
            raise ValueError(f"run(): unknown inputs {unknown} and missing inputs {missing}; the model's inputs "
                             f"are {names}")
        arrays = []
        for port in self._default.inputs:
            arr = np.asarray(feeds[port.name])
            if arr.dtype != port.cpu.numpy_dtype:
                raise ValueError(f"input {port.name!r}: dtype {arr.dtype}, expected {port.cpu.numpy_dtype} "
                                 f"({port.cpu.data_type.name}); convert it explicitly")
            arrays.append(np.require(arr, requirements="C"))  # keeps 0-d inputs 0-d
        signature = tuple(a.shape for a in arrays)
        try:
            compiled = self._compiled_for(signature) if signature != self._default.signature else self._default
        except _StatusError as e:
            raise ValueError(str(e)) from None
        ins = [NpuTensor(p.cpu.replace(shape=a.shape), a) for p, a in zip(compiled.inputs, arrays)]
        results = {p.name: np.empty(p.cpu.shape, p.cpu.numpy_dtype) for p in compiled.outputs}
        outs = [NpuTensor(p.cpu, results[p.name]) for p in compiled.outputs]
        status = self.execute([ins], [outs])
        if status is not StatusCode.SUCCESS:
            raise NpuError(f"{status.name}: {self.last_error}")
        return results

    # ---------------------------------------------------------------- lifecycle
    def close(self) -> None:
        """Stop accepting work, end queued jobs with FAILURE, finish running ones, release the engine."""
        with self._lock:
            if self._closed:
                return
            self._closed = True  # from here on nothing is queued
            workers, self._workers = self._workers, []
            # Each worker runs one job at a time, in submission order: of the unfinished jobs, the first
            # len(workers) are running (or being picked up); the rest never started and end here.
            unfinished = [j for j in self._jobs.values() if not j.finished and j.handle is None]
            for job in unfinished[len(workers):]:
                self._finish_locked(job, StatusCode.FAILURE, "the runner was closed before the job ran")
            in_engine = list(self._in_engine.values())
        _open_runners.discard(self)
        for job in in_engine:  # started on the engine: let them end
            while not self._await_job(job, None):
                pass
        for _ in workers:
            self._queue.put(None)  # behind every queued job
        for worker in workers:
            if worker is not threading.current_thread():
                worker.join()
        if self._callback_thread is not None:
            self._callback_queue.put(None)
            if self._callback_thread is not threading.current_thread():
                self._callback_thread.join()
        self._close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self._device_info.summary() if self._device_info else "not loaded"
        return f"<{type(self).__name__} {self.model_path.name}: {where}>"

    # ---------------------------------------------------------------- internals: planning
    def _compiled_for(self, signature: tuple[tuple[int, ...], ...]) -> Compiled:
        if all(s.is_static for s in self._in_specs):
            raise _StatusError(StatusCode.INVALID_INPUT,
                               f"input shapes {[list(s) for s in signature]} differ from the model's static shapes "
                               f"{[list(s) for s in self._default.signature]}")
        for spec, shape in zip(self._in_specs, signature):
            try:
                self._check_compatible(spec, shape, "input")
            except ValueError as e:
                raise _StatusError(StatusCode.INVALID_INPUT, str(e)) from None
        try:
            return self._get_compiled(signature)
        except Exception as e:  # noqa: BLE001
            raise _StatusError(StatusCode.INVALID_INPUT,
                               f"cannot compile the model for input shapes {[list(s) for s in signature]}: {e}"
                               ) from None

    def _plan(self, inputs: Any, outputs: Any) -> list[_Slot]:
        """Validate ``[batch][tensor]`` lists into a plan, reusing the plan of the same tensor objects.

        NpuTensors are immutable (info and memory), so a plan validated once for the same objects stays
        valid; the cache is keyed by their identity and holds them only weakly (a dead tensor's id may be
        reused: the weak references tell).
        """
        try:
            key = (tuple(tuple(map(id, s)) for s in inputs), tuple(tuple(map(id, s)) for s in outputs))
        except TypeError:
            return self._validate(inputs, outputs)  # not lists of lists: let validation say what is wrong
        flat = [t for s in inputs for t in s] + [t for s in outputs for t in s]
        hit = self._plans.get(key)
        if hit is not None and all(r() is t for r, t in zip(hit[0], flat)):
            return [slot.bind(si, so) for slot, si, so in zip(hit[1], inputs, outputs)]
        plan = self._validate(inputs, outputs)
        refs = tuple(weakref.ref(t) for t in flat)
        with self._lock:
            if len(self._plans) >= PLAN_CACHE_SIZE:
                self._plans.pop(next(iter(self._plans)))
            self._plans[key] = (refs, [slot.template() for slot in plan])
        return plan

    def _validate(self, inputs: Any, outputs: Any) -> list[_Slot]:
        """Validate ``[batch][tensor]`` lists; return per slot the compiled variant and tensors in port order."""
        batch = self.options.batch_size
        for what, lists, status in (("inputs", inputs, StatusCode.INVALID_INPUT),
                                    ("outputs", outputs, StatusCode.INVALID_OUTPUT)):
            if not isinstance(lists, Sequence) or isinstance(lists, (str, bytes)) or \
                    not all(isinstance(s, Sequence) and not isinstance(s, (str, bytes)) for s in lists):
                raise _StatusError(status, f"{what} must be a list (batch) of lists (tensors) of NpuTensor")
            if not 1 <= len(lists) <= batch:
                raise _StatusError(status, f"{what} has {len(lists)} batch slots; this runner takes 1 to {batch} "
                                           "(option batch_size)")
        if len(inputs) != len(outputs):
            raise _StatusError(StatusCode.INVALID_OUTPUT,
                               f"{len(inputs)} input batch slots but {len(outputs)} output slots")
        plan = []
        for b, (slot_in, slot_out) in enumerate(zip(inputs, outputs)):
            in_order = self._match(slot_in, self._default.inputs, b, "input", StatusCode.INVALID_INPUT)
            ins = [slot_in[k] for k in in_order]
            compiled = self._default
            signature = tuple(self._cpu_shape(t, p) for t, p in zip(ins, self._default.inputs))
            if signature != self._default.signature:
                compiled = self._compiled_for(signature)
            out_order = self._match(slot_out, compiled.outputs, b, "output", StatusCode.INVALID_OUTPUT)
            outs = [slot_out[k] for k in out_order]
            for tensors, ports, status in ((ins, compiled.inputs, StatusCode.INVALID_INPUT),
                                           (outs, compiled.outputs, StatusCode.INVALID_OUTPUT)):
                for t, p in zip(tensors, ports):
                    self._check_view(t, p, b, status)
            plan.append(_Slot(compiled, slot_in, slot_out, in_order, out_order))
        return plan

    @staticmethod
    def _match(tensors: Sequence[Any], ports: list[Port], b: int, what: str, status: StatusCode) -> tuple[int, ...]:
        """For each port, the index of its tensor in ``tensors`` (matched by name)."""
        if len(tensors) != len(ports):
            raise _StatusError(status, f"batch slot {b}: {len(tensors)} {what} tensors given, the model has "
                                       f"{len(ports)}: {[p.name for p in ports]}")
        by_name: dict[str, int] = {}
        for k, t in enumerate(tensors):
            if not isinstance(t, NpuTensor):
                raise _StatusError(status, f"batch slot {b}: {what} {t!r} is not an NpuTensor")
            if t.info.name in by_name:
                raise _StatusError(status, f"batch slot {b}: two {what} tensors are named {t.info.name!r}")
            by_name[t.info.name] = k
        order = []
        for p in ports:
            k = by_name.get(p.name)
            if k is None:
                unknown = sorted(set(by_name) - {q.name for q in ports})
                raise _StatusError(status, f"batch slot {b}: no {what} tensor for {p.name!r}; unknown names "
                                           f"{unknown}; the model's {what}s are {[q.name for q in ports]}")
            order.append(k)
        return tuple(order)

    @staticmethod
    def _cpu_shape(t: NpuTensor, port: Port) -> tuple[int, ...]:
        if t.info.tensor_type is TensorType.CPU:
            return t.info.shape
        if t.info.shape == port.hw.shape:
            return port.cpu.shape
        raise _StatusError(StatusCode.INVALID_INPUT,
                           f"input {port.name!r}: HW shape {list(t.info.shape)}, expected {list(port.hw.shape)} "
                           "(new shapes of a dynamic model are given in the CPU view)")

    @staticmethod
    def _check_view(t: NpuTensor, port: Port, b: int, status: StatusCode) -> None:
        want = port.info(t.info.tensor_type)
        got = t.info
        what = "input" if status is StatusCode.INVALID_INPUT else "output"
        for field_name in ("shape", "data_type", "memory_layout", "memory_layout_order"):
            g, w = getattr(got, field_name), getattr(want, field_name)
            if field_name == "memory_layout" and MemoryLayout.UNKNOWN in (g, w):
                continue
            if g != w:
                def show(v: Any) -> Any:
                    return v.name if hasattr(v, "name") else list(v) if isinstance(v, tuple) else v
                raise _StatusError(status, f"batch slot {b}: {what} {port.name!r} ({got.tensor_type.name} view): "
                                           f"{field_name} is {show(g)}, expected {show(w)}")
        if status is StatusCode.INVALID_OUTPUT and not t.writable:
            raise _StatusError(status, f"batch slot {b}: output {port.name!r} is read-only")

    # ---------------------------------------------------------------- internals: running
    def _execute_plan(self, plan: list[_Slot]) -> tuple[StatusCode, str]:
        for b, slot in enumerate(plan):
            try:
                if slot.direct:
                    self._run(slot.compiled, slot.ins, slot.outs)
                else:
                    self._execute_slot(slot)
            except Exception as e:  # noqa: BLE001 - the engine's error becomes a status
                return _status_of(e, b)
        return StatusCode.SUCCESS, ""

    def _execute_slot(self, slot: _Slot) -> None:
        """One slot with conversions into staging buffers and/or CPU-access bracketing of DMA-BUF memory."""
        compiled = slot.compiled
        borrowed: list[tuple[tuple[TensorDirection, int], NpuTensor]] = []
        try:
            engine_ins = list(slot.ins)
            for i in slot.convert_in:
                port = compiled.inputs[i]
                engine_ins[i] = self._borrow(compiled, TensorDirection.INPUT, i, port.engine, borrowed)
                self._convert(slot.ins[i], engine_ins[i], port.quant)
            engine_outs = list(slot.outs)
            for j in slot.convert_out:
                engine_outs[j] = self._borrow(compiled, TensorDirection.OUTPUT, j, compiled.outputs[j].engine,
                                              borrowed)
            for t in engine_ins:
                t.begin_cpu_access(write=False)
            for t in engine_outs:
                t.begin_cpu_access(write=True)
            try:
                self._run(compiled, engine_ins, engine_outs)
            finally:
                for t in engine_ins:
                    t.end_cpu_access(write=False)
                for t in engine_outs:
                    t.end_cpu_access(write=True)
            for j in slot.convert_out:
                self._convert(engine_outs[j], slot.outs[j], compiled.outputs[j].quant)
        finally:
            if borrowed:
                with self._lock:
                    for key, stage in borrowed:
                        compiled.staging.setdefault(key, []).append(stage)

    def _borrow(self, compiled: Compiled, direction: TensorDirection, index: int, info: NpuTensorInfo,
                borrowed: list[tuple[tuple[TensorDirection, int], NpuTensor]]) -> NpuTensor:
        """A staging tensor in the engine's view, reused across calls (one per concurrent call)."""
        key = (direction, index)
        with self._lock:
            free = compiled.staging.get(key)
            stage = free.pop() if free else None
        if stage is None:
            stage = allocate_tensor(info, MemoryType.XRT_BO, self.options.memory_provider)  # never strict
        borrowed.append((key, stage))
        return stage

    def _convert(self, src: NpuTensor, dst: NpuTensor, quant: QuantParameters | None) -> None:
        src.begin_cpu_access(write=False)
        dst.begin_cpu_access(write=True)
        try:
            formats.convert(src, dst, quant=quant)
        finally:
            dst.end_cpu_access(write=True)
            src.end_cpu_access(write=False)
        self._count_copy(dst.nbytes)

    # ---------------------------------------------------------------- internals: jobs
    def _await_job(self, job: _Job, timeout_s: float | None) -> bool:
        """Wait up to ``timeout_s`` (None: no limit) for a job to finish; whether it has."""
        if job.handle is None:
            return job.wait(-1 if timeout_s is None else timeout_s)
        # An engine-started job: one thread at a time asks the engine (holding the job's pending lock).
        if not job.pending.acquire(True, -1 if timeout_s is None else timeout_s):
            return job.finished
        try:
            if not job.finished:
                try:
                    ended = self._await(job.handle, timeout_s)
                except Exception as e:  # noqa: BLE001 - the engine's error is the job's status
                    self._finish_job(job, *_status_of(e, 0))
                else:
                    if ended:
                        self._finish_job(job, StatusCode.SUCCESS, "")
        finally:
            job.pending.release()
        return job.finished

    def _reap(self) -> None:
        """Finish every engine-started job that has ended (without waiting; skips those being waited for)."""
        with self._lock:
            started = list(self._in_engine.values())
        for job in started:
            self._await_job(job, 0)

    def _start_workers(self) -> None:
        """Start the worker threads (under _lock, on the first job)."""
        depth = self.options.async_threadpool_depth or self._max_concurrent
        for k in range(depth):
            worker = threading.Thread(target=self._work, name=f"npurt-run-{k}", daemon=True)
            worker.start()
            self._workers.append(worker)

    def _work(self) -> None:
        """A worker: run queued jobs until the sentinel; a worker never dies of a job."""
        get = self._queue.get
        while True:
            item = get()
            if item is None:
                return
            job, plan = item
            if job.finished:  # ended by close() before it started
                continue
            try:
                status, message = self._execute_plan(plan)
            except BaseException as e:  # noqa: BLE001
                status, message = StatusCode.FAILURE, f"unexpected error: {e!r}"
            self._finish_job(job, status, message)

    def _finish_job(self, job: _Job, status: StatusCode, message: str) -> None:
        with self._lock:
            self._finish_locked(job, status, message)

    def _finish_locked(self, job: _Job, status: StatusCode, message: str) -> None:
        """Give a job its final status, free its run and queue its callback (under _lock)."""
        if job.finished:
            return
        job.status, job.error = status, message
        self._running -= 1
        self._stats["jobs_completed"] += 1
        if status is not StatusCode.SUCCESS:
            self._stats["jobs_failed"] += 1
        if job.handle is None:
            job.pending.release()
        else:
            self._in_engine.pop(job.job_id, None)  # its waiter holds pending and lets go of it
        if job.callback is None:
            return
        if self.options.callback_order == "completion":
            self._callback_queue.put(job)
        else:
            self._callback_ready[job.callback_seq] = job
            while self._callback_due in self._callback_ready:
                self._callback_queue.put(self._callback_ready.pop(self._callback_due))
                self._callback_due += 1
        if self._callback_thread is None:
            self._callback_thread = threading.Thread(target=self._deliver_callbacks,
                                                     name="npurt-callbacks", daemon=True)
            self._callback_thread.start()

    def _deliver_callbacks(self) -> None:
        while True:
            job = self._callback_queue.get()
            if job is None:
                return
            try:
                job.callback(JobHandle(job.status, job.job_id))  # type: ignore[misc]
            except Exception:  # noqa: BLE001 - a raising callback must not kill the worker
                log.exception("callback of job %d raised", job.job_id)
            finally:
                with self._lock:
                    self._jobs.pop(job.job_id, None)


# Runners still open at interpreter exit are closed then, so that no worker thread is inside an engine
# call while the interpreter tears down (the workers are daemon threads: an unclosed runner must not
# keep the process alive).
_open_runners: weakref.WeakSet[Runner] = weakref.WeakSet()


@atexit.register
def _close_open_runners() -> None:
    for runner in list(_open_runners):
        try:
            runner.close()
        except Exception:  # noqa: BLE001 - exiting anyway
            log.exception("closing %r at exit", runner)
