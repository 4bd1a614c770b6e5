"""NpuTensor: tensor metadata over memory the tensor may or may not own."""

from __future__ import annotations

import ctypes
import logging
import operator
from typing import Any

import numpy as np

from . import _native
from .types import DYNAMIC_DIM, MemoryType, NpuError, NpuTensorInfo, TensorDirection, TensorType

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
    if arr.dtype.hasobject:  # Python object references, not data: writing them as bytes would crash the process
        raise ValueError(f"tensor {name!r}: buffer of dtype {arr.dtype} holds Python objects, not data")
    if not arr.flags.c_contiguous:
        raise ValueError(
            f"tensor {name!r}: buffer is not C-contiguous (strides {arr.strides} for shape {arr.shape}); "
            "pass np.ascontiguousarray(...) or describe the layout with NpuTensorInfo.strides"
        )
    return arr.reshape(-1).view(np.uint8)


class NpuTensor:
    """A tensor: an ``NpuTensorInfo`` and the memory it describes. Nothing is copied: the tensor is a view.

    ``NpuTensor(info, buffer, memory_type=USER_POINTER_NON_CMA, *, offset=0)`` wraps memory by memory type:
    USER_POINTER_NON_CMA / USER_POINTER_CMA take an object with the buffer protocol (a numpy array, bytearray,
    memoryview, mmap; C-contiguous) or an int address (trusted: the caller guarantees its size and lifetime, as in
    VART-ML); DMA_FD takes a file descriptor (a dma-buf, a memfd sealed against shrinking, or a regular file; the
    tensor maps its own duplicate, so the caller may close theirs; ``offset`` is bytes into the fd); XRT_BO takes
    an ``npurt._native.Buffer``.

    User-constructed tensors do not own their memory: the caller keeps it alive (the tensor keeps a
    reference to Python buffer objects, which is enough for those). Runner-allocated tensors own theirs.

    Raises ValueError for an info with dynamic dims, a HW info over USER_POINTER_NON_CMA (the device cannot see
    host memory), a negative offset, a buffer that is not C-contiguous or is smaller than ``info.size_in_bytes``,
    memory misaligned for its type (page-aligned for XRT_BO and USER_POINTER_CMA, element-aligned otherwise), an
    OUTPUT info over read-only memory, or an fd that is not acceptable memory; OSError for a closed fd or a failed
    mapping.
    """

    __slots__ = ("_info", "_memory_type", "_bytes", "_source", "_provider", "_owner", "_offset", "_parent",
                 "_buffer", "_dmabuf", "_result_shape", "_address", "__weakref__")

    def __init__(self, info: NpuTensorInfo, buffer: Any, memory_type: MemoryType = MemoryType.USER_POINTER_NON_CMA,
                 *, offset: int = 0) -> None:
        if (type(buffer) is np.ndarray and memory_type is MemoryType.USER_POINTER_NON_CMA and not offset
                and type(info) is NpuTensorInfo and self._init_array(info, buffer)):
            return  # an app's frame: the common case, checked in about a microsecond
        if not isinstance(info, NpuTensorInfo):
            raise ValueError(f"NpuTensor needs an NpuTensorInfo, got {type(info).__name__}")
        try:
            memory_type = MemoryType(memory_type)
        except ValueError:
            raise ValueError(f"tensor {info.name!r}: {memory_type!r} is not a MemoryType") from None
        name = info.name
        info.require_static("a tensor's memory needs a concrete shape")
        if info.tensor_type is TensorType.HW and memory_type is MemoryType.USER_POINTER_NON_CMA:
            raise ValueError(
                f"tensor {name!r}: a HW tensor cannot use USER_POINTER_NON_CMA memory (the device cannot see it); "
                "use runner.allocate_npu_tensor(), a DMA_FD, USER_POINTER_CMA memory, or the CPU view"
            )
        given = offset
        try:
            offset = -1 if isinstance(offset, bool) else operator.index(offset)  # an int, numpy's too
        except TypeError:
            offset = -1
        if offset < 0:
            raise ValueError(f"tensor {name!r}: offset {given!r} is not a byte offset >= 0")
        self._info = info
        self._memory_type = memory_type
        self._offset = offset
        self._owner: Any = None  # set for runner-owned memory (and XRT_BO over a native Buffer)
        self._parent: NpuTensor | None = None  # set for sub-tensors
        self._buffer: _native.Buffer | None = None  # the native memory, for sync and export
        self._dmabuf = False
        self._result_shape: tuple[int, ...] | None = None
        self._address = -1  # not asked yet
        if memory_type in (MemoryType.USER_POINTER_CMA, MemoryType.USER_POINTER_NON_CMA):
            self._init_user_pointer(buffer)
        elif memory_type in (MemoryType.XRT_BO, MemoryType.DMA_FD):
            self._init_native(buffer)
        else:
            raise ValueError(f"tensor {name!r}: memory type {memory_type.name} cannot hold a tensor")
        self._check_size_and_alignment()

    # -- construction helpers ------------------------------------------------------------------------
    def _init_array(self, info: NpuTensorInfo, array: np.ndarray) -> bool:
        """A C-contiguous, aligned numpy array large enough for a static CPU-view info (writable for an output):
        the checks of the general path, done from the array's flags. False: take the general path (which also
        says what is wrong)."""
        flags = array.flags
        if not (flags.c_contiguous and flags.aligned and array.dtype.alignment % info.data_type.itemsize == 0
                and not array.dtype.hasobject
                and array.nbytes >= info.size_in_bytes and info.tensor_type is TensorType.CPU
                and DYNAMIC_DIM not in info.shape
                and (flags.writeable or info.direction is not TensorDirection.OUTPUT)):
            return False
        self._info = info
        self._memory_type = MemoryType.USER_POINTER_NON_CMA
        self._offset = 0
        self._owner = None
        self._parent = None
        self._buffer = None
        self._dmabuf = False
        self._result_shape = None
        self._address = -1  # not asked yet
        self._bytes = array.reshape(-1).view(np.uint8)
        source: Any = array  # (the buffer a tensor was made from: an array, an fd, a native Buffer)
        self._source = source
        self._provider = "user"
        return True

    def _init_user_pointer(self, buffer: Any) -> None:
        name = self._info.name
        if isinstance(buffer, bool) or buffer is None:
            raise ValueError(f"tensor {name!r}: {buffer!r} is not a buffer or an address")
        if isinstance(buffer, int):
            if buffer == 0:
                raise ValueError(f"tensor {name!r}: null address")
            if not 0 < buffer < 1 << (8 * ctypes.sizeof(ctypes.c_void_p)):  # (reading one would crash the process)
                raise ValueError(f"tensor {name!r}: {buffer} is not an address")
            # A raw address: the caller guarantees size and lifetime, as in VART-ML.
            raw = (ctypes.c_uint8 * (self._offset + self._info.size_in_bytes)).from_address(buffer)
            self._bytes = np.frombuffer(memoryview(raw), dtype=np.uint8)
        else:
            self._bytes = _byte_view(buffer, name)
        if self._offset > self._bytes.nbytes:
            raise ValueError(f"tensor {name!r}: offset {self._offset} is past the end of a "
                             f"{self._bytes.nbytes}-byte buffer")
        self._bytes = self._bytes[self._offset:]
        self._source = buffer
        self._provider = "user"

    def _init_native(self, buffer: Any, allow_file: bool = True) -> _native.Buffer:
        """Map runner-owned or fd memory: the native buffer the tensor now holds."""
        info, name, offset = self._info, self._info.name, self._offset
        if self._memory_type is MemoryType.XRT_BO:
            if not isinstance(buffer, _native.Buffer):
                raise ValueError(
                    f"tensor {name!r}: XRT_BO memory is a native buffer (runner.allocate_npu_tensor() or "
                    f"npurt._native.Buffer), got {type(buffer).__name__}"
                )
            if offset > buffer.size:
                raise ValueError(f"tensor {name!r}: offset {offset} is past the end of a {buffer.size}-byte buffer")
            native, start = buffer, offset
            self._offset = buffer.offset + offset  # the offset inside the buffer's fd, for export
            self._owner = buffer
            self._source = buffer
        else:  # DMA_FD: an fd the caller keeps; we map our own duplicate of it
            if isinstance(buffer, bool) or not isinstance(buffer, int):
                raise ValueError(f"tensor {name!r}: DMA_FD memory is an fd (int), got {type(buffer).__name__}")
            if offset % info.data_type.itemsize:
                raise ValueError(f"tensor {name!r}: offset {offset} is not aligned to its "
                                 f"{info.data_type.itemsize}-byte {info.data_type.name} elements")
            # mmap needs a page-aligned file offset: map from the page below and start the view inside it.
            start = offset % PAGE_SIZE
            native = _import_fd(name, buffer, start + info.size_in_bytes, offset - start, allow_file)
            self._source = buffer
        self._buffer = native
        self._dmabuf = native.is_dmabuf
        self._provider = native.provider
        self._bytes = np.frombuffer(memoryview(native), dtype=np.uint8)[start:]
        return native

    def _check_size_and_alignment(self) -> None:
        info = self._info
        if self._bytes.nbytes < info.size_in_bytes:
            raise ValueError(
                f"tensor {info.name!r}: buffer holds {self._bytes.nbytes} bytes, "
                f"{info.describe()} needs {info.size_in_bytes}"
            )
        address = self.get_virtual_address()
        if self._memory_type in (MemoryType.USER_POINTER_NON_CMA, MemoryType.DMA_FD):
            # A DMA_FD reaches the device as fd + offset, so only the elements need alignment in the mapping.
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
        """The tensor's metadata (immutable)."""
        return self._info

    @property
    def memory_type(self) -> MemoryType:
        """The memory type the tensor was made with (runner-allocated: XRT_BO or DMA_FD)."""
        return self._memory_type

    @property
    def provider(self) -> str:
        """Where the memory came from: "dma_heap:<heap>", "udmabuf", "memfd", "host" or "user"."""
        return self._provider

    @property
    def offset(self) -> int:
        """Byte offset of the tensor's first byte inside the memory ``export_buffer()`` refers to."""
        return self._offset

    @property
    def nbytes(self) -> int:
        """``info.size_in_bytes``: the bytes the tensor spans (the memory may be larger)."""
        return self._info.size_in_bytes

    @property
    def writable(self) -> bool:
        """Whether the memory can be written (an output tensor needs writable memory)."""
        return bool(self._bytes.flags.writeable)

    def get_info(self) -> NpuTensorInfo:
        """``info`` (VART-ML's accessor)."""
        return self._info

    def get_memory_type(self) -> MemoryType:
        """``memory_type`` (VART-ML's accessor)."""
        return self._memory_type

    def get_buffer(self) -> Any:
        """The buffer the tensor was made from; None if none.

        A user object for USER_POINTER_*, the fd number for DMA_FD (the caller's, or for runner-allocated
        DMA_FD tensors the buffer's own fd, borrowed: do not close it), the native Buffer for XRT_BO.
        """
        return self._source

    @property
    def native(self) -> _native.Buffer | None:
        """The native buffer behind the memory (runner-allocated, DMA_FD, imported), None for user memory: what
        ``npurt.share`` and the service pass by fd."""
        return self._buffer

    def get_virtual_address(self) -> int:
        """The address of the tensor's first byte in this process, 0 where there is none."""
        address = self._address  # a tensor's memory never moves: engines bind by address on every call
        if address < 0:
            try:
                address = _native.address_of(self._bytes)  # (a tensor's bytes are one contiguous run)
            except Exception:  # a sentinel, never an exception (VART-ML accessor contract)
                return 0
            self._address = address
        return address

    def numpy(self) -> np.ndarray:
        """A zero-copy array over the tensor's memory, shaped and typed by ``info`` (BF16 shows as uint16);
        read-only where the memory is. Writing it writes the tensor."""
        info = self._info
        itemsize = info.data_type.itemsize
        return np.lib.stride_tricks.as_strided(
            self._bytes[: info.size_in_bytes].view(info.numpy_dtype),
            shape=info.shape,
            strides=tuple(s * itemsize for s in info.strides),
            writeable=self.writable,
        )

    @property
    def result_info(self) -> NpuTensorInfo:
        """What the last run wrote into this output tensor.

        ``info`` itself, except where the port's shape is known only after the run (a dynamic output on a device
        that runs dynamic shapes): then the shape the run produced, stored contiguously from the tensor's first
        byte; the memory may be larger.
        """
        shape = self._result_shape
        if shape is None or shape == self._info.shape:
            return self._info
        return self._info.replace(shape=shape, strides=(), size_in_bytes=-1)

    def result(self) -> np.ndarray:
        """A zero-copy array over what the last run wrote (``result_info``'s shape)."""
        info = self.result_info
        if info is self._info:
            return self.numpy()
        return self._bytes[: info.size_in_bytes].view(info.numpy_dtype).reshape(info.shape)

    def set_result_shape(self, shape: tuple[int, ...] | None) -> None:
        """For engines: the shape a run wrote (None: the tensor's own). Runs that write a tensor set it."""
        self._result_shape = shape

    def raw_bytes(self) -> np.ndarray:
        """The tensor's bytes as a flat uint8 array (zero-copy)."""
        return self._bytes[: self._info.size_in_bytes]

    # -- memory operations ---------------------------------------------------------------------------
    def sync_buffer(self) -> None:
        """Make CPU writes visible to the device and device writes visible to the CPU (DMA-BUF memory).

        A full DMA_BUF_IOCTL_SYNC start/end pair over the buffer; a no-op for memory that needs no cache
        maintenance (host memory, memfd, user memory).
        """
        if self._dmabuf and self._buffer is not None:
            self._buffer.sync_start(read=True, write=True)
            self._buffer.sync_end(read=True, write=True)

    def begin_cpu_access(self, write: bool) -> None:
        """Start a CPU access window (DMA_BUF_IOCTL_SYNC start); a no-op where not needed."""
        if self._dmabuf and self._buffer is not None:
            self._buffer.sync_start(read=True, write=bool(write))

    def end_cpu_access(self, write: bool) -> None:
        """End a CPU access window (DMA_BUF_IOCTL_SYNC end); a no-op where not needed."""
        if self._dmabuf and self._buffer is not None:
            self._buffer.sync_end(read=True, write=bool(write))

    def export_buffer(self) -> int:
        """A new DMA-BUF (or sealed memfd) fd that the caller owns and must close; -1 where not exportable.

        The fd refers to the whole underlying buffer; the tensor starts at ``offset`` bytes into it. A
        sub-tensor therefore exports its parent's buffer, and its ``offset`` says where it lies (as XRT does
        for sub-buffers): ``NpuTensor(info, fd, MemoryType.DMA_FD, offset=t.offset)`` maps it elsewhere.
        User memory and host memory give -1.
        """
        if self._buffer is None:
            return -1
        return self._buffer.export()

    # -- interop -------------------------------------------------------------------------------------
    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        """DLPack export of ``numpy()``: other array libraries get the tensor's memory without a copy."""
        return self.numpy().__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        """The DLPack device of the memory (the CPU: npurt's memory is host-mapped)."""
        return self.numpy().__dlpack_device__()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        """``np.asarray(tensor)``: ``numpy()``, no copy; a copy only for another dtype or ``copy=True``."""
        arr = self.numpy()
        if dtype is not None and np.dtype(dtype) != arr.dtype:
            return arr.astype(dtype)
        return arr.copy() if copy else arr

    def __repr__(self) -> str:
        return (f"NpuTensor({self._info.name!r}, {self._info.describe()}, {self._memory_type.name}, "
                f"provider={self._provider!r})")


