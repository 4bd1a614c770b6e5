"""Running plans: each batch slot on its engine, directly or through staging, and DMA-BUF CPU-access brackets.

A slot whose tensors are all in their ports' views runs on the engine with its binding (no copy). Otherwise:

a tensor in the other view than its port's is converted by the native kernels into a staging tensor in the
engine's view (one copy, counted in the runner's stats), as VART-ML does for CPU tensors; outputs come back the
same way. Staging tensors are allocated once per port and concurrent call, from the runner's memory provider, and
reused.

DMA-BUF memory that the CPU touches (the CPU device's engine, a conversion) is bracketed by DMA_BUF_IOCTL_SYNC
start/end: ``CpuAccess`` is that bracket, in the style of libcamera's ``DmaSyncer``. Other memory needs none.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from . import formats
from .engine import Done, Launched, ResultShapes
from .plans import Plan, SlotPlan
from .stats import RunnerStats
from .status import SUCCESS, status_of
from .tensor import NpuTensor, allocate_tensor
from .types import MemoryType, NpuTensorInfo, QuantParameters, StatusCode, TensorDirection
from .variants import StageKey, Variant, use_clock


class CpuAccess:
    """``with CpuAccess(reads, writes):`` brackets CPU access of DMA-BUF tensors (a no-op for other memory)."""

    __slots__ = ("_reads", "_writes", "_begun")

    def __init__(self, reads: Sequence[NpuTensor] = (), writes: Sequence[NpuTensor] = ()) -> None:
        self._reads, self._writes = reads, writes
        self._begun: list[tuple[NpuTensor, bool]] = []

    def __enter__(self) -> CpuAccess:
        try:
            for tensors, write in ((self._reads, False), (self._writes, True)):
                for t in tensors:
                    t.begin_cpu_access(write=write)
                    self._begun.append((t, write))
        except BaseException:
            self._end()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._end()

    def _end(self) -> None:
        begun, self._begun = self._begun, []
        for t, write in reversed(begun):
            t.end_cpu_access(write=write)


def record_shapes(outs: Sequence[NpuTensor], shapes: ResultShapes) -> None:
    """Record the shapes a run wrote on the output tensors (where the engine reported any)."""
    if shapes:
        for t, shape in zip(outs, shapes):
            t.set_result_shape(shape)


class Staging:
    """Runs slots that need conversions or CPU-access brackets, with staging tensors reused per port."""

    def __init__(self, memory_provider: str, stats: RunnerStats) -> None:
        self._provider = memory_provider
        self._stats = stats
        self._lock = threading.Lock()

    def run(self, slot: SlotPlan, ins: list[NpuTensor], outs: list[NpuTensor], context: Any = None) -> None:
        """One slot: convert inputs into staging, run on the engine's views (in ``context``: a stream's),
        convert outputs back."""
        variant = slot.variant
        engine = variant.engine
        if slot.direct:  # only the bracket: DMA-BUF memory that the engine reads and writes on the CPU
            with CpuAccess(ins, outs):
                binding = slot.binding if slot.binding is not None else engine.bind(ins, outs)
                record_shapes(outs, engine.run(binding, context))
            return
        borrowed: list[tuple[StageKey, NpuTensor]] = []
        try:
            engine_ins = list(ins)
            for i in slot.convert_in:
                port = variant.inputs[i]
                info = port.engine if port.engine.is_static else port.engine.replace(shape=ins[i].info.shape)
                engine_ins[i] = self._borrow(variant, TensorDirection.INPUT, i, info, borrowed)
                self.convert(ins[i], engine_ins[i], port.quant)
            engine_outs = list(outs)
            for j in slot.convert_out:
                engine_outs[j] = self._borrow(variant, TensorDirection.OUTPUT, j, variant.outputs[j].engine,
                                              borrowed)
            with CpuAccess(engine_ins, engine_outs):
                engine.run(engine.bind(engine_ins, engine_outs), context)  # staged outputs are static: no shapes
            for j in slot.convert_out:
                self.convert(engine_outs[j], outs[j], variant.outputs[j].quant)
        finally:
            if borrowed:
                with self._lock:
                    for key, stage in borrowed:
                        variant.staging.setdefault(key, []).append(stage)

    def _borrow(self, variant: Variant, direction: TensorDirection, index: int, info: NpuTensorInfo,
                borrowed: list[tuple[StageKey, NpuTensor]]) -> NpuTensor:
        """A staging tensor in the engine's view, reused across calls (one per concurrent call and shape)."""
        key = (direction, index, info.shape)
        with self._lock:
            free = variant.staging.get(key)
            stage = free.pop() if free else None
        if stage is None:
            stage = allocate_tensor(info, MemoryType.XRT_BO, self._provider)  # never strict
        borrowed.append((key, stage))
        return stage

    def convert(self, src: NpuTensor, dst: NpuTensor, quant: QuantParameters | None) -> None:
        """One counted host copy: ``src`` converted into ``dst`` (native kernels), CPU access bracketed."""
        with CpuAccess((src,), (dst,)):
            formats.convert(src, dst, quant=quant)
        self._stats.copy(dst.nbytes)


ContextOf = Callable[[Any], Any]  # an engine -> the context a run uses on it (a stream's), or None


def run_plan(plan: Plan, inputs: Sequence[Sequence[NpuTensor]], outputs: Sequence[Sequence[NpuTensor]],
             staging: Staging, context_of: ContextOf | None = None) -> tuple[StatusCode, str]:
    """Run every batch slot of a plan; the status (the engine's error becomes a status: this never raises)."""
    b = 0  # (no enumerate, one try: a 7 us run of the digits model on ONNX Runtime feels each step here)
    try:
        for slot in plan:
            variant = slot.variant
            variant.used = next(use_clock)  # (touch() without its frame)
            engine = variant.engine
            binding = slot.binding
            if binding is not None and not slot.sync:
                shapes = engine.run(binding, None if context_of is None else context_of(engine))
                if shapes:
                    record_shapes([outputs[b][k] for k in slot.out_order], shapes)
            else:
                staging.run(slot, *slot.tensors(inputs[b], outputs[b]),
                            None if context_of is None else context_of(engine))
            b += 1
    except Exception as e:  # noqa: BLE001 - the engine's error becomes a status
        return status_of(e, b)
    return SUCCESS, ""


def engine_start(plan: Plan, outputs: Sequence[Sequence[NpuTensor]], with_callback: bool = False
                 ) -> Callable[[Done], bool | Launched] | None:
    """How to start a one-slot job with nothing to convert on the engine's own requests (None: workers; also for a
    job with a callback on an engine whose ``callbacks_on_workers`` says so). Where the outputs' shapes are fixed
    the slot's own ``start`` is it (the engine's ``done`` is the job's, no wrapper per job)."""
    if len(plan) != 1:
        return None
    slot = plan[0]
    start = slot.start
    if start is None or with_callback and slot.variant.engine.callbacks_on_workers:
        return None
    if not slot.tells_shapes:
        return start

    def start_recording(done: Done) -> bool | Launched:
        def ended(error: BaseException | None, shapes: ResultShapes) -> None:
            if error is None and shapes:
                record_shapes([outputs[0][k] for k in slot.out_order], shapes)
            done(error, None)

        return slot.variant.engine.start(slot.binding, ended)

    return start_recording
