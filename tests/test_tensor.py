import ctypes

import numpy as np
import pytest

from npurt import DataType, MemoryType, NpuTensor, NpuTensorInfo, TensorDirection, TensorType
from npurt.tensor import PAGE_SIZE, allocate_tensor, sub_tensor


def cpu_info(shape=(1, 3, 4, 4), dtype=DataType.FLOAT32, direction=TensorDirection.INPUT, name="x"):
    return NpuTensorInfo(name=name, data_type=dtype, shape=shape, direction=direction, tensor_type=TensorType.CPU)


def test_numpy_is_a_zero_copy_view():
    arr = np.arange(48, dtype=np.float32).reshape(1, 3, 4, 4)
    t = NpuTensor(cpu_info(), arr)
    view = t.numpy()
    assert view.ctypes.data == arr.ctypes.data
    view[0, 0, 0, 0] = 42
    assert arr[0, 0, 0, 0] == 42
    assert t.get_virtual_address() == arr.ctypes.data
    assert t.get_buffer() is arr
    assert t.provider == "user"
    assert t.export_buffer() == -1


def test_array_tensors_and_buffer_tensors_agree():
    """A C-contiguous array takes the quick construction; any other buffer the general one: the same tensor."""
    arr = np.arange(48, dtype=np.float32).reshape(1, 3, 4, 4)
    quick = NpuTensor(cpu_info(), arr)
    general = NpuTensor(cpu_info(), memoryview(arr))
    for t in (quick, general):
        assert t.get_virtual_address() == arr.ctypes.data
        assert t.memory_type is MemoryType.USER_POINTER_NON_CMA and t.provider == "user" and t.offset == 0
        assert t.writable and t.nbytes == 192 and t.result_info == t.info
        np.testing.assert_array_equal(t.numpy(), arr)
    # what the quick path does not take goes the general way, and fails as it does
    with pytest.raises(ValueError, match="holds 188 bytes"):
        NpuTensor(cpu_info(), np.zeros(47, np.float32))
    with pytest.raises(ValueError, match="not C-contiguous"):
        NpuTensor(cpu_info(shape=(4, 4)), np.zeros((4, 8), np.float32)[:, ::2])
    with pytest.raises(ValueError, match="read-only"):
        NpuTensor(cpu_info(direction=TensorDirection.OUTPUT), np.frombuffer(bytes(192), np.float32))
    with pytest.raises(ValueError, match="not aligned"):
        NpuTensor(cpu_info(shape=(4,)), np.zeros(17, np.uint8)[1:])
    as_bytes = NpuTensor(cpu_info(), arr.view(np.uint8))  # bytes for floats: aligned, so taken as they are
    assert as_bytes.get_virtual_address() == arr.ctypes.data


def test_buffer_protocol_objects_and_addresses():
    raw = bytearray(48 * 4)
    t = NpuTensor(cpu_info(), raw)
    t.numpy()[...] = 1.0
    assert np.frombuffer(raw, np.float32).sum() == 48
    arr = np.zeros(48, np.float32)
    by_address = NpuTensor(cpu_info(), arr.ctypes.data, MemoryType.USER_POINTER_NON_CMA)
    by_address.numpy()[...] = 2.0
    assert arr.sum() == 96


def test_dlpack_hand_off():
    arr = np.arange(48, dtype=np.float32).reshape(1, 3, 4, 4)
    t = NpuTensor(cpu_info(), arr)
    other = np.from_dlpack(t)
    assert other.ctypes.data == arr.ctypes.data
    assert t.__dlpack_device__() == (1, 0)


def test_bf16_tensor_shows_uint16():
    info = NpuTensorInfo(name="h", data_type=DataType.BF16, shape=(2, 2), tensor_type=TensorType.CPU)
    t = NpuTensor(info, np.zeros(4, np.uint16))
    assert t.numpy().dtype == np.uint16


def test_hw_view_with_non_cma_memory_raises():
    info = NpuTensorInfo(name="x", data_type=DataType.FLOAT32, shape=(4,), tensor_type=TensorType.HW)
    with pytest.raises(ValueError, match=r"'x'.*USER_POINTER_NON_CMA"):
        NpuTensor(info, np.zeros(4, np.float32), MemoryType.USER_POINTER_NON_CMA)


def test_small_buffer_raises():
    with pytest.raises(ValueError, match=r"'x'.*holds 40 bytes.*needs 192"):
        NpuTensor(cpu_info(), np.zeros(10, np.float32))


