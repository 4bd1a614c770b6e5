"""InferQueue: a pool of slots over one runner, in the style of OpenVINO's ``AsyncInferQueue``.

Each slot owns its output tensors (allocated by the runner once) and runs one job at a time through the runner's
``execute_async``. ``start_async`` takes the next free slot, blocking only while every slot is busy; when a job
ends its slot's callback runs (where the runner runs job callbacks) with the slot and the job's user data, and the
slot is free again. ``wait_all`` waits for every job started. Inputs are numpy arrays (wrapped, not copied: keep
them unchanged until the job ends) or NpuTensors.

By default there are more slots than the runner runs at once (``max_concurrent_runs`` + max(it, 4)): while that
many jobs run, the others wait in the queue, and each job that ends starts the next waiting one as the next job
of the worker that ended it. The runner's runs never wait for the caller's thread or another worker to wake up (a
thread wake-up costs tens of microseconds of CPU and more of latency, a real share of a short job), and the
caller, when every slot is busy, is woken once half the waiting slots are free rather than once per job.

    queue = InferQueue(runner)
    queue.set_callback(lambda slot, frame_no: results.append((frame_no, slot.results())))
    for k, frame in enumerate(frames):
        queue.start_async({"x": frame}, userdata=k)
    queue.wait_all()
"""

from __future__ import annotations

import functools
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .jobs import hand_over_continuation
from .runner import Runner
from .tensor import NpuTensor
from .types import JobHandle, NpuError, StatusCode, TensorDirection, TensorType

SlotCallback = Callable[["QueueSlot", Any], None]


class QueueSlot:
    """One slot of an InferQueue: its output tensors and what its last job did."""

    def __init__(self, index: int, outputs: list[NpuTensor]) -> None:
        self.index = index
        self.outputs = outputs
        self.status = StatusCode.SUCCESS  # of the last job that ended on this slot
        self.error = ""  # its message, where it failed
        self.userdata: Any = None
        self._inputs: list[NpuTensor] = []  # kept alive while the job runs

    def results(self) -> dict[str, np.ndarray]:
        """The last job's outputs, by name: views of the slot's tensors (the slot's next job overwrites them)."""
        return {t.info.name: t.result() for t in self.outputs}


