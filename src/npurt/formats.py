"""Views: which layout / dtype / quantization each target's HW view uses, how a view lays a tensor out, and
conversion between views. The one owner of layout rules: ``ViewLayout`` (how a view stores the logical tensor)
and ``ViewMap`` (a port's CPU view to its HW view) are what the numpy reference, the native kernels, OpenVINO's
PrePostProcessor and the ONNX graph edits all build their conversions from.

The NPU's view rules (docs/api.md, "HW views"); on CPU and GPU the HW view is the CPU view:

| target   | 4-D float                          | other float       | int       | QDQ boundary             |
|----------|------------------------------------|-------------------|-----------|--------------------------|
| OPENVINO | NHWC, FP16                         | same layout, FP16 | unchanged | quantized int8/uint8/uint16 |
| VAIML    | HCWNC4, BF16, channels padded to 4 | same layout, BF16 | unchanged | quantized int8/uint8/uint16 |
| QNN      | the model's layout, FP16           | same layout, FP16 | unchanged | quantized uint8/uint16      |
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from . import _native
from .options import HwFormat
from .tensor import NpuTensor
from .types import DataType, MemoryLayout, NpuTensorInfo, QuantParameters, RoundingMode, TensorType, contiguous_strides

FLOAT_TYPES = (DataType.FLOAT32, DataType.FP16, DataType.BF16)
# The quantized views: (de)quantized with QuantParameters to and from the float types (a QDQ boundary's HW view).
QUANTIZED_TYPES = frozenset({DataType.INT8, DataType.UINT8, DataType.UINT16})
TARGET_FLOAT_TYPE = {"OPENVINO": DataType.FP16, "VAIML": DataType.BF16, "QNN": DataType.FP16}
# The HTP (QNN) takes the model's own layout at its boundary: its compiler lays tensors out inside the graph.
TARGET_4D_LAYOUT = {"OPENVINO": MemoryLayout.NHWC, "VAIML": MemoryLayout.HCWNC4}
CHANNEL_GROUP = {MemoryLayout.HCWNC4: 4, MemoryLayout.HCWNC8: 8, MemoryLayout.HCWNC16: 16}
# Axis permutations from the logical NCHW tensor (for HCWNCk: the [N, C/k, k, H, W] split of it).
_PERMUTATION = {
    MemoryLayout.NCHW: (0, 1, 2, 3),
    MemoryLayout.NHWC: (0, 2, 3, 1),
}
_HCWNC_PERMUTATION = (3, 1, 4, 0, 2)  # [N, C/k, k, H, W] -> [H, C/k, W, N, k]


def default_layout(rank: int) -> MemoryLayout:
    """The layout name of a CPU (ONNX) tensor of this rank."""
    return {2: MemoryLayout.NC, 3: MemoryLayout.NHW, 4: MemoryLayout.NCHW}.get(rank, MemoryLayout.UNKNOWN)


@dataclass(frozen=True)
class ViewLayout:
    """How a view stores a tensor, relative to its logical axes (the CPU view's: the model's own order).

    ``group``: a channel group of k lanes (0: none): the logical [N, C, H, W] is split into [N, C/k, k, H, W], C
    padded with zeros up to a multiple of k. ``perm``: view axis i holds axis ``perm[i]`` of the logical tensor (of
    its split when grouped).
    """

    group: int
    perm: tuple[int, ...]

    @classmethod
    def of(cls, layout: MemoryLayout, rank: int, order: tuple[int, ...] = ()) -> ViewLayout:
        if layout in CHANNEL_GROUP:
            if rank != 4:
                raise ValueError(f"{layout.name} needs a 4-D tensor, got rank {rank}")
            return cls(CHANNEL_GROUP[layout], _HCWNC_PERMUTATION)
        if layout is MemoryLayout.GENERIC and order:
            return cls(0, tuple(order))
        perm = _PERMUTATION.get(layout)
        return cls(0, perm if perm is not None and rank == 4 else tuple(range(rank)))

    @classmethod
    def of_info(cls, info: NpuTensorInfo) -> ViewLayout:
        return cls.of(info.memory_layout, len(info.shape) if info.memory_layout not in CHANNEL_GROUP else 4,
                      info.memory_layout_order)

    @property
    def is_identity(self) -> bool:
        return not self.group and self.perm == tuple(range(len(self.perm)))

    def split(self, logical: tuple[int, ...]) -> tuple[int, ...]:
        """The logical shape as the view's axes index it: split [N, C/k, k, H, W] when grouped."""
        if not self.group:
            return tuple(logical)
        n, c, h, w = logical
        return (n, -1 if c < 0 else math.ceil(c / self.group), self.group, h, w)

    def shape(self, logical: tuple[int, ...]) -> tuple[int, ...]:
        """The view's shape of a tensor of logical shape ``logical`` (a dynamic dim stays dynamic)."""
        split = self.split(logical)
        return tuple(split[i] for i in self.perm)

    def to_view(self, x: np.ndarray) -> np.ndarray:
        """A logical array as the view lays it out (numpy reference)."""
        if self.group:
            n, c, h, w = x.shape
            k = self.group
            cp = math.ceil(c / k) * k
            if cp != c:
                x = np.concatenate([x, np.zeros((n, cp - c, h, w), x.dtype)], axis=1)
            x = x.reshape(n, cp // k, k, h, w)
        view: np.ndarray = x.transpose(self.perm)
        return view

    def to_logical(self, a: np.ndarray, logical: tuple[int, ...]) -> np.ndarray:
        """A view's array in logical order (numpy reference): padding lanes dropped."""
        x: np.ndarray = a.transpose(np.argsort(self.perm))
        if self.group:
            n, c, h, w = logical
            x = x.reshape(n, -1, h, w)[:, :c]
        return x

    def strides(self, info: NpuTensorInfo) -> list[int]:
        """Element strides of the logical axes (of the split when grouped) in a view's memory (native kernels)."""
        strides = [0] * len(self.perm)
        for view_axis, axis in enumerate(self.perm):
            strides[axis] = info.strides[view_axis]
        return strides


@dataclass(frozen=True)
class ViewMap:
    """A port's map from its CPU view (the logical tensor) to its HW view: the layout and the element types."""

    layout: ViewLayout
    cpu_type: DataType
    hw_type: DataType
    logical: tuple[int, ...]

    @classmethod
    def of(cls, cpu: NpuTensorInfo, hw: NpuTensorInfo) -> ViewMap:
        if not ViewLayout.of_info(cpu).is_identity:
            raise ValueError(f"tensor {cpu.name!r}: a CPU view is in the model's own order, got {cpu.describe()}")
        return cls(ViewLayout.of_info(hw), cpu.data_type, hw.data_type, cpu.shape)

    @property
    def converts(self) -> bool:
        return not self.layout.is_identity or self.cpu_type is not self.hw_type


def layout_shape(logical: tuple[int, ...], layout: MemoryLayout, order: tuple[int, ...] = ()) -> tuple[int, ...]:
    """The shape of a tensor of logical (CPU) shape ``logical`` stored in ``layout``."""
    return ViewLayout.of(layout, len(logical), order).shape(logical)


def hw_view(cpu: NpuTensorInfo, target: str, *, quant_data_type: DataType | None = None,
            override: HwFormat | None = None) -> NpuTensorInfo:
    """The HW view of a CPU-view tensor on ``target`` (the target, not the device a fallback attached)."""
    layout = cpu.memory_layout
    dtype = cpu.data_type
    if quant_data_type is not None:
        dtype = quant_data_type
    elif cpu.data_type in FLOAT_TYPES and target in TARGET_FLOAT_TYPE:
        dtype = TARGET_FLOAT_TYPE[target]
        if len(cpu.shape) == 4:
            layout = TARGET_4D_LAYOUT.get(target, layout)
    if override is not None:
        layout = override.memory_layout if override.memory_layout is not None else layout
        dtype = override.data_type if override.data_type is not None else dtype
    if layout == cpu.memory_layout or layout is MemoryLayout.UNKNOWN:  # (a frame port's CPU view is NHWC already)
        if dtype is cpu.data_type and layout is cpu.memory_layout and not cpu.memory_layout_order and \
                (not cpu.strides or cpu.strides == contiguous_strides(cpu.shape)):  # the model's own view
            return cpu.in_view(TensorType.HW)
        shape = cpu.shape
    elif layout in CHANNEL_GROUP or (layout in _PERMUTATION and len(cpu.shape) == 4):
        shape = layout_shape(cpu.shape, layout)
    else:
        raise ValueError(f"tensor {cpu.name!r}: layout {layout.name} does not apply to shape {list(cpu.shape)}")
    return NpuTensorInfo(name=cpu.name, data_type=dtype, shape=shape, direction=cpu.direction,
                         tensor_type=TensorType.HW, memory_layout=layout)


# -- conversion (numpy reference path; the native kernels replace it where they apply) --------------
def _to_float32(a: np.ndarray, dtype: DataType, quant: QuantParameters | None) -> np.ndarray:
    if dtype is DataType.BF16:
        return (a.astype(np.uint32) << 16).view(np.float32)
    if dtype in QUANTIZED_TYPES and quant is not None:
        dequantized: np.ndarray = (a.astype(np.float32) - np.float32(quant.zero_point)) * np.float32(quant.scale)
        return dequantized.astype(np.float32)
    return a.astype(np.float32)


def _from_float32(x: np.ndarray, dtype: DataType, quant: QuantParameters | None) -> np.ndarray:
    if dtype is DataType.BF16:
        bits = x.astype(np.float32).view(np.uint32)
        rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
        nan = np.isnan(x)
        out: np.ndarray = rounded.astype(np.uint16)
        out[nan] = ((bits[nan] >> 16) | np.uint32(0x0040)).astype(np.uint16)  # keep NaN a (quiet) NaN
        return out
    if dtype in QUANTIZED_TYPES and quant is not None:
        info = np.iinfo(dtype.numpy)
        q = x / np.float32(quant.scale)
        q = np.trunc(q) if quant.rounding_mode is RoundingMode.ROUND_TOWARD_ZERO else np.rint(q)
        quantized: np.ndarray = np.clip(q + quant.zero_point, info.min, info.max)
        return quantized.astype(dtype.numpy)
    return x.astype(dtype.numpy)


def _logical_shape(src: NpuTensorInfo, dst: NpuTensorInfo) -> tuple[int, ...]:
    """The logical shape two views of one tensor share (from a view that is not channel-grouped, if any)."""
    for info in (src, dst):
        layout = ViewLayout.of_info(info)
        if not layout.group:
            return tuple(info.shape[i] for i in np.argsort(layout.perm))
    h, cg, w, n, k = src.shape  # both grouped: the padded channels are part of the tensor
    return (n, cg * k, h, w)


def _view_to_logical(a: np.ndarray, info: NpuTensorInfo, logical: tuple[int, ...]) -> np.ndarray:
    return ViewLayout.of_info(info).to_logical(a, logical)


def _logical_to_view(x: np.ndarray, info: NpuTensorInfo) -> np.ndarray:
    return ViewLayout.of_info(info).to_view(x)


# -- native path ------------------------------------------------------------------------------------------
# npurt's enums -> the native kernels' (same member names). Every type they know can be copied; _NATIVE_KINDS also
# converted. A type they do not know (FLOAT64, CPU views only) takes the numpy path.
_NATIVE_TYPES = {t: _native.ElementType.__members__[t.name] for t in DataType
                 if t.name in _native.ElementType.__members__}
_NATIVE_ROUNDING: dict[RoundingMode, _native.Rounding] = {
    m: _native.Rounding.__members__[m.name] for m in RoundingMode if m is not RoundingMode.UNKNOWN}
_NATIVE_KINDS = frozenset(t for t, native in _NATIVE_TYPES.items() if native in _native.CONVERTIBLE_TYPES)


def _logical_strides(info: NpuTensorInfo, rank: int) -> list[int]:
    """Element strides of the logical (CPU-order) axes of a non-grouped view."""
    return ViewLayout.of(info.memory_layout, rank, info.memory_layout_order).strides(info)


def _grouped_strides(info: NpuTensorInfo) -> list[int]:
    """Element strides of the split axes [N, C/k, k, H, W] of an HCWNCk view [H, C/k, W, N, k]."""
    return ViewLayout.of_info(info).strides(info)


def native_plan(s: NpuTensorInfo, d: NpuTensorInfo, logical: tuple[int, ...]
                ) -> tuple[list[int], list[int], list[int], _native.ChannelPadding | None] | None:
    """The iteration space of a conversion for the native kernels: (shape, src strides, dst strides, pad).

    None where no native kernel applies (then the numpy path runs).
    """
    if s.data_type not in _NATIVE_TYPES or d.data_type not in _NATIVE_TYPES:
        return None
    if s.data_type != d.data_type and not (s.data_type in _NATIVE_KINDS and d.data_type in _NATIVE_KINDS):
        return None
    sk, dk = CHANNEL_GROUP.get(s.memory_layout), CHANNEL_GROUP.get(d.memory_layout)
    if sk is not None and dk is not None:
        if sk != dk:
            return None
        h, cg, w, n, k = s.shape
        return [n, cg, k, h, w], _grouped_strides(s), _grouped_strides(d), None
    if sk is None and dk is None:
        return list(logical), _logical_strides(s, len(logical)), _logical_strides(d, len(logical)), None
    group = sk if sk is not None else dk
    if group is None:  # unreachable (one side is grouped): tells the type checker so
        return None
    k = group
    n, c, h, w = logical
    grouped, plain = (s, d) if sk else (d, s)
    ps = _logical_strides(plain, 4)
    plain_split = [ps[0], ps[1] * k, ps[1], ps[2], ps[3]]
    cg = -(-c // k)
    shape = [n, cg, k, h, w]
    pad = None if c == cg * k else _native.ChannelPadding(group_axis=1, lane_axis=2, channels=c, group_size=k,
                                                          dst_padded=dk is not None)
    if sk:
        return shape, _grouped_strides(grouped), plain_split, pad
    return shape, plain_split, _grouped_strides(grouped), pad


def convert(src: NpuTensor, dst: NpuTensor, *, quant: QuantParameters | None = None) -> None:
    """Convert ``src`` into ``dst``: two views of the same logical tensor (layout, dtype, quantization).

    ``quant`` gives the scale and zero point where one side is the quantized view of a float tensor
    (for a decoder's uint8 frame into a float tensor, ``QuantParameters(scale=1/255, zero_point=0)``
    computes ``(x - zero_point) * scale``). Runs in the native kernels (one pass, no temporaries, GIL
    released); a numpy path covers what they do not (for example INT32 -> FLOAT32). One copy: into ``dst``'s
    memory; ``src`` is only read.

    Raises ValueError for arguments that are not NpuTensors, a read-only ``dst``, infos that are not two views of
    one tensor, a conversion between quantized and float types without ``quant``, or rounding mode UNKNOWN.
    """
    if not isinstance(src, NpuTensor) or not isinstance(dst, NpuTensor):
        raise ValueError("convert() takes two NpuTensors")
    if quant is not None and not isinstance(quant, QuantParameters):
        raise ValueError(f"convert(): quant must be QuantParameters or None, got {type(quant).__name__}")
    if not dst.writable:
        raise ValueError(f"convert(): destination {dst.info.name!r} is read-only")
    s, d = src.info, dst.info
    if (s.data_type in QUANTIZED_TYPES) != (d.data_type in QUANTIZED_TYPES) and quant is None:
        raise ValueError(f"convert(): {s.data_type.name} -> {d.data_type.name} needs QuantParameters")
    plan = _checked_plan(s, d)
    if plan is not None:
        shape, src_strides, dst_strides, pad = plan
        q = quant or _NO_QUANT
        rounding = _NATIVE_ROUNDING.get(q.rounding_mode)
        if rounding is None:
            raise ValueError(f"convert(): rounding mode {q.rounding_mode.name} is neither ROUND_TO_NEAREST_EVEN nor "
                             "ROUND_TOWARD_ZERO")
        _native.convert_strided(src.raw_bytes(), _NATIVE_TYPES[s.data_type], dst.raw_bytes(),
                                _NATIVE_TYPES[d.data_type], shape, src_strides, dst_strides, q.scale,
                                float(q.zero_point), rounding, pad)
        return
    convert_reference(src, dst, quant=quant)


_NO_QUANT = QuantParameters(1.0, 0)


@functools.lru_cache(maxsize=256)
def _checked_plan(s: NpuTensorInfo, d: NpuTensorInfo
                  ) -> tuple[list[int], list[int], list[int], _native.ChannelPadding | None] | None:
    """Check that ``s`` and ``d`` are views of one tensor; the native plan (cached: runners convert the same
    pair of views on every call)."""
    logical = _logical_shape(s, d)
    if layout_shape(logical, s.memory_layout, s.memory_layout_order) != s.shape or \
            layout_shape(logical, d.memory_layout, d.memory_layout_order) != d.shape:
        raise ValueError(f"convert(): {s.name!r} {s.describe()} and {d.name!r} {d.describe()} are not views of "
                         "the same tensor")
    return native_plan(s, d, logical)


def convert_reference(src: NpuTensor, dst: NpuTensor, *, quant: QuantParameters | None = None) -> None:
    """The numpy reference of ``convert`` (the tests check the native kernels against it, bit for bit)."""
    s, d = src.info, dst.info
    logical = _logical_shape(s, d)
    x = _view_to_logical(src.numpy(), s, logical)
    if s.data_type != d.data_type:
        x = _from_float32(_to_float32(x, s.data_type, quant), d.data_type, quant)
    np.copyto(dst.numpy(), _logical_to_view(x, d))
