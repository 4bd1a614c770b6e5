"""An OpenVINO engine's infer requests, the bindings of tensors they are pointed at, and the jobs started on them.

``OpenVINOEngine`` (engine.py) owns these: a ``Binding`` wraps a set of tensors in ov.Tensors, a ``Request`` is one
InferRequest and what its ports point at, ``Started`` / ``NativeStarted`` are jobs running on a pooled request or on
one of the ``_ovjobs`` extension's, ended by their waiters. What they use of their engine is ``RequestsEngine``.
"""

from __future__ import annotations

import ctypes
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import openvino as ov
from openvino import _pyopenvino

from ...engine import Done, Launched, OutputTooSmallError, ResultShapes
from ...ports import Port
from ...tensor import NpuTensor
from ...types import padded_box


class RequestsEngine(Protocol):
    """What requests, bindings and started jobs use of the engine they belong to (``OpenVINOEngine``)."""

    compiled_model: ov.CompiledModel
    outputs: list[Port]
    ov_ports: list[Any]  # the ports OpenVINO has, inputs then outputs (ov.Output)
    ov_outputs: list[Any]
    bound_outputs: list[int]  # the model's outputs OpenVINO computes, in ov_outputs' order
    dynamic_outputs: bool
    dynamic_positions: list[tuple[int, int]]  # (output index, position among ov_ports) of outputs a run shapes
    home_places: list[None]  # places for bindings' own requests not yet given
    end_lock: threading.Lock  # ends each started job once
    count_copy: Callable[[int], None]

    def release(self, request: Request) -> None: ...

    def translate(self, e: BaseException) -> BaseException: ...


# The C++ methods under the Python wrappers: no Python data dispatch per call. infer(inputs, share_outputs,
# decode_strings) releases the GIL while inferring.
c_infer = _pyopenvino.InferRequest.infer
c_start_async = _pyopenvino.InferRequest.start_async
c_wait_for = _pyopenvino.InferRequest.wait_for  # (timeout ms) -> ended; raises the run's error; GIL released
WAIT_MS = 100  # untimed waits wait in slices, so that KeyboardInterrupt reaches a waiting main thread


def wrap(t: NpuTensor, element_type: ov.Type) -> ov.Tensor:
    """An ov.Tensor over a tensor's memory (no copy): a strided one (a plane with a row pitch) as the region of the
    contiguous box it lies in, which OpenVINO reads in place (the runner's plan lets only such boxes through)."""
    if t.info.is_contiguous:
        return ov.Tensor(t.raw_bytes(), list(t.info.shape), element_type)
    box = padded_box(t.info.shape, t.info.strides)
    assert box is not None
    whole = ov.Tensor(t.raw_bytes()[: math.prod(box) * t.info.data_type.itemsize], list(box), element_type)
    return ov.Tensor(whole, ov.Coordinate([0] * len(box)), ov.Coordinate(list(t.info.shape)))


def wrap_address(t: NpuTensor, element_type: ov.Type) -> ov.Tensor:
    """An ov.Tensor at a contiguous tensor's address that holds none of its memory (a view through ctypes, which
    owns nothing): kept by address (``OpenVINOEngine.bind``), it never keeps an app's freed array alive."""
    at = (ctypes.c_uint8 * t.info.size_in_bytes).from_address(t.get_virtual_address())
    return ov.Tensor(np.frombuffer(memoryview(at), np.uint8), list(t.info.shape), element_type)


Fill = tuple[int, np.ndarray, np.ndarray, tuple[int, ...]]  # (output index, source bytes, target bytes, shape)


class Binding:
    """A set of tensors as OpenVINO takes them: an ov.Tensor over each one's memory (ports OpenVINO has), and the
    outputs the engine must fill itself (inputs passed through), as (output index, source bytes, target bytes).
    A binding run again gets a request of its own (``home``, see ``OpenVINOEngine.run``), which goes with it."""

    __slots__ = ("wrapped", "fills", "home", "runs")

    def __init__(self, wrapped: list[ov.Tensor], fills: list[Fill]) -> None:
        self.wrapped = wrapped
        self.fills = fills
        self.home: Request | None = None
        self.runs = 0  # runs that found the pooled request pointed at other tensors, until it has a home

    def __del__(self) -> None:
        home = self.home
        if home is not None:  # its place among the engine's homes is free again (a list's append: no lock)
            home.engine.home_places.append(None)


