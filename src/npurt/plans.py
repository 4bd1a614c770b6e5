"""Plans: ``[batch][tensor]`` lists validated once into what each batch slot runs.

A plan slot holds the shape variant that runs it, the order of its tensors by port, which of them need a
conversion into the engine's view (through staging), and, where none does, the engine's binding of those tensors.

Two caches decide "are these the same tensors?", once for every layer below:
- by identity: the same NpuTensor objects again (a double-buffered app). The hit costs a dict lookup by the
  tensors' ids, and reuses the engine binding. An entry goes when any of its tensors is collected (a weak reference's
  callback, before another object can take its id), so the cache never keeps a user's frame (or its memory) alive
  and never answers for another object.
- by value: new NpuTensor objects with infos seen before (an app that wraps each frame anew). The hit skips
  validation; the engine binds the new memory.
NpuTensors are immutable (info and memory), so a plan validated once for them stays valid.
"""

from __future__ import annotations

import functools
import math
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Literal

from .engine import Done, Engine, LaneRef, Launched
from .ports import Port
from .status import StatusError
from .tensor import NpuTensor
from .types import DYNAMIC_DIM, MemoryLayout, NpuTensorInfo, StatusCode, TensorDirection, TensorType, padded_box
from .variants import ShapeError, ShapeVariants, Variant

# The plan caches' keys: the ids of a call's tensors, and their infos ([inputs][slot][tensor], [outputs]...)
IdKey = tuple[Any, ...]  # the tensors' ids (and how they split into inputs and outputs)
InfoKey = tuple[tuple[tuple[NpuTensorInfo, ...], ...], tuple[tuple[NpuTensorInfo, ...], ...]]

PLAN_CACHE_SIZE = 64  # plans kept per runner, per cache
_NO_SYNC_PROVIDERS = frozenset({"user", "host", "memfd"})  # memory the CPU sees coherently


def _fits(shape: tuple[int, ...], port_shape: tuple[int, ...]) -> bool:
    return len(shape) == len(port_shape) and all(p in (DYNAMIC_DIM, s) for s, p in zip(shape, port_shape))


def in_engine_view(info: NpuTensorInfo, port: Port, boxes: bool = False) -> bool:
    """Whether a tensor is laid out as the port's engine consumes it (then it goes to the engine as it is).
    ``boxes``: the engine also takes a strided tensor that is a box of a contiguous one it lies in whole (rows
    padded to a pitch: a decoder's plane), as OpenVINO takes a region of a tensor."""
    want = port.engine
    if not (info.data_type is want.data_type and info.memory_layout_order == want.memory_layout_order
            and (info.memory_layout is want.memory_layout or MemoryLayout.UNKNOWN in (info.memory_layout,
                                                                                       want.memory_layout))):
        return False
    if not info.is_contiguous:
        box = padded_box(info.shape, info.strides) if boxes else None
        return box is not None and info.size_in_bytes >= math.prod(box) * info.data_type.itemsize and \
            (info.shape == want.shape if want.is_static else _fits(info.shape, want.shape))
    return info.strides == want.strides if want.is_static else _fits(info.shape, want.shape)


