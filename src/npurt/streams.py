"""Streams: independent sequences of runs through one runner, each with its own state (a microphone, a camera).

A model keeps state in one of two ways, and a stream carries both:
- carried pairs (option ``state_pairs``, e.g. silero-vad's ``{"state": "stateN"}``): an output fed back as the next
  run's input. The stream holds the pair in two runner-allocated tensors that take turns (the engine writes the next
  state while it reads the current one), so no state is copied on the host; the app passes only the other tensors.
- engine-kept variables (OpenVINO's ReadValue / Assign): the stream has an engine context of its own (an infer
  request of its own on OpenVINO) that keeps them.

A stream's runs happen one at a time, in the order they were submitted (``execute``, ``execute_async``, ``run``);
reading, writing, resetting and closing its state take their place in that line too, so a reset after an
``execute_async`` applies after that job. A run that fails leaves the state as it was.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .status import StatusError
from .tensor import NpuTensor, sub_tensor
from .types import NpuError, NpuTensorInfo, StatusCode

if TYPE_CHECKING:
    from .runner import Runner


class Stream:
    """A handle to one stream of a runner (``Runner.open_stream``). Pass it as ``stream=`` to execute,
    execute_async and run; its methods are the runner's stream calls for it. Equal by runner and ``stream_id``;
    holding it keeps nothing alive but the runner."""

    __slots__ = ("runner", "stream_id")

    def __init__(self, runner: Runner, stream_id: int) -> None:
        self.runner = runner
        self.stream_id = stream_id

    def reset(self) -> StatusCode:
        """``runner.reset_stream(self)``: back to the initial state, after the runs already submitted."""
        return self.runner.reset_stream(self)

    def state(self) -> dict[str, np.ndarray]:
        """``runner.get_stream_state(self)``: a copy of the state, by name (ValueError once closed)."""
        return self.runner.get_stream_state(self)

    def set_state(self, state: Mapping[str, np.ndarray]) -> StatusCode:
        """``runner.set_stream_state(self, state)``: restore a state as ``state()`` gave it (copied in)."""
        return self.runner.set_stream_state(self, state)

    def close(self) -> StatusCode:
        """``runner.close_stream(self)``: close once the runs already submitted have ended, and free the state."""
        return self.runner.close_stream(self)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``runner.run(feeds, stream=self)``: one run in this stream on numpy arrays (raises like ``run``)."""
        return self.runner.run(feeds, stream=self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other.runner is self.runner and other.stream_id == self.stream_id

    def __hash__(self) -> int:
        return hash((id(self.runner), self.stream_id))

    def __repr__(self) -> str:
        return f"Stream({self.stream_id})"


class StreamState:
    """One stream's state and its line of turns."""

    def __init__(self, stream_id: int) -> None:
        self.stream_id = stream_id
        self.closed = False
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._next = 0  # the next place in line
        self._serving = 0  # the place whose turn it is
        self._waiting = 0  # threads waiting for their turn (no notify is needed without them)
        # carried input name -> the state the next run reads: a buffer seen as (input, output) tensors, or the
        # plain array a run() got from the engine (wrapped only if an execute() comes next); and the buffer an
        # execute() writes the next state to
        self.current: dict[str, tuple[NpuTensor, NpuTensor] | np.ndarray] = {}
        self.spare: dict[str, tuple[NpuTensor, NpuTensor]] = {}
        self.contexts: dict[int, Any] = {}  # id(engine) -> (engine, its context for this stream)

    def place(self) -> int:
        """A place in line (take it in the order the runs are queued)."""
        with self._lock:
            place = self._next
            self._next += 1
            return place

    def turn(self, place: int | None = None) -> _Turn:
        """``with state.turn(place):`` waits for ``place``'s turn (None: a place taken now, at the end of the line);
        the next place's turn comes when the block ends. NpuError if the stream closed."""
        return _Turn(self, place)

    def wake_all(self) -> None:
        with self._lock:
            self.closed = True
            self._cond.notify_all()


class _Turn:
    """One place's turn in a stream's line (a class, not a generator: a stream's run() takes one per chunk)."""

    __slots__ = ("state", "place")

    def __init__(self, state: StreamState, place: int | None) -> None:
        self.state = state
        self.place = place

    def __enter__(self) -> None:
        state = self.state
        with state._lock:
            place = self.place
            if place is None:
                place = self.place = state._next
                state._next += 1
            if state._serving != place and not state.closed:
                state._waiting += 1
                while state._serving != place and not state.closed:
                    state._cond.wait()
                state._waiting -= 1
            if state._serving == place:
                return
        self._leave()  # closed while waiting: the places behind this one must not wait for it
        raise NpuError(f"stream {state.stream_id} was closed")

    def __exit__(self, *exc: object) -> None:
        self._leave()

    def _leave(self) -> None:
        state = self.state
        with state._lock:
            if state._serving == self.place:
                state._serving += 1
            if state._waiting:
                state._cond.notify_all()


class StreamTable:
    """The streams of one runner: stream 0 is the default one (runs given no stream), the others are opened."""

    def __init__(self, pairs: Mapping[str, str], allocate: Callable[[NpuTensorInfo], NpuTensor]) -> None:
        self.pairs = dict(pairs)  # carried input -> the output it is fed from
        self._allocate = allocate
        self._lock = threading.Lock()
        self._streams: dict[int, StreamState] = {0: StreamState(0)}
        self._next_id = 1

    def open(self) -> int:
        with self._lock:
            stream_id = self._next_id
            self._next_id += 1
            self._streams[stream_id] = StreamState(stream_id)
            return stream_id

    def get(self, stream: Stream | int | None) -> StreamState:
        """The state of a stream handle (None: the default stream); StatusError-free: ValueError when unknown."""
        if stream is None:
            stream_id = 0
        elif isinstance(stream, Stream):
            stream_id = stream.stream_id
        elif isinstance(stream, int) and not isinstance(stream, bool):
            stream_id = stream
        else:
            raise ValueError(f"{stream!r} is not a Stream or a stream id")
        state = self._streams.get(stream_id)
        if state is None or state.closed:
            raise ValueError(f"stream {stream_id} is unknown to this runner or was closed")
        return state

    def forget(self, state: StreamState) -> None:
        with self._lock:
            self._streams.pop(state.stream_id, None)

    def close_all(self) -> list[StreamState]:
        with self._lock:
            streams = list(self._streams.values())
            self._streams.clear()
        for s in streams:
            s.wake_all()
        return streams

    # -- carried pairs ----------------------------------------------------------------------------------------
    # A carried pair's state lives in two buffers that take turns; each is seen as two NpuTensors over the same
    # memory, one named as the carried input (when a run reads it) and one as its output (when a run writes it).
    def carried(self, state: StreamState, in_info: NpuTensorInfo, out_info: NpuTensorInfo) -> tuple[NpuTensor,
                                                                                                     NpuTensor]:
        """The tensors a run reads the state from and writes the next state to, for one pair (made on first use;
        the first state is zeros)."""
        name = in_info.name
        current = state.current.get(name)
        if isinstance(current, np.ndarray):  # run()'s array: wrapped, not copied
            current = state.current[name] = (NpuTensor(in_info, current), NpuTensor(out_info, current))
        elif current is None or current[0].info.shape != in_info.shape:
            current = state.current[name] = self._buffer(in_info, out_info)
            current[0].numpy()[...] = 0
        spare = state.spare.get(name)
        if spare is None or spare[0].info.shape != in_info.shape:
            spare = state.spare[name] = self._buffer(in_info, out_info)
        return current[0], spare[1]

    def _buffer(self, in_info: NpuTensorInfo, out_info: NpuTensorInfo) -> tuple[NpuTensor, NpuTensor]:
        t = self._allocate(in_info)
        return t, sub_tensor(t, out_info.replace(shape=in_info.shape), 0)

    @staticmethod
    def advance(state: StreamState, name: str) -> None:
        """After an execute() that succeeded: the state it wrote is the one the next run reads."""
        current = state.current[name]
        assert not isinstance(current, np.ndarray)
        state.current[name], state.spare[name] = state.spare[name], current


class StreamRuns:
    """Runs in streams, for the Runner: each takes its turn in its stream's line, with the stream's state."""

    def __init__(self, runner: Runner, table: StreamTable) -> None:
        self.runner = runner
        self.table = table
        self._stateful: bool | None = True if table.pairs else None
        # (carried input, state shape) -> the pair's CPU-view (input, output) infos: derived once per shape
        self._infos: dict[tuple[str, tuple[int, ...]], tuple[NpuTensorInfo, NpuTensorInfo]] = {}
        # run()'s lists: where each carried input goes among the model's inputs (ascending), which output feeds it,
        # and the outputs the app gets
        in_names = [s.name for s in runner._in_specs]
        out_names = [s.name for s in runner._out_specs]
        self._carried_at = sorted((in_names.index(i), i) for i in table.pairs)
        self._carried_from = [(i, out_names.index(o)) for i, o in table.pairs.items()]
        self._app_outputs = [(n, k) for k, n in enumerate(out_names) if n not in set(table.pairs.values())]

    @property
    def stateful(self) -> bool:
        """Whether the model has state (carried pairs, or variables its engine keeps): then every run is a stream's,
        the default stream's where none is given."""
        if self._stateful is None:
            default = self.runner._variants.default if self.runner._variants is not None else None
            if default is None:
                return False  # nothing compiled yet: asked again after the first compile
            self._stateful = bool(default.engine.state_names)
        return self._stateful

    def context(self, state: StreamState, engine: Any) -> Any:
        """The stream's context on an engine (where the engine has one: OpenVINO's is an infer request of the
        stream's own, which keeps its variables and lets streams run side by side as one request each would)."""
        entry = state.contexts.get(id(engine))
        if entry is None or entry[0] is not engine:  # (an id the LRU's dropped engine had)
            entry = state.contexts[id(engine)] = (engine, engine.open_context())
        return entry[1]

    # -- runs -------------------------------------------------------------------------------------------------
    def execute(self, stream: Stream | int | None, inputs: Any, outputs: Any) -> tuple[StatusCode, str]:
        state = self.runner._stream_state(stream)
        try:
            with state.turn():
                return self._execute_in_turn(state, inputs, outputs)
        except NpuError as e:
            return StatusCode.FAILURE, str(e)

    def submit(self, stream: Stream | int | None, inputs: Any, outputs: Any, callback: Any) -> Any:
        """An execute_async on a stream: the job runs on a worker, in its place in the stream's line."""
        state = self.runner._stream_state(stream)
        self._full_lists(state, inputs, outputs, check_only=True)  # bad lists fail at submission, as elsewhere
        place: list[int] = []

        def work() -> tuple[StatusCode, str]:
            try:
                with state.turn(place[0]):
                    return self._execute_in_turn(state, inputs, outputs)
            except NpuError as e:
                return StatusCode.FAILURE, str(e)

        return self.runner._jobs.submit(work, None, callback, on_accept=lambda: place.append(state.place()))

    def _execute_in_turn(self, state: StreamState, inputs: Any, outputs: Any) -> tuple[StatusCode, str]:
        try:
            ins, outs = self._full_lists(state, inputs, outputs)
            plan = self.runner._planner.plan([ins], [outs])
        except StatusError as e:
            return e.status, str(e)
        status, message = self.runner._execute_plan(plan, [ins], [outs], state)
        if status is StatusCode.SUCCESS:
            for name in self.table.pairs:
                StreamTable.advance(state, name)
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
            runner = self.runner
            infos = (runner._port(in_name).cpu.replace(shape=shape),
                     runner._port(out_name).cpu.replace(shape=shape))
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
        runner = self.runner
        spec = next(s for s in runner._in_specs if s.name == in_name)
        names = spec.dim_names or (None,) * len(spec.shape)
        dims = []
        for d, dim_name in zip(spec.shape, names):
            if d is None:
                d = next((shapes[s.name][k] for s in runner._in_specs if s.name in shapes and s.dim_names
                          for k, n in enumerate(s.dim_names) if dim_name and n == dim_name
                          and k < len(shapes[s.name])), 1)
            dims.append(d)
        return tuple(dims)

    def run(self, stream: Stream | int | None, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Runner.run on a stream: the carried state goes in from the stream, and the engine's new state array stays
        there as it is (no copy, no wrapping: the next run() passes it straight back). Lean: a stream's run() is
        one chunk of audio, about 100 us of engine time."""
        runner = self.runner
        state = runner._streams.get(stream)
        arrays = runner._arrays.feeds(feeds)  # the app's inputs, in the model's order without the carried ones
        with state.turn():
            current = state.current
            for position, in_name in self._carried_at:
                value = current.get(in_name)
                if not isinstance(value, np.ndarray):
                    value = value[0].numpy() if value is not None else self._first_state(state, in_name, arrays)
                arrays.insert(position, value)
            results = runner._arrays.run(arrays, state)
            for in_name, k in self._carried_from:
                current[in_name] = results[k]
        return {name: results[k] for name, k in self._app_outputs}

    def _first_state(self, state: StreamState, in_name: str, app_arrays: list[np.ndarray]) -> np.ndarray:
        """A new stream's state: zeros, of the shape its inputs imply."""
        shape = self._state_shape(state, in_name, dict(zip(self.runner._input_names, (a.shape for a in app_arrays))))
        return np.zeros(shape, self.runner._port(in_name).cpu.numpy_dtype)

    # -- the state ---------------------------------------------------------------------------------------------
    def get_state(self, state: StreamState) -> dict[str, np.ndarray]:
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

    def set_state(self, state: StreamState, values: Mapping[str, np.ndarray]) -> None:
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
                buffers = state.current[in_name] = self.table._buffer(in_info.replace(shape=a.shape), out_info)
                buffers[0].numpy()[...] = a
                self.runner._stats.copy(buffers[0].nbytes)
            for engine, context in contexts:
                mine = {k: v for k, v in values.items() if k in engine.state_names}
                if mine:
                    engine.set_state(context, mine)

    def reset(self, state: StreamState) -> None:
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
        default = self.runner._variants.default if self.runner._variants is not None else None
        if default is not None and default.engine.state_names:
            self.context(state, default.engine)
        return list(state.contexts.values())

    @staticmethod
    def _close_contexts(state: StreamState) -> None:
        for engine, context in state.contexts.values():
            engine.close_context(context)
        state.contexts.clear()
