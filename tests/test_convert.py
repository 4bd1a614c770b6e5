"""The native conversion kernels (npurt._native.convert_strided) against numpy, bit for bit, on every clone."""

from __future__ import annotations

import ctypes
import mmap
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npurt import DataType, NpuTensor, NpuTensorInfo, QuantParameters, RoundingMode, TensorType, _native, convert
from npurt.formats import _from_float32, _to_float32

D = DataType
E = _native.ElementType


def native(t: DataType) -> _native.ElementType:
    return E.__members__[t.name]


def rounding(q: QuantParameters) -> _native.Rounding:
    return _native.Rounding.__members__[q.rounding_mode.name]


def padding(group_axis: int, lane_axis: int, channels: int, group_size: int, dst_padded: bool
            ) -> _native.ChannelPadding:
    return _native.ChannelPadding(group_axis=group_axis, lane_axis=lane_axis, channels=channels,
                                  group_size=group_size, dst_padded=dst_padded)


def _available_isas() -> list[str]:
    isas = []
    for name in ("avx512", "avx2", "portable"):
        try:
            _native.set_convert_isa(name)
            isas.append(name)
        except ValueError:
            pass
    _native.set_convert_isa("auto")
    return isas


ISAS = _available_isas()


@pytest.fixture(params=ISAS)
def isa(request: pytest.FixtureRequest):
    _native.set_convert_isa(request.param)
    yield request.param
    _native.set_convert_isa("auto")


def flat(src: np.ndarray, src_type: DataType, dst_type: DataType, quant: QuantParameters | None = None
         ) -> np.ndarray:
    """Element-wise conversion of a contiguous 1-D array through the kernels."""
    out = np.empty(src.size, dst_type.numpy)
    q = quant or QuantParameters(1.0, 0)
    _native.convert_strided(src, native(src_type), out, native(dst_type), [src.size], [1], [1], q.scale,
                            float(q.zero_point), rounding(q))
    return out


def permute(src: np.ndarray, src_type: DataType, dst_type: DataType, perm: tuple[int, ...],
            quant: QuantParameters | None = None) -> np.ndarray:
    """``src.transpose(perm)`` converted to ``dst_type``, through the kernels."""
    out_shape = tuple(src.shape[p] for p in perm)
    out = np.empty(out_shape, dst_type.numpy)
    src_strides = [s // src.itemsize for s in src.strides]
    dst_strides = [0] * src.ndim
    for out_axis, p in enumerate(perm):
        dst_strides[p] = out.strides[out_axis] // out.itemsize
    q = quant or QuantParameters(1.0, 0)
    _native.convert_strided(src, native(src_type), out, native(dst_type), list(src.shape), src_strides, dst_strides,
                            q.scale, float(q.zero_point), rounding(q))
    return out


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and \
        np.array_equal(np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))


SPECIALS = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, -np.nan, 65504.0, 65519.996, 65520.0, -65520.0,
                     1e10, 6.1035156e-05, 6.097555e-05, 5.9604645e-08, 2.9802322e-08, 2.9802326e-08, 1e-45, -1e-45,
                     1.17549435e-38, 3.4028235e38, 2049.0, 2051.0, 0.1, 1 / 3], np.float32)


def _random_f32_bits(n: int, seed: int) -> np.ndarray:
    """Random float32 bit patterns (all exponents, NaNs included), plus the special values."""
    bits = np.random.default_rng(seed).integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([SPECIALS, bits.view(np.float32)])


# ---------------------------------------------------------------- float16
def test_fp16_to_fp32_all_patterns(isa: str) -> None:
    halves = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    got, want = flat(halves, D.FP16, D.FLOAT32), halves.astype(np.float32)
    nan = np.isnan(want)
    assert same_bits(got[~nan], want[~nan])
    assert np.isnan(got[nan]).all() and np.array_equal(np.signbit(got[nan]), np.signbit(want[nan]))
    quiet = nan & ((halves.view(np.uint16) & 0x0200) != 0)  # quiet NaNs keep their payload bits
    assert same_bits(got[quiet], want[quiet])


