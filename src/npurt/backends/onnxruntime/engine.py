"""The ONNX Runtime engine: one session's runs through IOBinding, the same for every execution provider.

Tensors are bound by address (zero copy). An output whose shape only the run tells is bound in place with the
shape of the caller's tensor; where a run produces another shape, ONNX Runtime refuses it before writing, and the
output is then produced in ONNX Runtime's memory and copied into the caller's tensor (counted).

Speed: the runs call the C++ session and binding objects (``InferenceSession._sess``, ``IOBinding._iobinding``,
``OrtDevice._get_c_device``) to skip the Python wrappers' per-call checks, which the runner has made already. These
are ONNX Runtime's private names: tests/test_engine_privates.py fails, naming the version, where one is gone.
"""

from __future__ import annotations

import ctypes
import functools
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnxruntime as ort

from ...engine import BindingsByAddress, Engine, OutputTooSmallError, ResultShapes
from ...ports import DATA_TYPES_ONNX, Port
from ...tensor import NpuTensor
from ...types import DataType, NpuError

BFLOAT16 = DATA_TYPES_ONNX[DataType.BF16]  # ONNX Runtime's element type of a BF16 port

Placed = tuple[tuple[int, ...], int]  # a tensor as bound: (shape, address)


class _Refused:
    """What ``OrtEngine._run`` returns when ONNX Runtime refused a run because an output bound in place has
    another shape (nothing was written; the run is made again with that output in ONNX Runtime's memory)."""


_REFUSED = _Refused()


class _Binding:
    """An IOBinding of a set of tensors (by address), and where outputs produced by ONNX Runtime must go."""

    __slots__ = ("io", "c_io", "lock", "copies", "guessed", "plain", "inputs", "outputs")

    def __init__(self, io: Any, copies: list[tuple[int, int, int]], guessed: list[tuple[int, tuple[int, ...]]],
                 inputs: list[Placed], outputs: list[Placed]) -> None:
        self.lock = threading.Lock()  # an IOBinding serves one run at a time
        self.inputs, self.outputs = inputs, outputs  # (shape, address) per port, to bind again
        self.set(io, copies, guessed)

    def set(self, io: Any, copies: list[tuple[int, int, int]], guessed: list[tuple[int, tuple[int, ...]]]) -> None:
        self.io = io
        self.c_io = io._iobinding  # the C++ binding: no per-call Python checks
        self.copies = copies  # (output index, address, capacity) of outputs ONNX Runtime writes into its own memory
        self.guessed = guessed  # (output index, shape) of open-shaped outputs bound in place with the tensor's shape
        self.plain = not copies and not guessed  # a run is one call, and tells no shapes


