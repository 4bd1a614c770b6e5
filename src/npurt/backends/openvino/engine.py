"""OpenVINO engines: a compiled model, its pool of infer requests, and bindings of tensors (the requests, bindings
and started jobs themselves: infer_requests.py).

A binding wraps each tensor's memory in an ``ov.Tensor`` once; a request is pointed at it with ``set_tensor`` only
when it held something else, so a tensor in its port's view is never copied on the host. Bindings of contiguous
tensors are kept by the addresses they wrap and hold none of the memory (``bind``): new tensors over memory bound
before, such as arrays an app makes per call where the allocator places them again, reuse one. Outputs whose shape only
the run tells are written into the bound memory (OpenVINO reshapes a tensor within its capacity) and their shapes
reported.

Asynchronous jobs without a callback (``start``) start on a pooled request with OpenVINO's own ``start_async``,
and their waiters end them (``engine.Launched``): a waiter waits in the request's ``wait_for`` (GIL released), as a
user of OpenVINO waits for a request, then gives the request back and ends the job; no thread of npurt's is woken
per job. No Python completion callback is set on the requests: OpenVINO calls one only when a run succeeds, and
taking the GIL on OpenVINO's thread for it cost ~17 us of CPU per job on the 2-core VM (digits model, N = 2:
start_async + wait 25 us, with a no-op Python callback set 42 us). Jobs with a callback run on the runner's
workers (``callbacks_on_workers``), each a synchronous ``infer`` on a pooled request: the worker that ran a job runs
its "completion" callback and the next job that callback submits, with no thread woken between them.

Where npurt's ``_ovjobs`` extension is built (it links OpenVINO's C++ runtime), those jobs start instead on requests
of the extension's own (``NativeStarted``), whose completion callback is C++: it records the run's end and error
and wakes the waiters without the GIL, and a ``wait_any`` over such jobs waits in C++ for whichever ends first (with
a timeout), where the Python API can only wait on one request at a time.

On the CPU plugin, synchronous runs (``execute``, jobs on workers) of a binding run before take a request of its
own (its home, see ``OpenVINOEngine._home_for``) and lane jobs the request already pointed at their tensors:
re-pointing a request at other tensors costs OpenVINO ~10 us a port.

A compiled model serves one kind of execution (see ``_infer``): once it has started a job on ``start_async``, its
synchronous runs also go through ``start_async`` + ``wait``.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping, Sequence
from queue import Empty, SimpleQueue
from typing import Any

import numpy as np
import openvino as ov

from ...engine import BindingsByAddress, Done, Engine, Launched, OutputTooSmallError, ResultShapes
from ...ports import Port
from ...tensor import NpuTensor
from .infer_requests import (
    WAIT_MS,
    Binding,
    NativeStarted,
    Request,
    Started,
    c_infer,
    c_start_async,
    wrap,
    wrap_address,
)
from .model_ports import ModelPorts

_NativeRequests: Any = None  # the extension's requests (npurt._ovjobs.Requests), where it imports
try:
    from ..._ovjobs import Requests

    _NativeRequests = Requests
except ImportError:  # built without OpenVINO's C++ config, or against another OpenVINO: the Python path
    pass

BF16 = ov.Type.bf16
_ACQUIRE_SLICE_S = 0.001  # a run waiting for a request held by started jobs looks at them this often


class OpenVINOEngine(Engine):
    """A compiled model and its pool of infer requests."""

    takes_boxes = True  # a strided plane goes in as a region of the tensor it lies in (wrap)
    callbacks_on_workers = True  # see the module's docstring

    def __init__(self, compiled_model: ov.CompiledModel, inputs: list[Port], outputs: list[Port], pm: ModelPorts,
                 device: str, properties: dict[str, Any], limit: int, count_copy: Any) -> None:
        self.compiled_model = compiled_model
        self.inputs, self.outputs = inputs, outputs
        self.device = device
        self.properties = properties
        self.count_copy = count_copy
        compiled_in, compiled_out = list(compiled_model.inputs), list(compiled_model.outputs)
        # the model's ports OpenVINO has (inputs it kept, outputs it computes), in the model's order
        self.bound_inputs = [i for i, k in enumerate(pm.param_of) if k is not None]
        self.bound_outputs = [j for j, a in enumerate(pm.alias_of) if a is None]
        self.aliases = [(j, a) for j, a in enumerate(pm.alias_of) if a is not None]
        self.ov_inputs = [compiled_in[k] for k in pm.param_of if k is not None]  # in bound_inputs' order
        self.ov_outputs = [compiled_out[pm.result_of[j]] for j in self.bound_outputs]
        self.ov_ports = self.ov_inputs + self.ov_outputs
        self.element_types = [p.get_element_type() for p in self.ov_ports]
        self.dynamic_outputs = any(not p.is_static for p in outputs)
        # run_arrays' output tensors start empty where the run decides the shape (OpenVINO then sizes them)
        self.output_shapes = [ov.Shape([0 if d < 0 else d for d in outputs[j].engine.shape])
                              for j in self.bound_outputs]
        # OpenVINO's CPU plugin with one inference thread loses the errors of a synchronous infer(): an output too
        # small for the shape the run produced leaves the tensor unwritten and infer() returns as if it had run
        # (OpenVINO 2026.4, seen with plain OpenVINO; start_async() + wait() reports it). Such engines run
        # start_async() + wait() on the calling thread, which hands each run to OpenVINO's stream thread and back
        # (~100 us on the 2-core VM); only outputs whose shape the run decides can be too small, so engines whose
        # outputs are all static keep infer().
        try:
            one_thread = int(compiled_model.get_property("INFERENCE_NUM_THREADS")) == 1
        except RuntimeError:  # a device without the property
            one_thread = False
        self.sync_loses_errors = one_thread and self.dynamic_outputs
        try:
            self.optimal_requests = max(1, int(compiled_model.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")))
        except RuntimeError:
            self.optimal_requests = 1
        self.limit = max(1, limit)  # requests made at most
        self.made: list[Request] = []
        # requests that tensors run again may have to themselves (``_home_for``; the extension's lane keeps as many,
        # see ``_open_native``): as many as an InferQueue's default slots, on the CPU plugin, where re-pointing a
        # request costs ~10 us a port and a request next to no memory (measured there only: other devices keep
        # ``limit`` requests). home_places: those not yet given (list.pop / append take and give one back without a
        # lock, from a binding's finalizer too)
        cpu = device == "CPU"
        self.own_requests = self.limit + max(self.limit, 4) if cpu else self.limit
        self.home_places: list[None] = [None] * self.own_requests if cpu else []
        self.contexts: list[Request] = []  # streams' own requests
        self._free: SimpleQueue[Request] = SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._state_names: list[str] | None = None
        self.end_lock = threading.Lock()  # ends each started job once (Started.wait)
        # start_async for jobs: not where outputs come from the inputs (filled by the engine) or a run's errors are
        # lost by the one-thread synchronous path (its engines already run start_async + wait on the caller)
        self.starts = not self.aliases and not self.sync_loses_errors
        # jobs on the extension's requests (see the module's docstring): made at the first job. native_jobs: whether
        # to (False before the first job keeps the Python path: benchmarks/hostcost.py --paths compares the two)
        self._native: Any = None
        self.native_jobs = _NativeRequests is not None and self.starts
        # (output index, position among ov_ports) of each output whose shape the run decides
        self.dynamic_positions = [(j, len(self.ov_inputs) + k) for k, j in enumerate(self.bound_outputs)
                                  if not outputs[j].is_static]
        self._native_ports = ([(False, k) for k in pm.param_of if k is not None]
                              + [(True, pm.result_of[j]) for j in self.bound_outputs])  # ov_ports' order
        self.async_used = False  # a job started on start_async: synchronous runs use it too (one kind, _infer)
        # bindings by the addresses and shapes they wrap (see ``bind``): on the CPU plugin, which reads the memory
        # at each run (a device plugin may import host memory once, pinning the pages of whatever lay at the address
        # then); not where outputs come from the inputs (a binding's fills hold the tensors' bytes)
        self._by_address: BindingsByAddress[Binding] = BindingsByAddress()
        self._keeps_by_address = device == "CPU" and not self.aliases
        self.bindings_made = 0

    # A property (asked of a request on first use) in place of Engine's plain attribute, which stays an attribute
    # there so that other engines may simply assign it: hence the override ignore.
    @property
    def state_names(self) -> list[str]:  # type: ignore[override]
        """The model's variables (ReadValue / Assign), asked of a request on first use (a load makes none)."""
        if self._state_names is None:
            request = self.acquire()
            assert request is not None
            try:
                self._state_names = [state.name for state in request.request.query_state()]
            finally:
                self.release(request)
        return self._state_names

    def _new(self) -> Request:
        request = Request(self)
        self.made.append(request)
        return request

    def acquire(self, block: bool = True) -> Request | None:
        """A free request; a new one while fewer than ``limit`` exist; else wait for one (None if not ``block``)."""
        try:
            return self._free.get_nowait()
        except Empty:
            pass
        with self._lock:
            if len(self.made) < self.limit:
                return self._new()
        if not block:
            return None
        while True:
            # Requests held by jobs started on start_async come back when a waiter ends the job: where none may
            # ever wait (jobs not yet collected), this thread ends those that have ended.
            started = [s for s in (r.started for r in self.made) if s is not None]
            for s in started:
                s.wait(0)
            try:
                return self._free.get(timeout=_ACQUIRE_SLICE_S if started else WAIT_MS / 1000)
            except Empty:
                pass

    def release(self, request: Request) -> None:
        self._free.put(request)

    @property
    def requests(self) -> list[ov.InferRequest]:
        return [r.request for r in self.made]

    # -- the engine interface ------------------------------------------------------------------------------
    def bind(self, inputs: Sequence[NpuTensor], outputs: Sequence[NpuTensor]) -> Binding:
        # Shares the memory (no copy): the bytes reinterpreted with the engine's shape and element type.
        tensors = [inputs[i] for i in self.bound_inputs] + [outputs[j] for j in self.bound_outputs]
        if self._keeps_by_address and all(t.info.is_contiguous for t in tensors):
            # By address: new tensor objects over memory bound before (an app's reused buffers, or new arrays the
            # allocator placed where the last ones were) reuse that binding. OpenVINO runs a request given ov.Tensors
            # it has not seen ~60 us slower (silero-vad: 160 us against 100 with tensors it ran before, plain
            # OpenVINO). Safe as ONNX Runtime's IOBindings by address are (onnxruntime/engine.py): the binding holds
            # addresses only, never memory, and runs only for a call whose own tensors are at those addresses with
            # those shapes (the port's element type is the engine's).
            key = tuple((t.info.shape, t.get_virtual_address()) for t in tensors)
            binding = self._by_address.get(key)
            if binding is not None:
                return binding
            if all(address for _, address in key):  # (0: no address; such a tensor takes the path below)
                binding = Binding([wrap_address(t, et) for t, et in zip(tensors, self.element_types)], [])
                self.bindings_made += 1
                self._by_address.keep(key, binding)
                return binding
        wrapped = [wrap(t, et) for t, et in zip(tensors, self.element_types)]
        fills = [(j, inputs[a].raw_bytes(), outputs[j].raw_bytes(), inputs[a].info.shape) for j, a in self.aliases]
        self.bindings_made += 1
        return Binding(wrapped, fills)

    def _infer(self, request: Request) -> None:
        # Only one kind of execution per compiled model: OpenVINO's CPU plugin, given both infer() on callers'
        # threads and start_async() on one compiled model, grows its memory by ~50 MiB steps under CPU contention
        # (seen with plain OpenVINO: +300 to +550 MiB over 20,000 mixed calls beside two busy loops; flat with
        # either kind alone).
        if self.sync_loses_errors or self.async_used:
            c_start_async(request.request, {}, None)
            request.request.wait()
        else:
            c_infer(request.request, {}, True, True)

    def run(self, binding: Binding, context: Request | None = None) -> ResultShapes:
        """Run a binding: on the context given (a stream's), else on a pooled request where it last ran this
        binding, else on the binding's own request (its home) where it has one that is free, else on the pooled one.
        A run on its home holds the pooled request too, unused: the pool's ``limit`` bounds every run at once, as
        ``max_concurrent_runs`` says."""
        token: Request | None = None
        if context is None:
            token = self.acquire()
            assert token is not None
            request = token
            if token.last != id(binding):  # pointed at other tensors: the binding's own request, where it has one
                home = binding.home
                if home is None:
                    request = self._home_for(binding) or token
                elif home.busy.acquire(False):
                    request = home
        else:
            request = context
        try:
            request.last = id(binding)
            request.point(binding.wrapped)
            self._infer(request)
            if binding.fills or self.dynamic_outputs:
                return request.finish(binding.fills)
            return None
        except OutputTooSmallError:
            raise
        except Exception as e:
            raise self.translate(e) from None
        finally:
            if token is not None:
                if request is not token:
                    request.busy.release()
                self.release(token)

    def _home_for(self, binding: Binding) -> Request | None:
        """A request of its own (held) for a binding the second time its run finds the pooled request pointed at
        other tensors, while the engine has places for homes; else None (its run takes the pooled one).

        Why homes: OpenVINO's CPU plugin takes ~10 us a port on the next run of a request pointed at other tensors
        (2-core VM, digits model: npurt's jobs rotating over 6 sets of tensors on 2 pooled requests ran at 66 us a
        job against 37 us with a request per set), and a request costs next to no memory of its own (the model's
        working memory is its streams'). An app that cycles through a few sets of tensors (an InferQueue's slots,
        double buffers) then never re-points one; a binding used once stays on the pool. A binding kept by address whose
        tensors are gone gives its home to the next that needs one, where no place is left."""
        # (no place left: a binding looks for a dropped one's home on its 1st, 2nd, 4th, 8th... try, not on each run)
        runs = binding.runs
        if runs >= 1 and not self._closed and (self.home_places or runs & (runs - 1) == 0):
            with self._lock:
                if binding.home is None and not self._closed:
                    home = None
                    if self.home_places:
                        home = Request(self, pooled=False)  # (before its place is taken: a failure here loses none)
                        home.busy.acquire()
                        self.home_places.pop()
                    else:
                        home = self._home_of_a_dropped_binding()
                    if home is not None:
                        binding.home = home
                        return home
        binding.runs += 1
        return None

    def free_homes(self) -> int:
        """Homes a binding that runs again can take: places not given yet, and the homes of bindings kept by address
        whose tensors are gone (``_home_of_a_dropped_binding``)."""
        with self._by_address.lock:
            dropped = sum(b.home is not None and sys.getrefcount(b) <= 3 for b in self._by_address.kept())
        return len(self.home_places) + dropped

    def _home_of_a_dropped_binding(self) -> Request | None:
        """The home (held) of a binding kept by address whose tensors are gone, for another binding: the app moved
        on to other memory. Such a binding is referred to by this engine's cache alone (a live set of tensors has a
        plan that holds its binding); a home running now is left where it is."""
        with self._by_address.lock:
            for binding in self._by_address.kept():
                home = binding.home
                # (references: the cache's, this loop's and getrefcount's argument)
                if home is not None and sys.getrefcount(binding) <= 3 and home.busy.acquire(False):
                    binding.home = None
                    return home
        return None

    def start(self, binding: Binding, done: Done, context: Request | None = None) -> bool | Launched:
        """A job on a free pooled request's ``start_async``, ended by its waiters (``Started``). False (the
        runner's workers run it): a stream's context, an engine that starts none (``starts``), every request busy."""
        if context is not None or not self.starts or self._closed:
            return False
        native = self._native
        if native is not None or self.native_jobs and (native := self._open_native()) is not None:
            self.async_used = True
            try:
                ticket = native.start(binding.wrapped)  # the GIL released while it starts
            except Exception as e:
                raise self.translate(e) from None
            return False if ticket < 0 else NativeStarted(self, native, ticket, done)
        request: Request | None
        try:
            request = self._free.get_nowait()  # (acquire's first step, without its frame: every job's path)
        except Empty:
            request = self.acquire(block=False)
            if request is None:
                return False
        self.async_used = True
        try:
            request.point(binding.wrapped)
            c_start_async(request.request, {}, None)  # releases the GIL
        except Exception as e:
            self.release(request)
            raise self.translate(e) from None
        started = request.started = Started(request, done)
        return started

    def lane(self, binding: Binding) -> tuple[Any, list[ov.Tensor], Any] | None:
        """The extension's requests as the job lane (jobs without a callback whose outputs' shapes are fixed)."""
        if not self.starts or self.dynamic_positions or self._closed:
            return None
        native = self._native
        if native is None and (not self.native_jobs or (native := self._open_native()) is None):
            return None
        self.async_used = True
        return native, binding.wrapped, self.translate

    def _open_native(self) -> Any:
        """The extension's requests (None where it refuses this OpenVINO's objects): ``own_requests`` of them, of
        which the scheduler runs ``limit`` at once; a lane job takes the request already pointed at its tensors
        where that one is idle, so that tensors cycled through (a ring of buffers) are not re-pointed each job."""
        with self._lock:
            if self._native is None and self.native_jobs:
                try:
                    self._native = _NativeRequests(self.compiled_model, self.own_requests, self._native_ports,
                                                   [k for _, k in self.dynamic_positions])
                except TypeError:  # the conduit refused: an OpenVINO other than the one it was built with
                    self.native_jobs = False
            return self._native

    def run_arrays(self, arrays: Sequence[np.ndarray], context: Request | None = None) -> list[np.ndarray]:
        request = context or self.acquire()
        assert request is not None
        try:
            r, held = request.request, request.held
            k = 0
            for port, i, et in zip(self.ov_inputs, self.bound_inputs, self.element_types):
                a = arrays[i]
                # shares the array's memory; this constructor also takes read-only arrays (shared_memory=True
                # refuses them) and the port's type where numpy holds its bits in another (BF16 as uint16)
                t = held[k] = ov.Tensor(a, shared_memory=True) if a.flags.writeable and et != BF16 else \
                    ov.Tensor(a, list(a.shape), et)
                r.set_tensor(port, t)
                k += 1
            # Outputs in new tensors of OpenVINO's own per call: it sizes them to what the run produces (from an
            # empty shape), and each result array keeps its tensor alive: nothing is copied.
            outs = []
            for port, shape, et in zip(self.ov_outputs, self.output_shapes, self.element_types[k:]):
                t = held[k] = ov.Tensor(et, shape)
                r.set_tensor(port, t)
                outs.append(t)
                k += 1
            self._infer(request)
            results: dict[int, np.ndarray] = {}  # by output index: every one is computed or passed through
            for j, t, et in zip(self.bound_outputs, outs, self.element_types[len(self.ov_inputs):]):
                results[j] = t.data if et != BF16 else t.data.view(np.uint16)  # OpenVINO shows BF16 bits as float16
            for j, source in self.aliases:  # an input passed through: a copy of it
                results[j] = arrays[source].copy()
                self.count_copy(arrays[source].nbytes)
            return [results[j] for j in range(len(self.outputs))]
        except Exception as e:
            raise self.translate(e) from None
        finally:
            if request.pooled:
                self.release(request)

    # -- variables (stateful models: ReadValue / Assign) -----------------------------------------------------
    def open_context(self) -> Request | None:
        """A stream's own infer request: OpenVINO keeps a model's variables per request, and streams sharing the
        pool (``max_concurrent_runs`` requests) would wait for one another where one request each runs side by
        side."""
        with self._lock:
            request = Request(self, pooled=False)
            self.contexts.append(request)
        return request

    def close_context(self, context: Request | None) -> None:
        if context is not None:
            with self._lock:
                if context in self.contexts:
                    self.contexts.remove(context)

    def get_state(self, context: Request | None) -> dict[str, np.ndarray]:
        if context is None:
            return {}
        return {v.name: np.array(v.state.data) for v in context.request.query_state()}

    def set_state(self, context: Request | None, state: Mapping[str, np.ndarray]) -> None:
        if context is None:
            super().set_state(context, state)
            return
        variables = {v.name: v for v in context.request.query_state()}
        for name, value in state.items():
            variable = variables[name]
            current = variable.state
            a = np.ascontiguousarray(value, dtype=current.element_type.to_dtype())
            if a.shape != tuple(current.shape) and self.device != "CPU":
                # (only the CPU plug-in is known here to check a state against the variable's declared shape)
                raise ValueError(f"state {name!r}: shape {list(a.shape)}, expected {list(current.shape)}")
            try:  # OpenVINO copies it into the request's own state; the CPU plug-in checks its shape against the
                # variable's: a dim the model leaves open (a growing cache's rows) takes any length, so a state may
                # be cut
                variable.state = ov.Tensor(a)
            except RuntimeError as e:
                lines = [line for line in str(e).splitlines() if line.strip()]
                raise ValueError(f"state {name!r}: shape {list(a.shape)} does not fit the variable "
                                 f"({lines[-1].strip() if lines else type(e).__name__})") from None

    def reset_state(self, context: Request | None) -> None:
        if context is not None:
            context.request.reset_state()

    def translate(self, e: BaseException) -> BaseException:
        """OpenVINO's capacity error for a dynamic output as OutputTooSmallError; the rest as they are."""
        text = str(e)
        if "Could set new shape" in text and "m_capacity" in text:
            shape = text.rsplit("Could set new shape:", 1)[-1].strip().splitlines()[0].strip("[] ")
            try:
                needed = tuple(int(d) for d in shape.split(","))
            except ValueError:
                needed = ()
            name = next((p.name for p in self.outputs if not p.is_static), "?")
            return OutputTooSmallError(name, needed) if needed else e
        return e

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.made, self.contexts, self._native = [], [], None  # (the extension's requests wait for their runs)
        self._by_address.clear()  # (their homes' requests go with them)
        while True:
            try:
                self._free.get_nowait()
            except Empty:
                break
