"""HW views and npurt.convert between views: the native path against the numpy reference, bit for bit."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import npurt
from npurt import (
    DataType,
    MemoryLayout,
    MemoryType,
    NpuTensor,
    NpuTensorInfo,
    QuantParameters,
    RoundingMode,
    TensorType,
    formats,
)
from npurt.formats import _from_float32

D, L = DataType, MemoryLayout
FLOATS = (D.FLOAT32, D.FP16, D.BF16)
LAYOUTS = (L.NCHW, L.NHWC, L.HCWNC4, L.HCWNC8, L.HCWNC16, L.GENERIC)


def make(logical: tuple[int, ...], layout: MemoryLayout, dtype: DataType, order: tuple[int, ...] = (),
         fill: int | None = None, strides: tuple[int, ...] = ()) -> NpuTensor:
    shape = formats.layout_shape(logical, layout, order)
    info = NpuTensorInfo(name="t", data_type=dtype, shape=shape, tensor_type=TensorType.CPU, memory_layout=layout,
                         memory_layout_order=order, strides=strides)
    buf = np.zeros(info.size_in_bytes, np.uint8)
    t = NpuTensor(info, buf)
    if fill is not None:
        rng = np.random.default_rng(fill)
        x = (rng.standard_normal(shape) * 3).astype(np.float32)
        if dtype in (D.INT8, D.UINT8):
            t.numpy()[...] = rng.integers(np.iinfo(dtype.numpy).min, np.iinfo(dtype.numpy).max + 1, shape)
        else:
            t.numpy()[...] = _from_float32(x, dtype, None) if dtype is D.BF16 else x.astype(dtype.numpy)
        if layout in formats.CHANNEL_GROUP:  # padding channels hold zeros, as convert() writes them
            c, k = logical[1], formats.CHANNEL_GROUP[layout]
            if c % k:
                t.numpy()[:, -1, :, :, c % k:] = 0
    return t


def check(src: NpuTensor, dst: NpuTensor, quant: QuantParameters | None = None) -> None:
    ref = NpuTensor(dst.info.replace(tensor_type=TensorType.CPU), np.zeros(dst.info.size_in_bytes, np.uint8))
    dst.raw_bytes()[...] = 0xA5  # whatever was there must not leak through (padding is written too)
    npurt.convert(src, dst, quant=quant)
    formats.convert_reference(src, ref, quant=quant)
    np.testing.assert_array_equal(dst.numpy().view(np.uint8), ref.numpy().view(np.uint8),
                                  err_msg=f"{src.info.describe()} -> {dst.info.describe()}")


@pytest.mark.parametrize("c", [1, 3, 5, 17])
def test_runner_conversions_bit_exact(c: int) -> None:
    """Each CPU <-> HW conversion of the two targets, odd channel counts and widths."""
    logical = (1, c, 5, 37)
    for target in ("OPENVINO", "VAIML"):
        cpu = NpuTensorInfo(name="t", data_type=D.FLOAT32, shape=logical, memory_layout=L.NCHW,
                            tensor_type=TensorType.CPU)
        hw = formats.hw_view(cpu, target)
        a, b = make(logical, L.NCHW, D.FLOAT32, fill=c), make(logical, hw.memory_layout, hw.data_type)
        check(a, b)
        check(b, make(logical, L.NCHW, D.FLOAT32))
        q = QuantParameters(0.02, 128)
        qhw = formats.hw_view(cpu, target, quant_data_type=D.UINT8)
        qt = make(logical, qhw.memory_layout, D.UINT8)
        check(a, qt, q)
        check(qt, make(logical, L.NCHW, D.FLOAT32), q)


def test_hw_views_of_the_design() -> None:
    cpu = NpuTensorInfo(name="img", data_type=D.FLOAT32, shape=(1, 3, 224, 224), memory_layout=L.NCHW,
                        tensor_type=TensorType.CPU)
    ov, va = formats.hw_view(cpu, "OPENVINO"), formats.hw_view(cpu, "VAIML")
    assert (ov.shape, ov.data_type, ov.memory_layout) == ((1, 224, 224, 3), D.FP16, L.NHWC)
    assert (va.shape, va.data_type, va.memory_layout) == ((224, 1, 224, 1, 4), D.BF16, L.HCWNC4)


def test_decoder_frame_to_hw_views() -> None:
    """A decoder's NHWC uint8 frame straight into a float CPU view and into both HW views."""
    logical = (1, 3, 9, 45)
    frame = make(logical, L.NHWC, D.UINT8, fill=1)
    scale = QuantParameters(1 / 255, 0)
    for layout, dtype in ((L.NCHW, D.FLOAT32), (L.NHWC, D.FP16), (L.HCWNC4, D.BF16), (L.NCHW, D.FP16)):
        check(frame, make(logical, layout, dtype), scale)
    out = make(logical, L.NCHW, D.FLOAT32)
    npurt.convert(frame, out, quant=QuantParameters(0.5, 16))  # (x - 16) * 0.5: mean and scale
    want = (frame.numpy().transpose(0, 3, 1, 2).astype(np.float32) - 16) * np.float32(0.5)
    np.testing.assert_array_equal(out.numpy(), want)