class OrtEngine(Engine):
    """One ONNX Runtime session (shared by the variants it serves) and the ports of one variant.

    An output whose shape the run decides is bound in place with the shape of the caller's tensor (a carried state,
    an output allocated for the shape the app expects): ONNX Runtime writes it there when the run produces that
    shape. When a run produces another shape ONNX Runtime refuses the run before writing; the engine then runs
    again with that output in ONNX Runtime's own memory, copies the result out (counted), and binds such outputs
    that way from then on.
    """

    def __init__(self, session: ort.InferenceSession, inputs: list[Port], outputs: list[Port], count_copy: Any,
                 pinned_outputs: Callable[[], list[Port]] | None = None) -> None:
        self.session = session
        self.inputs = inputs
        self._outputs = outputs  # as the session tells them; ``pinned_outputs`` decides the rest on first use
        self._pinned_outputs = pinned_outputs
        self._pinned_lock = threading.Lock()
        self.count_copy = count_copy
        self.in_types = [(p.name, DATA_TYPES_ONNX[p.engine.data_type]) for p in inputs]
        self.out_types = [(p.name, DATA_TYPES_ONNX[p.engine.data_type]) for p in outputs]
        self.out_names = [p.name for p in outputs]
        self.bfloat16 = any(t == BFLOAT16 for _, t in (*self.in_types, *self.out_types))  # see _run_bfloat16
        self.in_place = [True] * len(outputs)  # whether an open-shaped output is still bound in place
        self.bindings_made = 0  # for tests and diagnostics
        self._by_address: BindingsByAddress[_Binding] = BindingsByAddress()

    # made on first use (a binding; a run with a guessed output shape), not at load (~20 us of a warm load)
    @functools.cached_property
    def cpu(self) -> ort.OrtDevice:
        return ort.OrtDevice.make("cpu", 0)

    @functools.cached_property
    def quiet(self) -> ort.RunOptions:
        options = ort.RunOptions()
        options.log_severity_level = 4  # a refused guess is no error worth a log line: it is run again
        return options

    @property
    def outputs(self) -> list[Port]:
        """The output ports; with pinned inputs, their dims as the graph decides them (read once, here)."""
        if self._pinned_outputs is None:
            return self._outputs
        with self._pinned_lock:
            decide = self._pinned_outputs
            if decide is not None:
                self._outputs = decide()
                self._pinned_outputs = None
        return self._outputs

    @outputs.setter
    def outputs(self, ports: list[Port]) -> None:
        with self._pinned_lock:
            self._outputs, self._pinned_outputs = ports, None

    @property
    def known_outputs(self) -> list[Port]:
        return self._outputs

    def _io(self, inputs: Sequence[Placed], outputs: Sequence[Placed]) -> _Binding:
        io = self.session.io_binding()
        c_io, device = io._iobinding, self.cpu._get_c_device()  # the C++ binding: no per-call Python checks
        for (name, etype), (shape, address) in zip(self.in_types, inputs):
            c_io.bind_input(name, device, etype, list(shape), address)
        copies, guessed = [], []
        for j, ((name, etype), port, (shape, address)) in enumerate(zip(self.out_types, self.outputs, outputs)):
            if port.is_static or self.in_place[j]:
                c_io.bind_output(name, device, etype, list(shape), address)
                if not port.is_static:
                    guessed.append((j, shape))
            else:  # ONNX Runtime allocates, and the result is copied out
                io.bind_output(name, "cpu")
                copies.append((j, address, int(np.prod(shape)) * np.dtype(port.engine.numpy_dtype).itemsize))
        self.bindings_made += 1
        return _Binding(io, copies, guessed, list(inputs), list(outputs))

    def bind(self, inputs: Sequence[NpuTensor], outputs: Sequence[NpuTensor]) -> _Binding:
        # By address: new tensor objects over memory bound before (an app's reused buffers, or new arrays that the
        # allocator placed where the last ones were) reuse that IOBinding, which ONNX Runtime runs ~30 us faster
        # for silero-vad than a new one. Safe: a binding holds addresses only, never memory, and it is used only
        # for a call whose own tensors are at those addresses with those shapes.
        placed_in = [(t.info.shape, t.get_virtual_address()) for t in inputs]
        placed_out = [(t.info.shape, t.get_virtual_address()) for t in outputs]
        key = (*placed_in, *placed_out)
        binding = self._by_address.get(key)
        if binding is None:
            binding = self._io(placed_in, placed_out)
            self._by_address.keep(key, binding)
        return binding

    def run(self, binding: _Binding, context: Any = None) -> ResultShapes:
        session = self.session
        if session is None:
            raise NpuError("the runner is closed")
        lock = binding.lock
        if not lock.acquire(False):  # the same tensors on two threads at once: a binding of its own
            return self._run_or_rebind(session, self._io(binding.inputs, binding.outputs))
        try:
            if binding.plain:  # (most runs: every output bound in place with its shape known)
                session._sess.run_with_iobinding(binding.c_io, None)  # releases the GIL
                return None
            return self._run_or_rebind(session, binding)
        finally:
            lock.release()

    def _run_or_rebind(self, session: ort.InferenceSession, binding: _Binding) -> ResultShapes:
        """A run; where ONNX Runtime refused an output bound in place, the binding without it, and the run again."""
        result = self._run(session, binding)
        if isinstance(result, _Refused):
            fresh = self._io(binding.inputs, binding.outputs)
            binding.set(fresh.io, fresh.copies, fresh.guessed)
            result = self._run(session, binding)
            if isinstance(result, _Refused):  # cannot be: the refused outputs are no longer bound in place
                raise NpuError("ONNX Runtime refused a run whose outputs are not bound in place")
        return result

    def _run(self, session: ort.InferenceSession, binding: _Binding) -> ResultShapes | _Refused:
        if binding.guessed:
            try:
                session._sess.run_with_iobinding(binding.c_io, self.quiet)  # releases the GIL
            except Exception:  # noqa: BLE001 - the run produced other shapes than guessed (or failed: it says so)
                for j, _ in binding.guessed:
                    self.in_place[j] = False
                return _REFUSED
        else:
            session._sess.run_with_iobinding(binding.c_io, None)  # releases the GIL
        if binding.plain:
            return None
        shapes: list[tuple[int, ...] | None] = [None] * len(self.outputs)
        for j, shape in binding.guessed:
            shapes[j] = tuple(shape)
        if binding.copies:
            values = binding.io.get_outputs()
            for j, address, capacity in binding.copies:
                value = values[j]
                shape = tuple(value.shape())
                nbytes = int(np.prod(shape)) * np.dtype(self.outputs[j].engine.numpy_dtype).itemsize
                if nbytes > capacity:
                    raise OutputTooSmallError(self.outputs[j].name, shape, nbytes, capacity)
                if nbytes:
                    ctypes.memmove(address, value.data_ptr(), nbytes)
                    self.count_copy(nbytes)
                shapes[j] = shape
        return shapes

    def run_arrays(self, arrays: Sequence[np.ndarray], context: Any = None) -> list[np.ndarray]:
        session = self.session
        if session is None:
            raise NpuError("the runner is closed")
        # the C++ session's run: InferenceSession.run's Python checks (input names, OrtValue ownership) are the
        # runner's own already
        if self.bfloat16:
            return self._run_bfloat16(arrays)
        feeds = {name: a for (name, _), a in zip(self.in_types, arrays)}
        results: list[np.ndarray] = session._sess.run(self.out_names, feeds, None)
        return results

    def _run_bfloat16(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """run_arrays where a port is BF16 (numpy holds its bits as uint16, which ONNX Runtime takes as UINT16):
        the arrays go in as OrtValues of the ports' own types over their memory; a BF16 output's bits are copied
        out of ONNX Runtime's memory (counted: numpy cannot view an OrtValue of a type it lacks)."""
        session = self.session
        assert session is not None
        feeds = {name: ort.OrtValue.ortvalue_from_numpy_with_onnx_type(a, etype)
                 for (name, etype), a in zip(self.in_types, arrays)}
        values = session.run_with_ort_values(self.out_names, feeds)
        results = []
        for (_, etype), value in zip(self.out_types, values):
            if etype != BFLOAT16:
                results.append(value.numpy())
                continue
            shape = tuple(value.shape())
            count = math.prod(shape)
            bits = np.ctypeslib.as_array(ctypes.cast(value.data_ptr(), ctypes.POINTER(ctypes.c_uint16)),
                                         (count,)) if count else np.empty(0, np.uint16)
            results.append(bits.reshape(shape).copy())
            self.count_copy(count * 2)
        return results

    def close(self) -> None:
        self.session = None
