"""The engine interface: all a backend does is adapt an engine to these two classes.

- ``Backend`` opens a model on a device: it selects the device (``devices.select_device``), reads the model's own
  inputs and outputs (``PortSpec`` s) and says whether the attached device compiles dynamic shapes. Then it
  compiles input ports into an ``Engine``.
- ``Engine`` is one compiled model. It binds tensors (once per set of tensors: the runner's plan keeps the binding),
  runs a binding on the calling thread, optionally starts one on the engine's own asynchronous requests and reports
  its end through a callback, runs numpy arrays for ``Runner.run``, and closes.

Everything the same for every backend (options, validation, plans, staging and conversion, the job table,
callbacks, status codes, stats) lives above this interface, in the runner's parts.

Tensors reach an engine in the view its ports consume (``Port.engine``), in port order. Output shapes that only a
run can tell are the engine's to report: it writes the data contiguously from the start of the output tensor's
memory and returns the shapes (the runner records them on the tensors: ``NpuTensor.result_info``); where the memory
is too small it raises ``OutputTooSmallError``.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeVar

import numpy as np

from .cache import CompiledModelCache
from .options import RunnerOptions
from .ports import Port, PortFactory, PortSpec
from .tensor import NpuTensor
from .types import DeviceInfo, NodePlacement, NpuError

ResultShapes = Sequence[tuple[int, ...] | None] | None  # per output, the shape a run wrote (None: as bound)
Done = Callable[[BaseException | None, ResultShapes], None]  # an engine-started run's end: its error, or its shapes


class Launched(ABC):
    """A run an engine started that its waiter ends (``Engine.start`` may return one instead of True): the engine
    calls no callback of npurt's when it ends; a thread that waits for the job calls ``wait``, which, once the run
    has ended, frees what it held and calls the ``done`` given to ``start`` (once, whichever thread sees the end
    first). Nothing is handed between threads per job: the waiter waits in the engine (GIL released)."""

    __slots__ = ()

    @abstractmethod
    def wait(self, timeout_s: float | None) -> bool:
        """Wait up to ``timeout_s`` (0: poll; None: no limit) for the run to end; whether it has (``done`` called,
        or being called by another thread). Never raises but KeyboardInterrupt: the run's error goes to ``done``."""

    def wait_any(self, others: Sequence[Launched], timeout_s: float) -> bool | None:
        """Wait up to ``timeout_s`` for this run or any of ``others`` to end, in the engine, ending the first (as
        ``wait`` does); whether one has. None where the engine cannot wait for several at once: the scheduler then
        waits on one at a time."""
        return None


class JobLane(Protocol):
    """Jobs an engine starts and ends itself, named by the runner's job ids, whose table the engine keeps in native
    code (``Engine.lane``): the runner submits such a job and collects it with a call or two and makes no object per
    job. Jobs the runner's scheduler must hold as its own (at close, in a wait over jobs of several kinds) are
    ``take`` n from the lane and collected with ``taken=True``. Timeouts in ms (0: poll); waits release the GIL. A
    job's outcome is its engine's error message, "" where it succeeded."""

    def reserve(self, job_id: int, others: int, limit: int, arg: Any, /) -> int:
        """Reserve a run for the job (``arg``: what ``launch`` will be given) where the lane's running jobs +
        ``others`` < ``limit``: 1; 0 where the lane is full; -1 where the limit is reached."""

    def launch(self, job_id: int, arg: Any, keep: Any, /) -> None:
        """Start a reserved job (``arg``: what ``Engine.lane`` gave for the binding); a failure is its outcome.
        ``keep`` (the call's tensors) is held until the job's run is over: a binding need not hold their memory."""

    def collect(self, job_id: int, timeout_ms: int, taken: bool, /) -> None | Literal[False] | str:
        """The job's message once it has ended (collected: forgotten here); None while it runs; False if the lane
        holds no such job (of the kind ``taken`` says)."""

    def collect_any(self, job_ids: Sequence[int], timeout_ms: int, taken: bool, /
                    ) -> None | tuple[int, Literal[False] | str]:
        """(job id, message) of whichever ended first (collected); None if none has; (id, False): id not held."""

    def take(self, job_id: int, /) -> bool | None:
        """Hand the job to the scheduler: None if not held; whether it had ended (its end counted by the lane). A
        taken job's outcome stays in the lane (``collect`` with ``taken=True`` answers it again) until ``forget``."""

    def forget(self, job_id: int, /) -> None:
        """Forget a taken job's outcome (its scheduler has ended the job from it)."""

    def jobs(self) -> list[int]:
        """Jobs not yet collected nor taken."""

    def running(self) -> int:
        """Jobs running, not taken."""

    def uncollected(self) -> int:
        """Jobs not yet collected nor taken."""

    def counts(self) -> tuple[int, int, int]:
        """Jobs (submitted, ended, failed) on the lane, ends counted as they happen (taken jobs' ends excluded)."""


# an engine's job lane for a binding: the lane, what its launch takes for the binding, and what makes a job's message
# the engine's error (Engine.lane)
LaneRef = tuple[JobLane, Any, Callable[[BaseException], BaseException]]