def test_fp32_to_fp16_round_to_nearest_even(isa: str) -> None:
    x = _random_f32_bits(200_000, seed=1)
    x = np.concatenate([x, np.random.default_rng(2).uniform(-70000, 70000, 100_000).astype(np.float32),
                        (np.random.default_rng(3).standard_normal(100_000) * 1e-5).astype(np.float32)])
    with np.errstate(over="ignore"):
        got, want = flat(x, D.FLOAT32, D.FP16), x.astype(np.float16)
    nan = np.isnan(x)
    assert same_bits(got[~nan], want[~nan])
    assert np.isnan(got[nan]).all()
    assert same_bits(got[np.isnan(x) & ((x.view(np.uint32) & 0x400000) != 0)],  # quiet NaN: payload kept
                     want[np.isnan(x) & ((x.view(np.uint32) & 0x400000) != 0)])
    assert np.isinf(flat(np.array([65520.0, -1e6], np.float32), D.FLOAT32, D.FP16)).all()  # overflow -> inf


def test_fp16_round_trip_exact(isa: str) -> None:
    halves = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    halves = halves[~np.isnan(halves)]
    assert same_bits(flat(flat(halves, D.FP16, D.FLOAT32), D.FLOAT32, D.FP16), halves)


# ---------------------------------------------------------------- bfloat16
def test_fp32_to_bf16(isa: str) -> None:
    x = _random_f32_bits(300_000, seed=4)
    got = flat(x, D.FLOAT32, D.BF16)
    assert same_bits(got, _from_float32(x, D.BF16, None))
    assert np.isnan(_to_float32(got[np.isnan(x)], D.BF16, None)).all()  # NaN stays NaN, even 0x7f800001


def test_bf16_to_fp32_all_patterns_and_round_trip(isa: str) -> None:
    b = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    got = flat(b, D.BF16, D.FLOAT32)
    assert same_bits(got, (b.astype(np.uint32) << 16).view(np.float32))
    finite = ~np.isnan(got)
    assert same_bits(flat(got[finite], D.FLOAT32, D.BF16), b[finite])


def test_fp16_bf16_cross(isa: str) -> None:
    halves = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    want = _from_float32(halves.astype(np.float32), D.BF16, None)
    got = flat(halves, D.FP16, D.BF16)
    nan = np.isnan(halves)
    assert same_bits(got[~nan], want[~nan])


# ---------------------------------------------------------------- quantization
ZERO_POINTS = {D.INT8: -7, D.UINT8: 121, D.UINT16: 30_001}


@pytest.mark.parametrize("dtype", [D.INT8, D.UINT8, D.UINT16])
@pytest.mark.parametrize("mode", [RoundingMode.ROUND_TO_NEAREST_EVEN, RoundingMode.ROUND_TOWARD_ZERO])
def test_quantize(isa: str, dtype: DataType, mode: RoundingMode) -> None:
    quant = QuantParameters(0.05, ZERO_POINTS[dtype], mode)
    rng = np.random.default_rng(5)
    ties = (np.arange(-300, 300, dtype=np.float32) + np.float32(0.5)) * np.float32(0.05)  # x / scale on .5
    span = 20 if dtype is not D.UINT16 else 2000  # uint16 codes: 0..65535
    x = np.concatenate([rng.uniform(-span, span, 50_000).astype(np.float32), ties,
                        np.array([0.0, -0.0, 1e9, -1e9, np.inf, -np.inf, 6.35, -6.4, 0.025, -0.025], np.float32)])
    got = flat(x, D.FLOAT32, dtype, quant)
    assert same_bits(got, _from_float32(x, dtype, quant))
    info = np.iinfo(dtype.numpy)
    assert list(got[-8:-4]) == [info.max, info.min, info.max, info.min]  # +-1e9 and +-inf saturate
    # NaN saturates to the lowest code, as ONNX Runtime's MLAS kernels do
    assert flat(np.array([np.nan], np.float32), D.FLOAT32, dtype, quant)[0] == info.min


