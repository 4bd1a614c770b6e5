"""npurt: one VART-ML style API for NPUs, over OpenVINO and ONNX Runtime (Vitis AI EP)."""

from typing import TYPE_CHECKING, Any

from .factory import RunnerFactory
from .generate.generator import Generator
from .runner import Runner
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
    from . import share
    from .embed import Embedder
    from .formats import convert
    from .infer_queue import InferQueue, QueueSlot
    from .serve import connect
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


# imported where they are first named: an app that does not use them does not pay for them (a decoder's load imports
# only what RunnerFactory and Generator need: ~60 ms less on the 2-core VM than with these at the top)
_LAZY = {"ChatSession": ("text", "ChatSession"), "Tokenizer": ("text", "Tokenizer"), "Embedder": ("embed", "Embedder"),
         "Transcriber": ("speech", "Transcriber"), "InferQueue": ("infer_queue", "InferQueue"),
         "QueueSlot": ("infer_queue", "QueueSlot"), "connect": ("serve", "connect"), "convert": ("formats", "convert"),
         "share": ("share", None)}


def __getattr__(name: str) -> Any:
    """The names of ``_LAZY``, imported where they are first named."""
    if name not in _LAZY:
        raise AttributeError(f"module 'npurt' has no attribute {name!r}")
    import importlib

    module_name, attribute = _LAZY[name]
    module = importlib.import_module(f".{module_name}", __name__)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value
