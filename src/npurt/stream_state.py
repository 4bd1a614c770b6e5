"""A stream's state: its line of turns, its carried state buffers and its contexts on the engines.

The state level of streams (``streams`` runs models in them): ``StreamState`` is one stream's line (runs, and reads
and writes of its state, take turns in the order they were queued), the buffers of its carried pairs (option
``state_pairs``) and its contexts on engines that keep variables; ``StreamTable`` is a runner's streams by id.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .tensor import NpuTensor, sub_tensor
from .types import NpuError, NpuTensorInfo


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

    def context(self, engine: Any) -> Any:
        """The stream's context on an engine, opened on first use (OpenVINO's is an infer request of the stream's
        own, which keeps its variables and lets streams run side by side as one request each would)."""
        entry = self.contexts.get(id(engine))
        if entry is None or entry[0] is not engine:  # (an id the LRU's dropped engine had)
            entry = self.contexts[id(engine)] = (engine, engine.open_context())
        return entry[1]

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

    def __init__(self, pairs: Mapping[str, str], allocate: Callable[[NpuTensorInfo], NpuTensor],
                 in_place: bool = False) -> None:
        self.pairs = dict(pairs)  # carried input -> the output it is fed from
        # in place: a run writes the next state into the buffer it reads (a decoder's KV cache, whose graph writes
        # only the new rows, npurt.generate); else two buffers take turns
        self.in_place = in_place
        self._allocate = allocate  # new memory of zeros (Buffer.allocate's): a stream's first state
        self._lock = threading.Lock()
        self._streams: dict[int, StreamState] = {0: StreamState(0)}
        self._next_id = 1

    def open(self) -> int:
        with self._lock:
            stream_id = self._next_id
            self._next_id += 1
            self._streams[stream_id] = StreamState(stream_id)
            return stream_id

    def get(self, stream_id: int) -> StreamState:
        """A stream's state by id (0: the default stream); ValueError when unknown or closed."""
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
            # (zeros as made: a fresh mapping; writing them would fault in every page of a decoder's whole cache,
            # ~12 MB and 11 ms on the way to SmolLM2's first token, rows it may never reach)
            current = state.current[name] = self.buffer(in_info, out_info)
        if self.in_place:
            return current
        spare = state.spare.get(name)
        if spare is None or spare[0].info.shape != in_info.shape:
            spare = state.spare[name] = self.buffer(in_info, out_info)
        return current[0], spare[1]

    def buffer(self, in_info: NpuTensorInfo, out_info: NpuTensorInfo) -> tuple[NpuTensor, NpuTensor]:
        """A new buffer for one pair's state, seen as the carried input and as its output (one memory)."""
        t = self._allocate(in_info)
        return t, sub_tensor(t, out_info if out_info.shape == in_info.shape else out_info.replace(shape=in_info.shape),
                             0)

    def advance(self, state: StreamState, name: str) -> None:
        """After an execute() that succeeded: the state it wrote is the one the next run reads."""
        if self.in_place:
            return
        current = state.current[name]
        assert not isinstance(current, np.ndarray)
        state.current[name], state.spare[name] = state.spare[name], current