@pytest.mark.parametrize("dtype", [D.INT8, D.UINT8, D.UINT16])
def test_dequantize_and_round_trip(isa: str, dtype: DataType) -> None:
    quant = QuantParameters(0.0173, 5)
    codes = (np.arange(65536, dtype=np.uint32).astype(np.uint16) if dtype is D.UINT16 else
             np.arange(256, dtype=np.uint8).view(dtype.numpy))
    got = flat(codes, dtype, D.FLOAT32, quant)
    assert same_bits(got, _to_float32(codes, dtype, quant))
    assert same_bits(flat(got, D.FLOAT32, dtype, quant), codes)  # dequantize then quantize is exact
    for out in (D.FP16, D.BF16):
        assert same_bits(flat(codes, dtype, out, quant), _from_float32(_to_float32(codes, dtype, quant), out, None))


# ---------------------------------------------------------------- layouts
@pytest.mark.parametrize("c", [1, 3, 5, 17])
@pytest.mark.parametrize("w", [1, 7, 37, 130])
def test_nchw_nhwc_both_ways_every_dtype_pair(isa: str, c: int, w: int) -> None:
    rng = np.random.default_rng(c * 1000 + w)
    x = (rng.standard_normal((2, c, 3, w)) * 4).astype(np.float32)
    quant = QuantParameters(0.031, 9)
    for dst_type in (D.FLOAT32, D.FP16, D.BF16, D.UINT8, D.INT8, D.UINT16):
        got = permute(x, D.FLOAT32, dst_type, (0, 2, 3, 1), quant)
        assert same_bits(got, _from_float32(x, dst_type, quant).transpose(0, 2, 3, 1)), dst_type
        back = permute(got, dst_type, D.FLOAT32, (0, 3, 1, 2), quant)
        assert same_bits(back, _to_float32(got, dst_type, quant).transpose(0, 3, 1, 2)), dst_type


def test_generic_permutations_nd(isa: str) -> None:
    rng = np.random.default_rng(7)
    for shape, perm in [((2, 3, 4, 5, 6), (4, 2, 0, 3, 1)), ((3, 1, 40, 33), (2, 0, 3, 1)),
                        ((2, 2, 3, 2, 2, 5), (5, 3, 1, 4, 0, 2)), ((70, 90), (1, 0)), ((5,), (0,))]:
        x = rng.standard_normal(shape).astype(np.float32)
        assert same_bits(permute(x, D.FLOAT32, D.FP16, perm), x.astype(np.float16).transpose(perm))
        assert same_bits(permute(x, D.FLOAT32, D.FLOAT32, perm), x.transpose(perm))
        i64 = rng.integers(-2**40, 2**40, shape)
        assert same_bits(permute(i64, D.INT64, D.INT64, perm), i64.transpose(perm))


