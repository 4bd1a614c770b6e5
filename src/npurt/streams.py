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
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
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
        self._cond = threading.Condition()
        self._next = 0  # the next place in line
        self._serving = 0  # the place whose turn it is
        # carried input name -> the buffer the next run reads (as input, as output), and the one it writes
        self.current: dict[str, tuple[NpuTensor, NpuTensor]] = {}
        self.spare: dict[str, tuple[NpuTensor, NpuTensor]] = {}
        self.contexts: dict[int, Any] = {}  # id(engine) -> (engine, its context for this stream)

    def place(self) -> int:
        """A place in line (take it in the order the runs are queued)."""
        with self._cond:
            place = self._next
            self._next += 1
            return place

    @contextmanager
    def turn(self, place: int) -> Iterator[None]:
        """Wait for ``place``'s turn; the next place's turn comes when the block ends. NpuError if the stream closed."""
        with self._cond:
            while self._serving != place and not self.closed:
                self._cond.wait()
            closed = self.closed and self._serving != place
        try:
            if closed:
                raise NpuError(f"stream {self.stream_id} was closed")
            yield
        finally:
            with self._cond:
                if self._serving == place:
                    self._serving += 1
                self._cond.notify_all()

    def wake_all(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()


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
        if current is None or current[0].info.shape != in_info.shape:
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
        """After a run that succeeded: the state it wrote is the one the next run reads."""
        state.current[name], state.spare[name] = state.spare[name], state.current[name]

    @staticmethod
    def adopt(state: StreamState, name: str, value: np.ndarray, in_info: NpuTensorInfo, out_info: NpuTensorInfo
              ) -> None:
        """After run(): the engine's new array is the state (kept as it is: no copy)."""
        state.current[name] = (NpuTensor(in_info.replace(shape=value.shape), value),
                               NpuTensor(out_info.replace(shape=value.shape), value))


class StreamRuns:
    """Runs in streams, for the Runner: each takes its turn in its stream's line, with the stream's state."""

    def __init__(self, runner: Runner, table: StreamTable) -> None:
        self.runner = runner
        self.table = table
        self._stateful: bool | None = True if table.pairs else None

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
        """The stream's context on an engine (its own infer request where the engine keeps variables)."""
        if not engine.state_names:
            return None
        entry = state.contexts.get(id(engine))
        if entry is None:
            entry = state.contexts[id(engine)] = (engine, engine.open_context())
        return entry[1]

    # -- runs -------------------------------------------------------------------------------------------------
    def execute(self, stream: Stream | int | None, inputs: Any, outputs: Any) -> tuple[StatusCode, str]:
        state = self.runner._stream_state(stream)
        try:
            with state.turn(state.place()):
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
        """The CPU-view infos of a carried pair, with the stream's state shape: the current state's, else the
        model's, its open dims taken from the app's inputs by dim name (silero-vad's ``batch``), else 1."""
        runner = self.runner
        in_port = runner.get_port(in_name)
        out_port = runner.get_port(out_name)
        current = state.current.get(in_name)
        if current is not None:
            shape = current[0].info.shape
        else:
            spec = next(s for s in runner._in_specs if s.name == in_name)
            names = spec.dim_names or (None,) * len(spec.shape)
            dims = []
            for d, dim_name in zip(spec.shape, names):
                if d is None:
                    d = next((shapes[s.name][k] for s in runner._in_specs if s.name in shapes and s.dim_names
                              for k, n in enumerate(s.dim_names) if dim_name and n == dim_name
                              and k < len(shapes[s.name])), 1)
                dims.append(d)
            shape = tuple(dims)
        return in_port.cpu.replace(shape=shape), out_port.cpu.replace(shape=shape)

    def run(self, stream: Stream | int | None, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Runner.run on a stream: the carried state goes in from the stream and its successor stays there."""
        runner = self.runner
        state = runner._streams.get(stream)
        arrays = runner._arrays.feeds(feeds)
        by_name = dict(zip(runner._input_names, arrays))
        with state.turn(state.place()):
            shapes = {n: a.shape for n, a in by_name.items()}
            infos = {}
            for in_name, out_name in self.table.pairs.items():
                infos[in_name] = self._state_infos(state, in_name, out_name, shapes)
                current, _ = self.table.carried(state, *infos[in_name])
                by_name[in_name] = current.numpy()
            results = runner._arrays.run([by_name[s.name] for s in runner._in_specs], state)
            out = dict(zip([s.name for s in runner._out_specs], results))
            for in_name, out_name in self.table.pairs.items():
                StreamTable.adopt(state, in_name, out.pop(out_name), *infos[in_name])
        return out

    # -- the state ---------------------------------------------------------------------------------------------
    def get_state(self, state: StreamState) -> dict[str, np.ndarray]:
        with state.turn(state.place()):
            result = {name: t[0].numpy().copy() for name, t in state.current.items()}
            for in_name in self.table.pairs:
                if in_name not in result:  # never run: the initial state
                    in_info, _ = self._state_infos(state, in_name, self.table.pairs[in_name], {})
                    result[in_name] = np.zeros(in_info.shape, in_info.numpy_dtype)
            for engine, context in self._contexts(state):
                result.update(engine.get_state(context))
            return result

    def set_state(self, state: StreamState, values: Mapping[str, np.ndarray]) -> None:
        with state.turn(state.place()):
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
        with state.turn(state.place()):
            state.current.clear()  # the next run starts from zeros, as a new stream's does
            for engine, context in self._contexts(state):
                engine.reset_state(context)

    def close(self, state: StreamState | None = None) -> None:
        """Close one stream after its submitted runs (or, with no stream, every stream: the runner closes)."""
        if state is None:
            for s in self.table.close_all():
                self._close_contexts(s)
            return
        with state.turn(state.place()):
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
