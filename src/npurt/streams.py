"""Streams: independent sequences of runs through one runner, each with its own state (a microphone, a camera).

A model keeps state in one of two ways, and a stream carries both:
- carried pairs (option ``state_pairs``, e.g. silero-vad's ``{"state": "stateN"}``): an output fed back as the next
  run's input. The stream holds the pair in two runner-allocated tensors that take turns (the engine writes the next
  state while it reads the current one), so no state is copied on the host; the app passes only the other tensors.
- engine-kept variables (OpenVINO's ReadValue / Assign): the stream has an engine context of its own (an infer
  request of its own on OpenVINO) that keeps them.

A stream's runs happen one at a time, in the order they were submitted (``execute``, ``execute_async``, ``run``);
reading, writing, resetting and closing its state take their place in that line too, so a reset after an
``execute_async`` applies after that job. A run that fails leaves the state as it was. The state itself (the line,
the buffers, the contexts) is ``stream_state``'s; this module runs the model in streams, over the runner's core.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .arrays import ArrayRuns
from .core import RunnerCore
from .jobs import Job
from .status import StatusError
from .stream_state import StreamState, StreamTable
from .tensor import NpuTensor
from .types import NpuError, NpuTensorInfo, StatusCode


class Stream:
    """A handle to one stream of a runner (``Runner.open_stream``). Pass it as ``stream=`` to execute,
    execute_async and run; its methods are the runner's stream calls for it. Equal by runner and ``stream_id``;
    holding it keeps nothing alive but the runner's streams."""

    __slots__ = ("_runs", "stream_id")

    def __init__(self, runs: StreamRuns, stream_id: int) -> None:
        self._runs = runs
        self.stream_id = stream_id

    def reset(self) -> StatusCode:
        """``runner.reset_stream(self)``: back to the initial state, after the runs already submitted."""
        return self._runs.reset(self)

    def state(self) -> dict[str, np.ndarray]:
        """``runner.get_stream_state(self)``: a copy of the state, by name (ValueError once closed)."""
        return self._runs.get_state(self)

    def set_state(self, state: Mapping[str, np.ndarray]) -> StatusCode:
        """``runner.set_stream_state(self, state)``: restore a state as ``state()`` gave it (copied in)."""
        return self._runs.set_state(self, state)

    def share_state(self, state: Mapping[str, np.ndarray]) -> StatusCode:
        """The stream's carried state becomes these arrays themselves, not copies: runs read and write them in place
        (a decoder's cache as a row of a pooled buffer, ``npurt.generate.batch``). State kept in place only (option
        ``decoder``); the caller keeps the arrays, and keeps streams over overlapping memory from running at once; a
        reset, or a ``run`` on numpy feeds (it keeps the engine's arrays), drops them. INVALID_INPUT (the message in
        ``runner.last_error``) for names the stream does not carry, arrays of another dtype, rank or fixed dim, or not
        writeable and C-contiguous."""
        return self._runs.share_state(self, state)

    def close(self) -> StatusCode:
        """``runner.close_stream(self)``: close once the runs already submitted have ended, and free the state."""
        return self._runs.close_stream(self)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``runner.run(feeds, stream=self)``: one run in this stream on numpy arrays (raises like ``run``)."""
        return self._runs.run(self, feeds)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other._runs is self._runs and other.stream_id == self.stream_id

    def __hash__(self) -> int:
        return hash((id(self._runs), self.stream_id))

    def __repr__(self) -> str:
        return f"Stream({self.stream_id})"


StreamRef = Stream | int | None  # a stream handle, a stream id, or None: the default stream (0)


class StreamRuns:
    """Runs in streams, for the Runner: each takes its turn in its stream's line, with the stream's state."""

    def __init__(self, core: RunnerCore, arrays: ArrayRuns) -> None:
        self.core = core
        self.arrays = arrays
        self.table: StreamTable = core.streams
        table = self.table
        if table.pairs:
            self.stateful = True
        # (carried input, state shape) -> the pair's CPU-view (input, output) infos: derived once per shape
        self._infos: dict[tuple[str, tuple[int, ...]], tuple[NpuTensorInfo, NpuTensorInfo]] = {}
        # run()'s lists: where each carried input goes among the model's inputs (ascending), which output feeds it,
        # and the outputs the app gets
        in_names = [s.name for s in core.in_specs]
        out_names = [s.name for s in core.out_specs]
        self._carried_at = sorted((in_names.index(i), i) for i in table.pairs)
        self._carried_from = [(i, out_names.index(o)) for i, o in table.pairs.items()]
        self._app_outputs = [(n, k) for k, n in enumerate(out_names) if n not in set(table.pairs.values())]

    # Whether the model has state (carried pairs, or variables its engine keeps): then every run is a stream's, the
    # default stream's where none is given. An instance attribute once known (a plain read on every run: this is
    # every execute's path), found by __getattr__ until then.
    stateful: bool

    def __getattr__(self, name: str) -> bool:
        if name != "stateful":
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        default = self.core.variants.default
        if default is None:
            return False  # nothing compiled yet: asked again after the first compile
        self.stateful = bool(default.engine.state_names)
        return self.stateful

    # -- the handles -------------------------------------------------------------------------------------------
    def open(self) -> Stream:
        return Stream(self, self.table.open())

    def state_of(self, stream: StreamRef) -> StreamState:
        """A stream's state by handle or id (None: the default stream); ValueError when unknown or closed."""
        if stream is None:
            return self.table.get(0)
        if isinstance(stream, Stream):
            if stream._runs is not self:
                raise ValueError(f"{stream!r} is a stream of another runner")
            return self.table.get(stream.stream_id)
        if isinstance(stream, int) and not isinstance(stream, bool):
            return self.table.get(stream)
        raise ValueError(f"{stream!r} is not a Stream or a stream id")

    def _state_or_status(self, stream: StreamRef) -> StreamState:
        """state_of on the execution path: INVALID_INPUT (a StatusError) for an unknown or closed stream."""
        try:
            return self.state_of(stream)
        except ValueError as e:
            raise StatusError(StatusCode.INVALID_INPUT, str(e)) from None

    # -- runs -------------------------------------------------------------------------------------------------
    def execute(self, stream: StreamRef, inputs: Any, outputs: Any) -> tuple[StatusCode, str]:
        state = self._state_or_status(stream)
        try:
            with state.turn():
                return self._execute_in_turn(state, inputs, outputs)
        except NpuError as e:
            return StatusCode.FAILURE, str(e)

    def submit(self, stream: StreamRef, inputs: Any, outputs: Any, callback: Any) -> Job:
        """An execute_async on a stream: the job runs on a worker, in its place in the stream's line."""
        state = self._state_or_status(stream)
        self._full_lists(state, inputs, outputs, check_only=True)  # bad lists fail at submission, as elsewhere
        place: list[int] = []

        def work() -> tuple[StatusCode, str]:
            try:
                with state.turn(place[0]):
                    return self._execute_in_turn(state, inputs, outputs)
            except NpuError as e:
                return StatusCode.FAILURE, str(e)

        return self.core.jobs.submit(work, (), None, callback, on_accept=lambda: place.append(state.place()))

    def bound(self, stream: StreamRef, inputs: Any, outputs: Any) -> Callable[[], tuple[StatusCode, str]]:
        """A stream's run planned once (``Runner.bind``): its carried state must stay in the same buffers, as pairs
        kept in place do (ping-pong pairs change buffers every run); where a reset, set_state or run() gave the
        stream new buffers, the next run binds those. StatusError for what execute would refuse."""
        state = self._state_or_status(stream)
        if self.table.pairs and not self.table.in_place:
            raise StatusError(StatusCode.INVALID_INPUT, "a bound run cannot carry state that changes buffers every "
                                                        "run (option state_pairs): use execute")
        pairs = tuple(self.table.pairs)
        ins, outs = self._full_lists(state, inputs, outputs)
        plan = self.core.planner.plan([ins], [outs])
        held = [state.current.get(name) for name in pairs]  # the state buffers bound

        def run() -> tuple[StatusCode, str]:
            nonlocal ins, outs, plan, held
            try:
                with state.turn():
                    # a reset, set_stream_state or run() since gave the stream other buffers: bound to them anew
                    current = state.current
                    for name, buffers in zip(pairs, held):  # (a plain loop: this runs every decode step)
                        if current.get(name) is not buffers:
                            ins, outs = self._full_lists(state, inputs, outputs)
                            plan = self.core.planner.plan([ins], [outs])
                            held = [current.get(name) for name in pairs]
                            break
                    return self.core.execute_plan(plan, [ins], [outs], state)
            except StatusError as e:
                return e.status, str(e)
            except NpuError as e:
                return StatusCode.FAILURE, str(e)

        return run

    def _execute_in_turn(self, state: StreamState, inputs: Any, outputs: Any) -> tuple[StatusCode, str]:
        try:
            ins, outs = self._full_lists(state, inputs, outputs)
            plan = self.core.planner.plan([ins], [outs])
        except StatusError as e:
            return e.status, str(e)
        status, message = self.core.execute_plan(plan, [ins], [outs], state)
        if status is StatusCode.SUCCESS:
            for name in self.table.pairs:
                self.table.advance(state, name)
        return status, message

    def _full_lists(self, state: StreamState, inputs: Any, outputs: Any, check_only: bool = False
                    ) -> tuple[list[NpuTensor], list[NpuTensor]]:
        """The app's tensors of one run plus the stream's carried state (the current one in, the next one out)."""
        for what, lists, status in (("inputs", inputs, StatusCode.INVALID_INPUT),
                                    ("outputs", outputs, StatusCode.INVALID_OUTPUT)):
            if not isinstance(lists, (list, tuple)) or len(lists) != 1 or not isinstance(lists[0], (list, tuple)):
                raise StatusError(status, f"{what}: a stream's run takes one batch slot, a list holding one list of "
                                          "NpuTensor")
        ins, outs = list(inputs[0]), list(outputs[0])
        carried = set(self.table.pairs) | set(self.table.pairs.values())
        for t in (*ins, *outs):
            if isinstance(t, NpuTensor) and t.info.name in carried:
                raise StatusError(StatusCode.INVALID_INPUT, f"tensor {t.info.name!r} is state the stream carries "
                                                            "(option state_pairs): leave it out")
        if check_only or not self.table.pairs:
            return ins, outs
        shapes = {t.info.name: t.info.shape for t in ins if isinstance(t, NpuTensor)}
        for in_name, out_name in self.table.pairs.items():
            in_info, out_info = self._state_infos(state, in_name, out_name, shapes)
            current, spare = self.table.carried(state, in_info, out_info)
            ins.append(current)
            outs.append(spare)
        return ins, outs

    def _state_infos(self, state: StreamState, in_name: str, out_name: str,
                     shapes: Mapping[str, tuple[int, ...]]) -> tuple[NpuTensorInfo, NpuTensorInfo]:
        """The CPU-view infos of a carried pair, with the stream's state shape."""
        shape = self._state_shape(state, in_name, shapes)
        infos = self._infos.get((in_name, shape))
        if infos is None:
            core = self.core
            infos = (core.port(in_name).cpu.replace(shape=shape), core.port(out_name).cpu.replace(shape=shape))
            if len(self._infos) >= 64:
                self._infos.clear()
            self._infos[(in_name, shape)] = infos
        return infos

    def _state_shape(self, state: StreamState, in_name: str, shapes: Mapping[str, tuple[int, ...]]
                     ) -> tuple[int, ...]:
        """The current state's shape, else the model's, its open dims taken from the app's inputs by dim name
        (silero-vad's ``batch``), else 1."""
        current = state.current.get(in_name)
        if current is not None:
            return current.shape if isinstance(current, np.ndarray) else current[0].info.shape
        in_specs = self.core.in_specs
        spec = next(s for s in in_specs if s.name == in_name)
        names = spec.dim_names or (None,) * len(spec.shape)
        dims = []
        for d, dim_name in zip(spec.shape, names):
            if d is None:
                d = next((shapes[s.name][k] for s in in_specs if s.name in shapes and s.dim_names
                          for k, n in enumerate(s.dim_names) if dim_name and n == dim_name
                          and k < len(shapes[s.name])), 1)
            dims.append(d)
        return tuple(dims)

    def run(self, stream: StreamRef, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Runner.run on a stream: the carried state goes in from the stream, and the engine's new state array stays
        there as it is (no copy, no wrapping: the next run() passes it straight back). Lean: a stream's run() is
        one chunk of audio, about 100 us of engine time. Raises like Runner.run (NpuError once closed)."""
        if self.core.closed:
            raise NpuError(f"runner for {self.core.model_name} is closed")
        state = self.state_of(stream)
        arrays = self.arrays.feeds(feeds)  # the app's inputs, in the model's order without the carried ones
        with state.turn():
            current = state.current
            for position, in_name in self._carried_at:
                value = current.get(in_name)
                if not isinstance(value, np.ndarray):
                    value = value[0].numpy() if value is not None else self._first_state(state, in_name, arrays)
                arrays.insert(position, value)
            results = self.arrays.run(arrays, state)
            for in_name, k in self._carried_from:
                current[in_name] = results[k]
        return {name: results[k] for name, k in self._app_outputs}

    def _first_state(self, state: StreamState, in_name: str, app_arrays: list[np.ndarray]) -> np.ndarray:
        """A new stream's state: zeros, of the shape its inputs imply."""
        shape = self._state_shape(state, in_name, dict(zip(self.core.input_names, (a.shape for a in app_arrays))))
        return np.zeros(shape, self.core.port(in_name).cpu.numpy_dtype)

    # -- the state ---------------------------------------------------------------------------------------------
    def get_state(self, stream: StreamRef) -> dict[str, np.ndarray]:
        """A copy of a stream's state (raises: ValueError for an unknown or closed stream, NpuError once the runner
        is closed)."""
        if self.core.closed:
            raise NpuError(f"runner for {self.core.model_name} is closed")
        state = self.state_of(stream)
        with state.turn():
            result = {name: (t if isinstance(t, np.ndarray) else t[0].numpy()).copy()
                      for name, t in state.current.items()}
            for in_name in self.table.pairs:
                if in_name not in result:  # never run: the initial state
                    in_info, _ = self._state_infos(state, in_name, self.table.pairs[in_name], {})
                    result[in_name] = np.zeros(in_info.shape, in_info.numpy_dtype)
            for engine, context in self._contexts(state):
                result.update(engine.get_state(context))
            return result

    def reset(self, stream: StreamRef) -> StatusCode:
        return self._status_op(stream, self._reset)

    def set_state(self, stream: StreamRef, values: Mapping[str, np.ndarray]) -> StatusCode:
        return self._status_op(stream, lambda state: self._set_state(state, values))

    def share_state(self, stream: StreamRef, arrays: Mapping[str, np.ndarray]) -> StatusCode:
        return self._status_op(stream, lambda state: self._share_state(state, arrays))

    def close_stream(self, stream: StreamRef) -> StatusCode:
        if stream is None or stream == 0:
            return self.core.fail(StatusCode.INVALID_INPUT, "the default stream (0) cannot be closed")
        return self._status_op(stream, self.close)

    def _status_op(self, stream: StreamRef, op: Callable[[StreamState], None]) -> StatusCode:
        """A state operation in the contract's form: a StatusCode, its message in last_error, never raising."""
        core = self.core
        try:
            core.check_open()
            op(self._state_or_status(stream))
        except StatusError as e:
            return core.fail(e.status, str(e))
        except (ValueError, NpuError) as e:
            return core.fail(StatusCode.INVALID_INPUT, str(e))
        return core.fail(StatusCode.SUCCESS, "")

    def _set_state(self, state: StreamState, values: Mapping[str, np.ndarray]) -> None:
        with state.turn():
            variables = set()
            contexts = self._contexts(state)
            for engine, _ in contexts:
                variables |= set(engine.state_names)
            unknown = sorted(set(values) - set(self.table.pairs) - variables)
            if unknown:
                raise ValueError(f"set_stream_state: {unknown} is not state this stream carries (it carries "
                                 f"{sorted(set(self.table.pairs) | variables)})")
            for in_name, out_name in self.table.pairs.items():
                if in_name not in values:
                    continue
                a = np.asarray(values[in_name])
                in_info, out_info = self._state_infos(state, in_name, out_name, {})
                if a.dtype != in_info.numpy_dtype or len(a.shape) != len(in_info.shape):
                    raise ValueError(f"set_stream_state: {in_name!r} takes {in_info.numpy_dtype} of rank "
                                     f"{len(in_info.shape)}, got {a.dtype} {list(a.shape)}")
                buffers = state.current[in_name] = self.table.buffer(in_info.replace(shape=a.shape), out_info)
                buffers[0].numpy()[...] = a
                self.core.stats.copy(buffers[0].nbytes)
            for engine, context in contexts:
                mine = {k: v for k, v in values.items() if k in engine.state_names}
                if mine:
                    engine.set_state(context, mine)

    def _share_state(self, state: StreamState, arrays: Mapping[str, np.ndarray]) -> None:
        """The stream's carried state becomes ``arrays`` themselves, not copies (state kept in place only: each
        run reads and writes them where they are)."""
        if not self.table.in_place:
            raise ValueError("Stream.share_state: this runner's state changes buffers every run (option "
                             "state_pairs); only state kept in place (a decoder's cache) can be shared")
        unknown = sorted(set(arrays) - set(self.table.pairs))
        if unknown:
            raise ValueError(f"Stream.share_state: {unknown} is not state this stream carries (it carries "
                             f"{sorted(self.table.pairs)})")
        wrapped = {}
        for in_name, a in arrays.items():
            in_info, out_info = self._state_infos(state, in_name, self.table.pairs[in_name], {})
            if (not isinstance(a, np.ndarray) or a.dtype != in_info.numpy_dtype or a.ndim != len(in_info.shape)
                    or not a.flags.c_contiguous or not a.flags.writeable):
                raise ValueError(f"Stream.share_state: {in_name!r} takes a writeable C-contiguous {in_info.numpy_dtype}"
                                 f" array of rank {len(in_info.shape)}, got {getattr(a, 'dtype', type(a).__name__)} "
                                 f"{list(getattr(a, 'shape', ()))}")
            fixed = next(spec.shape for spec in self.core.in_specs if spec.name == in_name)
            if any(d is not None and d != got for d, got in zip(fixed, a.shape)):
                raise ValueError(f"Stream.share_state: {in_name!r} is {list(a.shape)}; the model fixes it at "
                                 f"{[d if d is not None else '?' for d in fixed]}")
            wrapped[in_name] = (NpuTensor(in_info.replace(shape=a.shape), a),
                                NpuTensor(out_info.replace(shape=a.shape), a))
        with state.turn():
            state.current.update(wrapped)

    def _reset(self, state: StreamState) -> None:
        with state.turn():
            state.current.clear()  # the next run starts from zeros, as a new stream's does
            for engine, context in self._contexts(state):
                engine.reset_state(context)

    def close(self, state: StreamState | None = None) -> None:
        """Close one stream after its submitted runs (or, with no stream, every stream: the runner closes)."""
        if state is None:
            for s in self.table.close_all():
                self._close_contexts(s)
            return
        with state.turn():
            self.table.forget(state)
            self._close_contexts(state)
        state.wake_all()

    def _contexts(self, state: StreamState) -> list[tuple[Any, Any]]:
        """The stream's contexts, opening the default engine's (its variables exist before any run)."""
        default = self.core.variants.default
        if default is not None and default.engine.state_names:
            state.context(default.engine)
        return list(state.contexts.values())

    @staticmethod
    def _close_contexts(state: StreamState) -> None:
        for engine, context in state.contexts.values():
            engine.close_context(context)
        state.contexts.clear()
