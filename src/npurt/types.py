"""Enums and value types of the npurt API, with VART-ML's names and values."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np


class NpuError(RuntimeError):
    """An error of the runtime (engine, device, memory), as opposed to a bad argument (ValueError)."""


class NpuUnsupportedError(NpuError):
    """The engine cannot do what was asked (an operator, a memory type, a shape): StatusCode.UNSUPPORTED."""


class NpuFallbackWarning(UserWarning):
    """A runner runs somewhere else than it was asked to (for example on CPU because no NPU is present)."""


class RunnerType(IntEnum):
    """The backend a runner uses (``RunnerFactory.create_runner``); a backend's name works as well.

    OPENVINO: OpenVINO's NPU, GPU and CPU plugins. VAIML: ONNX Runtime with the Vitis AI execution provider (AMD
    NPUs), or its CPU provider. QNN: ONNX Runtime with the QNN execution provider's HTP (Qualcomm NPUs; Qualcomm's
    HTP emulator on x86-64), or its CPU provider. ONNXRUNTIME: ONNX Runtime with any execution provider it offers
    (option ``execution_provider``, or ONNX Runtime's device policy ``ep_policy``). AUTO: the backends that see
    their NPU first, then the others; the first that loads the model."""

    OPENVINO = 0
    VAIML = 1
    AUTO = 2
    QNN = 3
    ONNXRUNTIME = 4


class TensorType(IntEnum):
    """A tensor's view: CPU, the model's own layout and dtype; HW, what the device consumes (docs/shapes-and-views.md).
    """

    CPU = 0
    HW = 1


class TensorDirection(IntEnum):
    """Whether a port or tensor is a model input or output."""

    INPUT = 0
    OUTPUT = 1


class MemoryType(IntEnum):
    """Where a tensor's memory lives (see ``NpuTensor``): XRT_BO, runner-allocated device-visible memory; DMA_FD, a
    file descriptor; USER_POINTER_CMA, physically contiguous user memory; USER_POINTER_NON_CMA, plain host memory
    (CPU views only). UNKNOWN holds no tensor."""

    UNKNOWN = 0
    XRT_BO = 1
    DMA_FD = 2
    USER_POINTER_CMA = 3
    USER_POINTER_NON_CMA = 4


class MemoryLayout(IntEnum):
    """How a tensor's dims are laid out in memory, VART-ML's names: NCHW is the ONNX (CPU view) order of 4-D
    tensors, NHWC the Intel NPU's, HCWNC4 the AMD NPU's (channel groups of 4); GENERIC uses
    ``NpuTensorInfo.memory_layout_order``, a permutation relative to the CPU view."""

    UNKNOWN = 0
    NC = 1
    NCH = 2
    NHC = 3
    NHW = 4
    NWC = 5
    NHWC = 6
    NCHW = 7
    NHWC4 = 8
    NHWC8 = 9
    NC4HW4 = 10
    NC8HW8 = 11
    HCWNC4 = 12
    HCWNC8 = 13
    HCWNC16 = 14
    NHW16C4WC = 15
    NHW16WC4C = 16
    GENERIC = 17


class DataType(IntEnum):
    """A tensor's element type, VART-ML's names and values, plus FLOAT64 (CPU views only). ``numpy`` is the numpy
    dtype holding its bits (BF16 shows as uint16)."""

    UNKNOWN = 0
    BOOLEAN = 1
    INT8 = 2
    UINT8 = 3
    INT16 = 4
    UINT16 = 5
    BF16 = 6
    FP16 = 7
    INT32 = 8
    UINT32 = 9
    FLOAT32 = 10
    INT64 = 11
    UINT64 = 12
    FLOAT64 = 13  # CPU views only: neither NPU takes doubles

    @property
    def itemsize(self) -> int:
        """Bytes per element (ValueError for UNKNOWN)."""
        if self is DataType.UNKNOWN:
            raise ValueError("DataType.UNKNOWN has no element size")
        return _NUMPY_OF[self].itemsize

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype that holds this type's bits (BF16 shows as uint16)."""
        if self is DataType.UNKNOWN:
            raise ValueError("DataType.UNKNOWN has no numpy dtype")
        return _NUMPY_OF[self]

    @classmethod
    def from_numpy(cls, dtype: Any) -> DataType:
        """The DataType of a numpy dtype (uint16 is UINT16, never BF16); ValueError for one npurt does not carry."""
        dt = np.dtype(dtype)
        for k, v in _NUMPY_OF.items():
            if k is not DataType.BF16 and v == dt:
                return k
        raise ValueError(f"no npurt DataType for numpy dtype {dt}")


_NUMPY_OF: dict[DataType, np.dtype] = {
    DataType.BOOLEAN: np.dtype(np.bool_),
    DataType.INT8: np.dtype(np.int8),
    DataType.UINT8: np.dtype(np.uint8),
    DataType.INT16: np.dtype(np.int16),
    DataType.UINT16: np.dtype(np.uint16),
    DataType.BF16: np.dtype(np.uint16),
    DataType.FP16: np.dtype(np.float16),
    DataType.INT32: np.dtype(np.int32),
    DataType.UINT32: np.dtype(np.uint32),
    DataType.FLOAT32: np.dtype(np.float32),
    DataType.INT64: np.dtype(np.int64),
    DataType.UINT64: np.dtype(np.uint64),
    DataType.FLOAT64: np.dtype(np.float64),
}


class StatusCode(IntEnum):
    """What execution returns (execute, execute_async, wait, wait_any and the stream calls never raise); the
    message of a non-SUCCESS status is in ``Runner.last_error``. docs/api.md says when each is returned."""

    SUCCESS = 0
    FAILURE = 1
    INVALID_INPUT = 2
    INVALID_OUTPUT = 3
    OUT_OF_MEMORY = 4
    RUNTIME_ERROR = 5
    JOB_PENDING = 6
    INVALID_JOB_ID = 7
    RESOURCE_UNAVAILABLE = 8
    UNSUPPORTED = 9


class RoundingMode(IntEnum):
    """How a float is rounded to a quantized integer (``QuantParameters``, ``npurt.convert``)."""

    UNKNOWN = 0
    ROUND_TO_NEAREST_EVEN = 1
    ROUND_TOWARD_ZERO = 2


def enum_member(enum_cls: type[IntEnum], value: Any, what: str) -> Any:
    """An enum member from a member, its name (case-insensitive) or its value; ValueError naming ``what`` and the
    valid names otherwise."""
    if isinstance(value, enum_cls):
        return value
    if isinstance(value, str):
        try:
            return enum_cls[value.upper()]
        except KeyError:
            pass
    elif isinstance(value, int) and not isinstance(value, bool):
        try:
            return enum_cls(value)
        except ValueError:
            pass
    valid = ", ".join(m.name for m in enum_cls)
    raise ValueError(f"{what}: {value!r} is not a {enum_cls.__name__} (valid: {valid})")


DYNAMIC_DIM = -1  # a dim that the model leaves open, in NpuTensorInfo.shape


def padded_box(shape: Sequence[int], strides: Sequence[int]) -> tuple[int, ...] | None:
    """The contiguous shape a strided tensor is a box of, origin at its first element (rows padded to a pitch, a
    plane inside a larger image): each dim's stride a whole multiple of the next dim's extent. None where the
    strides are no such box (a permutation, a broadcast). The tensor itself where it is contiguous."""
    if not shape or strides[-1] != 1:
        return None
    box = [int(shape[-1])]
    for k in range(len(shape) - 2, -1, -1):
        inner = strides[k + 1]
        if strides[k] % inner or strides[k] // inner < box[0]:
            return None
        box[0] = strides[k] // inner
        box.insert(0, int(shape[k]))
    return tuple(box)


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides in elements."""
    strides = []
    acc = 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


_INFO_ENUMS: tuple[tuple[str, type[IntEnum]], ...] = (
    ("data_type", DataType), ("direction", TensorDirection), ("tensor_type", TensorType),
    ("memory_layout", MemoryLayout))


@dataclass(frozen=True)
class NpuTensorInfo:
    """Metadata of one tensor in one view. Immutable, hashable, equal by value; it describes memory, it holds none.

    ``strides`` (in elements), ``size`` (elements) and ``size_in_bytes`` are derived from ``shape`` and
    ``data_type`` unless given (padded rows, for example, give strides and a larger size_in_bytes). Enum fields take
    a member, its name (case-insensitive) or its value. ``memory_layout_order`` is a permutation relative to the
    CPU view, for MemoryLayout.GENERIC.

    Raises ValueError for an empty name, an unknown enum value, a shape that is not integers >= -1, an order that
    is not a permutation, DataType.UNKNOWN, strides of the wrong rank or negative, a ``size`` that does not match
    the shape, a ``size_in_bytes`` smaller than the shape and strides span, or strides or sizes with dynamic dims.

    A dim the model leaves open (a dynamic dim, on a device that runs dynamic shapes) is ``DYNAMIC_DIM`` (-1).
    Such an info describes a port, not memory: its ``strides`` are empty, ``size`` and ``size_in_bytes`` are
    -1, and ``is_static`` is False; allocate or wrap memory for it with a concrete shape,
    ``info.replace(shape=(1, 3, 640, 640))``.
    """

    name: str
    data_type: DataType
    shape: tuple[int, ...]
    direction: TensorDirection = TensorDirection.INPUT
    tensor_type: TensorType = TensorType.HW
    memory_layout: MemoryLayout = MemoryLayout.UNKNOWN
    memory_layout_order: tuple[int, ...] = ()
    strides: tuple[int, ...] = field(default=())
    size: int = -1
    size_in_bytes: int = -1
    # Runners look plans up by the infos of the tensors they are given: hash once, not on every lookup.
    _hash: int = field(default=0, init=False, repr=False, compare=False)
    # replace(shape=...) results by shape: apps and runners ask for the same few shapes on every call
    _reshaped: dict[tuple[int, ...], NpuTensorInfo] = field(default_factory=dict, init=False, repr=False,
                                                            compare=False)

    def __post_init__(self) -> None:
        setattr_ = object.__setattr__
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"NpuTensorInfo.name must be a non-empty string, got {self.name!r}")
        # (members as given are the common case: runners make several infos per port at load)
        for name, enum_cls in _INFO_ENUMS:
            value = getattr(self, name)
            if type(value) is not enum_cls:
                setattr_(self, name, enum_member(enum_cls, value, f"tensor {self.name!r} {name}"))
        try:
            shape = tuple(map(int, self.shape))
        except (TypeError, ValueError):
            raise ValueError(f"tensor {self.name!r}: shape must be a sequence of ints, got {self.shape!r}") from None
        if shape and min(shape) < DYNAMIC_DIM:
            raise ValueError(f"tensor {self.name!r}: shape {shape} has a negative dimension "
                             f"({DYNAMIC_DIM} marks a dynamic one)")
        setattr_(self, "shape", shape)
        order = tuple(map(int, self.memory_layout_order))
        if order and sorted(order) != list(range(len(shape))):
            raise ValueError(
                f"tensor {self.name!r}: memory_layout_order {order} is not a permutation of {len(shape)} dims"
            )
        setattr_(self, "memory_layout_order", order)
        if self.data_type is DataType.UNKNOWN:
            raise ValueError(f"tensor {self.name!r}: data_type UNKNOWN has no size")
        if DYNAMIC_DIM in shape:
            if self.strides or self.size not in (-1,) or self.size_in_bytes not in (-1,):
                raise ValueError(f"tensor {self.name!r}: shape {list(shape)} has dynamic dims; strides and sizes "
                                 "belong to a concrete shape")
            setattr_(self, "strides", ())
        else:
            self._derive_sizes(shape)
        setattr_(self, "_hash", self._fields_hash())

    def _fields_hash(self) -> int:
        return hash((self.name, self.data_type, self.shape, self.direction, self.tensor_type, self.memory_layout,
                     self.memory_layout_order, self.strides, self.size, self.size_in_bytes))

    def _derive_sizes(self, shape: tuple[int, ...]) -> None:
        setattr_ = object.__setattr__
        strides = tuple(int(s) for s in self.strides) if self.strides else contiguous_strides(shape)
        if len(strides) != len(shape):
            raise ValueError(f"tensor {self.name!r}: {len(strides)} strides for a {len(shape)}-d shape {shape}")
        if any(s < 0 for s in strides):
            raise ValueError(f"tensor {self.name!r}: negative strides {strides} are not supported")
        setattr_(self, "strides", strides)
        size = math.prod(shape)
        if self.size not in (-1, size):
            raise ValueError(f"tensor {self.name!r}: size {self.size} does not match shape {shape} ({size})")
        setattr_(self, "size", size)
        span = 0 if size == 0 else (sum((d - 1) * s for d, s in zip(shape, strides)) + 1)
        need = span * self.data_type.itemsize
        if self.size_in_bytes == -1:
            setattr_(self, "size_in_bytes", need)
        elif self.size_in_bytes < need:
            raise ValueError(
                f"tensor {self.name!r}: size_in_bytes {self.size_in_bytes} is smaller than the {need} bytes "
                f"that shape {shape} with strides {strides} spans"
            )

    def __hash__(self) -> int:
        return self._hash

    @property
    def is_static(self) -> bool:
        """Whether every dim is known (the info can describe memory)."""
        return DYNAMIC_DIM not in self.shape

    @property
    def is_contiguous(self) -> bool:
        """Whether the strides are row-major with no padding."""
        return self.strides == contiguous_strides(self.shape)

    @property
    def numpy_dtype(self) -> np.dtype:
        """``data_type.numpy``: the numpy dtype that holds the elements (BF16 as uint16)."""
        return self.data_type.numpy

    @classmethod
    def of_port(cls, name: str, data_type: DataType, shape: tuple[int, ...], direction: TensorDirection,
                memory_layout: MemoryLayout) -> NpuTensorInfo:
        """A port's CPU view from parts a runner has checked already (a non-empty name, members of the enums, a
        shape of ints >= DYNAMIC_DIM, a known data type): the info the constructor makes, contiguous, without
        checking it again (a load makes one per port; ``PortFactory.make``)."""
        if not name or data_type is DataType.UNKNOWN:  # (what a malformed model may still say)
            return cls(name=name, data_type=data_type, shape=shape, direction=direction, tensor_type=TensorType.CPU,
                       memory_layout=memory_layout)  # (raises, naming it)
        info: NpuTensorInfo = object.__new__(cls)
        static = DYNAMIC_DIM not in shape
        size = math.prod(shape) if static else -1
        info.__dict__.update(
            name=name, data_type=data_type, shape=shape, direction=direction, tensor_type=TensorType.CPU,
            memory_layout=memory_layout, memory_layout_order=(), strides=contiguous_strides(shape) if static else (),
            size=size, size_in_bytes=size * data_type.itemsize if static else -1, _reshaped={})
        object.__setattr__(info, "_hash", info._fields_hash())
        return info

    def in_view(self, tensor_type: TensorType) -> NpuTensorInfo:
        """This tensor in the other view where nothing else differs (layout, type and shape alike: a device whose
        views are the model's own). A copy of this validated info with its tensor type changed, which no derived
        field depends on: not validated again (a runner makes one per port at load)."""
        if tensor_type is self.tensor_type:
            return self
        info: NpuTensorInfo = object.__new__(NpuTensorInfo)
        info.__dict__.update(self.__dict__)
        setattr_ = object.__setattr__
        setattr_(info, "tensor_type", tensor_type)
        setattr_(info, "_reshaped", {})
        setattr_(info, "_hash", info._fields_hash())
        return info

    def replace(self, **changes: Any) -> NpuTensorInfo:
        """A copy with some fields changed; derived fields are derived again unless given."""
        shape = changes.get("shape")
        if type(shape) is tuple and len(changes) == 1:
            known = self._reshaped.get(shape)
            if known is not None:
                return known
        kw: dict[str, Any] = {
            "name": self.name,
            "data_type": self.data_type,
            "shape": self.shape,
            "direction": self.direction,
            "tensor_type": self.tensor_type,
            "memory_layout": self.memory_layout,
            "memory_layout_order": self.memory_layout_order,
        }
        if not ({"shape", "data_type"} & changes.keys()):
            kw.update(strides=self.strides, size_in_bytes=self.size_in_bytes)
        kw.update(changes)
        info = NpuTensorInfo(**kw)
        if type(shape) is tuple and len(changes) == 1 and len(self._reshaped) < 16:
            self._reshaped[shape] = info
        return info

    def require_static(self, what: str = "") -> None:
        """Raise ValueError naming the dynamic dims, for operations that need a concrete shape."""
        if not self.is_static:
            dims = ", ".join(str(i) for i, d in enumerate(self.shape) if d == DYNAMIC_DIM)
            raise ValueError(f"tensor {self.name!r}: shape {list(self.shape)} has dynamic dims ({dims}); "
                             f"{what or 'this needs a concrete shape'}: use info.replace(shape=...) with the shape "
                             "you will feed")

    def describe(self) -> str:
        """One line: view, shape (? for a dynamic dim), dtype and layout, e.g. ``CPU [?, 1, 8, 8] FLOAT32 NCHW``."""
        layout = self.memory_layout.name
        if self.memory_layout is MemoryLayout.GENERIC and self.memory_layout_order:
            layout += str(list(self.memory_layout_order))
        shape = "[" + ", ".join("?" if d == DYNAMIC_DIM else str(d) for d in self.shape) + "]"
        return f"{self.tensor_type.name} {shape} {self.data_type.name} {layout}"


@dataclass(frozen=True)
class QuantParameters:
    """The scale and zero point of a quantized tensor: real value = (q - zero_point) * scale. Immutable.

    ValueError unless ``scale`` is a positive finite number; ``rounding_mode`` takes a member, name or value."""

    scale: float
    zero_point: int
    rounding_mode: RoundingMode = RoundingMode.ROUND_TO_NEAREST_EVEN

    def __post_init__(self) -> None:
        if not (isinstance(self.scale, (int, float)) and math.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"QuantParameters.scale must be a positive finite number, got {self.scale!r}")
        object.__setattr__(self, "scale", float(self.scale))
        object.__setattr__(self, "zero_point", int(self.zero_point))
        object.__setattr__(self, "rounding_mode", enum_member(RoundingMode, self.rounding_mode, "rounding_mode"))


@dataclass(frozen=True)
class JobHandle:
    """What execute_async and wait_any return: a status and a job id. Job ids start at 1; 0 is never a valid job
    (a refused submission has job id 0)."""

    status: StatusCode
    job_id: int


def job_handle(status: StatusCode, job_id: int, _new: Any = object.__new__) -> JobHandle:
    """``JobHandle(status, job_id)``, the same object, made without the frozen dataclass's ``__init__`` (whose two
    ``object.__setattr__`` calls cost ~0.2 us on every submission)."""
    handle: JobHandle = _new(JobHandle)
    fields = handle.__dict__
    fields["status"] = status
    fields["job_id"] = job_id
    return handle


@dataclass(frozen=True)
class NodePlacement:
    """Where one node of the model runs (``Runner.placement``): its name (the model's, or the engine's name of a node
    it made, such as a fusion; an unnamed ONNX node is named by its first output), its operator, the device or
    provider that runs it (an ONNX Runtime EP name, or an OpenVINO device), and why it is not on the device asked for,
    where the engine says (None where it is)."""

    node: str
    op_type: str
    device: str
    reason: str | None = None


@dataclass(frozen=True)
class DeviceInfo:
    """Where a runner runs, and why there (``Runner.device_info``; immutable).

    The device requested and attached, the engine and its version, whether it fell back and why, the devices AUTO
    skipped and why, which provider took how many nodes, whose HW view is in force (``hw_view``), the shape mode
    (``shape_mode``), what npurt set on the engine (``engine_settings``) and what the load did (``load_steps``,
    milliseconds)."""

    requested: str
    attached: str
    engine: str
    engine_version: str
    fell_back: bool = False
    reason: str = ""
    skipped: tuple[tuple[str, str], ...] = ()  # (device, why it was not taken)
    full_name: str = ""
    placement: tuple[tuple[str, int], ...] = ()  # (engine provider, node count), where the engine says
    hw_view: str = "device"  # whose view HW ports take: the attached device's, or the NPU's (option hw_view)
    shape_mode: str = "static"  # "dynamic": one engine runs every input shape; "static": one engine per shape
    engine_settings: tuple[tuple[str, str], ...] = ()  # what npurt set on the engine (threads, hint, streams)
    load_steps: tuple[tuple[str, float], ...] = ()  # (step, milliseconds) of the load, e.g. compiled or from cache

    def summary(self) -> str:
        """One line: engine, version and device, the fallback and its reason, the node placement."""
        s = f"{self.engine} {self.engine_version} on {self.attached}"
        if self.full_name:
            s += f" ({self.full_name})"
        if self.fell_back:
            s += f" [asked for {self.requested}; fell back: {self.reason}]"
        if self.placement:
            s += "; nodes: " + ", ".join(f"{p}: {n}" for p, n in self.placement)
        return s


@dataclass(frozen=True)
class DecoderFacts:
    """What a Generator needs of a decoder runner (option ``decoder``: ``Runner.decoder``), and what ``npurt info``
    shows. Made by ``npurt.generate.model.prepare``."""

    max_length: int
    prefill_chunk: int
    vocab_size: int
    layers: int
    kv_heads: int
    head_dim: int
    context_length: int | None
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    pad_token_id: int
    pinned: bool  # the prefill chunk and the step are two static shapes (else the sequence dim is open)
    cache: str  # where the cache lives: "stream buffers, written in place" or "OpenVINO state"
    config: str | None  # the genai_config.json read, where there was one
    contrib_ops: tuple[str, ...] = field(default=())  # com.microsoft operators the model uses
    attention: str = "concat"  # how the export's cache is made (generate.layout.CONCAT, GROUP_QUERY)
    verification: str = ""  # how the derived form was checked against the export (generate.verify)
    batch: tuple[int, ...] = ()  # the batch sizes of batched steps (the batch form; npurt.generate.batch)

    def describe(self) -> dict[str, Any]:
        return {"max_length": self.max_length, "prefill_chunk": self.prefill_chunk, "vocab_size": self.vocab_size,
                "layers": self.layers, "kv_heads": self.kv_heads, "head_dim": self.head_dim,
                "context_length": self.context_length, "eos_token_ids": list(self.eos_token_ids),
                "bos_token_id": self.bos_token_id, "shapes": "prefill chunk and step pinned" if self.pinned
                else "sequence dim open (one compiled model)", "cache": self.cache, "genai_config": self.config,
                "contrib_ops": list(self.contrib_ops), "attention": self.attention,
                "verification": self.verification, **({"batch": list(self.batch)} if self.batch else {})}