class Request:
    """One InferRequest and the ov.Tensors it holds per port."""

    __slots__ = ("request", "held", "engine", "pooled", "started", "busy", "last")

    def __init__(self, engine: RequestsEngine, pooled: bool = True) -> None:
        self.engine = engine
        self.pooled = pooled  # in the engine's pool, or a stream's own (its variables are the stream's state)
        self.busy = threading.Lock()  # a binding's own request (its home): held while it runs
        self.request = engine.compiled_model.create_infer_request()
        self.held: list[Any] = [None] * len(engine.ov_ports)  # the ov.Tensor each port points at
        self.started: Started | None = None  # the job started on it, until a waiter ends it
        self.last = 0  # id() of the binding it last ran (a hint: ``point`` decides what to re-point)

    def point(self, wrapped: Sequence[Any]) -> None:
        """Point the request's ports at a binding's tensors, where it holds others."""
        held, ports, request = self.held, self.engine.ov_ports, self.request
        for k, t in enumerate(wrapped):
            if held[k] is not t:
                request.set_tensor(ports[k], t)
                held[k] = t

    def finish(self, fills: Sequence[Fill]) -> ResultShapes:
        """After a run: fill the passed-through outputs; the shapes of outputs the run decided."""
        engine = self.engine
        shapes: list[tuple[int, ...] | None] | None = None
        if engine.dynamic_outputs:
            shapes = [None] * len(engine.outputs)
            for j, p in zip(engine.bound_outputs, engine.ov_outputs):
                if not engine.outputs[j].is_static:  # the numpy view's shape: ~1 us, Tensor.shape ~15 us
                    shapes[j] = self.request.get_tensor(p).data.shape
        for j, src, dst, shape in fills:
            n = src.nbytes
            if n > dst.nbytes:
                raise OutputTooSmallError(engine.outputs[j].name, shape, n, dst.nbytes)
            dst[:n] = src
            engine.count_copy(n)
            if not engine.outputs[j].is_static:
                shapes = shapes if shapes is not None else [None] * len(engine.outputs)
                shapes[j] = shape
        return shapes


class Started(Launched):
    """A job running on a pooled request's ``start_async``; its waiters end it (see engine.py's docstring)."""

    __slots__ = ("request", "done", "ended")

    def __init__(self, request: Request, done: Done) -> None:
        self.request = request
        self.done: Done | None = done
        self.ended = False

    def wait(self, timeout_s: float | None) -> bool:
        if self.ended:
            return True
        request = self.request
        error: BaseException | None = None
        try:
            if timeout_s is None:
                while not c_wait_for(request.request, WAIT_MS):
                    pass
            elif not c_wait_for(request.request, math.ceil(timeout_s * 1000)):
                return False
        except Exception as e:  # noqa: BLE001 - the run's error is the job's
            error = e
        engine = request.engine
        end_lock = engine.end_lock
        end_lock.acquire()  # one thread ends it, whichever saw the end first (not `with`: half the cost, per job)
        try:
            if self.ended:
                return True
            self.ended = True
            request.started = None
        finally:
            end_lock.release()
        done, self.done = self.done, None  # the job refers to this: no cycle left through its done
        assert done is not None
        shapes: ResultShapes = None
        try:
            if error is None and engine.dynamic_outputs:
                shapes = request.finish(())
        except Exception as e:  # noqa: BLE001
            error = e
        finally:  # whatever happens here (KeyboardInterrupt included), the job ends and the request comes back
            engine.release(request)
            done(None if error is None else engine.translate(error), shapes)
        return True


class NativeStarted(Launched):
    """A job running on a request of the ``_ovjobs`` extension, named by its ticket; its waiters end it, as
    ``Started``'s do. The extension's ``finish`` ends a run once, whichever thread asks first (the others are told
    False): no lock of npurt's per job."""

    __slots__ = ("engine", "native", "ticket", "done")

    def __init__(self, engine: RequestsEngine, native: Any, ticket: int, done: Done) -> None:
        self.engine, self.native, self.ticket = engine, native, ticket
        self.done: Done | None = done

    def wait(self, timeout_s: float | None) -> bool:
        finish, ticket = self.native.finish, self.ticket
        if timeout_s is None:
            while (ended := finish(ticket, WAIT_MS)) is None:
                pass
        elif (ended := finish(ticket, math.ceil(timeout_s * 1000))) is None:
            return False
        if ended is not False:  # finished by this call: end the job
            done, self.done = self.done, None  # the job refers to this: no cycle left through its done
            assert done is not None
            if ended == "":  # (a run that succeeded, static outputs: every job's path)
                done(None, None)
            else:
                self._end(done, ended)
        return True

    def _end(self, done: Done, ended: str | tuple[str, list[list[int]]]) -> None:
        """End the job of a run that failed, or whose outputs' shapes it decided: ``finish``'s answer."""
        engine = self.engine
        told: list[list[int]] = []
        if isinstance(ended, str):
            message = ended
        else:
            message, told = ended
        if message:
            done(engine.translate(RuntimeError(message)), None)
            return
        shapes: list[tuple[int, ...] | None] = [None] * len(engine.outputs)
        for (j, _), shape in zip(engine.dynamic_positions, told):
            shapes[j] = tuple(shape)
        done(None, shapes)

    def wait_any(self, others: Sequence[Launched], timeout_s: float) -> bool | None:
        """This run or any of ``others`` (runs of this engine's extension requests) waited for in C++."""
        native = self.native
        for o in others:
            if type(o) is not NativeStarted or o.native is not native:
                return None
        runs: list[NativeStarted] = [self, *others]  # type: ignore[list-item]  # (checked above)
        ticket = native.wait_any([r.ticket for r in runs], math.ceil(timeout_s * 1000))
        if ticket < 0:
            return False
        for r in runs:
            if r.ticket == ticket:
                r.wait(0)
                break
        return True