def test_channel_padding_and_removal(isa: str) -> None:
    """NCHW -> [N, C/k, k, H, W] grouping with zero padding (the HCWNCk core), and back."""
    rng = np.random.default_rng(8)
    for c, k in [(1, 4), (3, 4), (5, 4), (17, 16), (3, 8), (8, 4)]:
        n, h, w = 2, 3, 37
        x = rng.standard_normal((n, c, h, w)).astype(np.float32)
        cg = -(-c // k)
        out = np.full((h, cg, w, n, k), 0xFFFF, np.uint16)  # HCWNCk bf16, garbage where padding goes
        split = [n, cg, k, h, w]
        sx = [c * h * w, k * h * w, h * w, w, 1]
        so = [k, w * n * k, 1, cg * w * n * k, n * k]
        pad = padding(1, 2, c, k, True) if c % k else None
        _native.convert_strided(x, E.FLOAT32, out, E.BF16, split, sx, so, pad=pad)
        padded = np.concatenate([x, np.zeros((n, cg * k - c, h, w), np.float32)], axis=1)
        want = _from_float32(padded, D.BF16, None).reshape(n, cg, k, h, w).transpose(3, 1, 4, 0, 2)
        assert same_bits(out, want), (c, k)
        back = np.full((n, c, h, w), np.nan, np.float32)
        _native.convert_strided(out, E.BF16, back, E.FLOAT32, split, so, sx,
                                pad=None if pad is None else padding(1, 2, c, k, False))
        assert same_bits(back, _to_float32(_from_float32(x, D.BF16, None), D.BF16, None))


# ---------------------------------------------------------------- whole frames
def _at(nbytes: int, offset: int) -> np.ndarray:
    """``nbytes`` raw bytes starting ``offset`` bytes past a 64-byte boundary."""
    buf = np.empty(nbytes + 128, np.uint8)
    start = -buf.ctypes.data % 64 + offset
    return buf[start:start + nbytes]


def _bytes(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


@pytest.mark.parametrize("h, w", [(720, 1280), (719, 1283)])
def test_frames_past_the_streaming_threshold(isa: str, h: int, w: int) -> None:
    """The runners' frame conversions (NCHW f32 <-> NHWC / HCWNC4) with destinations above the kernels'
    streaming-store threshold (8 MiB), channel planes that are or are not a multiple of 64 bytes, and
    destinations at any alignment: the same bits as numpy."""
    rng = np.random.default_rng(h)
    x = (rng.standard_normal((1, 3, h, w)) * 4).astype(np.float32)
    hw = h * w
    quant = QuantParameters(0.031, 9)
    f32 = E.FLOAT32
    nchw = [3 * hw, hw, w, 1]  # strides of (n, c, h, w) in NCHW and in NHWC
    nhwc = [3 * hw, 1, 3 * w, 3]
    for dtype in (D.FP16, D.BF16, D.UINT8, D.INT8):
        want = _from_float32(x, dtype, quant).transpose(0, 2, 3, 1)
        back = _to_float32(want, dtype, quant).transpose(0, 3, 1, 2)
        for offset in (0, 4, 2, 1):
            out = _at(want.nbytes, offset)
            _native.convert_strided(x, f32, out, native(dtype), [1, 3, h, w], nchw, nhwc, quant.scale,
                                    float(quant.zero_point))
            assert np.array_equal(out, _bytes(want)), (dtype, offset)
            out = _at(x.nbytes, offset)
            _native.convert_strided(np.ascontiguousarray(want), native(dtype), out, f32, [1, 3, h, w], nhwc, nchw,
                                    quant.scale, float(quant.zero_point))
            assert np.array_equal(out, _bytes(back)), (dtype, offset)
    # HCWNC4 bf16: (n, group, lane, h, w) with lane 3 padding
    split, sx, so = [1, 1, 4, h, w], [3 * hw, 4 * hw, hw, w, 1], [4, 4 * w, 1, 4 * w, 4]
    padded = np.concatenate([x, np.zeros((1, 1, h, w), np.float32)], axis=1)
    want = _from_float32(padded, D.BF16, None).reshape(1, 1, 4, h, w).transpose(3, 1, 4, 0, 2)
    back = _to_float32(_from_float32(x, D.BF16, None), D.BF16, None)
    for offset in (0, 4, 2, 1):
        out = _at(want.nbytes, offset)
        _native.convert_strided(x, f32, out, E.BF16, split, sx, so, pad=padding(1, 2, 3, 4, True))
        assert np.array_equal(out, _bytes(want)), offset
        out = _at(x.nbytes, offset)
        _native.convert_strided(np.ascontiguousarray(want), E.BF16, out, f32, split, so, sx,
                                pad=padding(1, 2, 3, 4, False))
        assert np.array_equal(out, _bytes(back)), offset


@pytest.mark.parametrize("w", [300, 304])
def test_padded_source_ending_at_an_unmapped_page(isa: str, w: int) -> None:
    """A padded HCWNC4 source may end right after its last real lane (the size check counts real channels
    only): the kernels must not read the padding lane past it. The buffer ends at a PROT_NONE page."""
    page = mmap.PAGESIZE
    m = mmap.mmap(-1, 3 * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    assert ctypes.CDLL(None).mprotect(ctypes.c_void_p(base + 2 * page), page, 0) == 0  # PROT_NONE
    # (1, 1, w, 4) bf16, lane 3 padding: 4 * (w - 1) + 3 real lanes
    n = 4 * (w - 1) + 3
    src = np.frombuffer(m, np.uint16, count=n, offset=2 * page - 2 * n)
    src[...] = np.random.default_rng(11).integers(0, 1 << 16, n, dtype=np.uint16) & 0x3FFF  # finite bf16
    out = np.empty((1, 3, 1, w), np.float32)
    _native.convert_strided(src, E.BF16, out, E.FLOAT32, [1, 1, 4, 1, w], [4, 4 * w, 1, 4 * w, 4],
                            [3 * w, 4 * w, w, w, 1], pad=padding(1, 2, 3, 4, False))
    lanes = np.concatenate([src, np.zeros(1, np.uint16)]).reshape(w, 4)[:, :3]
    assert same_bits(out.reshape(3, w), _to_float32(lanes.T.copy(), D.BF16, None))
    del src
    m.close()


# ---------------------------------------------------------------- bad input is refused
def test_refusals() -> None:
    x = np.zeros((4, 8), np.float32)
    out = np.zeros((4, 8), np.float16)
    f32, f16 = E.FLOAT32, E.FP16
    ok = dict(shape=[4, 8], src_strides=[8, 1], dst_strides=[8, 1])
    _native.convert_strided(x, f32, out, f16, **ok)
    with pytest.raises(ValueError, match="destination buffer holds 62 bytes"):
        _native.convert_strided(x, f32, out.reshape(-1).view(np.uint8)[:62], f16, **ok)
    with pytest.raises(ValueError, match="source buffer holds"):
        _native.convert_strided(x[:3], f32, out, f16, **ok)
    with pytest.raises(ValueError, match="not C-contiguous"):
        _native.convert_strided(np.zeros((4, 16), np.float32)[:, ::2], f32, out, f16, **ok)
    with pytest.raises(ValueError, match="expected FLOAT32"):
        _native.convert_strided(x.astype(np.float64), f32, out, f16, **ok)
    with pytest.raises(ValueError, match="expected FP16"):
        _native.convert_strided(x, f32, out.view(np.int16), f16, **ok)
    ro = out.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        _native.convert_strided(x, f32, ro, f16, **ok)
    with pytest.raises(ValueError, match="overlap"):
        _native.convert_strided(x, f32, x, f32, [4, 8], [8, 1], [1, 4])
    with pytest.raises(ValueError, match="no native conversion from INT32 to FLOAT32"):
        _native.convert_strided(x.view(np.int32), E.INT32, out, f32, **ok)
    with pytest.raises(ValueError, match=r"2\*\*63"):  # (2**62 - 1) * (2**62 + 1) must not wrap to a small size
        _native.convert_strided(x.view(np.uint8), E.UINT32, out.view(np.uint8), E.UINT32, [1 << 62],
                                [(1 << 62) + 1], [1 << 40])
    with pytest.raises(ValueError, match="negative"):
        _native.convert_strided(x, f32, out, f16, [4, 8], [8, -1], [8, 1])
    with pytest.raises(ValueError, match="stride 0"):
        _native.convert_strided(x, f32, out, f16, [4, 8], [8, 1], [8, 0])
    with pytest.raises(ValueError, match="axes"):
        _native.convert_strided(x, f32, out, f16, [4, 8], [8], [8, 1])
    with pytest.raises(ValueError, match="scale"):
        _native.convert_strided(x, f32, out, f16, **ok, scale=0.0)
    with pytest.raises(TypeError):
        _native.convert_strided(object(), f32, out, f16, **ok)
    with pytest.raises(ValueError, match="unknown instruction set"):
        _native.set_convert_isa("sse9")


def test_typed_boundary_refuses_integers_and_tuples() -> None:
    """The kernels take their own enums and a ChannelPadding: npurt's IntEnums, plain integers and the old
    5-tuple are a TypeError (never read as some other type); an enum made from a value it does not have is
    a ValueError."""
    x = np.zeros((4, 8), np.float32)
    out = np.zeros((4, 8), np.float16)
    ok = dict(shape=[4, 8], src_strides=[8, 1], dst_strides=[8, 1])
    for not_an_element_type in (int(D.FLOAT32), D.FLOAT32, "FLOAT32", None):
        with pytest.raises(TypeError):
            _native.convert_strided(x, not_an_element_type, out, E.FP16, **ok)
        with pytest.raises(TypeError):
            _native.convert_strided(x, E.FLOAT32, out, not_an_element_type, **ok)
    for not_a_rounding in (1, RoundingMode.ROUND_TOWARD_ZERO, E.FLOAT32):
        with pytest.raises(TypeError):
            _native.convert_strided(x, E.FLOAT32, out, E.FP16, **ok, rounding=not_a_rounding)
    with pytest.raises(ValueError, match="unknown data type code 99"):
        _native.convert_strided(x, E(99), out, E.FP16, **ok)
    with pytest.raises(ValueError, match="unknown data type code 0"):
        _native.convert_strided(x, E.FLOAT32, out, E(0), **ok)
    with pytest.raises(ValueError, match="rounding mode must be ROUND_TO_NEAREST_EVEN"):
        _native.convert_strided(x, E.FLOAT32, out, E.FP16, **ok, rounding=_native.Rounding(0))
    x4 = np.zeros((1, 3, 2, 2), np.float32)
    out4 = np.zeros((2, 1, 2, 1, 4), np.uint16)
    split, sx, so = [1, 1, 4, 2, 2], [12, 16, 4, 2, 1], [4, 8, 1, 8, 4]
    for not_a_padding in ((1, 2, 3, 4, 1), [1, 2, 3, 4, 1], {"group_axis": 1}):
        with pytest.raises(TypeError):
            _native.convert_strided(x4, E.FLOAT32, out4, E.BF16, split, sx, so, pad=not_a_padding)
    _native.convert_strided(x4, E.FLOAT32, out4, E.BF16, split, sx, so, pad=padding(1, 2, 3, 4, True))


def test_channel_padding_is_checked() -> None:
    pad = padding(1, 2, 3, 4, True)
    assert (pad.group_axis, pad.lane_axis, pad.channels, pad.group_size, pad.dst_padded) == (1, 2, 3, 4, True)
    assert repr(pad) == "ChannelPadding(group_axis=1, lane_axis=2, channels=3, group_size=4, dst_padded=True)"
    with pytest.raises(AttributeError):
        pad.channels = 8  # read-only: a cached plan's padding cannot be changed under it
    with pytest.raises(TypeError):
        _native.ChannelPadding(1, 2, 3, 4, True)  # keyword-only: five bare integers were the old problem
    with pytest.raises(TypeError):
        padding(1 << 40, 2, 3, 4, True)
    with pytest.raises(ValueError, match="two different axes, got 2 and 2"):
        padding(2, 2, 3, 4, True)
    with pytest.raises(ValueError, match="two different axes, got -1 and 2"):
        padding(-1, 2, 3, 4, True)
    with pytest.raises(ValueError, match="channels must not be negative, got -3"):
        padding(1, 2, -3, 4, True)
    with pytest.raises(ValueError, match="group_size must be at least 1, got 0"):
        padding(1, 2, 3, 0, True)
    # against the shape: [n, groups, lanes, h, w] = [1, 1, 4, 2, 2]
    x = np.zeros((1, 3, 2, 2), np.float32)
    out = np.zeros((2, 1, 2, 1, 4), np.uint16)
    split, sx, so = [1, 1, 4, 2, 2], [12, 16, 4, 2, 1], [4, 8, 1, 8, 4]
    with pytest.raises(ValueError, match=r"pad axes 1 \(group\) and 5 \(lane\) are not both axes"):
        _native.convert_strided(x, E.FLOAT32, out, E.BF16, split, sx, so, pad=padding(1, 5, 3, 4, True))
    with pytest.raises(ValueError, match="pad of 3 channels in groups of 8 does not fit"):
        _native.convert_strided(x, E.FLOAT32, out, E.BF16, split, sx, so, pad=padding(1, 2, 3, 8, True))
    with pytest.raises(ValueError, match="pad of 5 channels in groups of 4 does not fit"):
        _native.convert_strided(x, E.FLOAT32, out, E.BF16, split, sx, so, pad=padding(1, 2, 5, 4, True))


def test_native_enums_mirror_npurt() -> None:
    """formats.py maps npurt's enums to the native ones by name: same members (but UNKNOWN), same values."""
    assert {name: m.value for name, m in E.__members__.items()} == \
        {t.name: t.value for t in DataType if t is not DataType.UNKNOWN}
    assert {name: m.value for name, m in _native.Rounding.__members__.items()} == \
        {m.name: m.value for m in RoundingMode if m is not RoundingMode.UNKNOWN}
    assert _native.CONVERTIBLE_TYPES == frozenset({E.FLOAT32, E.FP16, E.BF16, E.INT8, E.UINT8, E.UINT16})


def test_convert_refuses_an_unknown_rounding_mode() -> None:
    """npurt.convert with QuantParameters(rounding_mode=UNKNOWN): a ValueError (the native enum has no such
    member), as before the boundary was typed."""
    src = NpuTensor(NpuTensorInfo(name="x", data_type=D.FLOAT32, shape=(1, 8), tensor_type=TensorType.CPU),
                    np.zeros(32, np.uint8))
    dst = NpuTensor(NpuTensorInfo(name="q", data_type=D.UINT8, shape=(1, 8), tensor_type=TensorType.CPU),
                    np.zeros(8, np.uint8))
    with pytest.raises(ValueError, match="rounding mode UNKNOWN"):
        convert(src, dst, quant=QuantParameters(0.5, 0, RoundingMode.UNKNOWN))
    convert(src, dst, quant=QuantParameters(0.5, 3, RoundingMode.ROUND_TOWARD_ZERO))
    assert (dst.numpy() == 3).all()


def test_threads_share_the_kernels() -> None:
    """Conversions on several threads at once (the GIL is released inside) give the same bits."""
    x = np.random.default_rng(9).standard_normal((1, 3, 64, 200)).astype(np.float32)
    want = x.transpose(0, 2, 3, 1).astype(np.float16)
    errors: list[str] = []

    def work() -> None:
        for _ in range(20):
            if not same_bits(permute(x, D.FLOAT32, D.FP16, (0, 2, 3, 1)), want):
                errors.append("mismatch")

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=5), data=st.data(),
       types=st.sampled_from([(D.FLOAT32, D.FP16), (D.FLOAT32, D.BF16), (D.FP16, D.FLOAT32), (D.FLOAT32, D.UINT8),
                              (D.INT8, D.FLOAT32), (D.FP16, D.FP16), (D.UINT8, D.BF16), (D.FLOAT32, D.UINT16),
                              (D.UINT16, D.FLOAT32), (D.UINT16, D.FP16)]))
def test_any_permutation_property(shape: list[int], data: st.DataObject, types: tuple[DataType, DataType]) -> None:
    perm = tuple(data.draw(st.permutations(range(len(shape)))))
    src_type, dst_type = types
    rng = np.random.default_rng(len(shape))
    x = (rng.standard_normal(shape) * 50).astype(np.float32)
    quant = QuantParameters(0.37, 3)
    src = _from_float32(x, src_type, quant) if src_type is not D.FLOAT32 else x
    want = _from_float32(_to_float32(src, src_type, quant), dst_type, quant) if src_type != dst_type else src
    assert same_bits(permute(np.ascontiguousarray(src), src_type, dst_type, perm, quant), want.transpose(perm))