# -- runner-owned memory ---------------------------------------------------------------------------
_log = logging.getLogger("npurt")


def _import_fd(name: str, fd: int, size: int, offset: int, allow_file: bool) -> _native.Buffer:
    """Buffer.import_fd with the tensor's name in the message."""
    try:
        return _native.Buffer.import_fd(fd, size, offset, allow_file)
    except ValueError as e:
        raise ValueError(f"tensor {name!r}: {e}") from None
    except OSError as e:
        raise type(e)(e.errno, f"tensor {name!r}: {e.strerror}") from None


def _owned(info: NpuTensorInfo, memory_type: MemoryType, data: np.ndarray, provider: str, owner: Any,
           source: Any, buffer: _native.Buffer | None) -> NpuTensor:
    t = NpuTensor.__new__(NpuTensor)
    t._info, t._memory_type, t._offset = info, memory_type, 0
    t._bytes, t._provider, t._owner, t._source = data, provider, owner, source
    t._parent = None
    t._buffer = buffer
    t._dmabuf = buffer is not None and buffer.is_dmabuf
    t._result_shape = None
    t._address = -1
    return t


def import_dma_fd(info: NpuTensorInfo, fd: int, offset: int = 0, *, allow_file: bool = True) -> NpuTensor:
    """``NpuTensor(info, fd, MemoryType.DMA_FD, offset=offset)``, optionally refusing regular files.

    For fds from another process (npurt.share), where a file could be truncated under the mapping. The
    tensor holds its own duplicate of ``fd``, and ``get_buffer()`` gives that one (borrowed), so the caller
    may close ``fd`` at once.
    """
    t = NpuTensor.__new__(NpuTensor)
    t._info, t._memory_type, t._offset = info, MemoryType.DMA_FD, offset
    t._owner, t._parent, t._buffer, t._dmabuf, t._result_shape = None, None, None, False, None
    t._address = -1
    info.require_static("a tensor's memory needs a concrete shape")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"tensor {info.name!r}: offset {offset!r} is not a byte offset >= 0")
    t._source = t._init_native(fd, allow_file).fd
    t._check_size_and_alignment()
    return t


