"""A runner closed while a stream's jobs wait for their turn: each ends once, with SUCCESS (it ran) or FAILURE
(it never ran: "stream ... was closed" or "closed before the job ran"), its callback runs once, and nothing hangs.
The case docs/reliability.md lists under Streams."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, save

from npurt import JobHandle, NpuTensor, RunnerFactory, StatusCode, TensorType


def accumulator(folder: Path) -> Path:
    """stateN = state + x; total = sum(stateN): state carried by option state_pairs."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["state", "x"], ["stateN"]),
         helper.make_node("ReduceSum", ["stateN"], ["total"], keepdims=1)],
        "accumulate",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4096]),
         helper.make_tensor_value_info("state", TensorProto.FLOAT, [1, 4096])],
        [helper.make_tensor_value_info("total", TensorProto.FLOAT, [1, 1]),
         helper.make_tensor_value_info("stateN", TensorProto.FLOAT, [1, 4096])])
    path = folder / "accumulate.onnx"
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return path


def test_close_with_stream_jobs_waiting_for_their_turn(tmp_path: Path) -> None:
    options = {"device": "CPU", "state_pairs": {"state": "stateN"}, "max_concurrent_runs": 8}
    runner = RunnerFactory.create_runner("VAIML", accumulator(tmp_path), options)
    stream = runner.open_stream()
    x = np.ones((1, 4096), np.float32)
    ins = [NpuTensor(runner.get_tensor_info_by_name("x", TensorType.CPU), x)]
    ended: list[tuple[int, StatusCode, str]] = []
    lock = threading.Lock()

    def on_end(handle: JobHandle) -> None:
        with lock:
            ended.append((handle.job_id, handle.status, runner.last_error))

    outs = [[NpuTensor(runner.get_tensor_info_by_name("total", TensorType.CPU), np.zeros((1, 1), np.float32))]
            for _ in range(8)]
    jobs = [runner.execute_async([ins], [out], callback=on_end, stream=stream) for out in outs]
    assert all(j.status is StatusCode.SUCCESS for j in jobs), runner.last_error
    t0 = time.monotonic()
    runner.close()
    assert time.monotonic() - t0 < 30
    assert sorted(job_id for job_id, _, _ in ended) == sorted(j.job_id for j in jobs)  # each callback once
    for _, status, message in ended:
        assert status in (StatusCode.SUCCESS, StatusCode.FAILURE)
        if status is StatusCode.FAILURE:
            assert "closed" in message, message
            assert not message.startswith("runner for"), message  # a job in its turn runs to its end
    ran = [out[0].numpy()[0, 0] for out, (_, status, _) in zip(outs, sorted(ended)) if status is StatusCode.SUCCESS]
    # the jobs that ran did so in the stream's order: totals 4096, 8192, ... with nothing skipped
    assert ran == [4096.0 * (k + 1) for k in range(len(ran))]
