"""ONNX Runtime engine: a run with the same tensors on two threads at once, where an open-shaped output is bound in
place with the caller's shape and the run produces another shape.

The second thread gets a binding of its own; ONNX Runtime refuses that run (nothing written) and the engine must run
it again with the output in ONNX Runtime's memory, as it does on the first thread. It used to hand the refusal's
sentinel back as the run's result shapes (a RUNTIME_ERROR "'object' is not iterable" at the runner).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from npurt import NpuTensor, RunnerFactory, TensorDirection, TensorType
from npurt.models import DEFAULT_MODEL, default_samples


def test_a_contended_binding_runs_again_where_onnx_runtime_refuses_the_guessed_shape() -> None:
    images, _ = default_samples()
    with RunnerFactory.create_runner("VAIML", DEFAULT_MODEL, {"device": "CPU"}) as runner:
        x_info = runner.get_tensors_info(TensorDirection.INPUT, TensorType.CPU)[0].replace(shape=(1, 1, 8, 8))
        # the scores of one image are [1, 10]; the tensor holds up to four images' scores
        y_info = runner.get_tensors_info(TensorDirection.OUTPUT, TensorType.CPU)[0].replace(shape=(4, 10))
        x = NpuTensor(x_info, np.ascontiguousarray(images[:1]))
        y = NpuTensor(y_info, np.full((4, 10), np.nan, np.float32))
        engine = runner.engine_for()
        binding = engine.bind([x], [y])
        assert binding.lock.acquire(False)  # as if another thread were running this binding now
        try:
            shapes = engine.run(binding)
        finally:
            binding.lock.release()
        assert shapes is not None and list(shapes) == [(1, 10)]
    # ONNX Runtime used directly (the model as it is, one intra-op thread as the suite's runners have it): bit for bit
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    (want,) = ort.InferenceSession(str(DEFAULT_MODEL), so, providers=["CPUExecutionProvider"]).run(
        None, {"image": images[:1]})
    np.testing.assert_array_equal(y.numpy().reshape(-1)[:10], want.reshape(-1))