B = TypeVar("B")
AddressKey = tuple[tuple[tuple[int, ...], int], ...]  # (shape, address) of each tensor a binding binds


class BindingsByAddress(Generic[B]):
    """An engine's bindings kept by the shape and address of each tensor they bind, the oldest let go past ``size``:
    new tensor objects over memory bound before (an app's reused buffers, or new arrays the allocator placed where
    the last ones were) reuse one. Only for bindings that hold addresses, never memory: a binding runs only for a
    call whose own tensors are at those addresses with those shapes. ``lock`` guards changes (and a walk over
    ``kept()``); a lookup needs none."""

    def __init__(self, size: int = 32) -> None:
        self._kept: dict[AddressKey, B] = {}
        self._size = size
        self.lock = threading.Lock()

    def get(self, key: AddressKey) -> B | None:
        return self._kept.get(key)

    def keep(self, key: AddressKey, binding: B) -> None:
        evicted = None
        with self.lock:
            if len(self._kept) >= self._size:
                evicted = self._kept.pop(next(iter(self._kept)), None)
            self._kept[key] = binding
        del evicted  # (let go of outside the lock: a binding's finalizer may run code of its engine's)

    def kept(self) -> Iterable[B]:
        """The bindings kept (walk them under ``lock``)."""
        return self._kept.values()

    def clear(self) -> None:
        with self.lock:
            dropped, self._kept = self._kept, {}
        del dropped


class OutputTooSmallError(NpuError):
    """An output tensor cannot hold what the run produced (StatusCode.INVALID_OUTPUT, with the needed shape)."""

    def __init__(self, name: str, needed: Sequence[int], nbytes: int | None = None,
                 capacity: int | None = None) -> None:
        sizes = f" ({nbytes} bytes; the tensor holds {capacity})" if nbytes is not None else ""
        super().__init__(f"output {name!r}: the run produced shape {list(needed)}{sizes}, more than the tensor "
                         f"holds: allocate it for shape {list(needed)} or larger")
        self.name = name
        self.needed = tuple(needed)


@dataclass(frozen=True)
class Discovery:
    """What a backend reports for `npurt devices`: its engine (a JSON-able report under the engine's key, the same
    for backends of one engine) and its NPU's verdict (name, present, emulated, why_not, needed), where it has one."""

    engine: str
    engine_report: Mapping[str, Any]
    npu: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class OpenedModel:
    """What a backend found when it opened a model: where it runs and the model's own ports."""

    device_info: DeviceInfo
    inputs: list[PortSpec]
    outputs: list[PortSpec]
    dynamic_shapes: bool  # whether the attached device compiles dynamic dims (CPU, GPU) or only static ones (NPU)


class Engine(ABC):
    """One compiled model: its ports (inputs as compiled, outputs as the engine produces them) and its runs.

    Each stream of runs may have a context of its own on the engine (``open_context``); runs of a stream pass
    it. An engine whose model keeps variables between runs (OpenVINO's ReadValue / Assign) names them in
    ``state_names`` and keeps each stream's values in its context. Runs without a context share the engine's pool.
    """

    inputs: list[Port]
    outputs: list[Port]  # an engine may decide dims here on first use (ONNX Runtime's pinned output dims)
    state_names: list[str] = []
    cache_metadata: Mapping[str, Any] = {}  # set by a compile that wrote what npurt's cache keeps (JSON)
    takes_boxes = False  # inputs may be strided boxes of a contiguous tensor (types.padded_box), bound as they are

    @property
    def known_outputs(self) -> list[Port]:
        """The output ports without deciding anything on first use: names, types and views as in ``outputs``; a
        dim that ``outputs`` decides may still be open here (what ``run_arrays`` needs to know)."""
        return self.outputs

    @abstractmethod
    def bind(self, inputs: Sequence[NpuTensor], outputs: Sequence[NpuTensor]) -> Any:
        """Prepare tensors (engine views, port order) for runs; the runner keeps the result while they live."""

    @abstractmethod
    def run(self, binding: Any, context: Any = None) -> ResultShapes:
        """One inference on the calling thread; the output shapes where a port's shape is open (else None).
        Raise on failure. Called from many threads at once (one at a time per context)."""

    # A job with a callback runs on the runner's workers (not ``start``), which run its callback as they end it and
    # the next job that callback submits with no thread woken: set where that is faster than the engine's own way.
    callbacks_on_workers = False

    def start(self, binding: Any, done: Done, context: Any = None) -> bool | Launched:
        """Start one inference on the engine's own asynchronous machinery and return at once; call
        ``done(error, shapes)`` when it ends (on any thread, quickly: no user code runs there), or return a
        ``Launched`` whose ``wait`` the job's waiters call, which calls ``done``. False when the engine cannot start
        one now (the runner then runs the job on its own workers with ``run``)."""
        return False

    def lane(self, binding: Any) -> LaneRef | None:
        """Where jobs on this binding (no callback, no context, outputs' shapes fixed) may go to the engine's job
        lane: the lane, what its ``launch`` takes for the binding, and what makes a job's message the engine's
        error (None: ``start``, or the workers)."""
        return None

    @abstractmethod
    def run_arrays(self, arrays: Sequence[np.ndarray], context: Any = None) -> list[np.ndarray]:
        """One inference on numpy arrays in the engine's views (C-contiguous, the ports' dtypes); new arrays out."""

    # -- variables kept by the engine (stateful models) ---------------------------------------------------
    def open_context(self) -> Any:
        """One stream's own resources on the engine: where its variables live (None: the engine keeps nothing
        per stream, its runs share the pool)."""
        return None

    def close_context(self, context: Any) -> None:  # noqa: B027 - nothing to release without variables
        pass

    def get_state(self, context: Any) -> dict[str, np.ndarray]:
        """A copy of a context's variables, by name."""
        return {}

    def set_state(self, context: Any, state: Mapping[str, np.ndarray]) -> None:
        if state:
            raise NpuError(f"this engine keeps no variables; {sorted(state)} cannot be set")

    def reset_state(self, context: Any) -> None:  # noqa: B027 - nothing to reset without variables
        """Set a context's variables to their initial values."""

    def close(self) -> None:  # noqa: B027 - engines without resources need nothing here
        """Release the engine (the runner calls it once, after every run on it has ended)."""