class SlotPlan:
    """One validated batch slot. Tensor-free: each call's own tensors are passed along with it."""

    __slots__ = ("variant", "in_order", "out_order", "convert_in", "convert_out", "sync", "binding", "start",
                 "tells_shapes", "lane")

    def __init__(self, variant: Variant, in_order: tuple[int, ...], out_order: tuple[int, ...],
                 convert_in: tuple[int, ...], convert_out: tuple[int, ...], sync: bool, binding: Any = None) -> None:
        self.variant = variant
        self.in_order, self.out_order = in_order, out_order
        self.convert_in, self.convert_out = convert_in, convert_out
        self.sync = sync  # DMA-BUF memory: CPU access is bracketed around the (CPU) engine's run
        self.binding = binding  # the engine's binding of the tensors, where no conversion is needed
        # ``start(done)``: a run of the binding started on the engine's own requests (Engine.start), where the
        # tensors go as they are and the engine has such requests (else None: the runner's workers run it)
        engine = variant.engine
        self.start: Callable[[Done], bool | Launched] | None = None
        if binding is not None and not sync and type(engine).start is not Engine.start:
            self.start = functools.partial(engine.start, binding)
        self.tells_shapes = not all(p.is_static for p in variant.outputs)  # a run reports the outputs' shapes
        # the engine's job lane for jobs on the binding (Engine.lane), asked on the first job: None until then,
        # False where there is none
        self.lane: LaneRef | Literal[False] | None = None

    def find_lane(self) -> LaneRef | Literal[False]:
        """The engine's job lane for jobs on this slot's binding, with what it takes and the engine's error
        translation (False: none; also where the tensors need conversions or the outputs' shapes are the run's)."""
        if self.start is None or self.tells_shapes:
            return False
        found = self.variant.engine.lane(self.binding)
        return False if found is None else found

    @property
    def direct(self) -> bool:
        """Nothing to convert: the tensors go to the engine as they are."""
        return not (self.convert_in or self.convert_out)

    def bound(self, binding: Any) -> SlotPlan:
        return SlotPlan(self.variant, self.in_order, self.out_order, self.convert_in, self.convert_out, self.sync,
                        binding)

    def tensors(self, slot_in: Sequence[NpuTensor], slot_out: Sequence[NpuTensor]
                ) -> tuple[list[NpuTensor], list[NpuTensor]]:
        """A call's tensors in port order."""
        return [slot_in[k] for k in self.in_order], [slot_out[k] for k in self.out_order]


Plan = list[SlotPlan]


