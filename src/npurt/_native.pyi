"""Types of npurt._native, the pybind11 extension in cpp/: zero-copy buffers and the conversion kernels.

Kept by hand; tests/test_native_stub.py checks it against the built module (names, members, parameters).
"""

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from typing_extensions import Buffer as _Buffer

# What the kernels take: anything with the buffer protocol (numpy's stubs give ndarray __buffer__ from 3.12 only).
_BufferLike = _Buffer | np.ndarray[Any, Any]

def page_size() -> int:
    """The system page size in bytes."""

def address_of(buffer: _BufferLike) -> int:
    """The address of the first byte of a contiguous buffer (anything with the buffer protocol)."""

# ---------------------------------------------------------------- buffers (cpp/buffer.cpp)
class Buffer:
    """Page-aligned memory owned by this object: a dma-buf, a sealed memfd or anonymous host memory.

    Made by ``allocate`` or ``import_fd`` only (no constructor). Supports the buffer protocol (zero-copy
    ``memoryview`` / ``numpy.frombuffer`` views, read-only where ``readonly``).
    """

    @staticmethod
    def allocate(size: int, provider: str = "auto", strict: bool = False, heap: str = "system") -> Buffer:
        """A new mapping of ``size`` bytes, zeros (every provider maps fresh memory: the kernel zero-fills it).
        Raises OSError when no provider could allocate, ValueError on bad arguments."""
    @staticmethod
    def import_fd(fd: int, size: int, offset: int = 0, allow_file: bool = True) -> Buffer:
        """Raises ValueError for an fd that is not acceptable memory, OSError for a closed fd or a failed mmap."""
    @property
    def provider(self) -> str:
        """'dma_heap:<heap>', 'udmabuf', 'memfd', 'host', or for imports 'dma_buf:<exporter>' / 'file'."""
    @property
    def size(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def fd(self) -> int:
        """Borrowed (do not close it); -1 for host memory."""
    @property
    def address(self) -> int: ...
    @property
    def is_dmabuf(self) -> bool: ...
    @property
    def readonly(self) -> bool: ...
    @property
    def fallback_reasons(self) -> list[str]: ...
    def export(self) -> int:
        """A new fd the caller owns and must close; -1 for host memory."""
    def sync_start(self, read: bool = True, write: bool = True) -> None: ...
    def sync_end(self, read: bool = True, write: bool = True) -> None: ...
    def __len__(self) -> int: ...
    # The buffer protocol (a C slot; Python names it __buffer__ from 3.12): declared for every version, as typeshed
    # does for bytes, so that a Buffer is a collections.abc.Buffer to the type checker.
    def __buffer__(self, flags: int, /) -> memoryview: ...

# ---------------------------------------------------------------- conversion kernels (cpp/convert.cpp)
class ElementType:
    """npurt.DataType's members (but UNKNOWN), by the same names and values (a pybind11 enum, not enum.Enum).

    ``ElementType(n)`` accepts any int; convert_strided refuses one that is not a member (ValueError).
    """

    BOOLEAN: ClassVar[ElementType]  # 1
    INT8: ClassVar[ElementType]  # 2
    UINT8: ClassVar[ElementType]  # 3
    INT16: ClassVar[ElementType]  # 4
    UINT16: ClassVar[ElementType]  # 5
    BF16: ClassVar[ElementType]  # 6
    FP16: ClassVar[ElementType]  # 7
    INT32: ClassVar[ElementType]  # 8
    UINT32: ClassVar[ElementType]  # 9
    FLOAT32: ClassVar[ElementType]  # 10
    INT64: ClassVar[ElementType]  # 11
    UINT64: ClassVar[ElementType]  # 12
    FLOAT64: ClassVar[ElementType]  # 13
    __members__: ClassVar[dict[str, ElementType]]
    def __init__(self, value: int) -> None: ...
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...
    def __index__(self) -> int: ...
    def __int__(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

class Rounding:
    """npurt.RoundingMode's members (but UNKNOWN), by the same names and values (a pybind11 enum)."""

    ROUND_TO_NEAREST_EVEN: ClassVar[Rounding]  # 1
    ROUND_TOWARD_ZERO: ClassVar[Rounding]  # 2
    __members__: ClassVar[dict[str, Rounding]]
    def __init__(self, value: int) -> None: ...
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...
    def __index__(self) -> int: ...
    def __int__(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

# The element types convert_strided converts between (through float32); any type is copied to itself.
CONVERTIBLE_TYPES: frozenset[ElementType]

class ChannelPadding:
    """Channel grouping with zero padding: channel group * group_size + lane is padding when >= channels.

    The padded side is the destination (zeros written there) when dst_padded, else the source (not read there).
    """

    def __init__(self, *, group_axis: int, lane_axis: int, channels: int, group_size: int, dst_padded: bool) -> None:
        """Raises ValueError unless the axes are two different axes >= 0, channels >= 0, group_size >= 1."""
    @property
    def group_axis(self) -> int: ...
    @property
    def lane_axis(self) -> int: ...
    @property
    def channels(self) -> int: ...
    @property
    def group_size(self) -> int: ...
    @property
    def dst_padded(self) -> bool: ...

def convert_strided(
    src: _BufferLike,
    src_type: ElementType,
    dst: _BufferLike,
    dst_type: ElementType,
    shape: Sequence[int],
    src_strides: Sequence[int],
    dst_strides: Sequence[int],
    scale: float = 1.0,
    zero_point: float = 0.0,
    rounding: Rounding = ...,
    pad: ChannelPadding | None = None,
) -> None:
    """Convert a tensor between layouts and dtypes in one pass, without the GIL. Raises ValueError on bad input."""

def convert_isa() -> str:
    """'avx512', 'avx2' or 'portable'."""

def set_convert_isa(name: str) -> None:
    """'auto', 'avx512', 'avx2' or 'portable'; ValueError for one this CPU cannot run."""