class Backend(ABC):
    """Adapts one engine. Registered by name (entry point group ``npurt.backends``)."""

    name: ClassVar[str] = ""
    target: str = ""  # the NPU's HW view family (formats.hw_view): "OPENVINO" or "VAIML"
    model_is_a_file: ClassVar[bool] = True  # False where the "model path" names something else (a served model)
    selects_execution_providers: ClassVar[bool] = False  # takes options execution_provider / ep_policy

    def __init__(self, model_path: Path, options: RunnerOptions) -> None:
        if (options.execution_provider or options.ep_policy) and not self.selects_execution_providers:
            raise ValueError(f"options 'execution_provider' and 'ep_policy' choose ONNX Runtime's EP for "
                             f"RunnerType.ONNXRUNTIME; {self.name}'s engine is fixed")
        self.model_path = model_path
        self.options = options
        # Engines call this for every host-side copy of tensor data they cannot avoid (the runner counts them).
        self.count_copy: Callable[[int], None] = lambda nbytes: None
        # npurt's compiled-model cache (option cache_dir), where the backend opened it to read facts of the model:
        # the runner's variants use the same one
        self.compiled_cache: CompiledModelCache | None = None

    @classmethod
    def npu_present(cls) -> bool:
        """Whether this backend's NPU is usable on this machine (RunnerType.AUTO prefers such a backend)."""
        return False

    @classmethod
    def discover(cls) -> Discovery | None:
        """Its engine's devices and its NPU's verdict, for `npurt devices` (None: a backend that reports nothing)."""
        return None

    @abstractmethod
    def open(self) -> OpenedModel:
        """Select the device and read the model's own inputs and outputs (by name and order)."""

    @abstractmethod
    def compile(self, inputs: list[Port], ports: PortFactory, store: Path | None = None) -> Engine:
        """An engine for these input ports (dims DYNAMIC_DIM where the engine is to take any size), with the
        CPU<->HW conversion of HW-view ports built in; its output ports made with ``ports.make``.

        ``store``: also write what npurt's compiled-model cache keeps into this file (and, where it names them
        relative to its directory, files beside it in that directory: the entry keeps them too), and what it needs
        besides (JSON) into the engine's ``cache_metadata`` (only where ``cache_key`` gave a key)."""

    def cache_key(self, inputs: list[Port]) -> dict[str, Any] | None:
        """What an engine compiled for these inputs depends on besides the model's content: the engine and its
        version, the device and its driver and compiler versions, the ports' views and shapes where they change
        the result, every setting that changes compilation (JSON-able). None: nothing goes into npurt's cache."""
        return None

    def load_compiled(self, stored: Path, metadata: Mapping[str, Any], inputs: list[Port],
                      ports: PortFactory) -> Engine:
        """The engine from the file ``compile(..., store=...)`` wrote (checked against the cache's manifest); raise
        if it cannot be loaded (the runner then compiles again and replaces the entry)."""
        raise NpuError(f"{self.name} keeps nothing in npurt's cache")

    def refine_device_info(self, info: DeviceInfo) -> DeviceInfo:
        """``open``'s device info with what compiling showed (which provider took the nodes, a late fallback)."""
        return info

    def node_placement(self) -> tuple[NodePlacement, ...]:
        """Where each node of the model runs, as the engine partitioned it, and why a node is not on the device
        asked for where the engine says (``Runner.placement``); () where the engine does not tell."""
        return ()

    def default_max_concurrent_runs(self, engine: Engine | None) -> int:
        return 2  # VART-ML's default

    def engine_settings(self) -> dict[str, str]:
        """What npurt set on the engine (threads, hint, streams), for device_info and `npurt info`."""
        return {}

    def close(self) -> None:  # noqa: B027 - backends without process-wide state need nothing here
        """Release what the backend holds besides its engines."""