def test_round_trips_exact() -> None:
    logical = (2, 5, 4, 19)
    x = make(logical, L.NCHW, D.FLOAT32, fill=2)
    x.numpy()[...] = x.numpy().astype(np.float16)  # representable in fp16 ...
    x.numpy()[...] = formats._to_float32(_from_float32(x.numpy(), D.BF16, None), D.BF16, None)  # ... and bf16
    for layout, dtype in ((L.NHWC, D.FP16), (L.HCWNC4, D.BF16), (L.HCWNC16, D.FP16), (L.NCHW, D.BF16)):
        mid, back = make(logical, layout, dtype), make(logical, L.NCHW, D.FLOAT32)
        npurt.convert(x, mid)
        npurt.convert(mid, back)
        np.testing.assert_array_equal(back.numpy(), x.numpy())
    codes = make(logical, L.NHWC, D.INT8, fill=3)
    q = QuantParameters(0.125, -3, RoundingMode.ROUND_TOWARD_ZERO)
    f, again = make(logical, L.HCWNC8, D.FLOAT32), make(logical, L.NHWC, D.INT8)
    npurt.convert(codes, f, quant=q)
    npurt.convert(f, again, quant=q)
    np.testing.assert_array_equal(again.numpy(), codes.numpy())


def test_strided_source_and_destination() -> None:
    """Tensors whose rows are padded (NpuTensorInfo.strides) are converted in place, not refused."""
    logical = (1, 3, 6, 21)
    strides = (3 * 6 * 32, 6 * 32, 32, 1)  # rows of 32 elements, 21 used
    src = make(logical, L.NCHW, D.FLOAT32, fill=4, strides=strides)
    check(src, make(logical, L.NHWC, D.FP16))
    rows = np.full((3 * 6, 32), -1.0, np.float32)  # the whole padded block; convert fills 21 of 32 per row
    dst = NpuTensor(NpuTensorInfo(name="t", data_type=D.FLOAT32, shape=logical, tensor_type=TensorType.CPU,
                                  memory_layout=L.NCHW, strides=strides), rows)
    hw = make(logical, L.HCWNC4, D.BF16, fill=5)
    npurt.convert(hw, dst)
    ref = make(logical, L.NCHW, D.FLOAT32)
    formats.convert_reference(hw, ref)
    np.testing.assert_array_equal(dst.numpy(), ref.numpy())
    assert (rows[:, 21:] == -1.0).all()  # the row padding was not written


def test_generic_and_other_ranks() -> None:
    check(make((2, 3, 4, 5), L.NCHW, D.FLOAT32, fill=6), make((2, 3, 4, 5), L.GENERIC, D.FP16, order=(3, 1, 0, 2)))
    check(make((2, 3, 4, 5, 6), L.GENERIC, D.BF16, order=(4, 0, 3, 1, 2), fill=7),
          make((2, 3, 4, 5, 6), L.GENERIC, D.FLOAT32, order=(1, 2, 0, 4, 3)))
    check(make((7, 300), L.NC, D.FLOAT32, fill=8), make((7, 300), L.NC, D.BF16))
    check(make((3, 50, 7), L.NHW, D.FP16, fill=9), make((3, 50, 7), L.NHW, D.FLOAT32))


