"""RunnerType.OPENVINO: OpenVINO's NPU plugin, and its CPU and GPU plugins, behind the engine interface.

- One ``ov.Core`` per process. The model (ONNX, OpenVINO IR, anything ``read_model`` reads) is read once per
  runner; each engine compiles it for its input ports: dims left open (CPU, GPU) or reshaped to static shapes (the
  NPU), with the CPU<->HW view conversion of HW-view ports built in by ``PrePostProcessor``.
- An engine keeps a pool of ``InferRequest`` s. A binding wraps each tensor's memory in an ``ov.Tensor`` once; a
  request is pointed at it with ``set_tensor`` only when it held something else, so a tensor in its port's view is
  never copied on the host. Outputs whose shape only the run tells are written into the bound memory (OpenVINO
  reshapes a tensor within its capacity) and their shapes reported.
- Asynchronous jobs run on the runner's workers, each a synchronous ``infer`` on a pooled request (engine.py says
  why not OpenVINO's ``start_async``).
- Placement: ``Core.query_model`` on the attached device, per operation of OpenVINO's graph.
"""

from .backend import OpenVINOBackend
from .discovery import core, data_type_of, device_family, gpu_unavailable_reason, npu_unavailable_reason, ov_type
from .engine import OpenVINOEngine

__all__ = ["OpenVINOBackend", "OpenVINOEngine", "core", "data_type_of", "device_family", "gpu_unavailable_reason",
           "npu_unavailable_reason", "ov_type"]
