"""Streams under faults: bad handles, the carried state passed by hand, a reset or a close between an execute_async
and its wait. Clear StatusCodes, nothing crashes, ordering holds (docs/reliability.md lists them)."""

from __future__ import annotations

import numpy as np
import pytest

from npurt import NpuTensor, RunnerFactory, StatusCode, TensorType
from tests.helpers.models import model_or_skip

SR = np.array(16000, np.int64)


@pytest.fixture
def vad():
    with RunnerFactory.create_runner("VAIML", model_or_skip("silero_vad"),
                                     {"device": "CPU", "state_pairs": {"state": "stateN"}}) as r:
        yield r


def chunks(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((1, 576)) * 0.3).astype(np.float32) for _ in range(n)]


def test_stream_faults_are_clear_statuses(vad):
    s = vad.open_stream()
    x = chunks(1)[0]
    assert vad.reset_stream(12345) is StatusCode.INVALID_INPUT and "stream 12345" in vad.last_error
    assert vad.close_stream(0) is StatusCode.INVALID_INPUT  # the default stream stays
    with pytest.raises(ValueError, match="stream 999"):
        vad.get_stream_state(999)
    # the carried state is the stream's: passing it is refused
    state = NpuTensor(vad.get_tensor_info_by_name("state", TensorType.CPU).replace(shape=(2, 1, 128)),
                      np.zeros((2, 1, 128), np.float32))
    ins = [NpuTensor(vad.get_tensor_info_by_name("input", TensorType.CPU).replace(shape=x.shape), x),
           NpuTensor(vad.get_tensor_info_by_name("sr", TensorType.CPU), SR), state]
    out = NpuTensor(vad.get_tensor_info_by_name("output", TensorType.CPU).replace(shape=(1, 1)),
                    np.zeros((1, 1), np.float32))
    assert vad.execute([ins], [[out]], stream=s) is StatusCode.INVALID_INPUT
    assert "state the stream carries" in vad.last_error
    # a reset between an execute_async and its wait applies after the job; a close waits for it too
    job = vad.execute_async([ins[:2]], [[out]], stream=s)
    assert job.status is StatusCode.SUCCESS, vad.last_error
    assert s.reset() is StatusCode.SUCCESS
    assert vad.wait(job, 30_000) is StatusCode.SUCCESS
    assert np.array_equal(s.state()["state"], np.zeros((2, 1, 128), np.float32))
    job = vad.execute_async([ins[:2]], [[out]], stream=s)
    assert s.close() is StatusCode.SUCCESS
    assert vad.wait(job, 30_000) is StatusCode.SUCCESS  # it ran before the close
    assert vad.execute([ins[:2]], [[out]], stream=s) is StatusCode.INVALID_INPUT
    assert "closed" in vad.last_error
    assert vad.execute_async([ins[:2]], [[out]], stream=s).status is StatusCode.INVALID_INPUT
    assert s.reset() is StatusCode.INVALID_INPUT
