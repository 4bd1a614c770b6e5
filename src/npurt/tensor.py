"""NpuTensor: tensor metadata over memory the tensor may or may not own."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from . import _native
from .types import MemoryType, NpuError, NpuTensorInfo, TensorDirection, TensorType

PAGE_SIZE: int = _native.page_size()


def _byte_view(buffer: Any, name: str) -> np.ndarray:
    """A flat uint8 view of a buffer-protocol object, without copying; refuses non-contiguous memory."""
    if isinstance(buffer, np.ndarray):
        arr = buffer
    else:
        try:
            arr = np.asarray(memoryview(buffer))
        except TypeError:
            raise ValueError(
                f"tensor {name!r}: buffer of type {type(buffer).__name__} does not support the buffer protocol"
            ) from None
    if not arr.flags.c_contiguous:
        raise ValueError(
            f"tensor {name!r}: buffer is not C-contiguous (strides {arr.strides} for shape {arr.shape}); "
            "pass np.ascontiguousarray(...) or describe the layout with NpuTensorInfo.strides"
        )
    return arr.reshape(-1).view(np.uint8)


class NpuTensor:
    """A tensor: an ``NpuTensorInfo`` and the memory it describes.

    User-constructed tensors do not own their memory: the caller keeps it alive (the tensor keeps a
    reference to Python buffer objects, which is enough for those). Runner-allocated tensors own theirs.
    """

    __slots__ = ("_info", "_memory_type", "_bytes", "_source", "_provider", "_owner", "_offset", "_parent",
                 "__weakref__")

    def __init__(self, info: NpuTensorInfo, buffer: Any, memory_type: MemoryType = MemoryType.USER_POINTER_NON_CMA,
                 *, offset: int = 0) -> None:
        if not isinstance(info, NpuTensorInfo):
            raise ValueError(f"NpuTensor needs an NpuTensorInfo, got {type(info).__name__}")
        try:
            memory_type = MemoryType(memory_type)
        except ValueError:
            raise ValueError(f"tensor {info.name!r}: {memory_type!r} is not a MemoryType") from None
        name = info.name
        if info.tensor_type is TensorType.HW and memory_type is MemoryType.USER_POINTER_NON_CMA:
            raise ValueError(
                f"tensor {name!r}: a HW tensor cannot use USER_POINTER_NON_CMA memory (the device cannot see it); "
                "use runner.allocate_npu_tensor(), a DMA_FD, USER_POINTER_CMA memory, or the CPU view"
            )
        if offset < 0:
            raise ValueError(f"tensor {name!r}: offset {offset} is negative")
        self._info = info
        self._memory_type = memory_type
        self._offset = offset
        self._owner: Any = None  # set for runner-owned memory
        self._parent: NpuTensor | None = None  # set for sub-tensors
        if memory_type in (MemoryType.USER_POINTER_CMA, MemoryType.USER_POINTER_NON_CMA):
            self._init_user_pointer(buffer)
        elif memory_type in (MemoryType.XRT_BO, MemoryType.DMA_FD):
            self._init_native(buffer)
        else:
            raise ValueError(f"tensor {name!r}: memory type {memory_type.name} cannot hold a tensor")
        self._check_size_and_alignment()

    # -- construction helpers ------------------------------------------------------------------------
    def _init_user_pointer(self, buffer: Any) -> None:
        name = self._info.name
        if isinstance(buffer, bool) or buffer is None:
            raise ValueError(f"tensor {name!r}: {buffer!r} is not a buffer or an address")
        if isinstance(buffer, int):
            if buffer == 0:
                raise ValueError(f"tensor {name!r}: null address")
            # A raw address: the caller guarantees size and lifetime, as in VART-ML.
            raw = (ctypes.c_uint8 * (self._offset + self._info.size_in_bytes)).from_address(buffer)
            self._bytes = np.frombuffer(raw, dtype=np.uint8)
        else:
            self._bytes = _byte_view(buffer, name)
        if self._offset > self._bytes.nbytes:
            raise ValueError(f"tensor {name!r}: offset {self._offset} is past the end of a "
                             f"{self._bytes.nbytes}-byte buffer")
        self._bytes = self._bytes[self._offset:]
        self._source = buffer
        self._provider = "user"

    def _init_native(self, buffer: Any) -> None:
        raise ValueError(
            f"tensor {self._info.name!r}: {self._memory_type.name} memory is not available in this build"
        )

    def _check_size_and_alignment(self) -> None:
        info = self._info
        if self._bytes.nbytes < info.size_in_bytes:
            raise ValueError(
                f"tensor {info.name!r}: buffer holds {self._bytes.nbytes} bytes, "
                f"{info.describe()} needs {info.size_in_bytes}"
            )
        address = self.get_virtual_address()
        if self._memory_type is MemoryType.USER_POINTER_NON_CMA:
            align, why = info.data_type.itemsize, f"its {info.data_type.name} elements"
        else:
            align, why = PAGE_SIZE, f"{self._memory_type.name} memory (page size)"
        if address % align:
            raise ValueError(
                f"tensor {info.name!r}: address 0x{address:x} is not aligned to {align} bytes, as {why} requires"
            )
        if info.direction is TensorDirection.OUTPUT and not self._bytes.flags.writeable:
            raise ValueError(f"tensor {info.name!r}: an output tensor needs writable memory, the buffer is read-only")

    # -- accessors -----------------------------------------------------------------------------------
    @property
    def info(self) -> NpuTensorInfo:
        return self._info

    @property
    def memory_type(self) -> MemoryType:
        return self._memory_type

    @property
    def provider(self) -> str:
        """Where the memory came from: "dma_heap:<heap>", "udmabuf", "memfd", "host" or "user"."""
        return self._provider

    @property
    def nbytes(self) -> int:
        return self._info.size_in_bytes

    @property
    def writable(self) -> bool:
        return bool(self._bytes.flags.writeable)

    def get_info(self) -> NpuTensorInfo:
        return self._info

    def get_memory_type(self) -> MemoryType:
        return self._memory_type

    def get_buffer(self) -> Any:
        """The buffer the tensor was made from (a user object, an fd, or the runner's buffer); None if none."""
        return self._source

    def get_virtual_address(self) -> int:
        """The address of the tensor's first byte in this process, 0 where there is none."""
        try:
            return int(self._bytes.__array_interface__["data"][0])
        except Exception:  # a sentinel, never an exception (VART-ML accessor contract)
            return 0

    def numpy(self) -> np.ndarray:
        """A zero-copy array over the tensor's memory, shaped and typed by ``info`` (BF16 shows as uint16)."""
        info = self._info
        itemsize = info.data_type.itemsize
        return np.lib.stride_tricks.as_strided(
            self._bytes[: info.size_in_bytes].view(info.numpy_dtype),
            shape=info.shape,
            strides=tuple(s * itemsize for s in info.strides),
            writeable=self.writable,
        )

    def raw_bytes(self) -> np.ndarray:
        """The tensor's bytes as a flat uint8 array (zero-copy)."""
        return self._bytes[: self._info.size_in_bytes]

    # -- memory operations ---------------------------------------------------------------------------
    def sync_buffer(self) -> None:
        """Make CPU writes visible to the device (inputs) or device writes visible to the CPU (outputs).

        A no-op for memory that needs no cache maintenance (host memory, memfd).
        """

    def begin_cpu_access(self, write: bool) -> None:
        """Start a CPU access window (DMA_BUF_IOCTL_SYNC start); a no-op where not needed."""

    def end_cpu_access(self, write: bool) -> None:
        """End a CPU access window (DMA_BUF_IOCTL_SYNC end); a no-op where not needed."""

    def export_buffer(self) -> int:
        """A new DMA-BUF (or sealed memfd) fd that the caller owns, or -1 where the memory is not exportable."""
        return -1

    # -- interop -------------------------------------------------------------------------------------
    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self.numpy().__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.numpy().__dlpack_device__()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        arr = self.numpy()
        if dtype is not None and np.dtype(dtype) != arr.dtype:
            return arr.astype(dtype)
        return arr.copy() if copy else arr

    def __repr__(self) -> str:
        return (f"NpuTensor({self._info.name!r}, {self._info.describe()}, {self._memory_type.name}, "
                f"provider={self._provider!r})")


# -- runner-owned memory ---------------------------------------------------------------------------
def _page_aligned_host_bytes(nbytes: int) -> np.ndarray:
    raw = np.zeros(nbytes + PAGE_SIZE, np.uint8)
    start = (-raw.ctypes.data) % PAGE_SIZE
    return raw[start:start + nbytes]


def _owned(info: NpuTensorInfo, memory_type: MemoryType, data: np.ndarray, provider: str, owner: Any,
           source: Any) -> NpuTensor:
    t = NpuTensor.__new__(NpuTensor)
    t._info, t._memory_type, t._offset = info, memory_type, 0
    t._bytes, t._provider, t._owner, t._source = data, provider, owner, source
    t._parent = None
    return t


def allocate_tensor(info: NpuTensorInfo, memory_type: MemoryType = MemoryType.XRT_BO, provider: str = "auto",
                    strict: bool = False) -> NpuTensor:
    """Runner-owned, page-aligned memory for ``info`` (see Runner.allocate_npu_tensor)."""
    memory_type = MemoryType(memory_type)
    if memory_type is MemoryType.UNKNOWN:
        raise ValueError(f"tensor {info.name!r}: cannot allocate memory of type UNKNOWN")
    if info.tensor_type is TensorType.HW and memory_type is MemoryType.USER_POINTER_NON_CMA:
        raise ValueError(f"tensor {info.name!r}: a HW tensor cannot use USER_POINTER_NON_CMA memory")
    if provider not in ("auto", "host") and strict:
        raise NpuError(f"tensor {info.name!r}: memory provider {provider!r} is not available in this build")
    data = _page_aligned_host_bytes(max(info.size_in_bytes, 1))[: info.size_in_bytes]
    return _owned(info, memory_type, data, "host", owner=data, source=data)


def sub_tensor(parent: NpuTensor, info: NpuTensorInfo, offset: int) -> NpuTensor:
    """A view of ``info`` at byte ``offset`` into a runner-allocated parent; the memory lives on with it."""
    if not isinstance(parent, NpuTensor) or parent._owner is None:
        raise ValueError("allocate_sub_tensor needs a parent made by allocate_npu_tensor")
    if parent._parent is not None:
        raise ValueError(f"tensor {parent.info.name!r} is a sub-tensor; only one level of nesting is supported")
    if not isinstance(info, NpuTensorInfo):
        raise ValueError(f"allocate_sub_tensor needs an NpuTensorInfo, got {type(info).__name__}")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"sub-tensor {info.name!r}: offset {offset!r} is not a byte offset >= 0")
    end = offset + info.size_in_bytes
    if end > parent.nbytes:
        raise ValueError(f"sub-tensor {info.name!r}: bytes {offset}..{end} do not fit in parent "
                         f"{parent.info.name!r} of {parent.nbytes} bytes")
    if offset % info.data_type.itemsize:
        raise ValueError(f"sub-tensor {info.name!r}: offset {offset} is not aligned to its "
                         f"{info.data_type.itemsize}-byte elements")
    t = _owned(info, parent.memory_type, parent._bytes[offset:end], parent.provider, parent._owner, parent._source)
    t._offset, t._parent = offset, parent
    return t
