"""ONNX Runtime: one adapter (``backend``: sessions, IOBinding in ``engine``, shapes, npurt's cache, ``placement``)
for every execution provider, with a small module per EP beside it: ``vitisai`` (RunnerType.VAIML, AMD NPUs)."""

from .backend import OrtBackend
from .engine import OrtEngine
from .providers import CPU_EP, ExecutionProvider
from .vitisai import VITISAI_EP, VaimlBackend

__all__ = ["CPU_EP", "VITISAI_EP", "ExecutionProvider", "OrtBackend", "OrtEngine", "VaimlBackend"]