def test_numpy_fallback_for_other_types() -> None:
    src = make((1, 3, 4, 5), L.NCHW, D.INT32)
    src.numpy()[...] = np.arange(60).reshape(1, 3, 4, 5)
    dst = make((1, 3, 4, 5), L.NHWC, D.FLOAT32)
    assert formats.native_plan(src.info, dst.info, (1, 3, 4, 5)) is None
    npurt.convert(src, dst)
    want = np.arange(60, dtype=np.float32).reshape(1, 3, 4, 5).transpose(0, 2, 3, 1)
    np.testing.assert_array_equal(dst.numpy(), want)


def test_errors() -> None:
    a = make((1, 3, 4, 5), L.NCHW, D.FLOAT32)
    with pytest.raises(ValueError, match="not views of the same tensor"):
        npurt.convert(a, make((1, 3, 4, 6), L.NHWC, D.FP16))
    with pytest.raises(ValueError, match="needs QuantParameters"):
        npurt.convert(a, make((1, 3, 4, 5), L.NHWC, D.UINT8))
    with pytest.raises(ValueError, match="two NpuTensors"):
        npurt.convert(a, np.zeros((1, 4, 5, 3), np.float16))
    ro = np.zeros(a.info.size_in_bytes, np.uint8)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        npurt.convert(a, NpuTensor(a.info, ro))


def test_no_frame_sized_temporaries() -> None:
    src = make((1, 3, 256, 256), L.NCHW, D.FLOAT32, fill=10)
    dsts = [make((1, 3, 256, 256), layout, dtype) for layout, dtype in ((L.NHWC, D.FP16), (L.HCWNC4, D.BF16))]
    npurt.convert(src, dsts[0])
    tracemalloc.start()
    try:
        for dst in dsts:
            npurt.convert(src, dst)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024, f"convert allocated {peak} bytes for a {src.nbytes}-byte frame"


def test_hw_memory_tensor() -> None:
    """A page-aligned HW tensor (USER_POINTER_CMA) converts like any other."""
    hw_info = formats.hw_view(NpuTensorInfo(name="t", data_type=D.FLOAT32, shape=(1, 3, 8, 8), memory_layout=L.NCHW,
                                            tensor_type=TensorType.CPU), "VAIML")
    raw = np.zeros(hw_info.size_in_bytes + 8192, np.uint8)
    start = (-raw.ctypes.data) % 4096
    hw = NpuTensor(hw_info, raw[start:start + hw_info.size_in_bytes], MemoryType.USER_POINTER_CMA)
    check(make((1, 3, 8, 8), L.NCHW, D.FLOAT32, fill=11), hw)


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 18), h=st.integers(1, 4), w=st.integers(1, 40),
       layouts=st.tuples(st.sampled_from(LAYOUTS), st.sampled_from(LAYOUTS)),
       dtypes=st.tuples(st.sampled_from(FLOATS + (D.UINT8, D.INT8)), st.sampled_from(FLOATS + (D.UINT8, D.INT8))),
       order=st.permutations(range(4)), mode=st.sampled_from(list(RoundingMode)[1:]))
def test_any_view_pair_property(n: int, c: int, h: int, w: int, layouts: tuple[MemoryLayout, MemoryLayout],
                                dtypes: tuple[DataType, DataType], order: list[int], mode: RoundingMode) -> None:
    logical = (n, c, h, w)
    (sl, dl), (sd, dd) = layouts, dtypes
    if sl in formats.CHANNEL_GROUP and dl in formats.CHANNEL_GROUP and sl != dl:
        sl = L.NCHW  # two different channel groupings are not views of the same (padded) tensor
    so = tuple(order) if sl is L.GENERIC else ()
    do = tuple(reversed(order)) if dl is L.GENERIC else ()
    quant = QuantParameters(0.07, 5 if D.INT8 in dtypes else 130, mode)
    check(make(logical, sl, sd, so, fill=c * w), make(logical, dl, dd, do), quant)
