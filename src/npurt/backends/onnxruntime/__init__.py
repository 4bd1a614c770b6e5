"""ONNX Runtime: one adapter (``adapter``: sessions, IOBinding in ``engine``, shapes, npurt's cache, ``placement``)
for every execution provider, and a module per EP beside it holding the EP and its backend: ``vitisai``
(RunnerType.VAIML, AMD NPUs), ``qnn`` (RunnerType.QNN, Qualcomm NPUs), ``generic`` (RunnerType.ONNXRUNTIME: any EP,
by name or device policy). ``providers`` is what the adapter asks of an EP, ``plugins`` the EP packages that
register with ONNX Runtime, ``discovery`` ONNX Runtime's side of `npurt devices`."""

from .adapter import OrtBackend
from .engine import OrtEngine
from .generic import OnnxRuntimeBackend
from .providers import CPU_EP, QNN_EP, VITISAI_EP, ExecutionProvider
from .qnn import QnnBackend
from .vitisai import VaimlBackend

__all__ = ["CPU_EP", "QNN_EP", "VITISAI_EP", "ExecutionProvider", "OnnxRuntimeBackend", "OrtBackend", "OrtEngine",
           "QnnBackend", "VaimlBackend"]