def allocate_tensor(info: NpuTensorInfo, memory_type: MemoryType = MemoryType.XRT_BO, provider: str = "auto",
                    strict: bool = False) -> NpuTensor:
    """Runner-owned, page-aligned memory for ``info`` (see Runner.allocate_npu_tensor).

    ``provider`` "auto" walks the chain dma_heap:system -> udmabuf -> memfd -> host, and ``strict`` refuses to
    fall below its top; an explicit provider ("dma_heap", "dma_heap:<heap>", "udmabuf", "memfd", "host")
    gives exactly that one or raises NpuError saying why. DMA_FD tensors need fd-backed memory, so the host
    step is not taken for them.
    """
    memory_type = MemoryType(memory_type)
    info.require_static("memory is allocated for a concrete shape")
    if memory_type is MemoryType.UNKNOWN:
        raise ValueError(f"tensor {info.name!r}: cannot allocate memory of type UNKNOWN")
    if info.tensor_type is TensorType.HW and memory_type is MemoryType.USER_POINTER_NON_CMA:
        raise ValueError(f"tensor {info.name!r}: a HW tensor cannot use USER_POINTER_NON_CMA memory")
    if not isinstance(provider, str):
        raise ValueError(f"tensor {info.name!r}: memory provider {provider!r} is not a string")
    if memory_type is MemoryType.DMA_FD and provider == "host":
        raise ValueError(f"tensor {info.name!r}: DMA_FD memory needs an fd-backed provider, not 'host'")
    nbytes = info.size_in_bytes
    try:
        buffer = _native.Buffer.allocate(max(nbytes, 1), provider, bool(strict))
    except ValueError as e:
        raise ValueError(f"tensor {info.name!r}: {e}") from None
    except OSError as e:
        raise NpuError(f"tensor {info.name!r}: {e.strerror}") from e
    if memory_type is MemoryType.DMA_FD and buffer.fd < 0:
        raise NpuError(f"tensor {info.name!r}: DMA_FD memory needs an fd, but only {buffer.provider} memory was "
                       f"available ({'; '.join(buffer.fallback_reasons)})")
    if buffer.fallback_reasons:
        _log.debug("tensor %r: %s memory (%s)", info.name, buffer.provider, "; ".join(buffer.fallback_reasons))
    data = np.frombuffer(memoryview(buffer), dtype=np.uint8)[:nbytes]
    source = buffer.fd if memory_type is MemoryType.DMA_FD else buffer
    return _owned(info, memory_type, data, buffer.provider, owner=buffer, source=source, buffer=buffer)


def sub_tensor(parent: NpuTensor, info: NpuTensorInfo, offset: int) -> NpuTensor:
    """A view of ``info`` at byte ``offset`` into a runner-allocated parent; the memory lives on with it.

    The view holds the parent's native buffer (through its numpy base), so the mapping and the fd stay until
    the parent and every sub-tensor are gone. ``export_buffer()`` of a sub-tensor gives the parent's buffer,
    with the sub-tensor's ``offset`` inside it.
    """
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
    t = _owned(info, parent.memory_type, parent._bytes[offset:end], parent.provider, parent._owner, parent._source,
               parent._buffer)
    t._offset, t._parent = parent._offset + offset, parent
    return t