class InferQueue:
    """Slots of tensors over one runner; ``start_async`` blocks only while every slot is busy."""

    def __init__(self, runner: Runner, jobs: int = 0, tensor_type: TensorType = TensorType.CPU,
                 output_shapes: Mapping[str, Sequence[int]] | None = None) -> None:
        """``jobs``: the number of slots (0: the runner's ``max_concurrent_runs`` + max(it, 4); slots beyond the
        runs the runner has wait for one, see the module's docstring). ``tensor_type``: the view of the
        slots' output tensors. ``output_shapes``: shapes for outputs whose dims the model leaves open (their largest
        shape: a job writes its result at the start of the tensor, see ``NpuTensor.result_info``). The output tensors
        are allocated once, by the runner. ValueError for a runner that is not a Runner, a negative ``jobs``,
        ``output_shapes`` naming outputs the model lacks, or an open-shaped output without a shape."""
        if not isinstance(runner, Runner):
            raise ValueError(f"InferQueue needs a Runner, got {type(runner).__name__}")
        if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 0:
            raise ValueError(f"InferQueue: jobs must be an integer >= 0, got {jobs!r}")
        self.runner = runner
        self._limit = runner.max_concurrent_runs  # this queue's jobs submitted to the runner at most
        n = jobs or self._limit + max(self._limit, 4)
        given = dict(output_shapes or {})
        infos = runner.get_tensors_info(TensorDirection.OUTPUT, TensorType(tensor_type))
        unknown = sorted(set(given) - {i.name for i in infos})
        if unknown:
            raise ValueError(f"InferQueue: output_shapes names {unknown}; the model's outputs are "
                             f"{[i.name for i in infos]}")
        shaped = []
        for info in infos:
            if info.name in given:
                info = info.replace(shape=tuple(given[info.name]))
            elif not info.is_static:
                raise ValueError(f"InferQueue: output {info.name!r} has dims the model leaves open "
                                 f"({info.describe()}): give output_shapes={{{info.name!r}: (...)}}, its largest shape")
            shaped.append(info)
        self._in_infos = {i.name: i for i in runner.get_tensors_info(TensorDirection.INPUT, TensorType.CPU)}
        # The last array given per input and its wrapping: an app that feeds the same array again (a buffer it
        # refills) gets the same NpuTensor, whose plan and engine binding the runner already holds. Holding the
        # array is what the wrapping does anyway; the next array replaces it.
        self._wrapped: dict[str, tuple[np.ndarray, NpuTensor]] = {}
        self.slots = [QueueSlot(k, [runner.allocate_npu_tensor(i) for i in shaped]) for k in range(n)]
        self._callback: SlotCallback | None = None
        self._free = list(range(n))
        self._busy = 0  # slots started and not yet released
        self._submitted = 0  # jobs of this queue submitted to the runner and not yet ended
        self._waiting: deque[QueueSlot] = deque()  # started slots waiting for a run of the runner
        # A caller blocked on a full queue is woken once this many slots are free (one per job would cost a
        # wake-up per job while the waiting slots keep the runner busy anyway).
        self._wake_at = max(1, (n - self._limit) // 2)
        self._lock = threading.Lock()  # a plain lock for the per-job bookkeeping (a C-level with)
        self._cond = threading.Condition(self._lock)  # the same lock, for the waits

    def __len__(self) -> int:
        return len(self.slots)

    def __getitem__(self, index: int) -> QueueSlot:
        return self.slots[index]

    def set_callback(self, callback: SlotCallback | None) -> None:
        """``callback(slot, userdata)`` after each job ends (check ``slot.status``); it may start the next job.
        An exception in it is logged and does not stop the queue."""
        if callback is not None and not callable(callback):
            raise ValueError(f"InferQueue: callback {callback!r} is not callable")
        self._callback = callback

    def is_ready(self) -> bool:
        """Whether a slot is free (start_async would not block)."""
        with self._lock:
            return bool(self._free)

    def start_async(self, inputs: Mapping[str, Any] | Sequence[NpuTensor], userdata: Any = None) -> int:
        """Start a job on the next free slot (waiting for one while all are busy); its slot index.

        ``inputs``: {name: numpy array} in the model's own view (wrapped, not copied: keep the arrays unchanged until
        the job ends), or NpuTensors in either view. Raises ValueError for unknown, missing or mistyped inputs, and
        NpuError when the runner refuses the job (its StatusCode and message)."""
        tensors = self._tensors(inputs)
        if not self._free:  # about to block: inside a job's callback, the job it started must not wait for this
            hand_over_continuation()
        with self._lock:
            while not self._free:
                self._cond.wait()
            slot = self.slots[self._free.pop()]
            self._busy += 1
            slot.userdata, slot._inputs = userdata, tensors
            if self._submitted >= self._limit:  # every run is ours and busy: a job that ends starts this one
                self._waiting.append(slot)
                return slot.index
            self._submitted += 1
        while True:
            status = self._submit(slot)
            if status is not StatusCode.RESOURCE_UNAVAILABLE:
                break
            # every run of the runner is taken (by its other users): wait for one of ours, or give others a moment
            with self._lock:
                self._cond.wait(0.001)
        if status is not StatusCode.SUCCESS:
            message = self.runner.last_error
            if self._release(slot, submitted=True):
                self._start_waiting()
            raise NpuError(f"{status.name}: {message}")
        return slot.index

    def _submit(self, slot: QueueSlot) -> StatusCode:
        # at the end of a job's callback, the worker that ran it runs this job next (no other worker is woken)
        return self.runner.execute_async([slot._inputs], [slot.outputs], functools.partial(self._ended, slot)).status

    def _start_waiting(self) -> None:
        """Submit waiting slots while this queue has runs to spare (on the thread that ended a job: no hand-off).
        A slot the runner refuses ends with that status (its callback says so); RESOURCE_UNAVAILABLE (the
        runner's other users hold its runs) leaves it waiting for the next job of ours to end."""
        while True:
            with self._lock:
                if not self._waiting or self._submitted >= self._limit:
                    return
                slot = self._waiting.popleft()
                self._submitted += 1
            status = self._submit(slot)
            if status is StatusCode.SUCCESS:
                continue
            with self._lock:
                self._submitted -= 1
                if status is StatusCode.RESOURCE_UNAVAILABLE:
                    self._waiting.appendleft(slot)
                    if self._submitted:  # one of ours will end and try again
                        return
            if status is StatusCode.RESOURCE_UNAVAILABLE:  # none of ours runs: give the others a moment
                with self._lock:
                    self._cond.wait(0.001)
                continue
            self._ended(slot, JobHandle(status, 0), submitted=False)

    def _tensors(self, inputs: Mapping[str, Any] | Sequence[NpuTensor]) -> list[NpuTensor]:
        if isinstance(inputs, Mapping):
            if inputs.keys() != self._in_infos.keys():
                unknown = sorted(set(inputs) - set(self._in_infos))
                missing = sorted(set(self._in_infos) - set(inputs))
                raise ValueError(f"InferQueue.start_async: unknown inputs {unknown} and missing inputs {missing}; "
                                 f"the model's inputs are {list(self._in_infos)}")
            tensors = []
            for name, value in inputs.items():
                if isinstance(value, NpuTensor):
                    tensors.append(value)
                    continue
                last = self._wrapped.get(name)
                if last is not None and last[0] is value and value.shape == last[1].info.shape \
                        and value.dtype == last[1].info.numpy_dtype:  # an array's shape and dtype can be reassigned
                    tensors.append(last[1])
                    continue
                a = np.require(value, requirements="C")
                info = self._in_infos[name]
                if a.dtype != info.numpy_dtype:
                    raise ValueError(f"input {name!r}: dtype {a.dtype}, expected {info.numpy_dtype}")
                tensor = NpuTensor(info.replace(shape=a.shape), a)
                if a is value:  # not a contiguous copy made here: the same array again is the same memory
                    self._wrapped[name] = (value, tensor)
                tensors.append(tensor)
            return tensors
        if not all(isinstance(t, NpuTensor) for t in inputs):
            raise ValueError("InferQueue.start_async takes {name: array} or a list of NpuTensors")
        return list(inputs)

    def _ended(self, slot: QueueSlot, handle: JobHandle, submitted: bool = True) -> None:
        slot.status = handle.status
        slot.error = self.runner.last_error  # the job's message, on this (callback) thread
        try:
            if self._callback is not None:
                self._callback(slot, slot.userdata)
        finally:
            if self._release(slot, submitted):
                self._start_waiting()

    def _release(self, slot: QueueSlot, submitted: bool) -> bool:
        """Free a slot (``submitted``: and the run its job held); whether a waiting slot can start now."""
        slot._inputs = []
        with self._lock:
            if submitted:
                self._submitted -= 1
            self._free.append(slot.index)
            self._busy -= 1
            if len(self._free) >= self._wake_at or not self._busy:
                self._cond.notify_all()
            return submitted and bool(self._waiting) and self._submitted < self._limit

    def wait_all(self, timeout_s: float | None = None) -> bool:
        """Wait until every started job has ended and its callback returned; False on timeout."""
        hand_over_continuation()
        with self._lock:
            return self._cond.wait_for(lambda: self._busy == 0, timeout_s)
