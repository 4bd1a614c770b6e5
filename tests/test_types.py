import numpy as np
import pytest

from npurt import (
    DataType,
    JobHandle,
    MemoryLayout,
    MemoryType,
    NpuTensorInfo,
    QuantParameters,
    RoundingMode,
    RunnerType,
    StatusCode,
    TensorDirection,
    TensorType,
)


def test_enum_values_follow_vart_ml():
    assert [m.name for m in DataType] == ["UNKNOWN", "BOOLEAN", "INT8", "UINT8", "INT16", "UINT16", "BF16", "FP16",
                                          "INT32", "UINT32", "FLOAT32", "INT64", "UINT64", "FLOAT64"]
    assert [int(m) for m in DataType] == list(range(14))
    assert MemoryType.XRT_BO == 1 and MemoryType.USER_POINTER_NON_CMA == 4
    assert MemoryLayout.HCWNC4 == 12 and MemoryLayout.GENERIC == 17
    assert StatusCode.SUCCESS == 0 and StatusCode.UNSUPPORTED == 9
    assert [m.name for m in StatusCode] == ["SUCCESS", "FAILURE", "INVALID_INPUT", "INVALID_OUTPUT", "OUT_OF_MEMORY",
                                            "RUNTIME_ERROR", "JOB_PENDING", "INVALID_JOB_ID", "RESOURCE_UNAVAILABLE",
                                            "UNSUPPORTED"]
    assert {m.name: int(m) for m in RunnerType} == {"OPENVINO": 0, "VAIML": 1, "AUTO": 2, "QNN": 3, "ONNXRUNTIME": 4}
    assert TensorType.CPU == 0 and TensorDirection.OUTPUT == 1
    assert RoundingMode.ROUND_TOWARD_ZERO == 2


def test_info_derives_strides_and_sizes():
    info = NpuTensorInfo(name="x", data_type=DataType.FP16, shape=(1, 3, 4, 5))
    assert info.strides == (60, 20, 5, 1)
    assert info.size == 60 and info.size_in_bytes == 120
    assert info.is_contiguous
    assert info.tensor_type is TensorType.HW and info.memory_layout_order == ()
    assert info == NpuTensorInfo(name="x", data_type="fp16", shape=[1, 3, 4, 5])
    assert hash(info) == hash(NpuTensorInfo(name="x", data_type=DataType.FP16, shape=(1, 3, 4, 5)))


def test_info_padded_strides():
    info = NpuTensorInfo(name="row", data_type=DataType.UINT8, shape=(2, 3), strides=(8, 1))
    assert info.size == 6 and info.size_in_bytes == 11
    with pytest.raises(ValueError, match="smaller than"):
        NpuTensorInfo(name="row", data_type=DataType.UINT8, shape=(2, 3), strides=(8, 1), size_in_bytes=10)


def test_info_is_immutable_and_replace_rederives():
    info = NpuTensorInfo(name="x", data_type=DataType.FLOAT32, shape=(2, 2))
    with pytest.raises(AttributeError):
        info.name = "y"  # type: ignore[misc]
    bigger = info.replace(shape=(4, 4))
    assert bigger.size_in_bytes == 64 and bigger.strides == (4, 1)
    # a shape asked for again is the same info (apps and runners ask on every call); equal to one made anew
    assert info.replace(shape=(4, 4)) is bigger
    assert bigger == NpuTensorInfo(name="x", data_type=DataType.FLOAT32, shape=(4, 4))
    assert hash(bigger) == hash(NpuTensorInfo(name="x", data_type=DataType.FLOAT32, shape=(4, 4)))
    assert info.replace(shape=(4, 4), tensor_type=TensorType.CPU).tensor_type is TensorType.CPU
    assert info.replace(shape=(4, 4)).tensor_type is TensorType.HW  # other changes are not remembered as a shape
    with pytest.raises(ValueError, match="negative"):
        info.replace(shape=(4, -3))


@pytest.mark.parametrize("kwargs, match", [
    ({"name": "", "data_type": DataType.FLOAT32, "shape": (1,)}, "non-empty"),
    ({"name": "x", "data_type": DataType.UNKNOWN, "shape": (1,)}, "UNKNOWN"),
    ({"name": "x", "data_type": "float99", "shape": (1,)}, "not a DataType"),
    ({"name": "x", "data_type": DataType.FLOAT32, "shape": (1, -2)}, "negative"),
    ({"name": "x", "data_type": DataType.FLOAT32, "shape": (2, 3), "memory_layout_order": (0, 0)}, "permutation"),
    ({"name": "x", "data_type": DataType.FLOAT32, "shape": (2, 3), "strides": (1,)}, "strides"),
    ({"name": "x", "data_type": DataType.FLOAT32, "shape": (2, 3), "size": 5}, "size 5"),
])
def test_info_rejects_bad_fields(kwargs, match):
    with pytest.raises(ValueError, match=match):
        NpuTensorInfo(**kwargs)


