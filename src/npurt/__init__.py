"""npurt: one VART-ML style API for NPUs, over OpenVINO and ONNX Runtime (Vitis AI EP)."""

from typing import TYPE_CHECKING, Any

from . import share
from .factory import RunnerFactory
from .formats import convert
from .generate.generator import Generator
from .infer_queue import InferQueue, QueueSlot
from .runner import Runner
from .serve import connect
from .tensor import NpuTensor
from .types import (
    DataType,
    DeviceInfo,
    JobHandle,
    MemoryLayout,
    MemoryType,
    NodePlacement,
    NpuError,
    NpuFallbackWarning,
    NpuTensorInfo,
    NpuUnsupportedError,
    QuantParameters,
    RoundingMode,
    RunnerType,
    StatusCode,
    TensorDirection,
    TensorType,
)

if TYPE_CHECKING:
    from .embed import Embedder
    from .speech import Transcriber
    from .text import ChatSession, Tokenizer

__version__ = "0.1.0"  # the only place the version is written: pyproject.toml reads it from here

__all__ = [
    "ChatSession", "DataType", "DeviceInfo", "Embedder", "Generator", "InferQueue", "JobHandle", "MemoryLayout",
    "MemoryType", "NodePlacement",
    "NpuError", "NpuFallbackWarning", "NpuTensor", "NpuTensorInfo", "NpuUnsupportedError", "QuantParameters",
    "QueueSlot", "RoundingMode", "Runner", "RunnerFactory", "RunnerType", "StatusCode", "TensorDirection",
    "TensorType", "Tokenizer", "Transcriber", "connect", "convert", "share", "__version__",
]


def __getattr__(name: str) -> Any:
    """The text layer (``Tokenizer``, ``ChatSession``), ``Embedder`` and ``Transcriber`` are imported where they
    are first named: an app without them does not pay for them."""
    if name in ("ChatSession", "Tokenizer"):
        from . import text

        return getattr(text, name)
    if name == "Embedder":
        from .embed import Embedder

        return Embedder
    if name == "Transcriber":
        from .speech import Transcriber

        return Transcriber
    raise AttributeError(f"module 'npurt' has no attribute {name!r}")
