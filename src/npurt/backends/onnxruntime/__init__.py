"""ONNX Runtime: one adapter (``backend``: sessions, IOBinding in ``engine``, shapes, npurt's cache, ``placement``)
for every execution provider, with a small module per EP beside it: ``vitisai`` (RunnerType.VAIML, AMD NPUs),
``qnn`` (RunnerType.QNN, Qualcomm NPUs), ``generic`` (RunnerType.ONNXRUNTIME: any EP, by name or device policy),
and ``plugins`` (EP packages that register with ONNX Runtime)."""

from .backend import OrtBackend
from .backends import OnnxRuntimeBackend, QnnBackend, VaimlBackend
from .engine import OrtEngine
from .providers import CPU_EP, ExecutionProvider
from .qnn import QNN_EP
from .vitisai import VITISAI_EP

__all__ = ["CPU_EP", "QNN_EP", "VITISAI_EP", "ExecutionProvider", "OnnxRuntimeBackend", "OrtBackend", "OrtEngine",
           "QnnBackend", "VaimlBackend"]