@pytest.mark.parametrize("shape", [(1, 3, 48, 192), (-1, 3, -1, -1), ()])
def test_info_in_the_other_view_is_the_info_made_in_that_view(shape):
    """in_view (a copy with the tensor type changed, not validated again) equals, hashes and derives like an info made
    in that view; the copy's shape cache is its own."""
    made = dict(name="x", data_type=DataType.FLOAT32, shape=shape, direction=TensorDirection.OUTPUT,
                memory_layout=MemoryLayout.NCHW if len(shape) == 4 else MemoryLayout.UNKNOWN)
    cpu = NpuTensorInfo(tensor_type=TensorType.CPU, **made)
    hw = cpu.in_view(TensorType.HW)
    want = NpuTensorInfo(tensor_type=TensorType.HW, **made)
    assert hw == want and hash(hw) == hash(want) and hw != cpu and cpu.tensor_type is TensorType.CPU
    assert (hw.strides, hw.size, hw.size_in_bytes) == (want.strides, want.size, want.size_in_bytes)
    assert cpu.in_view(TensorType.CPU) is cpu
    if -1 in shape:
        assert hw.replace(shape=(1, 3, 4, 4)).tensor_type is TensorType.HW
        assert cpu.replace(shape=(1, 3, 4, 4)).tensor_type is TensorType.CPU


@pytest.mark.parametrize("shape,dtype", [((1, 3, 48, 192), DataType.FLOAT32), ((-1, 3, -1, -1), DataType.INT8),
                                         ((), DataType.INT64), ((2, 0, 5), DataType.FP16), ((7,), DataType.BOOLEAN)])
def test_a_ports_info_made_unchecked_is_the_info_the_constructor_makes(shape, dtype):
    """of_port (a port's CPU view, from parts checked where the port's spec was made) equals, hashes and derives like
    the constructor's info; where a malformed model gives what the constructor refuses, it refuses it too."""
    layout = MemoryLayout.NCHW if len(shape) == 4 else MemoryLayout.UNKNOWN
    made = NpuTensorInfo.of_port("x", dtype, shape, TensorDirection.OUTPUT, layout)
    want = NpuTensorInfo(name="x", data_type=dtype, shape=shape, direction=TensorDirection.OUTPUT,
                         tensor_type=TensorType.CPU, memory_layout=layout)
    assert made == want and hash(made) == hash(want) and repr(made) == repr(want)
    assert (made.strides, made.size, made.size_in_bytes, made.is_static) == \
        (want.strides, want.size, want.size_in_bytes, want.is_static)
    assert made.replace(shape=(1, 3, 4, 4) if len(shape) == 4 else shape) == \
        want.replace(shape=(1, 3, 4, 4) if len(shape) == 4 else shape)
    with pytest.raises(ValueError, match="non-empty string"):
        NpuTensorInfo.of_port("", dtype, shape, TensorDirection.INPUT, layout)
    with pytest.raises(ValueError, match="UNKNOWN"):
        NpuTensorInfo.of_port("x", DataType.UNKNOWN, shape, TensorDirection.INPUT, layout)


def test_bf16_shows_as_uint16():
    assert DataType.BF16.numpy == np.uint16
    assert DataType.from_numpy(np.uint16) is DataType.UINT16
    assert DataType.from_numpy(np.float16) is DataType.FP16


def test_quant_parameters_and_job_handle():
    q = QuantParameters(0.5, 3)
    assert q.rounding_mode is RoundingMode.ROUND_TO_NEAREST_EVEN
    with pytest.raises(ValueError):
        QuantParameters(0.0, 0)
    assert JobHandle(StatusCode.SUCCESS, 1) == JobHandle(StatusCode.SUCCESS, 1)


def test_job_handle_made_fast_is_a_job_handle():
    """types.job_handle (the runner's way to make a JobHandle per submission) gives the very object the dataclass's
    constructor gives: equal, same hash and repr, frozen."""
    import dataclasses

    from npurt.types import job_handle

    fast, slow = job_handle(StatusCode.RESOURCE_UNAVAILABLE, 7), JobHandle(StatusCode.RESOURCE_UNAVAILABLE, 7)
    assert type(fast) is JobHandle and fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert dataclasses.astuple(fast) == (StatusCode.RESOURCE_UNAVAILABLE, 7)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.job_id = 8  # type: ignore[misc]