class Planner:
    """Validates ``[batch][tensor]`` lists against the runner's ports and caches the result."""

    def __init__(self, variants: ShapeVariants, batch_size: int) -> None:
        self._variants = variants
        self._batch = batch_size
        self._lock = threading.Lock()
        self._by_id: dict[IdKey, tuple[tuple[weakref.ref[NpuTensor], ...], Plan]] = {}
        self._by_info: dict[InfoKey, Plan] = {}
        # how an entry's weak references reach the planner: weakly (the app's tensors must not keep the plans, and
        # through them the engines, alive)
        self._weakly = weakref.ref(self)

    def plan(self, inputs: Any, outputs: Any) -> Plan:
        """The plan of one call (StatusError for anything wrong with the lists or tensors)."""
        try:
            if len(inputs) == 1 and len(outputs) == 1:  # one batch slot (most calls): a flat key, built in C
                slot_in, slot_out = inputs[0], outputs[0]
                if type(slot_in) is list and type(slot_out) is list and len(slot_in) == 1 and len(slot_out) == 1:
                    key: Any = (1, id(slot_in[0]), id(slot_out[0]))  # (the same key without map objects: lists only,
                    # where indexing is iterating; a mapping indexed by 0 must not pass for its tensor)
                else:
                    key = (len(slot_in), *map(id, slot_in), *map(id, slot_out))
            else:
                key = (tuple(tuple(map(id, s)) for s in inputs), tuple(tuple(map(id, s)) for s in outputs))
        except TypeError:
            return self._validate(inputs, outputs)  # not lists of lists: let validation say what is wrong
        hit = self._by_id.get(key)
        if hit is not None:  # the very tensors of the entry (see _remember): ids are enough
            return hit[1]
        try:
            info_key = (tuple(tuple(t.info for t in s) for s in inputs),
                        tuple(tuple(t.info for t in s) for s in outputs))
        except AttributeError:
            return self._validate(inputs, outputs)  # something that is not an NpuTensor: validation says so
        template = self._by_info.get(info_key)
        if template is None:
            template = self._validate(inputs, outputs)
            with self._lock:
                if len(self._by_info) >= PLAN_CACHE_SIZE:
                    self._by_info.pop(next(iter(self._by_info)))
                self._by_info[info_key] = template
        plan = self._bind(template, inputs, outputs)
        self._remember(key, inputs, outputs, plan)
        return plan

    @staticmethod
    def _bind(template: Plan, inputs: Any, outputs: Any) -> Plan:
        plan = []
        for slot, si, so in zip(template, inputs, outputs):
            if slot.direct:
                ins, outs = slot.tensors(si, so)
                slot = slot.bound(slot.variant.engine.bind(ins, outs))
            plan.append(slot)
        return plan

    def _remember(self, key: IdKey, inputs: Any, outputs: Any, plan: Plan) -> None:
        # An entry is keyed by its tensors' ids, and each tensor's weak reference removes it as that tensor is
        # finalized: CPython calls a live weak reference's callback before the object's memory is freed, so no other
        # object can have that id while the entry is there, and a hit by ids is a hit on these very tensors.
        planner = self._weakly

        def forget(_: Any, key: IdKey = key) -> None:
            if (alive := planner()) is not None:
                alive.forget_key(key)

        snap_in, snap_out = [list(s) for s in inputs], [list(s) for s in outputs]  # one reading of the lists
        if len(snap_in) == 1 and len(snap_out) == 1:  # the key as plan() makes it, of this reading
            now: IdKey = (len(snap_in[0]), *map(id, snap_in[0]), *map(id, snap_out[0]))
        else:
            now = (tuple(tuple(map(id, s)) for s in snap_in), tuple(tuple(map(id, s)) for s in snap_out))
        if now != key:
            return  # the lists changed during the call (another thread's): nothing cached for either set
        refs = tuple(weakref.ref(t, forget) for s in (*snap_in, *snap_out) for t in s)
        evicted = None
        with self._lock:
            if len(self._by_id) >= PLAN_CACHE_SIZE:
                evicted = self._by_id.pop(next(iter(self._by_id)))
            self._by_id[key] = (refs, plan)
        del evicted  # (outside the lock, as every entry the planner drops: see forget_key)

    def forget_key(self, key: IdKey) -> None:
        """Drop the cached plan of one set of tensors (one of them is going). Entries are let go of outside the
        lock: the last reference to a plan may hold the last to other tensors (a lane's request holds a job's
        tensors until it runs again), whose callbacks come back here."""
        with self._lock:
            dropped = self._by_id.pop(key, None)
        del dropped

    def forget_variant(self, variant: Variant) -> None:
        """Drop every cached plan that runs on an evicted variant."""
        with self._lock:
            dropped: list[object] = [self._by_id.pop(k) for k, (_, plan) in list(self._by_id.items())
                                     if any(s.variant is variant for s in plan)]
            dropped += [self._by_info.pop(k) for k, plan in list(self._by_info.items())
                        if any(s.variant is variant for s in plan)]
        del dropped

    def clear(self) -> None:
        with self._lock:
            dropped = (self._by_id, self._by_info)
            self._by_id, self._by_info = {}, {}
        del dropped

    # -- validation ------------------------------------------------------------------------------------
    def _validate(self, inputs: Any, outputs: Any) -> Plan:
        for what, lists, status in (("inputs", inputs, StatusCode.INVALID_INPUT),
                                    ("outputs", outputs, StatusCode.INVALID_OUTPUT)):
            if not isinstance(lists, Sequence) or isinstance(lists, (str, bytes)) or \
                    not all(isinstance(s, Sequence) and not isinstance(s, (str, bytes)) for s in lists):
                raise StatusError(status, f"{what} must be a list (batch) of lists (tensors) of NpuTensor")
            if not 1 <= len(lists) <= self._batch:
                raise StatusError(status, f"{what} has {len(lists)} batch slots; this runner takes 1 to "
                                          f"{self._batch} (option batch_size)")
        if len(inputs) != len(outputs):
            raise StatusError(StatusCode.INVALID_OUTPUT,
                              f"{len(inputs)} input batch slots but {len(outputs)} output slots")
        return [self._validate_slot(b, si, so) for b, (si, so) in enumerate(zip(inputs, outputs))]

    def _validate_slot(self, b: int, slot_in: Sequence[Any], slot_out: Sequence[Any]) -> SlotPlan:
        query_inputs = self._variants.ports(TensorDirection.INPUT)
        in_order = _match(slot_in, query_inputs, b, "input", StatusCode.INVALID_INPUT)
        ins = [slot_in[k] for k in in_order]
        signature = tuple(_cpu_shape(t, p) for t, p in zip(ins, query_inputs))
        try:
            variant = self._variants.get(signature)
        except ShapeError as e:
            raise StatusError(StatusCode.INVALID_INPUT, f"batch slot {b}: {e}") from None
        except Exception as e:  # noqa: BLE001 - a compile failure for these shapes
            raise StatusError(StatusCode.INVALID_INPUT, f"batch slot {b}: cannot compile the model for input "
                                                        f"shapes {[list(s) for s in signature]}: {e}") from None
        out_order = _match(slot_out, variant.outputs, b, "output", StatusCode.INVALID_OUTPUT)
        outs = [slot_out[k] for k in out_order]
        for tensors, ports, status in ((ins, variant.inputs, StatusCode.INVALID_INPUT),
                                       (outs, variant.outputs, StatusCode.INVALID_OUTPUT)):
            for t, p in zip(tensors, ports):
                _check_view(t, p, b, status)
        boxes = variant.engine.takes_boxes
        convert_in = tuple(i for i, (t, p) in enumerate(zip(ins, variant.inputs))
                           if not in_engine_view(t.info, p, boxes))
        convert_out = tuple(j for j, (t, p) in enumerate(zip(outs, variant.outputs))
                            if not in_engine_view(t.info, p))
        sync = any(t.provider not in _NO_SYNC_PROVIDERS for t in (*ins, *outs))
        return SlotPlan(variant, in_order, out_order, convert_in, convert_out, sync)