def test_misaligned_addresses_raise():
    raw = np.zeros(1000, np.uint8)
    with pytest.raises(ValueError, match="not aligned to 4 bytes"):
        NpuTensor(cpu_info(shape=(4,)), raw[1:17])
    page = allocate_tensor(cpu_info(shape=(PAGE_SIZE,), dtype=DataType.UINT8))
    assert page.get_virtual_address() % PAGE_SIZE == 0
    addr = page.get_virtual_address() + 64
    with pytest.raises(ValueError, match=f"not aligned to {PAGE_SIZE} bytes"):
        NpuTensor(cpu_info(shape=(16,), dtype=DataType.UINT8), addr, MemoryType.USER_POINTER_CMA)
    ok = NpuTensor(cpu_info(shape=(16,), dtype=DataType.UINT8), page.get_virtual_address(),
                   MemoryType.USER_POINTER_CMA)
    assert ok.get_virtual_address() == page.get_virtual_address()


def test_read_only_output_raises_and_read_only_input_works():
    arr = np.zeros(48, np.float32)
    arr.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        NpuTensor(cpu_info(direction=TensorDirection.OUTPUT), arr)
    t = NpuTensor(cpu_info(), arr)
    assert not t.numpy().flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        NpuTensor(cpu_info(direction=TensorDirection.OUTPUT), bytes(192))


def test_non_contiguous_buffer_raises():
    arr = np.zeros((8, 48), np.float32)[:, 0]
    with pytest.raises(ValueError, match="not C-contiguous"):
        NpuTensor(cpu_info(shape=(8,)), arr)


@pytest.mark.parametrize("bad", [None, 0, True, "text", 3.5, -4096, 1 << 64, np.empty(48, object),
                                 memoryview(np.empty(48, object))])
def test_bad_buffers_raise(bad):
    """Never a tensor that crashes the process when read (a negative address was taken, and read at
    0xfffffffffffff000: SIGSEGV; an object array became bytes over its references) nor a TypeError."""
    with pytest.raises(ValueError, match="'x'"):
        NpuTensor(cpu_info(), bad)


@pytest.mark.parametrize("offset", [1.5, True, "4", -4])
def test_bad_offsets_raise(offset):
    with pytest.raises(ValueError, match="'x'.*offset"):
        NpuTensor(cpu_info(), np.zeros(64, np.float32), offset=offset)
    arr = np.arange(64, dtype=np.float32)
    np.testing.assert_array_equal(NpuTensor(cpu_info(), arr, offset=np.int64(16)).numpy().ravel(), arr[4:52])


def test_strided_info_gives_strided_view():
    info = NpuTensorInfo(name="rows", data_type=DataType.UINT8, shape=(2, 3), strides=(8, 1),
                         tensor_type=TensorType.CPU)
    raw = np.arange(16, dtype=np.uint8)
    t = NpuTensor(info, raw)
    assert t.numpy().tolist() == [[0, 1, 2], [8, 9, 10]]


def test_allocate_and_sub_tensor_share_memory_and_lifetime():
    parent = allocate_tensor(cpu_info(shape=(2, 8), dtype=DataType.FLOAT32))
    assert parent.memory_type is MemoryType.XRT_BO
    row = NpuTensorInfo(name="row", data_type=DataType.FLOAT32, shape=(8,), tensor_type=TensorType.CPU)
    second = sub_tensor(parent, row, 32)
    address = second.get_virtual_address()
    assert address == parent.get_virtual_address() + 32
    second.numpy()[...] = 7
    assert parent.numpy()[1].tolist() == [7] * 8
    del parent
    # the parent's memory lives on with the sub-tensor
    assert ctypes.string_at(address, 4) == np.float32(7).tobytes()
    with pytest.raises(ValueError, match="one level"):
        sub_tensor(second, row, 0)


def test_sub_tensor_bounds():
    parent = allocate_tensor(cpu_info(shape=(16,), dtype=DataType.UINT8))
    info = NpuTensorInfo(name="s", data_type=DataType.UINT8, shape=(8,), tensor_type=TensorType.CPU)
    with pytest.raises(ValueError, match="do not fit"):
        sub_tensor(parent, info, 9)
    with pytest.raises(ValueError, match="runner-allocated|allocate_npu_tensor"):
        sub_tensor(NpuTensor(info, np.zeros(8, np.uint8)), info, 0)
