"""Runner.bind: tensors validated and bound once, executed many times, with execute's results and status codes."""

from __future__ import annotations

import numpy as np
import pytest

from npurt import NpuError, NpuTensor, RunnerFactory, StatusCode, TensorDirection, TensorType
from npurt.models import DEFAULT_MODEL, default_samples


@pytest.mark.parametrize("backend", ["OPENVINO", "VAIML"])
def test_a_bound_run_gives_execute_s_results(backend):
    images = default_samples()[0]
    with RunnerFactory.create_runner(backend, DEFAULT_MODEL, {"device": "CPU", "shapes": {"image": [1, 1, 8, 8]},
                                                              "input_tensor_type": "CPU"}) as r:
        x_info = r.get_tensors_info(TensorDirection.INPUT, TensorType.CPU)[0]
        x = np.zeros(x_info.shape, np.float32)
        y = r.allocate_npu_tensor(r.get_tensors_info(TensorDirection.OUTPUT)[0])
        bound = r.bind([[NpuTensor(x_info, x)]], [[y]])
        for image in images[:5]:
            x[...] = image  # the bound memory, written in place
            assert bound.execute() is StatusCode.SUCCESS, r.last_error
            np.testing.assert_array_equal(y.numpy(), r.run({"image": image[None]})["scores"])
        executes = r.stats["executes"]
        with pytest.raises(ValueError, match="INVALID_INPUT"):
            r.bind([[y]], [[y]])
    assert executes >= 5
    assert bound.execute() is StatusCode.FAILURE and "closed" in r.last_error
    with pytest.raises(NpuError, match="closed"):  # as every other call of a closed runner (not an internal error)
        r.bind([[NpuTensor(x_info, x)]], [[y]])


def test_a_stream_whose_state_changes_buffers_cannot_be_bound():
    from tests.helpers.models import model_or_skip

    path = model_or_skip("silero_vad")
    with RunnerFactory.create_runner("VAIML", path, {"device": "CPU", "state_pairs": {"state": "stateN"}}) as r:
        infos = {i.name: i for i in r.get_tensors_info(TensorDirection.INPUT, TensorType.CPU)}
        ins = [NpuTensor(infos["input"].replace(shape=(1, 512)), np.zeros((1, 512), np.float32)),
               NpuTensor(infos["sr"], np.array(16000, np.int64))]
        out = r.allocate_npu_tensor(r.get_tensors_info(TensorDirection.OUTPUT)[0].replace(shape=(1, 1)))
        with pytest.raises(ValueError, match="changes buffers"):
            r.bind([ins], [[out]], stream=r.open_stream())