def _match(tensors: Sequence[Any], ports: list[Port], b: int, what: str, status: StatusCode) -> tuple[int, ...]:
    """For each port, the index of its tensor in ``tensors`` (matched by name)."""
    if len(tensors) != len(ports):
        raise StatusError(status, f"batch slot {b}: {len(tensors)} {what} tensors given, the model has "
                                  f"{len(ports)}: {[p.name for p in ports]}")
    by_name: dict[str, int] = {}
    for k, t in enumerate(tensors):
        if not isinstance(t, NpuTensor):
            raise StatusError(status, f"batch slot {b}: {what} {t!r} is not an NpuTensor")
        if t.info.name in by_name:
            raise StatusError(status, f"batch slot {b}: two {what} tensors are named {t.info.name!r}")
        by_name[t.info.name] = k
    order = []
    for p in ports:
        index = by_name.get(p.name)
        if index is None:
            unknown = sorted(set(by_name) - {q.name for q in ports})
            raise StatusError(status, f"batch slot {b}: no {what} tensor for {p.name!r}; unknown names "
                                      f"{unknown}; the model's {what}s are {[q.name for q in ports]}")
        order.append(index)
    return tuple(order)


def _cpu_shape(t: NpuTensor, port: Port) -> tuple[int, ...]:
    """The CPU-view shape of an input tensor in either view."""
    info = t.info
    if info.tensor_type is TensorType.CPU or port.hw.memory_layout == port.cpu.memory_layout and \
            port.hw.memory_layout_order == port.cpu.memory_layout_order:
        return info.shape
    if info.shape == port.hw.shape and port.is_static:
        return port.cpu.shape
    raise StatusError(StatusCode.INVALID_INPUT,
                      f"input {port.name!r}: HW shape {list(info.shape)}, expected {list(port.hw.shape)} "
                      "(new shapes of a dynamic model are given in the CPU view)")


def _show(v: Any) -> Any:
    return v.name if hasattr(v, "name") else list(v) if isinstance(v, tuple) else v


def _check_view(t: NpuTensor, port: Port, b: int, status: StatusCode) -> None:
    want = port.info(t.info.tensor_type)
    got = t.info
    what = "input" if status is StatusCode.INVALID_INPUT else "output"
    for field_name in ("shape", "data_type", "memory_layout", "memory_layout_order"):
        g, w = getattr(got, field_name), getattr(want, field_name)
        if field_name == "memory_layout" and MemoryLayout.UNKNOWN in (g, w):
            continue
        if field_name == "shape" and not want.is_static:
            if _fits(g, w):
                continue
        elif g == w:
            continue
        raise StatusError(status, f"batch slot {b}: {what} {port.name!r} ({got.tensor_type.name} view): "
                                  f"{field_name} is {_show(g)}, expected {_show(w)}")
    if status is StatusCode.INVALID_OUTPUT and not t.writable:
        raise StatusError(status, f"batch slot {b}: output {port.name!r} is read-only")
